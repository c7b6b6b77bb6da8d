"""detectron2 evaluation parts: evaluator factory registry and results.json."""
from .. import require_detectron2

require_detectron2("sparseclip_d2.evaluation")

from .build import EVALUATOR_REGISTRY, SparseCLIPSemSegEvaluator, build_evaluator
from .results import SUMMARY_HOOK_REGISTRY, build_results, dataset_summary, finalize_summaries, write_results

from .attention_stats import AttentionStatsEvaluator, build_attention_stats_evaluator
from .fgovd_evaluation import FGOVDEvaluator, add_mhme  # registers the "fgovd" evaluator and the mHME hook
from ..data.datasets.mess_benchmark import mess_available

if mess_available():  # the optional `mess` extra: MESS's evaluator for its datasets (benchmark "mess")
    from . import mess_benchmark  # noqa: F401

__all__ = [
    "AttentionStatsEvaluator",
    "build_attention_stats_evaluator",
    "EVALUATOR_REGISTRY",
    "FGOVDEvaluator",
    "add_mhme",
    "SparseCLIPSemSegEvaluator",
    "build_evaluator",
    "build_results",
    "finalize_summaries",
    "SUMMARY_HOOK_REGISTRY",
    "dataset_summary",
    "write_results",
]
