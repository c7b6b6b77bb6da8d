"""A compact text syntax for :class:`~sparseclip_d2.clip.AttentionSpec` (``tools/demo.py --compare``).

A spec string is colon-separated tokens, read left to right::

    [BASE:]TOKEN[:TOKEN...]

``BASE`` (optional, first token): a preset name (``clip``, ``sclip``, ``clearclip``,
``naclip``, ``maskclip``, see ``AttentionSpec.preset``) or ``cfg`` (the spec of the config
file). Without a base the start is ``clip``: plain CLIP attention (``qk``, softmax, full
block), so ``entmax:1.2`` means QK scores with alpha-entmax 1.2.

``TOKEN`` is one of

- a normaliser (``softmax``, ``entmax``, ``sparsemax``, ``random_matched``); ``entmax`` and
  ``random_matched`` may be followed by a number token, the alpha (``entmax:1.2``);
- a score source (``qk``, ``qq``, ``kk``, ``vv``, ``identity``, sums such as ``qq+kk``, or
  the paper's names ``qkv``, ``qqv``, ``kkv``, ``vvv``, ``v-only``);
- ``key=value`` for any field: ``alpha``, ``temperature`` (``t``), ``layers``
  (``num_layers``), ``residual``, ``ffn`` (true/false/1/0/on/off), ``prior``,
  ``prior_std`` (``std``), ``sum_mode``, ``seed``, ``source``, ``normalizer``.

Examples: ``softmax``, ``entmax:1.2``, ``qq:entmax:1.2``, ``clearclip:entmax:1.5``,
``naclip``, ``qq+kk:sparsemax:layers=2``, ``softmax:t=0.5``, ``cfg:alpha=1.4``.
"""
from typing import Any, Dict, List, Optional, Tuple

from ..attention import NORMALIZER_REGISTRY, canonical_source
from ..clip import PRESETS, AttentionSpec

__all__ = ["parse_attention_spec", "parse_attention_specs", "describe_spec", "SPEC_KEYS"]

#: key=value keys (and aliases) -> AttentionSpec field.
SPEC_KEYS = {
    "alpha": "alpha", "temperature": "temperature", "t": "temperature", "temp": "temperature",
    "layers": "num_layers", "num_layers": "num_layers", "residual": "residual", "ffn": "ffn",
    "prior": "prior", "prior_std": "prior_std", "std": "prior_std", "sum_mode": "sum_mode",
    "seed": "seed", "source": "source", "normalizer": "normalizer",
}
_ALPHA_NORMALIZERS = ("entmax", "random_matched")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _normalizers() -> List[str]:
    return [name for name, _ in NORMALIZER_REGISTRY]


def _syntax_help() -> str:
    return (f"valid: bases: {', '.join(PRESETS)}, cfg; normalizers: {', '.join(_normalizers())} (entmax:ALPHA); "
            "sources: qk, qq, kk, vv, identity, sums like qq+kk; key=value with keys "
            f"{', '.join(sorted(SPEC_KEYS))}")


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _value(field: str, raw: str, text: str) -> Any:
    if field in ("residual", "ffn"):
        if raw.lower() in _TRUE:
            return True
        if raw.lower() in _FALSE:
            return False
        raise ValueError(f"spec {text!r}: {field}={raw!r} is not a boolean (use true/false, 1/0, on/off)")
    if field in ("alpha", "temperature", "prior_std"):
        if not _is_number(raw):
            raise ValueError(f"spec {text!r}: {field}={raw!r} is not a number")
        return float(raw)
    if field in ("num_layers", "seed"):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"spec {text!r}: {field}={raw!r} is not an integer") from None
    return raw


def parse_attention_spec(text: str, config_spec: Optional[AttentionSpec] = None) -> AttentionSpec:
    """Parse one spec string (syntax in the module docstring) into a validated ``AttentionSpec``.

    Args:
        text: e.g. ``"qq:entmax:1.2"``.
        config_spec: the spec that the base ``cfg`` stands for (None: ``cfg`` is refused).

    Raises:
        ValueError: an unknown token, a misplaced number, a bad key or value, or a field
            value ``AttentionSpec`` rejects; the message quotes the spec and the valid choices.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty attention spec {text!r}; {_syntax_help()}")
    tokens = [t.strip() for t in text.strip().split(":")]
    if any(not t for t in tokens):
        raise ValueError(f"spec {text!r} has an empty token (two colons in a row or a trailing colon)")
    first = tokens[0].lower()
    if first in PRESETS:
        spec, tokens = AttentionSpec.preset(first), tokens[1:]
    elif first in ("cfg", "config"):
        if config_spec is None:
            raise ValueError(f"spec {text!r}: base 'cfg' needs the config's spec, none was given")
        spec, tokens = config_spec, tokens[1:]
    else:
        spec = AttentionSpec()
    changes: Dict[str, Any] = {}
    normalizers = _normalizers()
    i = 0
    while i < len(tokens):
        tok, low = tokens[i], tokens[i].lower()
        if "=" in tok:
            key, raw = (s.strip() for s in tok.split("=", 1))
            if key.lower() not in SPEC_KEYS:
                raise ValueError(f"spec {text!r}: unknown key {key!r}; valid keys: {', '.join(sorted(SPEC_KEYS))}")
            field = SPEC_KEYS[key.lower()]
            changes[field] = _value(field, raw, text)
        elif low in normalizers:
            changes["normalizer"] = low
            if i + 1 < len(tokens) and _is_number(tokens[i + 1]):
                if low not in _ALPHA_NORMALIZERS:
                    raise ValueError(
                        f"spec {text!r}: a number after {low!r} is not allowed (only after "
                        f"{' or '.join(_ALPHA_NORMALIZERS)}, as alpha); for a temperature write t={tokens[i + 1]}"
                    )
                changes["alpha"] = float(tokens[i + 1])
                i += 1
        elif _is_number(tok):
            raise ValueError(f"spec {text!r}: the number {tok!r} must follow entmax or random_matched (the alpha)")
        elif low in PRESETS or low in ("cfg", "config"):
            raise ValueError(f"spec {text!r}: the base {tok!r} must be the first token")
        else:
            try:
                changes["source"] = canonical_source(tok)
            except ValueError:
                raise ValueError(f"spec {text!r}: unknown token {tok!r}; {_syntax_help()}") from None
        i += 1
    try:
        return spec.replace(**changes)
    except (ValueError, TypeError) as e:
        raise ValueError(f"spec {text!r}: {e}") from e


def parse_attention_specs(texts: List[str], config_spec: Optional[AttentionSpec] = None) -> List[Tuple[str, AttentionSpec]]:
    """Parse several spec strings; returns ``[(text, spec)]`` in order.

    Raises:
        ValueError: a spec is invalid, or the same text appears twice.
    """
    if not texts:
        raise ValueError(f"no attention spec given; {_syntax_help()}")
    out, seen = [], set()
    for text in texts:
        if text in seen:
            raise ValueError(f"attention spec {text!r} given twice")
        seen.add(text)
        out.append((text, parse_attention_spec(text, config_spec)))
    return out


def describe_spec(spec: AttentionSpec) -> str:
    """A one-line human description, e.g. ``"qq, entmax a=1.2, last 1 block, no residual/FFN"``."""
    norm = spec.normalizer
    if norm in _ALPHA_NORMALIZERS:
        norm = f"{norm} \u03b1={spec.alpha:g}"
    parts = [spec.source, norm]
    if spec.temperature != 1.0:
        parts.append(f"T={spec.temperature:g}")
    parts.append(f"last {spec.num_layers} block" + ("s" if spec.num_layers > 1 else ""))
    dropped = [n for n, keep in (("residual", spec.residual), ("FFN", spec.ffn)) if not keep]
    if dropped:
        parts.append("no " + "/".join(dropped))
    if spec.prior != "none":
        parts.append(f"{spec.prior} prior \u03c3={spec.prior_std:g}")
    return ", ".join(parts)
