"""CLIPtrase's parts (leaves162/CLIPtrase @ 2b7de61 ``clip_self_correlation.py``): the CLS-logit
product (a logit head, ``MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT``) and the DBSCAN cluster vote on a
block's self-correlation (a labels stage, ``MODEL.SPARSECLIP.CLUSTER_VOTE.*``). The maths is in
``methods/cliptrase/cluster_vote.py``; the centre-crop protocol is ``INPUT.CENTER_CROP_TEST`` (data/)."""
from ...common.keys import check_number
from ...common.needs import Needs
from ...dense.windows import encode_window_logits
from .cluster_vote import ClusterVoteSettings, cluster_assignment, majority_vote
from ...dense.windows import symmetric_pad
from ..registry import LOGIT_HEADS, STAGES, LogitHead, Stage

__all__ = ["CLSProductHead", "ClusterVoteStage"]


def _check_keys(cfg) -> None:
    """Validate CLIPtrase's post-processing keys (``MODEL.SPARSECLIP.CLUSTER_VOTE.*``,
    ``CLS_LOGIT_PRODUCT``; ``methods/cliptrase/cluster_vote.py``); ``ValueError`` naming the key, its value
    and the valid choices. What they cannot run with follows from the parts' declarations
    (``methods.check_parts``)."""
    inf = float("inf")
    sc = cfg.MODEL.SPARSECLIP
    c = sc.CLUSTER_VOTE
    for key, value in (("MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED", c.ENABLED),
                       ("MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT", sc.CLS_LOGIT_PRODUCT)):
        if not isinstance(value, bool):
            raise ValueError(f"{key} = {value!r} is invalid; valid: True, False")
    check_number("MODEL.SPARSECLIP.CLUSTER_VOTE.LAYER", c.LAYER, -inf, inf, integer=True)
    check_number("MODEL.SPARSECLIP.CLUSTER_VOTE.EPS", c.EPS, 0, inf, low_open=True)
    check_number("MODEL.SPARSECLIP.CLUSTER_VOTE.MIN_SAMPLES", c.MIN_SAMPLES, 1, inf, integer=True)
    check_number("MODEL.SPARSECLIP.CLUSTER_VOTE.UPSAMPLE", c.UPSAMPLE, 1, inf, integer=True)
    check_number("MODEL.SPARSECLIP.CLUSTER_VOTE.MEDIAN_SIZE", c.MEDIAN_SIZE, 1, inf, integer=True)
    if sc.PROXY.NAME:  # the vote's pass is the CLIP encoder's own (forward_pass), not the proxy block
        for on, name in ((c.ENABLED, "MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED"),
                         (sc.CLS_LOGIT_PRODUCT, "MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT")):
            if on:
                raise ValueError(f"{name} True cannot be combined with MODEL.SPARSECLIP.PROXY.NAME = "
                                 f"{sc.PROXY.NAME!r} (that path computes its logits its own way); valid: "
                                 "MODEL.SPARSECLIP.PROXY.NAME ''")


@LOGIT_HEADS.register("cls_product")
class CLSProductHead(LogitHead):
    """Each window's patch logits times its CLS logits, per synonym (CLIPtrase's VOC20 rule)."""

    key = "MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT"
    reads_correlation = True

    @classmethod
    def settings_from_config(cls, cfg):
        _check_keys(cfg)
        return True if cfg.MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT else None

    @classmethod
    def from_config(cls, cfg, clip):
        return cls() if cls.settings_from_config(cfg) else None

    def forward(self, model, images, text_emb, inputs, sink, context):
        return encode_window_logits(model.encoder, images, text_emb, model.logit_scale, cls_product=True,
                                    feedback=inputs.get("feedback"))[0]

    def with_correlation(self, model, images, text_emb, inputs, layer):
        return encode_window_logits(model.encoder, images, text_emb, model.logit_scale, cls_product=True,
                                    correlation_layer=layer, feedback=inputs.get("feedback"))

    def describe(self) -> str:
        return "CLS-logit product"


@STAGES.register("cluster_vote")
class ClusterVoteStage(Stage):
    """DBSCAN clusters of block ``LAYER``'s self-correlation; every pixel of a cluster takes its
    most frequent label."""

    kind = "labels"
    key = "MODEL.SPARSECLIP.CLUSTER_VOTE.ENABLED"
    records_attention = False

    def __init__(self, settings: ClusterVoteSettings):
        super().__init__()
        self.settings = settings
        self.needs = Needs(whole_image=True, correlation_layer=settings.layer)

    @classmethod
    def settings_from_config(cls, cfg):
        _check_keys(cfg)
        return ClusterVoteSettings.from_config(cfg)

    @classmethod
    def from_config(cls, cfg, clip):
        s = cls.settings_from_config(cfg)
        return cls(s) if s is not None else None

    def forward(self, model, inputs, labels):
        H, W = inputs.image.shape[-2:]
        p = int(model.encoder.patch_size)
        pad = symmetric_pad(H, W, p)
        grid = ((H + pad[2] + pad[3]) // p, (W + pad[0] + pad[1]) // p)
        assignment = cluster_assignment(inputs.correlation[0], grid, self.settings, inputs.out_size, pad=pad,
                                        patch_size=p)
        if assignment is None:  # every patch is DBSCAN noise: the labels stay (as upstream)
            return labels
        return majority_vote(labels, assignment.to(labels.device))

    def describe(self) -> str:
        s = self.settings
        return f"cluster vote (layer {s.layer}, eps {s.eps:g}, min {s.min_samples})"


# the class's declaration for check_parts before an instance exists (the layer comes from the config)
ClusterVoteStage.needs = Needs(whole_image=True, correlation_layer=-2)
