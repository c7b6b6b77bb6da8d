"""PEARL (PGSmall/PEARL @ c26062b, CVPR 2026): Procrustes-aligned keys in the last block (the
``procrustes`` score source, ``attention/procrustes.py``, and the ``pearl`` preset of
``clip/spec.py``) and the text-aware Laplacian propagation of the logits, a logits stage any
method can run (:mod:`.stage`, maths in :mod:`.propagation`, keys ``MODEL.SPARSECLIP.TLP.*``); its
entry in the upstream benchmark and the agreement driver (:mod:`.upstream`)."""
from . import upstream  # noqa: F401  (registers its upstream entry)
from .propagation import (KEY, TLPSettings, apply_laplacian, check_tlp_settings, conjugate_gradient, edge_weights,
                          text_affinity, text_laplacian_propagation)
from .stage import TLP_SECTION, TextLaplacianStage, tlp_settings_from_config

__all__ = ["KEY", "TLPSettings", "check_tlp_settings", "text_affinity", "edge_weights", "apply_laplacian",
           "conjugate_gradient", "text_laplacian_propagation", "TLP_SECTION", "TextLaplacianStage",
           "tlp_settings_from_config"]
