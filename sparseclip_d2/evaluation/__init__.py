"""detectron2 evaluation parts: evaluator factory registry and results.json."""
from .. import require_detectron2

require_detectron2("sparseclip_d2.evaluation")

from .build import EVALUATOR_FACTORIES, SparseCLIPSemSegEvaluator, build_evaluator, build_sem_seg_evaluator
from .results import SUMMARY_HOOKS, build_results, dataset_summary, finalize_summaries, write_results

from .attention_stats import AttentionStatsEvaluator, build_attention_stats_evaluator
from .fgovd_evaluation import FGOVDEvaluator, add_mhme, build_fgovd_evaluator  # registers "fgovd" and mHME

__all__ = [
    "AttentionStatsEvaluator",
    "build_attention_stats_evaluator",
    "EVALUATOR_FACTORIES",
    "FGOVDEvaluator",
    "add_mhme",
    "build_fgovd_evaluator",
    "SparseCLIPSemSegEvaluator",
    "build_evaluator",
    "build_sem_seg_evaluator",
    "build_results",
    "finalize_summaries",
    "SUMMARY_HOOKS",
    "dataset_summary",
    "write_results",
]
