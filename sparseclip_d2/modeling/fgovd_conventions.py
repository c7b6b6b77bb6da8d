"""FG-OVD evaluation conventions: a frozen, validated record and the named presets.

The official evaluations differ in five details, each a field of :class:`FGOVDConventions`
(config keys ``MODEL.SPARSECLIP.FGOVD.{MIN_NEGATIVES, TIES, MEDIAN, RESIZE_INTERPOLATION,
PROPOSAL_MATCHING}``, an empty value taking the preset's, preset ``FGOVD.CONVENTIONS``).
The model reads ``resize_interpolation`` and ``proposal_matching``; the evaluator the rest.
"""
from dataclasses import asdict, dataclass, replace
from typing import Dict

__all__ = ["FGOVDConventions", "FGOVD_CONVENTION_PRESETS", "CONVENTION_CHOICES", "conventions_from_config"]

# field -> valid values
CONVENTION_CHOICES: Dict[str, tuple] = {
    "min_negatives": ("drop", "keep"),
    "ties": ("miss", "hit"),
    "median": ("fgovd", "fgclip", "mean"),
    "resize_interpolation": ("bicubic", "bilinear"),
    "proposal_matching": ("score", "iou"),
}

# config key (under MODEL.SPARSECLIP.FGOVD) -> field
_KEYS = {
    "MIN_NEGATIVES": "min_negatives",
    "TIES": "ties",
    "MEDIAN": "median",
    "RESIZE_INTERPOLATION": "resize_interpolation",
    "PROPOSAL_MATCHING": "proposal_matching",
}


@dataclass(frozen=True)
class FGOVDConventions:
    """How boxes are kept, ranked and summarised, and how the image and proposals are used.

    Attributes:
        min_negatives: "drop" boxes with fewer than N negatives (counted in ``num_dropped``)
            or "keep" them, ranked among the negatives they have (counted in ``num_short``).
        ties: a negative scoring exactly as the positive makes the box a "miss" (rank
            ``1 + #{neg >= pos}``) or leaves it a "hit" (rank ``1 + #{neg > pos}``).
        median: "fgovd" ``sorted(r)[n // 2 + 1]``, "fgclip" ``sorted(r)[n // 2]``, "mean"
            (the middle value, or the mean of the two middle values for an even count).
        resize_interpolation: whole-image resize of the dense protocol, PIL "bicubic" or
            "bilinear" (antialiased when shrinking, as PIL does).
        proposal_matching: "score" (the highest-objectness proposal with IoU > threshold) or
            "iou" (the proposal of highest IoU, if IoU >= threshold).
    """

    min_negatives: str = "drop"
    ties: str = "miss"
    median: str = "fgovd"
    resize_interpolation: str = "bicubic"
    proposal_matching: str = "score"

    def __post_init__(self):
        for name, valid in CONVENTION_CHOICES.items():
            value = getattr(self, name)
            if value not in valid:
                key = next(k for k, f in _KEYS.items() if f == name)
                raise ValueError(
                    f"unknown MODEL.SPARSECLIP.FGOVD.{key} {value!r}; valid: {', '.join(valid)} "
                    f"(or \"\" for the preset's)"
                )

    def as_dict(self) -> Dict[str, str]:
        """The five fields as a plain dict (recorded in results.json)."""
        return asdict(self)


FGOVD_CONVENTION_PRESETS: Dict[str, FGOVDConventions] = {
    # Official FG-OVD rank evaluation. lorebianchi98/FG-OVD evaluation/ranks.py:
    # CustomMetrics.update keeps annotations with len(neg_category_ids) >= n_neg; the rank
    # counts the confidences >= the positive's; get_median_rank is
    # sorted(r)[len(r) // 2 + 1]; a ground-truth box takes the highest-scoring prediction that
    # NMS (IoU threshold 0.5) suppresses with it. No whole-image resize there (the crop
    # baseline of lorebianchi98/FG-CLIP inference_on_benchmark.py uses CLIP's bicubic).
    "fgovd": FGOVDConventions("drop", "miss", "fgovd", "bicubic", "score"),
    # Dense RoIAlign top-1. 360CVGroup/FG-CLIP fgclip/eval/fgovd_eval.py (eval_fg): every box
    # of the file scored with the captions it has, a hit when torch.equal(max, positive) (a
    # tie is a hit), image resized with img.resize((size, size)) (PIL's default, bicubic).
    # That script reports no median; "mean" is the textbook definition. Proposals are not
    # used there; "score" follows the FG-OVD detector evaluation.
    "region_top1": FGOVDConventions("keep", "hit", "mean", "bicubic", "score"),
}


def conventions_from_config(cfg) -> FGOVDConventions:
    """The conventions of ``cfg.MODEL.SPARSECLIP.FGOVD``: the preset ``CONVENTIONS`` with each
    non-empty key among MIN_NEGATIVES, TIES, MEDIAN, RESIZE_INTERPOLATION,
    PROPOSAL_MATCHING replacing its field.

    Raises:
        ValueError: an unknown preset or value, naming the key and the valid choices.
    """
    f = cfg.MODEL.SPARSECLIP.FGOVD
    preset = str(f.CONVENTIONS)
    if preset not in FGOVD_CONVENTION_PRESETS:
        raise ValueError(
            f"unknown MODEL.SPARSECLIP.FGOVD.CONVENTIONS {preset!r}; valid: "
            f"{', '.join(FGOVD_CONVENTION_PRESETS)}"
        )
    overrides = {field: str(f.get(key)) for key, field in _KEYS.items() if str(f.get(key, ""))}
    return replace(FGOVD_CONVENTION_PRESETS[preset], **overrides)
