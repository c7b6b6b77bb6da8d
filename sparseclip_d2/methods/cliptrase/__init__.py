"""CLIPtrase (leaves162/CLIPtrase): the CLS-product head and the DBSCAN cluster vote stage
(:mod:`.parts`, maths in :mod:`.cluster_vote`). Its self-correlation attention is a preset
(``clip/spec.py``)."""
from .cluster_vote import CLUSTER_VOTE_SECTION, ClusterVoteSettings, cluster_assignment, majority_vote
from .parts import ClusterVoteStage, CLSProductHead
from . import upstream  # noqa: F401  (registers its upstream benchmark entry)

__all__ = ["CLSProductHead", "ClusterVoteStage", "ClusterVoteSettings", "CLUSTER_VOTE_SECTION", "cluster_assignment",
           "majority_vote"]
