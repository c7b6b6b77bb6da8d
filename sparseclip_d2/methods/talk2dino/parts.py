"""Talk2DINO (lorebianchi98/Talk2DINO @ 4918c2d, ICCV 2025; NOT training-free: a learned text
projection) on the pipeline: an encoder family on the second backbone (DINOv2-reg) and its logit head
(sigmoid masks, background cleaning, per-window PAMR, the constant background score), switched on
together by ``MODEL.SPARSECLIP.PROXY.TALK2DINO.ENABLED``."""
import dataclasses
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from ...clip.spec import AttentionSpec, describe_spec
from ...clip.text import split_synonyms
from ...common.keys import Key, Section, check_number, key_field, switch_is_on
from ...dense.pamr import pamr
from ...proxy.keys import KEY as PROXY_KEY, proxy_node
from ..registry import CONFIG_SECTIONS, ENCODERS, LOGIT_HEADS, EncoderFamily, LogitHead
from .encoder import Talk2DINOEncoder
from .maths import TextProjection, clean_background, load_projection, random_projection, sigmoid_masks

__all__ = ["KEY", "Talk2DINOSettings", "TALK2DINO_SECTION", "talk2dino_settings_from_config", "Talk2DINOFamily",
           "Talk2DINOHead", "template_mean_embeddings"]

KEY = f"{PROXY_KEY}.TALK2DINO"
_RANDOM = ("random", "none")


@dataclasses.dataclass(frozen=True)
class Talk2DINOSettings:
    """``MODEL.SPARSECLIP.PROXY.TALK2DINO.*`` (lorebianchi98/Talk2DINO @ 4918c2d)."""

    projection: str = key_field("random", "PROJECTION", "The learned text projection: upstream's file "
                                "weights/vitb_mlp_infonce.pth (keys linear_layer.*, hidden_layers.0.*), or 'random' "
                                "(seeded, a smoke run, logged loudly)")
    projection_seed: int = key_field(0, "PROJECTION_SEED", "Seed of the random projection")
    size: int = key_field(448, "SIZE", "Each window is resized to SIZE x SIZE for DINOv2 "
                          "(configs/*/dinotext_*_vitb_mlp_infonce.yml resize_dim: 448)")
    background_clean: bool = key_field(False, "BACKGROUND_CLEAN", "Background cleaning with the last block's heads "
                                       "(dinotext.py with_bg_clean; True in configs/voc_bg, configs/context_bg)")
    lambda_bg: float = key_field(0.2, "LAMBDA_BG", "Weight of the cleaning (dinotext.py generate_masks lambda_bg=0.2)")
    background_score: float = key_field(0.55, "BACKGROUND_SCORE", "The background class's constant mask value "
                                         "(segmentation/evaluation/dinotext_seg.py bg_thresh; "
                                         "configs/voc_bg/eval_voc_bg_pamr.yml 0.55, configs/voc/*.yml 0.4)")
    pamr_steps: int = key_field(10, "PAMR_STEPS", "PAMR steps on each window (dinotext.py apply_pamr pamr_iter = 10; "
                                "0 = off, eval_*.yml pamr: false)")
    pamr_dilations: Tuple[int, ...] = key_field((1, 2, 4, 8, 12, 24), "PAMR_DILATIONS",
                                                "dinotext.py apply_pamr pamr_kernel = [1, 2, 4, 8, 12, 24]")


#: ``ENABLED`` then :class:`Talk2DINOSettings`' keys; with ``ENABLED False`` the others keep their defaults.
TALK2DINO_SECTION = CONFIG_SECTIONS.register(KEY)(Section(Talk2DINOSettings, switch="ENABLED", before=(
    Key("ENABLED", False, "Talk2DINO (lorebianchi98/Talk2DINO, not training-free): DINOv2-reg patch tokens against "
                          "CLIP text through a learned projection; PROXY.NAME vit_base_patch14_reg4_dinov2"),)))


def talk2dino_settings_from_config(cfg) -> Optional[Talk2DINOSettings]:
    """The validated settings, or None when ``ENABLED`` is False (then the other keys keep their defaults)."""
    n = proxy_node(cfg).TALK2DINO
    if not switch_is_on(n, TALK2DINO_SECTION, KEY):
        return None
    inf = float("inf")
    check_number(f"{KEY}.PROJECTION_SEED", n.PROJECTION_SEED, 0, inf, integer=True)
    check_number(f"{KEY}.SIZE", n.SIZE, 1, inf, integer=True)
    check_number(f"{KEY}.LAMBDA_BG", n.LAMBDA_BG, 0, inf)
    check_number(f"{KEY}.BACKGROUND_SCORE", n.BACKGROUND_SCORE, 0, 1)
    check_number(f"{KEY}.PAMR_STEPS", n.PAMR_STEPS, 0, inf, integer=True)
    if not isinstance(n.BACKGROUND_CLEAN, bool):
        raise ValueError(f"{KEY}.BACKGROUND_CLEAN = {n.BACKGROUND_CLEAN!r} is invalid; valid: True, False")
    dil = list(n.PAMR_DILATIONS)
    if not dil or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in dil):
        raise ValueError(f"{KEY}.PAMR_DILATIONS = {dil!r} is invalid; valid: a non-empty list of positive integers")
    proj = str(n.PROJECTION).strip()
    if not proj:
        raise ValueError(f"{KEY}.PROJECTION is empty; valid: a projection file or 'random'")
    return Talk2DINOSettings(projection=proj, projection_seed=int(n.PROJECTION_SEED), size=int(n.SIZE),
                             background_clean=n.BACKGROUND_CLEAN, lambda_bg=float(n.LAMBDA_BG),
                             background_score=float(n.BACKGROUND_SCORE), pamr_steps=int(n.PAMR_STEPS),
                             pamr_dilations=tuple(int(d) for d in dil))


@ENCODERS.register("talk2dino")
class Talk2DINOFamily(EncoderFamily):
    """lorebianchi98/Talk2DINO: DINOv2-reg's patch tokens replace CLIP's dense features."""

    key = f"{KEY}.ENABLED"

    @classmethod
    def settings_from_config(cls, cfg):
        return talk2dino_settings_from_config(cfg)

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        sc = cfg.MODEL.SPARSECLIP
        bad = []
        if proxy_options.name.startswith("samvit"):
            bad.append(f"{PROXY_KEY}.NAME {proxy_options.name!r} (valid: a DINOv2 ViT, vit_base_patch14_reg4_dinov2)")
        if proxy_options.layer != -1 or proxy_options.feature != "tokens" or proxy_options.input_size != 0:
            bad.append(f"{PROXY_KEY}.LAYER / FEATURE / INPUT_SIZE = {proxy_options.layer} / {proxy_options.feature!r} / "
                       f"{proxy_options.input_size} (valid: -1 / 'tokens' / 0; the resize is {KEY}.SIZE)")
        if sc.PROB_THRESHOLD or sc.AREA_THRESHOLD:
            bad.append("MODEL.SPARSECLIP.PROB_THRESHOLD / AREA_THRESHOLD (valid: 0; the background is the constant "
                       f"{KEY}.BACKGROUND_SCORE)")
        if sc.TEXT.DEFINITIONS:
            bad.append("MODEL.SPARSECLIP.TEXT.DEFINITIONS (the projection reads CLIP's template means; valid: '')")
        if sc.PIXEL_NORM != "clip":
            bad.append(f"MODEL.SPARSECLIP.PIXEL_NORM {sc.PIXEL_NORM!r} (valid: clip, which is the encoder's ImageNet "
                       "mean / std)")
        spec = AttentionSpec.from_config(cfg, warn=False)
        if spec != AttentionSpec():
            bad.append(f"MODEL.SPARSECLIP.ATTENTION / BLOCK keys ({describe_spec(spec)}; valid: their defaults, "
                       "there is no CLIP attention to change)")
        if bad:
            raise ValueError(f"{cls.key} True refuses: " + "; ".join(bad))

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, *, device, crop_size, pos_embed_interp, attn_pool_dense):
        return Talk2DINOEncoder(visual, spec, proxy, size=settings.size)


def template_mean_embeddings(classifier, synonyms: Sequence[str], chunk: int = 32) -> torch.Tensor:
    """``(S, D)`` float32: per synonym, the mean over the classifier's templates of CLIP's text
    embeddings, NOT normalised (upstream ``dinotext.py`` ``build_text_embedding``: ``encode_text`` in
    chunks of 32, ``mean(dim=1).float()``, then the projection)."""
    prompts = [t.replace("{}", s) for s in synonyms for t in classifier.templates]
    device = next(classifier.model.parameters()).device
    out = []
    with torch.no_grad():
        for i in range(0, len(prompts), chunk):
            out.append(classifier.model.encode_text(classifier.tokenizer(prompts[i:i + chunk]).to(device)))
    emb = torch.cat(out).reshape(len(synonyms), len(classifier.templates), -1)
    return emb.mean(dim=1).float()


@LOGIT_HEADS.register("talk2dino")
class Talk2DINOHead(LogitHead):
    """Per window: sigmoid(cos(DINOv2 patch, projected text)) masks, optionally cleaned with the last
    block's heads, bilinearly resized to the window (``align_corners=True``) and refined by PAMR on the
    window's 0-255 RGB (``dinotext.py`` ``generate_masks``); the background class's synonyms get the
    constant ``BACKGROUND_SCORE`` (``dinotext_seg.py``). Returns pixel-resolution masks (the window
    loop averages them; the softmax and argmax that follow keep their order, as mmseg's do)."""

    key = f"{KEY}.ENABLED"
    passes_encoder_inputs = False

    def __init__(self, settings: Talk2DINOSettings, projection: TextProjection):
        super().__init__()
        self.settings = settings
        self.projection = projection

    @classmethod
    def settings_from_config(cls, cfg):
        return talk2dino_settings_from_config(cfg)

    @classmethod
    def from_config(cls, cfg, clip):
        s = cls.settings_from_config(cfg)
        if s is None:
            return None
        if s.projection.lower() in _RANDOM:
            dim = 512
            if clip is not None and getattr(clip.clip_model, "text_projection", None) is not None:
                tp = clip.clip_model.text_projection
                dim = int(tp.shape[1] if isinstance(tp, torch.Tensor) else tp.out_features)
            dino = 768
            if clip is not None:
                dino = int(clip.encoder.proxy.model.embed_dim)
            proj = random_projection(s.projection_seed, dim, dino)
        else:
            proj = load_projection(s.projection, f"{KEY}.PROJECTION")
        if clip is not None:
            proj = proj.to(clip.encoder.proxy.model.cls_token.device)
        return cls(s, proj)

    def describe(self) -> str:
        s = self.settings
        parts = [f"Talk2DINO projection {s.projection}"]
        if s.background_clean:
            parts.append(f"background cleaning lambda {s.lambda_bg:g}")
        if s.pamr_steps:
            parts.append(f"PAMR {s.pamr_steps} steps {list(s.pamr_dilations)}")
        return ", ".join(parts)

    def text_embeddings(self, classifier, vocabulary: Sequence[str], background_index: Optional[int]):
        """Projected, unit text embeddings in DINOv2's space; the background class's rows are zeros (its
        masks are the constant ``BACKGROUND_SCORE``)."""
        synonyms, index = split_synonyms(list(vocabulary))
        raw = template_mean_embeddings(classifier, synonyms)
        emb = F.normalize(self.projection(raw.to(self.projection.linear_layer.weight.device)), dim=-1)
        class_index = torch.tensor(index, dtype=torch.long)
        if background_index is not None:
            emb[class_index.to(emb.device) == background_index] = 0
        return emb, class_index

    def forward(self, model, images, text_emb, inputs, sink, context):
        s = self.settings
        N, _, H, W = images.shape
        feats, scores = model.encoder.dino_tokens(images)
        fg = text_emb.norm(dim=-1) > 0
        text = text_emb[fg].float()
        out = torch.full((N, text_emb.shape[0], H, W), s.background_score, dtype=torch.float32, device=images.device)
        if text.shape[0] == 0:
            return out
        mask = sigmoid_masks(feats, text)
        if s.background_clean:
            mask = clean_background(mask, feats, scores, text, s.lambda_bg)
        mask = F.interpolate(mask, size=(H, W), mode="bilinear", align_corners=True)
        if s.pamr_steps:
            rgb = images.float() * model.pixel_std + model.pixel_mean  # the window on the 0-255 scale
            mask = pamr(rgb, mask, s.pamr_steps, s.pamr_dilations)
        out[:, fg] = mask
        return out
