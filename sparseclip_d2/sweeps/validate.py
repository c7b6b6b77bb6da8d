"""Checking a run before anything runs, as the run itself would check it: the merged config,
``AttentionSpec.from_config`` (plus ``NUM_LAYERS`` against the model's depth), the prompt
templates and the datasets (registered). Invalid runs carry their errors and the sweep refuses
to start (:class:`SweepValidationError`); settings that change nothing are warnings."""
from typing import List, Sequence, Tuple

from .sweep_file import SweepRun

__all__ = ["SweepValidationError", "validate_config", "model_depth"]


class SweepValidationError(ValueError):
    """Some runs of a sweep are invalid; ``runs`` holds them (each with ``errors``)."""

    def __init__(self, runs: Sequence[SweepRun]):
        self.runs = list(runs)
        lines = [f"{len(self.runs)} run(s) of the sweep are invalid:"]
        for r in self.runs:
            lines += [f"  {r.name}: {e}" for e in r.errors]
        super().__init__("\n".join(lines))


def model_depth(name: str) -> int:
    """Number of vision blocks of an open_clip (or sparseclip_d2 local) model name."""
    import open_clip

    from sparseclip_d2.clip.model_configs import get_local_model_config

    mc = get_local_model_config(name) or open_clip.get_model_config(name)
    if mc is None:
        raise ValueError(f"MODEL.SPARSECLIP.CLIP.NAME={name!r} is not an open_clip model; valid: "
                         f"{', '.join(open_clip.list_models()[:8])}, ... (open_clip.list_models())")
    layers = mc["vision_cfg"]["layers"]
    return int(layers if isinstance(layers, int) else sum(layers))


def _attention_checks(cfg, errors: List[str], warnings: List[str]) -> None:
    from sparseclip_d2.clip import AttentionSpec

    spec = None
    try:
        spec = AttentionSpec.from_config(cfg, warn=False)
        warnings += spec.inert_settings()
    except ValueError as e:
        errors.append(str(e))
    try:
        depth = model_depth(cfg.MODEL.SPARSECLIP.CLIP.NAME)
    except ValueError as e:
        errors.append(str(e))
        return
    if spec is not None:
        try:
            spec.check_depth(depth)
        except ValueError as e:
            key = _DEPTH_KEYS[getattr(e, "field", "num_layers")]
            errors.append(f"MODEL.SPARSECLIP.{key}: {e} ({cfg.MODEL.SPARSECLIP.CLIP.NAME})")


#: The config key of each spec field ``AttentionSpec.check_depth`` checks against the depth
#: (``SpecDepthError.field``).
_DEPTH_KEYS = {"num_layers": "ATTENTION.NUM_LAYERS", "mix_layers": "ATTENTION.MIX.LAYERS",
               "parallel_layers": "PARALLEL.LAYERS"}


def validate_config(cfg) -> Tuple[List[str], List[str]]:
    """Check a run's merged config as the run would: ``(errors, warnings)``.

    Errors: an invalid attention setting (``AttentionSpec.from_config``), ``NUM_LAYERS``
    beyond the model's depth, an unknown model, unknown prompt templates, an empty or
    unregistered ``DATASETS.TEST``. Warnings: settings that change nothing
    (``AttentionSpec.inert_settings``).
    """
    from detectron2.data import DatasetCatalog

    import sparseclip_d2.data  # noqa: F401  (registers the datasets)
    from sparseclip_d2.clip import get_templates

    errors: List[str] = []
    warnings: List[str] = []
    _attention_checks(cfg, errors, warnings)
    try:
        get_templates(cfg.MODEL.SPARSECLIP.TEXT.TEMPLATES)
    except ValueError as e:
        errors.append(f"MODEL.SPARSECLIP.TEXT.TEMPLATES: {e}")
    if not cfg.DATASETS.TEST:
        errors.append("DATASETS.TEST is empty: name at least one registered dataset")
    registered = set(DatasetCatalog.list())
    for name in cfg.DATASETS.TEST:
        if name not in registered:
            errors.append(f"dataset {name!r} is not registered; registered: {', '.join(sorted(registered))}")
    return errors, warnings
