"""``AttentionSpec``: the validated, hashable description of a modified final attention, and
its one text grammar (:func:`parse_attention_spec`, used by the demo, the attention
visualiser and the sweep's error messages)."""
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..attention import (
    NORMALIZER_REGISTRY,
    SUM_MODES,
    canonical_source,
    check_alpha,
    get_normalizer,
    get_prior,
    paper_source_name,
    parse_source,
)

__all__ = ["AttentionSpec", "PRESETS", "SPEC_KEYS", "parse_attention_spec", "parse_attention_specs",
           "describe_spec"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AttentionSpec:
    """What the last block(s) of the vision tower compute.

    Fields:
        source: score source of the **last** block: ``qk``, ``qq``, ``kk``, ``vv``,
            ``identity`` (value path) or sums like ``qq+kk``; the paper's names
            (``qkv``, ``qqv``, ``kkv``, ``vvv``, ``v-only``) are accepted and stored canonically.
        normalizer: row normaliser of the last ``num_layers`` blocks: ``softmax``,
            ``entmax``, ``sparsemax`` or ``random_matched``.
        alpha: entmax alpha in [1, 2] (also the reference sparsity of ``random_matched``).
        temperature: scores are divided by it in the last ``num_layers`` blocks (> 0).
        num_layers: how many final blocks use ``normalizer``/``temperature`` (the paper's
            depth study varies where entmax applies); the source, prior and block switches
            act on the last block only, so in the earlier blocks the source stays ``qk`` and
            the block is full. With ``softmax`` at temperature 1 the earlier blocks are plain
            CLIP blocks and ``num_layers`` changes nothing (see :meth:`inert_settings`).
        residual, ffn: keep the last block's attention residual / FFN branch.
        prior: additive score prior of the last block, ``none`` or ``gaussian`` (NACLIP).
        prior_std: std of the gaussian prior, in patches.
        sum_mode: ``normalize_then_sum`` (SCLIP) or ``sum_then_normalize``, for sum sources.
        seed: seed of the ``random_matched`` generator (re-seeded at every forward).

    Instances are frozen and hashable; invalid values raise ``ValueError`` naming the value
    and the valid choices. ``num_layers`` is checked against the model depth by
    :meth:`check_depth` (the encoder calls it).
    """

    source: str = "qk"
    normalizer: str = "softmax"
    alpha: float = 1.2
    temperature: float = 1.0
    num_layers: int = 1
    residual: bool = True
    ffn: bool = True
    prior: str = "none"
    prior_std: float = 5.0
    sum_mode: str = "normalize_then_sum"
    seed: int = 0

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("source", canonical_source(self.source))
        if not isinstance(self.normalizer, str):
            raise ValueError(f"normalizer must be a string, got {self.normalizer!r}")
        set_("normalizer", self.normalizer.strip().lower())
        get_normalizer(self.normalizer)
        set_("alpha", check_alpha(self.alpha))
        set_("temperature", _number("temperature", self.temperature))
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature!r}")
        set_("num_layers", _integer("num_layers", self.num_layers))
        if self.num_layers < 1:
            raise ValueError(f"num_layers must be >= 1 (number of final blocks), got {self.num_layers!r}")
        set_("residual", _boolean("residual", self.residual))
        set_("ffn", _boolean("ffn", self.ffn))
        if not isinstance(self.prior, str):
            raise ValueError(f"prior must be a string, got {self.prior!r}")
        set_("prior", self.prior.strip().lower())
        get_prior(self.prior)
        set_("prior_std", _number("prior_std", self.prior_std))
        if not self.prior_std > 0:
            raise ValueError(f"prior_std must be > 0 patches, got {self.prior_std!r}")
        if self.sum_mode not in SUM_MODES:
            raise ValueError(f"unknown sum_mode {self.sum_mode!r}; valid: {', '.join(SUM_MODES)}")
        set_("seed", _integer("seed", self.seed))

    def check_depth(self, depth: int) -> None:
        """Raise ``ValueError`` unless ``1 <= num_layers <= depth``."""
        if not 1 <= self.num_layers <= int(depth):
            raise ValueError(f"num_layers={self.num_layers} is outside [1, {int(depth)}] for a tower of depth {depth}")

    def inert_settings(self) -> List[str]:
        """Settings of this spec that cannot change the result, one message each (empty when
        every setting matters).

        Checked: ``num_layers > 1`` with softmax at temperature 1 (the earlier blocks are plain
        CLIP blocks); a normaliser, temperature or prior on the ``identity`` source's last block
        (it outputs its values whatever the weights); a non-default ``sum_mode`` on a single
        source; a non-default ``prior_std`` without a prior; a non-default ``seed`` without
        ``random_matched``.
        """
        out = []
        if self.num_layers > 1 and self.normalizer == "softmax" and self.temperature == 1.0:
            out.append(f"num_layers={self.num_layers} changes nothing: the normaliser and temperature are what "
                       "extend to the earlier blocks, and softmax at temperature 1 there is plain CLIP (the source "
                       f"{self.source!r} applies to the last block only)")
        if self.source == "identity":
            if self.num_layers == 1 and (self.normalizer != "softmax" or self.temperature != 1.0):
                out.append(f"normalizer={self.normalizer!r}/temperature={self.temperature:g} changes nothing: the "
                           "identity source's block outputs its values whatever the normaliser (use layers>1 to "
                           "apply it to earlier blocks)")
            if self.prior != "none":
                out.append(f"prior={self.prior!r} changes nothing on the identity source")
        if self.sum_mode != "normalize_then_sum" and len(parse_source(self.source)) == 1:
            out.append(f"sum_mode={self.sum_mode!r} changes nothing: source {self.source!r} is not a sum")
        if self.prior == "none" and self.prior_std != 5.0:
            out.append(f"prior_std={self.prior_std:g} changes nothing without a prior (prior='none')")
        if self.seed != 0 and self.normalizer != "random_matched":
            out.append(f"seed={self.seed} changes nothing: only the random_matched normaliser is random")
        return out

    def warn_inert(self, where: str = "attention spec") -> List[str]:
        """Log a warning for each of :meth:`inert_settings`; returns them."""
        found = self.inert_settings()
        for msg in found:
            logger.warning("%s: %s", where, msg)
        return found

    @property
    def terms(self) -> Tuple[str, ...]:
        """The source's terms, e.g. ``("qq", "kk")``."""
        return parse_source(self.source)

    @property
    def rows_sum_to(self) -> int:
        """What the last block's attention rows sum to: the number of source terms with
        ``normalize_then_sum`` (SCLIP's convention), else 1."""
        return len(self.terms) if self.sum_mode == "normalize_then_sum" else 1

    @property
    def paper_source(self) -> str:
        """The paper's name of the source (``qkv``, ``qqv``, ``v-only``, ``qq+kk``, ...)."""
        return paper_source_name(self.source)

    @classmethod
    def parse(cls, text: str, config_spec: Optional["AttentionSpec"] = None) -> "AttentionSpec":
        """Shorthand of :func:`parse_attention_spec`."""
        return parse_attention_spec(text, config_spec)

    def replace(self, **changes: Any) -> "AttentionSpec":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "AttentionSpec":
        """A baseline's spec: ``clip``, ``sclip``, ``clearclip``, ``naclip``, ``maskclip``,
        ``maskclip_reduced`` (see :data:`PRESETS`).

        ``overrides`` change fields of the preset (e.g. ``normalizer="entmax"``).
        """
        key = str(name).strip().lower()
        if key not in PRESETS:
            raise ValueError(f"unknown attention preset {name!r}; valid: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[key], **overrides)

    @classmethod
    def from_config(cls, cfg, *, warn: bool = True) -> "AttentionSpec":
        """Read ``cfg.MODEL.SPARSECLIP.ATTENTION.*`` and ``cfg.MODEL.SPARSECLIP.BLOCK.*`` (duck-typed).

        Invalid values raise ``ValueError``; settings that change nothing
        (:meth:`inert_settings`) are logged as warnings unless ``warn`` is False.
        """
        try:
            a = cfg.MODEL.SPARSECLIP.ATTENTION
            b = cfg.MODEL.SPARSECLIP.BLOCK
            kwargs = dict(
                source=a.SOURCE, normalizer=a.NORMALIZER, alpha=a.ALPHA, temperature=a.TEMPERATURE,
                num_layers=a.NUM_LAYERS, prior=a.PRIOR, prior_std=a.PRIOR_STD, sum_mode=a.SUM_MODE,
                seed=a.SEED, residual=b.RESIDUAL, ffn=b.FFN,
            )
        except (AttributeError, KeyError) as e:
            raise ValueError(
                f"config lacks a MODEL.SPARSECLIP.ATTENTION/BLOCK key ({e}); call "
                "sparseclip_d2.add_sparseclip_config(cfg) before merging a config file") from e
        try:
            spec = cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"MODEL.SPARSECLIP.ATTENTION/BLOCK: {e}") from e
        if warn:
            spec.warn_inert("MODEL.SPARSECLIP.ATTENTION")
        return spec


def _number(name, value) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None


def _integer(name, value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"{name} must be an integer, got {value!r}")


def _boolean(name, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


#: Training-free baselines expressed as specs (README, "Baselines"; upstream files cited per preset).
#:
#: - ``maskclip``: MaskCLIP as published (chongzhou96/MaskCLIP ``mmseg/models/backbones/vit.py``,
#:   ``TransformerEncoderLayer.forward`` with ``return_qkv``): the last block's value path
#:   ``v = out_proj(v_proj(ln_1(x)))`` (identity attention), then the residual ``v + x``, then
#:   the FFN on ``ln_2`` of that with it as identity: residual and FFN kept.
#: - ``maskclip_reduced``: the value path alone, no residual, no FFN: what ClearCLIP calls
#:   "MaskCLIP" (mc-lan/ClearCLIP ``open_clip/transformer.py``, ``model_type='MaskCLIP'``
#:   with ``ignore_residual=True``).
PRESETS = {
    "clip": AttentionSpec(),
    "sclip": AttentionSpec(source="qq+kk", normalizer="softmax", residual=True, ffn=True),
    "clearclip": AttentionSpec(source="qq", normalizer="softmax", residual=False, ffn=False),
    "naclip": AttentionSpec(source="kk", normalizer="softmax", prior="gaussian", prior_std=5.0,
                            residual=False, ffn=False),
    "maskclip": AttentionSpec(source="identity", normalizer="softmax", residual=True, ffn=True),
    "maskclip_reduced": AttentionSpec(source="identity", normalizer="softmax", residual=False, ffn=False),
}


# ------------------------------------------------------------------------------ the grammar
#: ``key=value`` keys (and aliases) of the spec grammar -> AttentionSpec field.
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
            "sources: qk, qq, kk, vv, identity, sums like qq+kk (paper names qkv, qqv, kkv, vvv, v-only); "
            f"key=value with keys {', '.join(sorted(SPEC_KEYS))}")


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
    """Parse a spec string into a validated ``AttentionSpec``: the package's one spec grammar.

    Grammar: colon-separated tokens ``[BASE:]TOKEN[:TOKEN...]``, read left to right.

    - ``BASE`` (optional, first): a preset (``clip``, ``sclip``, ``clearclip``, ``naclip``,
      ``maskclip``; :data:`PRESETS`) or ``cfg`` (``config_spec``). Without a base the start is
      ``clip`` (QK scores, softmax, full block): ``entmax:1.2`` is QK with alpha-entmax 1.2.
    - a normaliser (``softmax``, ``entmax``, ``sparsemax``, ``random_matched``); ``entmax`` and
      ``random_matched`` take an optional number token after them, the alpha (``entmax:1.2``);
    - a score source (``qk``, ``qq``, ``kk``, ``vv``, ``identity``, sums like ``qq+kk``, or the
      paper's ``qkv``, ``qqv``, ``kkv``, ``vvv``, ``v-only``);
    - ``key=value`` for any field (:data:`SPEC_KEYS`): ``alpha``, ``temperature``/``t``,
      ``layers``/``num_layers``, ``residual``, ``ffn`` (true/false, 1/0, on/off), ``prior``,
      ``prior_std``/``std``, ``sum_mode``, ``seed``, ``source``, ``normalizer``.

    ``layers=N`` applies the normaliser and temperature to the last N blocks; the source,
    prior and residual/FFN switches act on the last block only (the paper's depth study).

    Examples: ``softmax``, ``entmax:1.2``, ``qq:entmax:1.2``, ``clearclip:entmax:1.5``,
    ``naclip``, ``qq+kk:sparsemax:layers=2``, ``softmax:t=0.5``, ``cfg:alpha=1.4``.

    Raises:
        ValueError: an unknown token, a misplaced number, a bad key or value, a field value
            ``AttentionSpec`` rejects, an ``alpha`` given to a normaliser that ignores it, or a
            setting that changes nothing (:meth:`AttentionSpec.inert_settings`, e.g.
            ``qq+kk:layers=2`` with softmax); the message quotes the spec and the valid choices.
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
        out = spec.replace(**changes)
    except (ValueError, TypeError) as e:
        raise ValueError(f"spec {text!r}: {e}") from e
    if "alpha" in changes and out.normalizer not in _ALPHA_NORMALIZERS:
        raise ValueError(f"spec {text!r}: alpha={changes['alpha']:g} changes nothing with normalizer "
                         f"{out.normalizer!r} (alpha is used by {' and '.join(_ALPHA_NORMALIZERS)})")
    inert = out.inert_settings()
    if inert:
        raise ValueError(f"spec {text!r}: " + "; ".join(inert))
    return out


def parse_attention_specs(texts: List[str], config_spec: Optional[AttentionSpec] = None
                          ) -> List[Tuple[str, AttentionSpec]]:
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
    """A one-line human description, e.g. ``"qq, entmax \u03b1=1.2, last 1 block, no residual/FFN"``."""
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
