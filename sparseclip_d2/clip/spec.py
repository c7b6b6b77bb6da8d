"""``AttentionSpec``: the validated, hashable description of a modified final attention, and
its one text grammar (:func:`parse_attention_spec`, used by the demo, the attention
visualiser and the sweep's error messages).

A spec is a small core (the last block's score source, normaliser, temperature, depth, prior
and block switches) plus four nested option groups, each frozen, validated and hashable:

- ``spec.mix``: :class:`MixOptions`, attention of earlier blocks mixed into the last one
  (ITACLIP, ResCLIP's RCS);
- ``spec.parallel``: :class:`ParallelOptions`, a parallel path over the last blocks and its
  cosine scores (GEM, CLIP Surgery);
- ``spec.feedback``: :class:`FeedbackOptions`, a second run of the last block with the first
  segmentation's prior (ResCLIP's SFR);
- ``spec.calibration``: :class:`CalibrationOptions`, the calibrated last block (SC-CLIP, SFP);
- ``spec.procrustes``: :class:`ProcrustesOptions`, the options of the ``procrustes`` score source.

A group is truthy when it changes the block (``if spec.mix:``). Every setting also has one
flat name (:data:`SETTINGS`: ``mix_layers``, ``parallel_cls``, ``feedback_weight``, ...): the
grammar's keys (:data:`SPEC_KEYS`), the names in error messages, :meth:`AttentionSpec.settings`,
and what :meth:`AttentionSpec.replace` / :meth:`AttentionSpec.preset` /
:meth:`AttentionSpec.from_settings` accept. All presets are in one table, :data:`PRESETS`.
"""
import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..attention import (
    NORMALIZER_REGISTRY,
    PROCRUSTES_SOLVERS,
    QKV_NORMS,
    check_cosine_source,
    SUM_MODES,
    canonical_source,
    check_alpha,
    check_mix_scale,
    check_mix_weight,
    check_feedback_precision,
    get_normalizer,
    get_prior,
    paper_source_name,
    parse_source,
)
from ..attention.outliers import (check_cls_scale, check_contamination, check_count, check_neighbors,
                                  check_outlier_detector)
from ..attention.similarity import check_similarity_scale, check_similarity_threshold

__all__ = ["AttentionSpec", "MixOptions", "ParallelOptions", "FeedbackOptions", "CalibrationOptions",
           "ProcrustesOptions", "PRESETS",
           "SETTINGS", "SPEC_KEYS", "parse_attention_spec", "parse_attention_specs", "describe_spec",
           "SpecDepthError"]

logger = logging.getLogger(__name__)


class SpecDepthError(ValueError):
    """A spec setting out of range for a tower's depth; ``field`` names the setting by its flat
    name (``num_layers``, ``mix_layers`` = ``mix.layers``, ``parallel_layers`` = ``parallel.layers``)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


# ------------------------------------------------------------------------------ value checks
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


def _layers(name, value) -> Tuple[int, ...]:
    """A sorted tuple of distinct non-negative block indices from a list/tuple of integers."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise ValueError(f"{name} must be a list of 0-based block indices, got {value!r}")
    out = [_integer(name, v) for v in value]
    if any(i < 0 for i in out):
        raise ValueError(f"{name} must hold 0-based block indices >= 0, got {list(value)!r}")
    if len(set(out)) != len(out):
        raise ValueError(f"{name} names a block twice: {list(value)!r}")
    return tuple(sorted(out))


def _boolean(name, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def _setter(obj):
    """``set_(name, value)`` on a frozen dataclass (for normalising values in ``__post_init__``)."""
    return lambda k, v: object.__setattr__(obj, k, v)


def _changed(group, defaults) -> List[Tuple[str, Any]]:
    """``(flat name, value)`` of ``group``'s fields that differ from ``defaults`` (same class)."""
    return [(_FLAT[(group.GROUP, f.name)], getattr(group, f.name)) for f in dataclasses.fields(group)
            if getattr(group, f.name) != getattr(defaults, f.name)]


# ------------------------------------------------------------------------------ option groups
@dataclass(frozen=True)
class MixOptions:
    """Attention of earlier blocks mixed into the last block's weights (``spec.mix``).

    Fields (flat names ``mix_layers``, ``mix_source``, ``mix_normalizer``, ``mix_weight``,
    ``mix_scale``; config ``MODEL.SPARSECLIP.ATTENTION.MIX.*``):
        layers: 0-based indices of earlier blocks whose attention, computed from each
            block's own input in the same forward pass (no second pass), is mixed into the last
            block's weights: ``W = scale * ((1 - weight) * W_last + weight * mean_l W_l)``
            (:func:`~sparseclip_d2.attention.mix_attention`). Empty = no mixing.
            Each index must be below ``depth - 1``; upstream papers count layers from 1
            (ITACLIP's 7, 8, 10 are indices 6, 7, 9).
        source: score source of the tapped layers' attention (``qk`` = the block's own
            attention, ``qq+kk`` = ITACLIP's), summed with the spec's ``sum_mode``; no
            temperature or prior.
        normalizer: normaliser of the tapped layers' attention; ``""`` = the spec's
            ``normalizer`` (so one ``normalizer`` override reaches every softmax of the method;
            :attr:`AttentionSpec.tap_normalizer`).
        weight: share of the tapped layers' mean, in [0, 1] (ResCLIP's lambda).
        scale: factor on the blend, > 0 (ResCLIP's tau).

    Truthy when ``layers`` is not empty.
    """

    GROUP = "mix"

    layers: Tuple[int, ...] = ()
    source: str = "qk"
    normalizer: str = ""
    weight: float = 0.5
    scale: float = 1.0

    def __post_init__(self):
        set_ = _setter(self)
        set_("layers", _layers("mix_layers", self.layers))
        try:
            set_("source", canonical_source(self.source))
        except ValueError as e:
            raise ValueError(f"mix_source: {e}") from None
        if not isinstance(self.normalizer, str):
            raise ValueError(f"mix_normalizer must be a string, got {self.normalizer!r}; valid: '' (= normalizer), "
                             f"{', '.join(n for n, _ in NORMALIZER_REGISTRY)}")
        set_("normalizer", self.normalizer.strip().lower())
        if self.normalizer:
            try:
                get_normalizer(self.normalizer)
            except ValueError as e:
                raise ValueError(f"mix_normalizer: {e} (or '' = normalizer)") from None
        set_("weight", check_mix_weight(_number("mix_weight", self.weight)))
        set_("scale", check_mix_scale(_number("mix_scale", self.scale)))

    @property
    def active(self) -> bool:
        return bool(self.layers)

    __bool__ = active.fget

    def inert_settings(self) -> List[str]:
        """Settings of this group that cannot change the result."""
        if not self.layers:
            return [f"{name}={value!r} changes nothing without mix_layers" for name, value in
                    _changed(self, MixOptions())]
        if self.weight == 0.0:
            return [f"mix_layers={list(self.layers)} change nothing with mix_weight=0 (only mix_scale applies)"]
        return []


#: How the blocks before the modified ones compute their attention (``AttentionSpec.unmodified_blocks``).
UNMODIFIED_BLOCKS = ("sdpa", "explicit")

#: Where a parallel path's output prefix (CLS) tokens come from (``ParallelOptions.cls``).
PARALLEL_CLS = ("parallel", "main")


@dataclass(frozen=True)
class ParallelOptions:
    """A parallel path over the last blocks and its cosine scores (``spec.parallel``).

    Fields (flat names ``parallel_layers``, ``parallel_cls``, ``qkv_norm``, ``cosine_scale``,
    ``self_iterations``; config ``MODEL.SPARSECLIP.PARALLEL.*`` and
    ``MODEL.SPARSECLIP.ATTENTION.QKV_NORM`` / ``COSINE_SCALE`` / ``SELF_ITERATIONS``):
        layers: 0, or k: the last k blocks also run a **parallel path**
            (:mod:`sparseclip_d2.clip.parallel`, GEM / CLIP Surgery): a branch started from the
            main stream's input of the first of them reads, at each of the k blocks, that
            block's normed main-stream input, applies the spec's attention (source,
            normaliser, temperature, prior, ``qkv_norm``), keeps its residual if ``residual``
            and its FFN if ``ffn``; the main stream runs unchanged and the branch's tokens are
            the output. Needs ``num_layers`` 1, no ``mix_layers``, ``cls_weight`` 0.
        cls: where the output's prefix (CLS) tokens come from with a parallel path:
            ``parallel`` (the branch, GEM) or ``main`` (the unchanged stream, CLIP Surgery).
        qkv_norm: ``none`` (scaled dot products) or ``l2``: scores are cosine similarities of
            the L2-normalised projections times an inverse temperature (GEM;
            :func:`~sparseclip_d2.attention.cosine_attention_weights`); parallel path only.
        cosine_scale: the inverse temperature of ``l2`` scores: 0 = GEM's adaptive
            ``mean ||ln_1(x)|| * d**-0.5`` per image; > 0 a fixed value (GEM's ``ss_attn_temp``).
        self_iterations: GEM's self-self loop count (``ss_attn_iter``) for ``l2`` self terms.

    Truthy when ``layers`` > 0.
    """

    GROUP = "parallel"

    layers: int = 0
    cls: str = "parallel"
    qkv_norm: str = "none"
    cosine_scale: float = 0.0
    self_iterations: int = 0

    def __post_init__(self):
        set_ = _setter(self)
        set_("layers", _integer("parallel_layers", self.layers))
        if self.layers < 0:
            raise ValueError(f"parallel_layers (PARALLEL.LAYERS) must be >= 0 (0 = no parallel path, k = the last k "
                             f"blocks), got {self.layers!r}")
        if not isinstance(self.cls, str) or self.cls.strip().lower() not in PARALLEL_CLS:
            raise ValueError(f"unknown parallel_cls (PARALLEL.CLS) {self.cls!r}; valid: {', '.join(PARALLEL_CLS)}")
        set_("cls", self.cls.strip().lower())
        if not isinstance(self.qkv_norm, str) or self.qkv_norm.strip().lower() not in QKV_NORMS:
            raise ValueError(f"unknown qkv_norm (ATTENTION.QKV_NORM) {self.qkv_norm!r}; valid: {', '.join(QKV_NORMS)}")
        set_("qkv_norm", self.qkv_norm.strip().lower())
        set_("cosine_scale", _number("cosine_scale", self.cosine_scale))
        if not (math.isfinite(self.cosine_scale) and self.cosine_scale >= 0):
            raise ValueError(f"cosine_scale (ATTENTION.COSINE_SCALE) must be >= 0 (0 = GEM's adaptive inverse "
                             f"temperature, > 0 a fixed one), got {self.cosine_scale!r}")
        set_("self_iterations", _integer("self_iterations", self.self_iterations))
        if self.self_iterations < 0:
            raise ValueError(f"self_iterations (ATTENTION.SELF_ITERATIONS) must be an integer >= 0, got "
                             f"{self.self_iterations!r}")
        if self.qkv_norm == "l2" and not self.layers:
            raise ValueError("qkv_norm='l2' (cosine scores) is implemented on the parallel path only; set "
                             "parallel_layers > 0 (PARALLEL.LAYERS), or use qkv_norm='none'")

    @property
    def active(self) -> bool:
        return self.layers > 0

    __bool__ = active.fget

    def inert_settings(self) -> List[str]:
        """Settings of this group that cannot change the result (the plain-branch check needs
        the core: :meth:`AttentionSpec.inert_settings`)."""
        out = []
        if not self.layers and self.cls != "parallel":
            out.append(f"parallel_cls={self.cls!r} changes nothing without a parallel path (parallel_layers=0)")
        if self.qkv_norm != "l2":
            if self.cosine_scale != 0.0:
                out.append(f"cosine_scale={self.cosine_scale:g} changes nothing without qkv_norm='l2'")
            if self.self_iterations:
                out.append(f"self_iterations={self.self_iterations} changes nothing without qkv_norm='l2'")
        return out


@dataclass(frozen=True)
class FeedbackOptions:
    """A second run of the last block with the first segmentation's prior (``spec.feedback``).

    Fields (flat names ``feedback``, ``feedback_weight``, ``feedback_scale``,
    ``feedback_precision``; config ``MODEL.SPARSECLIP.FEEDBACK.ENABLED`` / ``WEIGHT`` / ``SCALE`` /
    ``PRECISION``):
        enabled: run the last block twice: the first pass's segmentation gives a prior ``P``
            (``attention.feedback.feedback_prior``, built by the caller, e.g. ``SparseCLIP``
            with ``MODEL.SPARSECLIP.FEEDBACK.*``) blended into the second pass's scores of every
            source term before temperature and prior: ``scale * ((1 - weight) * S + weight *
            P / max P)`` (ResCLIP's SFR). The blocks before the last run once.
        weight: share of the prior, in [0, 1] (ResCLIP's SFR lambda).
        scale: factor on the blend, > 0 (ResCLIP's SFR tau).
        precision: ``float32``, or ``float16`` (ResCLIP casts the prior to float16 even in
            float32 runs).

    Truthy when ``enabled``.
    """

    GROUP = "feedback"

    enabled: bool = False
    weight: float = 0.7
    scale: float = 2.2
    precision: str = "float32"

    def __post_init__(self):
        set_ = _setter(self)
        set_("enabled", _boolean("feedback", self.enabled))
        set_("weight", _number("feedback_weight", self.weight))
        if not 0.0 <= self.weight <= 1.0:
            raise ValueError(f"feedback_weight must be in [0, 1] (the prior's share), got {self.weight!r}")
        set_("scale", _number("feedback_scale", self.scale))
        if not 0.0 < self.scale < float("inf"):
            raise ValueError(f"feedback_scale must be a finite number > 0 (ResCLIP's SFR tau), got {self.scale!r}")
        set_("precision", check_feedback_precision(self.precision))

    @property
    def active(self) -> bool:
        return self.enabled

    __bool__ = active.fget

    def inert_settings(self) -> List[str]:
        """Settings of this group that cannot change the result."""
        if self.enabled:
            return []
        return [f"{name}={value!r} changes nothing without feedback" for name, value in
                _changed(self, FeedbackOptions())]


#: How the fusion branch attends: with the last block's weights (SC-CLIP) or the similarity term alone (SFP).
FUSION_ATTENTIONS = ("last", "similarity")


def _calibration_key(name: str) -> str:
    """The config key of a calibration field (MODEL.SPARSECLIP.CALIBRATION.*), named in the errors."""
    return "MODEL.SPARSECLIP.CALIBRATION." + name.upper()


def _tap_index(name: str, value) -> int:
    i = _integer(name, value)
    if i < -1:
        raise ValueError(f"{name} ({_calibration_key(name)}) must be -1 (off) or a 0-based tap index >= 0, got "
                         f"{value!r}")
    return i


@dataclass(frozen=True)
class CalibrationOptions:
    """The calibrated last block (``spec.calibration``; SC-CLIP, SFP;
    :mod:`sparseclip_d2.clip.calibrated`): outlier repair, similarity layers, fusion.

    Fields (flat names = field names; config ``MODEL.SPARSECLIP.CALIBRATION.<NAME>``):
        outlier_detector: ``none``, ``l2``, ``lof`` or ``som``: which of the last block's input
            patches are repaired; ``outlier_neighbors`` / ``outlier_contamination`` (lof),
            ``outlier_count`` (l2, som) and ``outlier_cls_scale`` (som) configure it.
        similarity_layer: -1 (off) or the tap whose patch similarity ``S`` aggregates the
            tokens and joins the source terms as ``(S - mean) * similarity_scale``;
            ``similarity_threshold`` is the aggregation's cosine threshold.
        post_similarity_layer: -1 (off) or the tap whose similarity aggregates the output.
        fusion_layers: taps summed into a fusion branch; ``fusion_attention`` ``last`` (the last
            block's weights, SC-CLIP) or ``similarity`` (the similarity term alone, SFP).
        threshold_similarity_term: the term reads ``S`` with entries below the threshold set to 0 (SFP).

    Truthy when any part is set (outlier detector, similarity, post-similarity or fusion layers).
    """

    GROUP = "calibration"

    outlier_detector: str = "none"
    outlier_neighbors: int = 30
    outlier_contamination: float = 0.05
    similarity_layer: int = -1
    similarity_scale: float = 3.0
    similarity_threshold: float = 0.4
    post_similarity_layer: int = -1
    fusion_layers: Tuple[int, ...] = ()
    outlier_count: int = 10
    outlier_cls_scale: float = 1.5
    fusion_attention: str = "last"
    threshold_similarity_term: bool = False

    def __post_init__(self):
        """Check and normalise the fields (errors name the field, its config key, the value and
        the valid choices)."""
        set_ = _setter(self)

        def named(name, fn):
            try:
                set_(name, fn(getattr(self, name)))
            except ValueError as e:
                raise ValueError(f"{e} ({_calibration_key(name)})") from None

        named("outlier_detector", check_outlier_detector)
        named("outlier_neighbors", check_neighbors)
        named("outlier_contamination", check_contamination)
        set_("similarity_layer", _tap_index("similarity_layer", self.similarity_layer))
        set_("post_similarity_layer", _tap_index("post_similarity_layer", self.post_similarity_layer))
        named("similarity_scale", check_similarity_scale)
        named("similarity_threshold", check_similarity_threshold)
        named("fusion_layers", lambda v: _layers("fusion_layers", v))
        named("outlier_count", check_count)
        named("outlier_cls_scale", check_cls_scale)
        fa = self.fusion_attention.strip().lower() if isinstance(self.fusion_attention, str) else self.fusion_attention
        if fa not in FUSION_ATTENTIONS:
            raise ValueError(f"unknown fusion_attention {self.fusion_attention!r} "
                             f"({_calibration_key('fusion_attention')}); valid: {', '.join(FUSION_ATTENTIONS)}")
        set_("fusion_attention", fa)
        named("threshold_similarity_term", lambda v: _boolean("threshold_similarity_term", v))
        if fa == "similarity" and self.fusion_layers and self.similarity_layer < 0:
            raise ValueError("fusion_attention 'similarity' (MODEL.SPARSECLIP.CALIBRATION.FUSION_ATTENTION) attends "
                             "the fusion branch with the similarity term, which needs similarity_layer >= 0; valid: "
                             "fusion_attention 'last', or set SIMILARITY_LAYER")

    @property
    def active(self) -> bool:
        return (self.outlier_detector != "none" or self.similarity_layer >= 0 or self.post_similarity_layer >= 0
                or bool(self.fusion_layers))

    __bool__ = active.fget

    def inert_settings(self) -> List[str]:
        """Settings of this group that cannot change the result."""
        out = []
        d = CalibrationOptions()
        reads = {"outlier_neighbors": ("lof",), "outlier_contamination": ("lof",), "outlier_count": ("l2", "som"),
                 "outlier_cls_scale": ("som",)}
        for name, detectors in reads.items():
            if self.outlier_detector not in detectors and getattr(self, name) != getattr(d, name):
                out.append(f"{name}={getattr(self, name)!r} changes nothing without outlier_detector "
                           f"{' or '.join(detectors)}")
        if not self.fusion_layers and self.fusion_attention != d.fusion_attention:
            out.append(f"fusion_attention={self.fusion_attention!r} changes nothing without fusion_layers")
        if self.similarity_layer < 0 and self.similarity_scale != d.similarity_scale:
            out.append(f"similarity_scale={self.similarity_scale:g} changes nothing without similarity_layer")
        if self.similarity_layer < 0 and self.threshold_similarity_term:
            out.append("threshold_similarity_term=True changes nothing without similarity_layer")
        if (self.similarity_layer < 0 and self.post_similarity_layer < 0
                and self.similarity_threshold != d.similarity_threshold):
            out.append(f"similarity_threshold={self.similarity_threshold:g} changes nothing without similarity_layer "
                       "or post_similarity_layer")
        return out

    def describe(self) -> List[str]:
        """The :func:`describe_spec` parts of this group."""
        parts = []
        if self.outlier_detector == "lof":
            parts.append(f"lof outlier repair (k={self.outlier_neighbors}, contamination "
                         f"{self.outlier_contamination:g})")
        elif self.outlier_detector != "none":
            scale = f", CLS x {self.outlier_cls_scale:g}" if self.outlier_detector == "som" else ""
            parts.append(f"{self.outlier_detector} outlier repair (top {self.outlier_count}{scale})")
        if self.similarity_layer >= 0:
            term = "S thresholded" if self.threshold_similarity_term else "S"
            parts.append(f"tap {self.similarity_layer} similarity as a term (({term} - mean) x "
                         f"{self.similarity_scale:g}) and aggregator (S >= {self.similarity_threshold:g})")
        if self.post_similarity_layer >= 0:
            parts.append(f"post-aggregation by tap {self.post_similarity_layer} similarity")
        if self.fusion_layers:
            how = " attended by the similarity term" if self.fusion_attention == "similarity" else ""
            parts.append(f"fusion of taps {','.join(str(i) for i in self.fusion_layers)}{how}")
        return parts


_PROCRUSTES_KEY = "MODEL.SPARSECLIP.ATTENTION.PROCRUSTES."


@dataclass(frozen=True)
class ProcrustesOptions:
    """Options of the ``procrustes`` score source (``spec.procrustes``; ``attention/procrustes.py``):
    the keys rotated onto the queries by the orthogonal polar factor of ``k_c^T q_c``.

    Fields (flat names ``procrustes_kk_weight``, ``procrustes_solver``, ``procrustes_iterations``;
    config ``MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.KK_WEIGHT`` / ``SOLVER`` / ``ITERATIONS``):
        kk_weight: weight of the centred key term ``k_c k_c^T d**-0.5`` added to the scores
            (0 = none).
        solver: ``newton_schulz`` (coupled Newton-Schulz steps) or ``svd``.
        iterations: Newton-Schulz steps, >= 1 (``svd`` ignores it).

    The CLS (prefix) tokens get weight 0 in the weighted means: the encoder passes its tower's
    prefix-token count (:meth:`AttentionSpec.source_options`). Read only where a source term is
    ``procrustes``; never truthy (the group changes nothing by itself).
    """

    GROUP = "procrustes"

    kk_weight: float = 0.0
    solver: str = "newton_schulz"
    iterations: int = 5

    def __post_init__(self):
        set_ = _setter(self)
        kk = _number(f"procrustes_kk_weight ({_PROCRUSTES_KEY}KK_WEIGHT)", self.kk_weight)
        if not math.isfinite(kk):
            raise ValueError(f"procrustes_kk_weight ({_PROCRUSTES_KEY}KK_WEIGHT) must be a finite number, got "
                             f"{self.kk_weight!r}")
        set_("kk_weight", kk)
        solver = self.solver.strip().lower() if isinstance(self.solver, str) else self.solver
        if solver not in PROCRUSTES_SOLVERS:
            raise ValueError(f"unknown procrustes_solver ({_PROCRUSTES_KEY}SOLVER) {self.solver!r}; valid: "
                             f"{', '.join(PROCRUSTES_SOLVERS)}")
        set_("solver", solver)
        it = _integer(f"procrustes_iterations ({_PROCRUSTES_KEY}ITERATIONS)", self.iterations)
        if it < 1:
            raise ValueError(f"procrustes_iterations ({_PROCRUSTES_KEY}ITERATIONS) must be an integer >= 1, got "
                             f"{self.iterations!r}")
        set_("iterations", it)

    def __bool__(self) -> bool:
        return False

    def options(self, prefix_tokens: int) -> Dict[str, Any]:
        """The ``procrustes`` source's keyword options (``attention_weights(source_options=...)``)."""
        return {"kk_weight": self.kk_weight, "solver": self.solver, "iterations": self.iterations,
                "prefix_tokens": int(prefix_tokens)}

    def inert_settings(self, used: bool) -> List[str]:
        """Settings that cannot change the result; ``used``: a source term (or a tapped layer's) is
        ``procrustes``."""
        if not used:
            return [f"{name}={value!r} changes nothing without the procrustes source" for name, value in
                    _changed(self, ProcrustesOptions())]
        if self.solver == "svd" and self.iterations != ProcrustesOptions.iterations:
            return [f"procrustes_iterations={self.iterations} changes nothing with procrustes_solver 'svd'"]
        return []

    def describe(self) -> str:
        steps = "SVD" if self.solver == "svd" else f"{self.iterations} Newton-Schulz steps"
        kk = f" + {self.kk_weight:g} x centred kk" if self.kk_weight else ""
        return f"keys Procrustes-aligned to the queries ({steps}){kk}"


#: The option groups: ``AttentionSpec`` field name -> class.
GROUPS = {"mix": MixOptions, "parallel": ParallelOptions, "feedback": FeedbackOptions,
          "calibration": CalibrationOptions, "procrustes": ProcrustesOptions}

#: Every setting of a spec by its flat name (grammar key, error-message and config-derived
#: name) -> ``(group, field, kind)``: ``group`` None for the core; ``kind`` is how the grammar
#: reads a ``key=value`` (``str``, ``int``, ``float``, ``bool``, ``layers`` = comma-separated
#: block indices). In the order of the former flat fields.
SETTINGS: Dict[str, Tuple[Optional[str], str, str]] = {
    "source": (None, "source", "str"),
    "normalizer": (None, "normalizer", "str"),
    "alpha": (None, "alpha", "float"),
    "temperature": (None, "temperature", "float"),
    "num_layers": (None, "num_layers", "int"),
    "residual": (None, "residual", "bool"),
    "ffn": (None, "ffn", "bool"),
    "prior": (None, "prior", "str"),
    "prior_std": (None, "prior_std", "float"),
    "sum_mode": (None, "sum_mode", "str"),
    "seed": (None, "seed", "int"),
    "mix_layers": ("mix", "layers", "layers"),
    "mix_source": ("mix", "source", "str"),
    "mix_normalizer": ("mix", "normalizer", "str"),
    "mix_weight": ("mix", "weight", "float"),
    "mix_scale": ("mix", "scale", "float"),
    "cls_weight": (None, "cls_weight", "float"),
    "unmodified_blocks": (None, "unmodified_blocks", "str"),
    "parallel_layers": ("parallel", "layers", "int"),
    "parallel_cls": ("parallel", "cls", "str"),
    "qkv_norm": ("parallel", "qkv_norm", "str"),
    "cosine_scale": ("parallel", "cosine_scale", "float"),
    "self_iterations": ("parallel", "self_iterations", "int"),
    "feedback": ("feedback", "enabled", "bool"),
    "feedback_weight": ("feedback", "weight", "float"),
    "feedback_scale": ("feedback", "scale", "float"),
    "feedback_precision": ("feedback", "precision", "str"),
    "outlier_detector": ("calibration", "outlier_detector", "str"),
    "outlier_neighbors": ("calibration", "outlier_neighbors", "int"),
    "outlier_contamination": ("calibration", "outlier_contamination", "float"),
    "similarity_layer": ("calibration", "similarity_layer", "int"),
    "similarity_scale": ("calibration", "similarity_scale", "float"),
    "similarity_threshold": ("calibration", "similarity_threshold", "float"),
    "post_similarity_layer": ("calibration", "post_similarity_layer", "int"),
    "fusion_layers": ("calibration", "fusion_layers", "layers"),
    "outlier_count": ("calibration", "outlier_count", "int"),
    "outlier_cls_scale": ("calibration", "outlier_cls_scale", "float"),
    "fusion_attention": ("calibration", "fusion_attention", "str"),
    "threshold_similarity_term": ("calibration", "threshold_similarity_term", "bool"),
    "procrustes_kk_weight": ("procrustes", "kk_weight", "float"),
    "procrustes_solver": ("procrustes", "solver", "str"),
    "procrustes_iterations": ("procrustes", "iterations", "int"),
}
#: ``(group, field)`` -> flat name.
_FLAT = {(group, field): name for name, (group, field, _) in SETTINGS.items()}
#: Error messages of the calibration fields start with the field name (or "unknown <field>").
_CALIBRATION_PREFIXES = tuple(f.name for f in dataclasses.fields(CalibrationOptions)) + (
    "unknown outlier_detector", "the calibrated", "unknown fusion_attention")


# ------------------------------------------------------------------------------ the spec
@dataclass(frozen=True)
class AttentionSpec:
    """What the last block(s) of the vision tower compute: a core plus option groups.

    Core fields:
        source: score source of the **last** block: ``qk``, ``qq``, ``kk``, ``vv``,
            ``identity`` (value path), ``procrustes`` (keys Procrustes-aligned to the queries,
            options in ``procrustes``) or sums like ``qq+kk``; the paper's names
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
        cls_weight: CLS-token residual weight: ``cls_weight`` times the last block's input
            CLS token is added to every output token of the last block (SC-CLIP's ``res_cls``,
            0.3); 0 disables. Needs a tower with a CLS token.
        unmodified_blocks: how the blocks before the modified ones compute their attention:
            ``sdpa`` (default) as ``nn.MultiheadAttention`` does outside its fused fast path
            (packed in-projection, ``F.scaled_dot_product_attention``, out-projection: the
            sequence-first OpenAI CLIP blocks that SCLIP, NACLIP, ClearCLIP and others run), or
            ``explicit``: ``softmax((q d^-1/2) k^T)``, then the product with ``v``, one product
            after the other (ResCLIP's ``custom_attn`` for its blocks before the last,
            yvhangyang/ResCLIP ``clip/model.py``). The two differ only in float rounding, which
            matters where a later stage takes a discrete decision (ResCLIP's first segmentation).
            Not with a parallel path or the calibrated last block, which run their own blocks.

    Option groups (each frozen and validated; see its class):
        mix: :class:`MixOptions` (attention of earlier blocks mixed into the last one).
        parallel: :class:`ParallelOptions` (a parallel path and its cosine scores).
        feedback: :class:`FeedbackOptions` (a second run with the first segmentation's prior).
        calibration: :class:`CalibrationOptions` (the calibrated last block).
        procrustes: :class:`ProcrustesOptions` (options of the ``procrustes`` source).

    Instances are frozen and hashable; invalid values raise ``ValueError`` naming the value
    and the valid choices. ``num_layers`` is checked against the model depth by
    :meth:`check_depth` (the encoder calls it). Build one from flat setting names with
    :meth:`from_settings`, change one with :meth:`replace`.
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
    cls_weight: float = 0.0
    unmodified_blocks: str = "sdpa"
    mix: MixOptions = MixOptions()
    parallel: ParallelOptions = ParallelOptions()
    feedback: FeedbackOptions = FeedbackOptions()
    calibration: CalibrationOptions = CalibrationOptions()
    procrustes: ProcrustesOptions = ProcrustesOptions()

    def __post_init__(self):
        self._check_core()
        for name, cls in GROUPS.items():
            if not isinstance(getattr(self, name), cls):
                raise TypeError(f"AttentionSpec.{name} must be a {cls.__name__}, got {getattr(self, name)!r}")
        self._check_combinations()

    def _check_core(self) -> None:
        set_ = _setter(self)
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
        set_("cls_weight", _number("cls_weight", self.cls_weight))
        if not math.isfinite(self.cls_weight):
            raise ValueError(f"cls_weight must be a finite number, got {self.cls_weight!r}")
        if self.unmodified_blocks not in UNMODIFIED_BLOCKS:
            raise ValueError(f"unknown unmodified_blocks {self.unmodified_blocks!r}; valid: "
                             f"{', '.join(UNMODIFIED_BLOCKS)}")

    def _check_combinations(self) -> None:
        """The checks that read the core and a group, or two groups."""
        par, mix, cal = self.parallel, self.mix, self.calibration
        if par.qkv_norm == "l2":
            check_cosine_source(self.source, par.self_iterations)
        if par.layers:
            if self.num_layers != 1:
                raise ValueError(f"num_layers={self.num_layers} with parallel_layers={par.layers}: the main stream of "
                                 "a parallel path runs unchanged; use num_layers 1 (the parallel blocks all use the "
                                 "spec's normaliser)")
            if mix.layers:
                raise ValueError(f"mix_layers {list(mix.layers)} cannot be combined with a parallel path "
                                 f"(parallel_layers={par.layers}); use one or the other")
            if self.cls_weight:
                raise ValueError(f"cls_weight={self.cls_weight:g} cannot be combined with a parallel path "
                                 f"(parallel_layers={par.layers}); use cls_weight 0")
        if self.unmodified_blocks != "sdpa" and (par.layers or cal.active):
            raise ValueError(f"unmodified_blocks={self.unmodified_blocks!r} applies to the standard forward only; "
                             "a parallel path (parallel_layers) or the calibrated last block (MODEL.SPARSECLIP."
                             "CALIBRATION) runs its own blocks: use unmodified_blocks 'sdpa'")
        if self.feedback.enabled and par.layers:
            raise ValueError(f"feedback (ResCLIP's SFR: a second run of the last block) cannot be combined with a "
                             f"parallel path (parallel_layers={par.layers}); use one or the other")
        if not cal.active:
            return
        clash = [f"{name}={value!r}" for name, value, off in (
            ("num_layers", self.num_layers, 1), ("mix_layers", mix.layers, ()),
            ("parallel_layers", par.layers, 0), ("feedback", self.feedback.enabled, False)) if value != off]
        if clash:
            raise ValueError(f"the calibrated last block (outlier_detector / similarity_layer / post_similarity_layer "
                             f"/ fusion_layers, MODEL.SPARSECLIP.CALIBRATION) cannot be combined with "
                             f"{', '.join(clash)}; valid: num_layers 1, no mix_layers, parallel_layers 0, feedback "
                             "False")
        if cal.similarity_layer >= 0 and self.sum_mode == "sum_then_normalize":
            raise ValueError("similarity_layer (MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_LAYER) joins the source terms "
                             "as a normalised term; sum_mode 'sum_then_normalize' is not supported with it; valid: "
                             "normalize_then_mean (SC-CLIP, SFP), normalize_then_sum")

    @property
    def tap_normalizer(self) -> str:
        """The normaliser of the tapped layers' attention (``mix.normalizer`` or ``normalizer``)."""
        return self.mix.normalizer or self.normalizer

    def check_depth(self, depth: int) -> None:
        """Raise :class:`SpecDepthError` (a ``ValueError`` naming the setting in ``.field``)
        unless ``1 <= num_layers <= depth``, every ``mix.layers`` index is an earlier block
        (``< depth - 1``) and ``parallel.layers <= depth``."""
        if not 1 <= self.num_layers <= int(depth):
            raise SpecDepthError("num_layers", f"num_layers={self.num_layers} is outside [1, {int(depth)}] for a "
                                 f"tower of depth {depth}")
        bad = [i for i in self.mix.layers if i >= int(depth) - 1]
        if bad:
            raise SpecDepthError("mix_layers", f"mix_layers {list(self.mix.layers)}: {bad} not earlier blocks of a "
                                 f"tower of depth {depth}; valid: 0-based indices 0..{int(depth) - 2}")
        if self.parallel.layers > int(depth):
            raise SpecDepthError("parallel_layers", f"parallel_layers={self.parallel.layers} is outside [0, "
                                 f"{int(depth)}] for a tower of depth {depth}")

    def inert_settings(self) -> List[str]:
        """Settings of this spec that cannot change the result, one message each (empty when
        every setting matters).

        Checked: ``num_layers > 1`` with softmax at temperature 1 (the earlier blocks are plain
        CLIP blocks); a normaliser, temperature or prior on the ``identity`` source's last block
        (it outputs its values whatever the weights); a non-default ``sum_mode`` on a single
        source; a non-default ``prior_std`` without a prior; a non-default ``seed`` without
        ``random_matched``; then each group's settings that its switch leaves unused
        (``inert_settings`` of the group).
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
        # a similarity term makes the calibrated block's source a sum
        if (self.sum_mode != "normalize_then_sum" and len(parse_source(self.source)) == 1
                and self.calibration.similarity_layer < 0):
            out.append(f"sum_mode={self.sum_mode!r} changes nothing: source {self.source!r} is not a sum")
        if self.prior == "none" and self.prior_std != 5.0:
            out.append(f"prior_std={self.prior_std:g} changes nothing without a prior (prior='none')")
        if self.seed != 0 and "random_matched" not in (self.normalizer, self.tap_normalizer if self.mix.layers else ""):
            out.append(f"seed={self.seed} changes nothing: only the random_matched normaliser is random")
        out.extend(self.mix.inert_settings())
        if (self.parallel.layers and self.source == "qk" and self.normalizer == "softmax" and self.temperature == 1.0
                and self.prior == "none" and self.parallel.qkv_norm == "none" and self.residual and self.ffn):
            out.append(f"parallel_layers={self.parallel.layers} changes nothing: a branch with the plain block (qk, "
                       "softmax, residual and FFN) is the main stream itself")
        out.extend(self.parallel.inert_settings())
        out.extend(self.feedback.inert_settings())
        if self.feedback.enabled and self.source == "identity":
            out.append("feedback changes nothing on the identity source (its block outputs its values)")
        out.extend(self.calibration.inert_settings())
        out.extend(self.procrustes.inert_settings(self.uses_procrustes))
        return out

    @property
    def uses_procrustes(self) -> bool:
        """Whether a source term of the last block or of the tapped layers is ``procrustes``."""
        return "procrustes" in self.terms or (bool(self.mix.layers) and "procrustes" in parse_source(self.mix.source))

    def source_options(self, prefix_tokens: int) -> Dict[str, Dict[str, Any]]:
        """``attention_weights(source_options=...)`` of this spec: the ``procrustes`` term's options
        with ``prefix_tokens`` leading tokens (the CLS token) weighted 0 (empty when no term uses it)."""
        return {"procrustes": self.procrustes.options(prefix_tokens)} if self.uses_procrustes else {}

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
    def rows_sum_to(self) -> float:
        """What the last block's attention rows sum to: the number of source terms with
        ``normalize_then_sum`` (SCLIP's convention), else 1; with ``mix.layers``,
        ``mix.scale * ((1 - mix.weight) * that + mix.weight * the same for mix.source)``."""
        n = len(self.terms) if self.sum_mode == "normalize_then_sum" else 1
        if self.calibration.similarity_layer >= 0 and self.sum_mode == "normalize_then_sum":
            n += 1  # the calibrated block's similarity term (clip/calibrated.py)
        if not self.mix.layers:
            return n
        m = len(parse_source(self.mix.source)) if self.sum_mode == "normalize_then_sum" else 1
        return self.mix.scale * ((1.0 - self.mix.weight) * n + self.mix.weight * m)

    @property
    def paper_source(self) -> str:
        """The paper's name of the source (``qkv``, ``qqv``, ``v-only``, ``qq+kk``, ...)."""
        return paper_source_name(self.source)

    def settings(self) -> Dict[str, Any]:
        """Every setting by its flat name (:data:`SETTINGS`, e.g. ``{"mix_layers": (6, 7, 9), ...}``)."""
        return {name: getattr(self if group is None else getattr(self, group), field)
                for name, (group, field, _) in SETTINGS.items()}

    @classmethod
    def parse(cls, text: str, config_spec: Optional["AttentionSpec"] = None) -> "AttentionSpec":
        """Shorthand of :func:`parse_attention_spec`."""
        return parse_attention_spec(text, config_spec)

    def replace(self, **changes: Any) -> "AttentionSpec":
        """A validated copy with some settings changed: core fields, whole groups
        (``mix=MixOptions(...)``) and any flat setting name of :data:`SETTINGS`
        (``mix_layers=(6, 7, 9)``, ``feedback=True``, ``parallel_cls="main"``; applied on top
        of a group given in the same call).

        Raises:
            TypeError: an unknown name.
        """
        core: Dict[str, Any] = {}
        nested: Dict[str, Dict[str, Any]] = {name: {} for name in GROUPS}
        for name, value in changes.items():
            if name in GROUPS and isinstance(value, GROUPS[name]):  # a whole group (feedback=True is the flag)
                core[name] = value
            elif name in SETTINGS:
                group, field, _ = SETTINGS[name]
                if group is None:
                    core[name] = value
                else:
                    nested[group][field] = value
            elif name in GROUPS:
                core[name] = value  # not a group instance: __post_init__ names the class it needs
            else:
                raise TypeError(f"unknown AttentionSpec setting {name!r}; valid: {', '.join(GROUPS)}, "
                                f"{', '.join(SETTINGS)}")
        for group, fields in nested.items():
            if fields:
                base = core.get(group, getattr(self, group))
                if not isinstance(base, GROUPS[group]):
                    raise TypeError(f"AttentionSpec.{group} must be a {GROUPS[group].__name__}, got {base!r}")
                core[group] = dataclasses.replace(base, **fields)
        return dataclasses.replace(self, **core)

    @classmethod
    def from_settings(cls, **settings: Any) -> "AttentionSpec":
        """A spec from the defaults with ``settings`` (as :meth:`replace` takes them)."""
        return cls().replace(**settings)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "AttentionSpec":
        """A baseline's spec from :data:`PRESETS` (``clip``, ``sclip``, ``clearclip``, ``naclip``,
        ``maskclip``, ``itaclip``, ``resclip``, ``gem``, ``scclip``, ...).

        ``overrides`` change settings of the preset as :meth:`replace` takes them (e.g.
        ``normalizer="entmax"``, ``mix_layers=(0, 1)``).
        """
        key = str(name).strip().lower()
        if key not in PRESETS:
            raise ValueError(f"unknown attention preset {name!r}; valid: {', '.join(PRESETS)}")
        return PRESETS[key].replace(**overrides)

    @classmethod
    def from_config(cls, cfg, *, warn: bool = True) -> "AttentionSpec":
        """Read ``cfg.MODEL.SPARSECLIP.ATTENTION.*`` (with ``MIX.*``), ``BLOCK.*``, ``PARALLEL.*``,
        ``FEEDBACK.*`` and ``CALIBRATION.*`` (duck-typed).

        Invalid values raise ``ValueError``; settings that change nothing
        (:meth:`inert_settings`) are logged as warnings unless ``warn`` is False.
        """
        try:
            settings = _config_settings(cfg.MODEL.SPARSECLIP)
        except (AttributeError, KeyError) as e:
            raise ValueError(
                f"config lacks a MODEL.SPARSECLIP.ATTENTION/BLOCK/PARALLEL/FEEDBACK key ({e}); call "
                "sparseclip_d2.add_sparseclip_config(cfg) before merging a config file") from e
        try:
            spec = cls.from_settings(**settings)
        except ValueError as e:
            where = ("MODEL.SPARSECLIP.FEEDBACK" if str(e).startswith(("feedback", "unknown feedback"))
                     else "MODEL.SPARSECLIP.ATTENTION/BLOCK")
            if str(e).startswith(_CALIBRATION_PREFIXES):
                where = "MODEL.SPARSECLIP.CALIBRATION"
            raise ValueError(f"{where}: {e}") from e
        if warn:
            spec.warn_inert("MODEL.SPARSECLIP.ATTENTION")
        return spec


def _config_settings(s) -> Dict[str, Any]:
    """The flat settings read from ``cfg.MODEL.SPARSECLIP`` (``s``); config keys per setting."""
    a, b, p, fb, cal = s.ATTENTION, s.BLOCK, s.PARALLEL, s.FEEDBACK, s.CALIBRATION
    return dict(
        source=a.SOURCE, normalizer=a.NORMALIZER, alpha=a.ALPHA, temperature=a.TEMPERATURE,
        num_layers=a.NUM_LAYERS, prior=a.PRIOR, prior_std=a.PRIOR_STD, sum_mode=a.SUM_MODE,
        seed=a.SEED, residual=b.RESIDUAL, ffn=b.FFN, cls_weight=b.CLS_WEIGHT, unmodified_blocks=a.UNMODIFIED_BLOCKS,
        mix_layers=a.MIX.LAYERS, mix_source=a.MIX.SOURCE, mix_normalizer=a.MIX.NORMALIZER,
        mix_weight=a.MIX.WEIGHT, mix_scale=a.MIX.SCALE,
        parallel_layers=p.LAYERS, parallel_cls=p.CLS, qkv_norm=a.QKV_NORM,
        cosine_scale=a.COSINE_SCALE, self_iterations=a.SELF_ITERATIONS,
        feedback=fb.ENABLED, feedback_weight=fb.WEIGHT, feedback_scale=fb.SCALE, feedback_precision=fb.PRECISION,
        outlier_detector=cal.OUTLIER_DETECTOR, outlier_neighbors=cal.OUTLIER_NEIGHBORS,
        outlier_contamination=cal.OUTLIER_CONTAMINATION, similarity_layer=cal.SIMILARITY_LAYER,
        similarity_scale=cal.SIMILARITY_SCALE, similarity_threshold=cal.SIMILARITY_THRESHOLD,
        post_similarity_layer=cal.POST_SIMILARITY_LAYER, fusion_layers=cal.FUSION_LAYERS,
        outlier_count=cal.OUTLIER_COUNT, outlier_cls_scale=cal.OUTLIER_CLS_SCALE,
        fusion_attention=cal.FUSION_ATTENTION, threshold_similarity_term=cal.THRESHOLD_SIMILARITY_TERM,
        procrustes_kk_weight=a.PROCRUSTES.KK_WEIGHT, procrustes_solver=a.PROCRUSTES.SOLVER,
        procrustes_iterations=a.PROCRUSTES.ITERATIONS,
    )


def describe_spec(spec: AttentionSpec) -> str:
    """A one-line human description, e.g. ``"qq, entmax \u03b1=1.2, last 1 block, no residual/FFN"``."""
    norm = spec.normalizer
    if norm in _ALPHA_NORMALIZERS:
        norm = f"{norm} \u03b1={spec.alpha:g}"
    parts = [spec.source, norm]
    if spec.temperature != 1.0:
        parts.append(f"T={spec.temperature:g}")
    mix, par, fb = spec.mix, spec.parallel, spec.feedback
    if not par.layers:  # a parallel path names its blocks below
        parts.append(f"last {spec.num_layers} block" + ("s" if spec.num_layers > 1 else ""))
    dropped = [n for n, keep in (("residual", spec.residual), ("FFN", spec.ffn)) if not keep]
    if dropped:
        parts.append("no " + "/".join(dropped))
    if spec.prior != "none":
        parts.append(f"{spec.prior} prior \u03c3={spec.prior_std:g}")
    if mix.layers:
        parts.append(f"mixed with {mix.source} ({spec.tap_normalizer}) of blocks "
                     f"{','.join(str(i) for i in mix.layers)}: {mix.scale:g} x ((1 - {mix.weight:g}) "
                     f"last + {mix.weight:g} mean)")
    if spec.cls_weight:
        parts.append(f"+ {spec.cls_weight:g} x CLS")
    if par.qkv_norm == "l2":
        scale = "adaptive" if par.cosine_scale == 0 else f"{par.cosine_scale:g}"
        parts.append(f"cosine scores (inverse temperature {scale}, self iterations {par.self_iterations})")
    if par.layers:
        parts.append(f"parallel path over the last {par.layers} blocks, CLS from the {par.cls} path")
    if fb.enabled:
        parts.append(f"second pass with the first segmentation's prior P ({fb.precision}): "
                     f"{fb.scale:g} x ((1 - {fb.weight:g}) S + {fb.weight:g} P)")
    parts.extend(spec.calibration.describe())
    if spec.uses_procrustes:
        parts.append(spec.procrustes.describe())
    return ", ".join(parts)


# ------------------------------------------------------------------------------ the presets
#: Training-free baselines expressed as specs (README, "Baselines"; upstream files cited per preset).
#:
#: - ``maskclip``: MaskCLIP as published (chongzhou96/MaskCLIP ``mmseg/models/backbones/vit.py``,
#:   ``TransformerEncoderLayer.forward`` with ``return_qkv``): the last block's value path
#:   ``v = out_proj(v_proj(ln_1(x)))`` (identity attention), then the residual ``v + x``, then
#:   the FFN on ``ln_2`` of that with it as identity: residual and FFN kept.
#: - ``maskclip_reduced``: the value path alone, no residual, no FFN: what ClearCLIP calls
#:   "MaskCLIP" (mc-lan/ClearCLIP ``open_clip/transformer.py``, ``model_type='MaskCLIP'``
#:   with ``ignore_residual=True``).
#: - ``itaclip``: ITACLIP's last block (m-arda-aydn/ITACLIP @ 521a33c ``clip/model.py``
#:   ``VisionTransformer.forward`` with ``attn_self=True``, as every ``configs/cfg_*.py`` sets):
#:   ``0.5 * (softmax(QQ) + softmax(KK)) + 0.5 * mean`` of the same map computed from the
#:   inputs of blocks 7, 8 and 10 (``selected_intermediate_layers = [7,8,10]``, counted from 1
#:   over ``resblocks[:-1]``: indices 6, 7, 9); ``x + use_saved_attn(...)``: residual kept, no
#:   FFN. Its test-time augmentation, text definitions, PAMR and label closing are not part
#:   of the spec.
#: - ``resclip_rcs``: ResCLIP's RCS on its default ``attn_strategy='resclip'`` (yvhangyang/ResCLIP
#:   @ 0e085f7 ``clip/model.py`` ``custom_attn``: softmax(KK^T s + NACLIP's gaussian prior) with
#:   ``gaussian_std=5.`` and ``arch='wo_resi'``, the ``resclip_segmentor.py`` defaults), then
#:   ``tau * ((1 - lambda) A + lambda A_rcs)`` with ``A_rcs`` the per-head mean of the Q-K
#:   softmax maps of layers 6-9 (``range(5, 9)`` in ``forward``) and ``(tau, lambda) = (2.0,
#:   0.3)`` (``configs/cfg_voc21.py`` ``attn_rcs_weights``). Without SFR (the second pass of
#:   ResCLIP, not in this spec).
#: - ``resclip``: ResCLIP as its segmentor runs it (``use_rcs=True, use_sfr=True``, the
#:   ``configs/base_config.py`` setting): ``resclip_rcs`` plus the SFR second pass, the prior
#:   blended into the KK scores before the gaussian prior as ``tau * ((1 - lambda) S + lambda
#:   P)`` with ``(tau, lambda) = (2.2, 0.7)`` (``configs/cfg_voc21.py`` ``attn_sfr_weights``),
#:   the prior cast to float16 (``custom_attn``: ``attn_sfr = attn_sfr.to(torch.float16)``).
#:
#: Parallel-path baselines (:mod:`sparseclip_d2.clip.parallel`):
#:
#: - ``gem``: GEM (WalBouss/GEM @ 5fa677c ``gem/gem_utils.py`` ``SelfSelfAttention.forward``,
#:   ``GEMResidualBlock.forward``; ``gem/gem_wrapper.py`` ``GEMWrapper``): cosine scores of
#:   L2-normalised v, k and q (in that order, ``xs1 = v, xs2 = k, xs3 = q``) with the adaptive
#:   inverse temperature (``ss_attn_temp=None``), one self-self iteration (``ss_attn_iter=1``),
#:   the three softmaxes averaged (``(xs1 + xs2 + xs3) / 3``), on a parallel path over the last
#:   6 blocks (``depth=7``, ``range(1, self.depth)``) that keeps its residual
#:   (``x_gem = x_gem + x_gem_res``) and has no FFN; CLS from the GEM path (``x_gem``).
#: - ``clipsurgery``: CLIP Surgery (xmed-lab/CLIP_Surgery @ d4696d4 ``clip/clip_surgery_model.py``
#:   ``Attention.forward``, ``ResidualAttentionBlock.forward``, ``VisionTransformer.forward``):
#:   ``softmax(V V^T * d**-0.5)`` (``k = v; q = k``, ``settings=''`` for ViTs), a parallel path
#:   over the last 6 blocks (``for i in range(1, 7)``) with its residual and without FFN
#:   (``x += x_res # skip ffn for the new path``), CLS from the original path
#:   (``x[0, :, :] = x_ori[0, :, :]``). Its text-side feature surgery is not part of the spec.
#: - ``cliptrase``: CLIPtrase's last block (leaves162/CLIPtrase @ 2b7de61 ``clip_utils/attn2.py``
#:   ``multi_head_attention_forward`` with ``self_qk_weight=True``, set for block 12 in
#:   ``clip_utils/model.py`` ``VisionTransformer.forward``): ``softmax(QQ^T s) + softmax(KK^T s) +
#:   softmax(VV^T s)``, ``s = d**-0.5``, rows summing to 3 (``normalize_then_sum``), residual and FFN
#:   kept (``ResidualAttentionBlock.forward`` unchanged). Its layer-11 self-correlation, DBSCAN
#:   cluster vote and VOC20 CLS-logit product are post-processing keys
#:   (``MODEL.SPARSECLIP.CLUSTER_VOTE.*``, ``CLS_LOGIT_PRODUCT``; ``methods/cliptrase/cluster_vote.py``).
#:
#: Calibrated-block baselines (:mod:`sparseclip_d2.clip.calibrated`):
#:
#: - ``scclip``: SC-CLIP (SuleBai/SC-CLIP @ 0417ba9 ``clip/model.py`` ``VisionTransformer``):
#:   LOF on the last block's input patches (``lof_pytorch(..., n_neighbors=30,
#:   contamination=0.05)``) repaired by ``mean_interpolation``; the similarity of the repaired
#:   output of layer 9 (``pre_adjust_idx = 8`` into ``feats_list``, = tap 9) thresholded at
#:   ``beta = 0.4`` aggregates the tokens and joins ``custom_attn`` as
#:   ``(softmax((S - mean) * 3.0, negatives -inf) + softmax(KK)) / 2``; no residual, no FFN,
#:   ``+ res_cls * cls_token`` with ``res_cls = 0.3``; post-aggregation by the output of layer 4
#:   (``post_adjust_idx = 3``, tap 4); fusion of the outputs of layers 4-10
#:   (``range(multi_start_idx=3, multi_end_idx=10)`` into ``feats_list``, taps 4..10).
#: - ``sfp``: SFP (Kimsure/SFP @ 2804f5b ``SFP_ICCV/clip/model.py`` ``VisionTransformer``, the
#:   ``configs/base_config.py`` setting ``pm='SOM'``, ``purify=True``, ``res_cls=0.3``): SC-CLIP's
#:   calibrated block with the SOM detector on layer 11's attention (``attn_map[:,:,0,1:] *=
#:   self.res_cls * self.res_scale``, 0.3 x 5.0; ``cls_to_patch > patch_self``, the first 10 of the
#:   descending sort), the last block ``(softmax(KK) + softmax(QQ) + softmax(S)) / 3``
#:   (``custom_attn``) and the fusion branch attended by ``softmax(S)`` alone (``sinkhorn_attn``
#:   with ``pre_sim``), both reading ``pre_sim`` after its in-place threshold (``pre_sim[pre_sim <
#:   0.4] = 0.0`` precedes them); similarity of layer 9 (``hidden_states[8]``), post-aggregation by layer 4
#:   (``hidden_states[3]``), fusion of layers 4-10 (``hidden_states[3:10]``), threshold 0.4, scale 3.
#:
#: Procrustes-aligned keys (``attention/procrustes.py``):
#:
#: - ``pearl``: PEARL's last block (PGSmall/PEARL @ c26062b ``clip/model.py``
#:   ``VisionTransformer.forward`` with ``arch='reduced'``: ``x = custom_attn(...)``, no residual, no
#:   FFN; ``custom_attn`` with ``attn_strategy='pearl'``: ``pearl/attn.py`` ``pa_attn`` with
#:   ``detach_cls=True``, ``use_kk=True``, ``alpha_kk=0.08``, ``align_solver='polar'``,
#:   ``polar_iters=5``, the ``pearl_ovss.py`` ``PEARL`` defaults; Cityscapes and ADE20K configs set
#:   ``alpha_kk=0.3``, ``procrustes_kk_weight`` 0.3), then softmax. Its text-aware Laplacian
#:   propagation is a logits stage of its family folder, not part of the spec.
PRESETS: Dict[str, AttentionSpec] = {
    "clip": AttentionSpec(),
    "sclip": AttentionSpec(source="qq+kk", normalizer="softmax", residual=True, ffn=True),
    "clearclip": AttentionSpec(source="qq", normalizer="softmax", residual=False, ffn=False),
    "naclip": AttentionSpec(source="kk", normalizer="softmax", prior="gaussian", prior_std=5.0,
                            residual=False, ffn=False),
    "maskclip": AttentionSpec(source="identity", normalizer="softmax", residual=True, ffn=True),
    "maskclip_reduced": AttentionSpec(source="identity", normalizer="softmax", residual=False, ffn=False),
    "itaclip": AttentionSpec(source="qq+kk", normalizer="softmax", residual=True, ffn=False,
                             mix=MixOptions(layers=(6, 7, 9), source="qq+kk", weight=0.5, scale=1.0)),
    "resclip_rcs": AttentionSpec(source="kk", normalizer="softmax", prior="gaussian", prior_std=5.0,
                                 unmodified_blocks="explicit",
                                 residual=False, ffn=False,
                                 mix=MixOptions(layers=(5, 6, 7, 8), source="qk", weight=0.3, scale=2.0)),
    "resclip": AttentionSpec(source="kk", normalizer="softmax", prior="gaussian", prior_std=5.0,
                             unmodified_blocks="explicit",
                             residual=False, ffn=False,
                             mix=MixOptions(layers=(5, 6, 7, 8), source="qk", weight=0.3, scale=2.0),
                             feedback=FeedbackOptions(enabled=True, weight=0.7, scale=2.2, precision="float16")),
    "gem": AttentionSpec(source="vv+kk+qq", normalizer="softmax", sum_mode="normalize_then_mean",
                         residual=True, ffn=False,
                         parallel=ParallelOptions(layers=6, cls="parallel", qkv_norm="l2", cosine_scale=0.0,
                                                  self_iterations=1)),
    "clipsurgery": AttentionSpec(source="vv", normalizer="softmax", residual=True, ffn=False,
                                 parallel=ParallelOptions(layers=6, cls="main")),
    "cliptrase": AttentionSpec(source="qq+kk+vv", normalizer="softmax", sum_mode="normalize_then_sum",
                               residual=True, ffn=True),
    "scclip": AttentionSpec(source="kk", normalizer="softmax", sum_mode="normalize_then_mean", residual=False,
                            ffn=False, cls_weight=0.3,
                            calibration=CalibrationOptions(
                                outlier_detector="lof", outlier_neighbors=30, outlier_contamination=0.05,
                                similarity_layer=9, similarity_scale=3.0, similarity_threshold=0.4,
                                post_similarity_layer=4, fusion_layers=(4, 5, 6, 7, 8, 9, 10))),
    "sfp": AttentionSpec(source="qq+kk", normalizer="softmax", sum_mode="normalize_then_mean", residual=False,
                         ffn=False, cls_weight=0.3,
                         calibration=CalibrationOptions(
                             outlier_detector="som", outlier_count=10, outlier_cls_scale=1.5, similarity_layer=9,
                             similarity_scale=3.0, similarity_threshold=0.4, post_similarity_layer=4,
                             fusion_layers=(4, 5, 6, 7, 8, 9, 10), fusion_attention="similarity",
                             threshold_similarity_term=True)),
    "pearl": AttentionSpec(source="procrustes", normalizer="softmax", residual=False, ffn=False,
                           procrustes=ProcrustesOptions(kk_weight=0.08, solver="newton_schulz", iterations=5)),
}


# ------------------------------------------------------------------------------ the grammar
#: ``key=value`` keys of the spec grammar -> setting (:data:`SETTINGS`): every setting's flat
#: name, and the aliases ``t``/``temp``, ``layers``, ``std``, ``parallel``.
SPEC_KEYS: Dict[str, str] = {name: name for name in SETTINGS}
SPEC_KEYS.update({"t": "temperature", "temp": "temperature", "layers": "num_layers", "std": "prior_std",
                  "parallel": "parallel_layers"})
#: An example of each ``layers``-kind setting for the grammar's error message.
_LAYERS_EXAMPLES = {"mix_layers": "6,7,9", "fusion_layers": "4,5,6,7,8,9,10"}
_ALPHA_NORMALIZERS = ("entmax", "random_matched")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _normalizers() -> List[str]:
    return [name for name, _ in NORMALIZER_REGISTRY]


def _syntax_help() -> str:
    return (f"valid: bases: {', '.join(PRESETS)}, cfg; normalizers: {', '.join(_normalizers())} (entmax:ALPHA); "
            "sources: qk, qq, kk, vv, identity, procrustes, sums like qq+kk (paper names qkv, qqv, kkv, vvv, v-only); "
            f"key=value with keys {', '.join(sorted(SPEC_KEYS))}")


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def _value(field: str, raw: str, text: str) -> Any:
    """The value of ``key=raw`` for setting ``field``, read as its kind (:data:`SETTINGS`)."""
    kind = SETTINGS[field][2]
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"spec {text!r}: {field}={raw!r} is not an integer") from None
    if kind == "float":
        if not _is_number(raw):
            raise ValueError(f"spec {text!r}: {field}={raw!r} is not a number")
        return float(raw)
    if kind == "bool":
        if raw.lower() in _TRUE + _FALSE:
            return raw.lower() in _TRUE
        raise ValueError(f"spec {text!r}: {field}={raw!r} is not a boolean (use true/false, 1/0, on/off)")
    if kind == "layers":
        parts = [p.strip() for p in raw.split(",")] if raw.strip() else []
        if not all(p.lstrip("-").isdigit() for p in parts):
            raise ValueError(f"spec {text!r}: {field}={raw!r} is not a comma-separated list of block indices "
                             f"(e.g. {field}={_LAYERS_EXAMPLES[field]})")
        return tuple(int(p) for p in parts)
    return raw


def _base(tokens: List[str], text: str, config_spec: Optional[AttentionSpec]) -> Tuple[AttentionSpec, List[str]]:
    """The spec a text starts from (a preset, ``cfg`` or ``clip``) and its remaining tokens."""
    first = tokens[0].lower()
    if first in PRESETS:
        return AttentionSpec.preset(first), tokens[1:]
    if first in ("cfg", "config"):
        if config_spec is None:
            raise ValueError(f"spec {text!r}: base 'cfg' needs the config's spec, none was given")
        return config_spec, tokens[1:]
    return AttentionSpec(), tokens


def _changes(tokens: List[str], text: str) -> Dict[str, Any]:
    """The settings the tokens after the base set, by flat name, left to right."""
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
    return changes


def parse_attention_spec(text: str, config_spec: Optional[AttentionSpec] = None) -> AttentionSpec:
    """Parse a spec string into a validated ``AttentionSpec``: the package's one spec grammar.

    Grammar: colon-separated tokens ``[BASE:]TOKEN[:TOKEN...]``, read left to right.

    - ``BASE`` (optional, first): a preset (``clip``, ``sclip``, ``clearclip``, ``naclip``,
      ``maskclip``, ``itaclip``, ``resclip_rcs``, ...; :data:`PRESETS`) or ``cfg``
      (``config_spec``). Without a base the start is ``clip`` (QK scores, softmax, full block):
      ``entmax:1.2`` is QK with alpha-entmax 1.2.
    - a normaliser (``softmax``, ``entmax``, ``sparsemax``, ``random_matched``); ``entmax`` and
      ``random_matched`` take an optional number token after them, the alpha (``entmax:1.2``);
    - a score source (``qk``, ``qq``, ``kk``, ``vv``, ``identity``, sums like ``qq+kk``, or the
      paper's ``qkv``, ``qqv``, ``kkv``, ``vvv``, ``v-only``);
    - ``key=value`` for any setting by its flat name (:data:`SPEC_KEYS`, :data:`SETTINGS`):
      ``alpha``, ``temperature``/``t``, ``layers``/``num_layers``, ``residual``, ``ffn``
      (true/false, 1/0, on/off), ``prior``, ``prior_std``/``std``, ``sum_mode``, ``seed``,
      ``source``, ``normalizer``, ``mix_layers`` (comma-separated 0-based indices,
      ``mix_layers=6,7,9``), ``mix_source``, ``mix_normalizer``, ``mix_weight``, ``mix_scale``,
      ``cls_weight``, ``parallel``/``parallel_layers``, ``feedback_*``, the calibration settings.

    ``layers=N`` applies the normaliser and temperature to the last N blocks; the source,
    prior and residual/FFN switches act on the last block only (the paper's depth study).

    Examples: ``softmax``, ``entmax:1.2``, ``qq:entmax:1.2``, ``clearclip:entmax:1.5``,
    ``naclip``, ``qq+kk:sparsemax:layers=2``, ``softmax:t=0.5``, ``cfg:alpha=1.4``.

    Raises:
        ValueError: an unknown token, a misplaced number, a bad key or value, a value
            ``AttentionSpec`` rejects, an ``alpha`` given to a normaliser that ignores it, or a
            setting that changes nothing (:meth:`AttentionSpec.inert_settings`, e.g.
            ``qq+kk:layers=2`` with softmax); the message quotes the spec and the valid choices.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"empty attention spec {text!r}; {_syntax_help()}")
    tokens = [t.strip() for t in text.strip().split(":")]
    if any(not t for t in tokens):
        raise ValueError(f"spec {text!r} has an empty token (two colons in a row or a trailing colon)")
    spec, tokens = _base(tokens, text, config_spec)
    changes = _changes(tokens, text)
    try:
        out = spec.replace(**changes)
    except (ValueError, TypeError) as e:
        raise ValueError(f"spec {text!r}: {e}") from e
    uses_alpha = out.normalizer in _ALPHA_NORMALIZERS or (bool(out.mix.layers)
                                                          and out.tap_normalizer in _ALPHA_NORMALIZERS)
    if "alpha" in changes and not uses_alpha:
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
