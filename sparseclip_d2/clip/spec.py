"""``AttentionSpec``: the validated, hashable description of a modified final attention."""
import dataclasses
from dataclasses import dataclass
from typing import Any

from ..attention import SUM_MODES, canonical_source, get_normalizer, get_prior

__all__ = ["AttentionSpec", "PRESETS"]


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
        num_layers: how many final blocks use ``normalizer``/``temperature`` (the depth
            sweep); in the earlier of them the source stays ``qk`` and the block is full.
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
        set_("alpha", _number("alpha", self.alpha))
        if not 1.0 <= self.alpha <= 2.0:
            raise ValueError(f"alpha must be in [1, 2] (1 = softmax, 2 = sparsemax), got {self.alpha!r}")
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

    def replace(self, **changes: Any) -> "AttentionSpec":
        """A validated copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @property
    def is_unmodified(self) -> bool:
        """True when the spec computes exactly the original CLIP blocks."""
        return (self.source == "qk" and self.normalizer == "softmax" and self.temperature == 1.0
                and self.prior == "none" and self.residual and self.ffn)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "AttentionSpec":
        """A baseline's spec: ``clip``, ``sclip``, ``clearclip``, ``naclip``, ``maskclip``.

        ``overrides`` change fields of the preset (e.g. ``normalizer="entmax"``).
        """
        key = str(name).strip().lower()
        if key not in PRESETS:
            raise ValueError(f"unknown attention preset {name!r}; valid: {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[key], **overrides)

    @classmethod
    def from_config(cls, cfg) -> "AttentionSpec":
        """Read ``cfg.MODEL.SPARSECLIP.ATTENTION.*`` and ``cfg.MODEL.SPARSECLIP.BLOCK.*`` (duck-typed)."""
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
        return cls(**kwargs)


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


#: Training-free baselines expressed as specs (see docs: protocol section 2).
#: ``maskclip``: identity attention (value path) with the last block reduced to it
#: (no residual, no FFN), as the "v-path" last block of the protocol table.
PRESETS = {
    "clip": AttentionSpec(),
    "sclip": AttentionSpec(source="qq+kk", normalizer="softmax", residual=True, ffn=True),
    "clearclip": AttentionSpec(source="qq", normalizer="softmax", residual=False, ffn=False),
    "naclip": AttentionSpec(source="kk", normalizer="softmax", prior="gaussian", prior_std=5.0,
                            residual=False, ffn=False),
    "maskclip": AttentionSpec(source="identity", normalizer="softmax", residual=False, ffn=False),
}
