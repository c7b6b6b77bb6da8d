"""detectron2 evaluation parts: evaluator factory registry and results.json."""
from .build import EVALUATOR_FACTORIES, SparseCLIPSemSegEvaluator, build_evaluator, build_sem_seg_evaluator
from .results import build_results, dataset_summary, write_results

# LEAD: add the FG-OVD factory here, e.g.
#   from .fgovd_evaluation import build_fgovd_evaluator
#   EVALUATOR_FACTORIES["fgovd"] = build_fgovd_evaluator
# (file owned by the FG-OVD session).

__all__ = [
    "EVALUATOR_FACTORIES",
    "SparseCLIPSemSegEvaluator",
    "build_evaluator",
    "build_sem_seg_evaluator",
    "build_results",
    "dataset_summary",
    "write_results",
]
