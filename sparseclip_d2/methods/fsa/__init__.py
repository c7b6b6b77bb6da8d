"""FSA (chi-chi-zx/FSA): feedback attention on the proxy last block, guided by the class texts."""
from .encoder import FSAEncoder, FSASettings, check_fsa_settings, fsa_ensemble, fsa_scores, kl_similarity
from . import keys  # noqa: F401  (registers the family and its config sections)
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

#: the families this one is built on (it may name them; tests/project/test_source_rules.py)
BUILDS_ON = ("proxyclip",)

__all__ = ["FSAEncoder", "FSASettings", "check_fsa_settings", "kl_similarity", "fsa_scores", "fsa_ensemble"]
