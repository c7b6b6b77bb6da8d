"""``SparseCLIP``: training-free open-vocabulary semantic segmentation META_ARCH.

Pipeline per image (inputs are already resized by the mapper to the working resolution):
normalise -> whole-image or sliding-window dense encoding (``sliding_window.dense_logits``)
-> ``LOGIT_SCALE * cosine(patch, synonym)`` patch logits upsampled bilinearly ->
resize to the original ``height x width`` -> softmax over synonyms, max per class,
background rules (``postprocess.class_scores``) -> ``{"sem_seg": (C, H, W)}``.

The vocabulary comes from the input: ``vocabulary`` (list of class names with
comma-separated synonyms) or the ``stuff_classes`` of ``MetadataCatalog.get(dataset_name)``;
text classifiers are built once per (vocabulary, templates, device) and cached.

Other code (the demo, the attention analysis) reuses the parts:

- ``model.encoder``: the ``DenseCLIPEncoder`` (``(B, 3, H, W)`` normalised images ->
  ``(B, D, H/p, W/p)``);
- ``model.clip_model``: the open_clip model (None when built from parts without it);
- ``model.text_classifier_for(vocabulary, templates=None)`` -> ``(emb (S, D), class_index (S,))``
  on ``model.device``;
- ``model.normalize_images(batched_inputs)`` -> a detectron2 ``ImageList`` of normalised RGB
  float images padded to a multiple of the patch size.
"""
import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectron2.config import configurable
from detectron2.data import MetadataCatalog
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.structures import ImageList

from ..data.image_io import check_input_format
from ..common.cache import LRUCache
from ..common.synonyms import split_class_name
from ..data.class_names import CLASS_NAME_SETS, load_class_names
from .attention_record import attention_record
from .cluster_vote import ClusterVoteSettings, cluster_assignment, encode_window_logits, majority_vote
from ..clip.definitions import load_definitions, mix_definitions
from ..clip.surgery import check_surgery_options, check_surgery_scale, feature_surgery
from .backbone import build_clip_parts
from .feedback import FeedbackSettings, first_segmentation_prior
from ..clip.encoder import DenseCLIPEncoder
from ..clip.spec import AttentionSpec
from ..clip.text import max_over_synonyms
from ..clip.object_presence import object_presence_from_config, object_presence_logits, text_clusters
from .pamr import pamr
from ..propagation.config import build_label_propagation
from .postprocess import ScoreMaps
from .sliding_window import PATCH_REMAINDER_MODES, dense_logits
from .tta import TTA_MODES, check_method_options, close_labels, tta_logits

__all__ = ["SparseCLIP"]

logger = logging.getLogger(__name__)

TextClassifierFn = Callable[[List[str]], Tuple[torch.Tensor, torch.Tensor]]


@META_ARCH_REGISTRY.register()
class SparseCLIP(nn.Module):
    """Frozen CLIP with a modified final attention as a dense open-vocabulary segmenter."""

    @configurable
    def __init__(
        self,
        *,
        encoder: nn.Module,
        text_classifier: TextClassifierFn,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
        clip_model: Optional[nn.Module] = None,
        text_classifier_factory: Optional[Callable[[str], TextClassifierFn]] = None,
        templates: str = "single",
        input_format: str = "RGB",
        logit_scale: float = 50.0,
        prob_threshold: float = 0.0,
        area_threshold: float = 0.0,
        sliding_window: bool = False,
        crop_size: int = 448,
        stride: int = 224,
        window_batch_size: int = 8,
        random_weights: bool = False,
        text_cache_size: int = 64,
        attention_stats: bool = False,
        max_scores_mb: float = 1024.0,
        patch_remainder: str = "pad_crop",
        pamr_steps: int = 0,
        pamr_dilations: Sequence[int] = (8, 16),
        class_names: str = "",
        tta_mode: str = "",
        tta_weight: float = 0.75,
        label_closing: int = 0,
        definitions: Optional[Sequence[Tuple[str, str]]] = None,
        definition_weight: float = 0.0,
        feature_surgery: bool = False,
        feature_surgery_scale: float = 2.0,
        feedback: Optional[FeedbackSettings] = None,
        cluster_vote: Optional[ClusterVoteSettings] = None,
        cls_logit_product: bool = False,
        object_presence=None,
        label_propagation: Optional[nn.Module] = None,
    ):
        """
        Args:
            encoder: module with ``patch_size`` and ``embed_dim`` attributes mapping
                ``(N, 3, h, w)`` normalised images (h, w multiples of ``patch_size``) to
                ``(N, D, h/p, w/p)`` patch embeddings (a ``DenseCLIPEncoder``).
            text_classifier: ``class_names -> (emb (S, D), class_index (S,))`` for the
                default ``templates`` (a ``TextClassifier``; any callable in tests).
            pixel_mean, pixel_std: per-channel RGB normalisation in 0-255 scale.
            clip_model: the open_clip model the parts come from (exposed, optional).
            text_classifier_factory: ``templates -> text classifier``, used by
                ``text_classifier_for(..., templates=other)``; None = only the default.
            templates: name of the default template set (cache key).
            input_format: "RGB" or "BGR", the channel order of ``input["image"]``.
            logit_scale: logits = logit_scale * cosine(patch, class synonym).
            prob_threshold, area_threshold: background rules (see ``class_scores``).
            sliding_window, crop_size, stride, window_batch_size: MMSeg slide inference;
                windows of an image are encoded ``window_batch_size`` at a time.
            random_weights: the CLIP weights are random (recorded, logged).
            text_cache_size: number of (vocabulary, templates, device) entries kept.
            attention_stats: also return ``output["attention"]`` (the last block's attention
                of every window, per head; see ``modeling.attention_record``).
            max_scores_mb: outputs whose ``(C, H, W)`` float32 scores would exceed this many
                MiB return ``{"sem_seg_labels": (H, W) long}`` (computed in bands) instead
                of ``{"sem_seg": (C, H, W)}``.
            patch_remainder: windows whose sides are not multiples of the patch size, one of
                ``sliding_window.PATCH_REMAINDER_MODES``.
            pamr_steps, pamr_dilations: PAMR refinement of the synonym logits at the output
                size, guided by the normalised image resized to it (``modeling.pamr``); 0 steps
                disables it.
            class_names: "" (the dataset's ``stuff_classes``) or an upstream class-name set
                (``sclip``, ``clearclip``, ``naclip``, ``maskclip``) whose file for the dataset's
                ``class_names_file`` replaces them.
            tta_mode, tta_weight: test-time augmentation of each window's logits
                (``modeling.tta``, ``""`` = none).
            label_closing: morphological closing of the label map (0 = off); when on, outputs
                are ``{"sem_seg_labels": (H, W) long}``.
            definitions, definition_weight: ``[(name, text)]`` class definitions (background
                excluded) mixed into the synonym embeddings (``clip.definitions``), or None.
            feature_surgery, feature_surgery_scale: CLIP Surgery's feature surgery of each
                window's logits (``clip.surgery``), its CLS factor.
            feedback: how the first segmentation of an ``encoder.spec.feedback`` spec (ResCLIP's
                SFR) is made (``modeling.feedback``); None = ``FeedbackSettings()``.
            cluster_vote: CLIPtrase's DBSCAN cluster vote (``modeling.cluster_vote``), or None;
                outputs are then ``{"sem_seg_labels": (H, W) long}``.
            cls_logit_product: multiply each window's patch logits by its CLS logits (CLIPtrase's
                VOC20 rule).
            label_propagation: LPOSS / LPOSS+ over the windows' patch logits
                (``propagation.LabelPropagation``), or None.
        """
        super().__init__()
        for name in ("patch_size", "embed_dim"):
            if not hasattr(encoder, name):
                raise ValueError(f"encoder {type(encoder).__name__} lacks the attribute {name!r}")
        check_input_format(input_format)
        if sliding_window and (crop_size <= 0 or stride <= 0 or window_batch_size <= 0):
            raise ValueError(
                f"TEST.SLIDING_WINDOW needs positive CROP_SIZE/STRIDE/BATCH_SIZE, got "
                f"{crop_size}/{stride}/{window_batch_size}"
            )
        self.encoder = encoder
        self.clip_model = clip_model
        self._text_classifier = text_classifier
        self._text_classifier_factory = text_classifier_factory
        self.templates = templates
        self.input_format = input_format
        self.logit_scale = float(logit_scale)
        self.prob_threshold = float(prob_threshold)
        self.area_threshold = float(area_threshold)
        self.sliding_window = bool(sliding_window)
        self.crop_size = int(crop_size)
        self.stride = int(stride)
        self.window_batch_size = int(window_batch_size)
        self.random_weights = bool(random_weights)
        self.attention_stats = bool(attention_stats)
        self._text_cache: "LRUCache[Tuple[torch.Tensor, torch.Tensor]]" = LRUCache(int(text_cache_size))
        self._warned_threshold: set = set()
        self.max_scores_bytes = float(max_scores_mb) * 2 ** 20
        self._warned_labels_only = False
        self._checked_vocabularies: set = set()
        if patch_remainder not in PATCH_REMAINDER_MODES:
            raise ValueError(f"MODEL.SPARSECLIP.PATCH_REMAINDER must be one of {', '.join(PATCH_REMAINDER_MODES)}, "
                             f"got {patch_remainder!r}")
        if int(pamr_steps) != pamr_steps or pamr_steps < 0:
            raise ValueError(f"MODEL.SPARSECLIP.PAMR.STEPS must be a non-negative integer, got {pamr_steps!r}")
        if attention_stats and patch_remainder != "pad_crop":
            raise ValueError(
                f"TEST.ATTENTION_STATS.ENABLED needs MODEL.SPARSECLIP.PATCH_REMAINDER pad_crop (the attention "
                f"record maps patches to pixels with symmetric padding), got {patch_remainder!r}")
        self.patch_remainder = patch_remainder
        self.pamr_steps = int(pamr_steps)
        self.pamr_dilations = tuple(pamr_dilations)
        if self.pamr_steps:
            pamr(torch.zeros(1, 3, 2, 2), torch.zeros(1, 1, 2, 2), 1, self.pamr_dilations)  # validates dilations
        self.class_names = str(class_names or "")
        if self.class_names and self.class_names not in CLASS_NAME_SETS:
            raise ValueError(f"unknown MODEL.SPARSECLIP.CLASS_NAMES {self.class_names!r}; valid: '' (each "
                             f"dataset's packaged names), {', '.join(CLASS_NAME_SETS)}")
        if tta_mode not in TTA_MODES:
            raise ValueError(f"TEST.TTA.MODE must be one of {TTA_MODES}, got {tta_mode!r}")
        if tta_mode and attention_stats:
            raise ValueError("TEST.TTA.MODE cannot be combined with TEST.ATTENTION_STATS.ENABLED")
        self.tta_mode, self.tta_weight = tta_mode, float(tta_weight)
        self.label_closing = int(label_closing)
        self.definitions = list(definitions) if definitions else None
        self.definition_weight = float(definition_weight)
        if feature_surgery and tta_mode:
            raise ValueError("MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED cannot be combined with TEST.TTA.MODE")
        self.feature_surgery = bool(feature_surgery)
        self.feature_surgery_scale = check_surgery_scale(feature_surgery_scale)
        self.feedback = feedback if feedback is not None else FeedbackSettings()
        if getattr(getattr(encoder, "spec", None), "feedback", False) and tta_mode:
            raise ValueError(f"TEST.TTA.MODE = {tta_mode!r} cannot be combined with MODEL.SPARSECLIP.FEEDBACK.ENABLED "
                             "(the TTA views have no first segmentation); valid: TEST.TTA.MODE ''")
        self.cluster_vote = cluster_vote
        self.cls_logit_product = bool(cls_logit_product)
        if (cluster_vote is not None or self.cls_logit_product) and (tta_mode or feature_surgery or attention_stats):
            raise ValueError("MODEL.SPARSECLIP.CLUSTER_VOTE / CLS_LOGIT_PRODUCT cannot be combined with TEST.TTA.MODE, "
                             "FEATURE_SURGERY.ENABLED or TEST.ATTENTION_STATS.ENABLED")
        if cluster_vote is not None and (sliding_window or patch_remainder != "pad_crop" or label_closing):
            raise ValueError("MODEL.SPARSECLIP.CLUSTER_VOTE needs whole-image inference (TEST.SLIDING_WINDOW.ENABLED "
                             "False), PATCH_REMAINDER pad_crop and LABEL_CLOSING 0")
        # CASS's object-presence prompt adjustment (clip/object_presence.py); its "image" embedding
        # comes from the unmodified tower (the default spec is CLIP's own block)
        self.object_presence = object_presence
        self._native_encoder = None
        if object_presence is not None and object_presence.global_source == "image":
            self._native_encoder = DenseCLIPEncoder(encoder.visual, AttentionSpec(),
                                                    pos_embed_interp=encoder.pos_embed_interp,
                                                    attn_pool_dense=encoder.attn_pool_dense)
        self.label_propagation = label_propagation
        if label_propagation is not None and (cluster_vote is not None or self.pamr_steps or attention_stats):
            raise ValueError("MODEL.SPARSECLIP.LABEL_PROPAGATION.KIND cannot be combined with CLUSTER_VOTE, PAMR or "
                             "TEST.ATTENTION_STATS.ENABLED")
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        self.eval()

    @classmethod
    def from_config(cls, cfg):
        sc = cfg.MODEL.SPARSECLIP
        check_method_options(cfg)
        check_surgery_options(cfg)
        feedback = FeedbackSettings.from_config(cfg)
        if not cfg.MODEL.SPARSECLIP.FEEDBACK.ENABLED and feedback != FeedbackSettings():
            logger.warning("MODEL.SPARSECLIP.FEEDBACK.THRESHOLD/PAMR_*/CONNECTIVITY/SMOOTH_STD = %s change nothing: "
                           "MODEL.SPARSECLIP.FEEDBACK.ENABLED is False", feedback)
        if cfg.MODEL.SPARSECLIP.FEEDBACK.ENABLED and cfg.TEST.TTA.MODE:
            raise ValueError(f"TEST.TTA.MODE = {cfg.TEST.TTA.MODE!r} cannot be combined with "
                             "MODEL.SPARSECLIP.FEEDBACK.ENABLED (the TTA views have no first segmentation); valid: "
                             "TEST.TTA.MODE '' or FEEDBACK.ENABLED False")
        parts = build_clip_parts(cfg)  # validates every user-facing value before the weights load
        clip_model, encoder = parts.clip_model, parts.encoder
        logit_scale = float(sc.LOGIT_SCALE)  # >= 0, checked by build_clip_parts
        if logit_scale == 0:
            logit_scale = float(clip_model.logit_scale.detach().float().exp())

        sw = cfg.TEST.SLIDING_WINDOW
        return {
            "encoder": encoder,
            "clip_model": clip_model,
            "text_classifier": parts.text_classifier(sc.TEXT.TEMPLATES),
            "text_classifier_factory": parts.text_classifier,
            "templates": sc.TEXT.TEMPLATES,
            "pixel_mean": parts.pixel_mean,
            "pixel_std": parts.pixel_std,
            "input_format": cfg.INPUT.FORMAT,
            "logit_scale": logit_scale,
            "prob_threshold": sc.PROB_THRESHOLD,
            "area_threshold": sc.AREA_THRESHOLD,
            "sliding_window": sw.ENABLED,
            "crop_size": sw.CROP_SIZE,
            "stride": sw.STRIDE,
            "window_batch_size": sw.BATCH_SIZE,
            "random_weights": parts.random_weights,
            "attention_stats": cfg.TEST.ATTENTION_STATS.ENABLED,
            "max_scores_mb": cfg.TEST.SEM_SEG_SCORES_MAX_MB,
            "patch_remainder": sc.PATCH_REMAINDER,
            "pamr_steps": sc.PAMR.STEPS,
            "pamr_dilations": tuple(sc.PAMR.DILATIONS),
            "class_names": sc.CLASS_NAMES,
            "tta_mode": cfg.TEST.TTA.MODE,
            "tta_weight": cfg.TEST.TTA.WEIGHT,
            "label_closing": sc.LABEL_CLOSING,
            "definitions": load_definitions(sc.TEXT.DEFINITIONS) if sc.TEXT.DEFINITIONS else None,
            "definition_weight": sc.TEXT.DEFINITION_WEIGHT,
            "feature_surgery": sc.FEATURE_SURGERY.ENABLED,
            "feature_surgery_scale": sc.FEATURE_SURGERY.CLS_SCALE,
            "feedback": feedback,
            "cluster_vote": ClusterVoteSettings.from_config(cfg),
            "cls_logit_product": sc.CLS_LOGIT_PRODUCT,
            "object_presence": object_presence_from_config(cfg),
            "label_propagation": build_label_propagation(
                cfg, cfg.MODEL.DEVICE, [m / 255.0 for m in parts.pixel_mean], [v / 255.0 for v in parts.pixel_std]),
        }

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    # ------------------------------------------------------------------ parts reused by other code
    def text_classifier_for(
        self, vocabulary: Sequence[str], templates: Optional[str] = None, background_index: Optional[int] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Class embeddings of a vocabulary, cached per (vocabulary, templates, device).

        Args:
            vocabulary: C class names, each with comma-separated synonyms.
            templates: a template-set name or file; None = the model's default.
            background_index: the vocabulary's background class, kept out of the class
                definitions (used only when the model mixes definitions in).

        Returns:
            ``(emb (S, D) float32 L2-normalised, class_index (S,) long)`` on ``self.device``.
        """
        templates = self.templates if templates is None else templates
        key = (tuple(vocabulary), templates, str(self.device), background_index if self.definitions else None)

        def make() -> Tuple[torch.Tensor, torch.Tensor]:
            classifier = self.text_classifier(templates)
            emb, class_index = classifier(list(vocabulary))
            if self.definitions:
                texts = [text for _, text in self.definitions]
                emb = mix_definitions(emb, class_index, classifier.encode(texts).to(emb.device),
                                      self.definition_weight, background_index,
                                      what="MODEL.SPARSECLIP.TEXT.DEFINITIONS")
            if emb.dim() != 2 or class_index.shape != (emb.shape[0],):
                raise ValueError(
                    f"text classifier returned emb {tuple(emb.shape)} and class_index "
                    f"{tuple(class_index.shape)}; expected (S, D) and (S,)"
                )
            return emb.to(self.device, torch.float32), class_index.to(self.device, torch.long)

        return self._text_cache.get_or_create(key, make)

    def share_text_cache(self, other: "SparseCLIP") -> None:
        """Use ``other``'s vocabulary-embedding cache (models built from one CLIP, e.g. the
        attention variants of a ``Predictor``, then encode each vocabulary once in all)."""
        self._text_cache = other._text_cache

    def text_classifier(self, templates: Optional[str] = None) -> TextClassifierFn:
        """The text classifier for a template set (None = the model's default): the one the
        model was built with, or a new one from ``text_classifier_factory``. Uncached: use
        :meth:`text_classifier_for` for cached vocabulary embeddings."""
        templates = self.templates if templates is None else templates
        if templates == self.templates:
            return self._text_classifier
        if self._text_classifier_factory is not None:
            return self._text_classifier_factory(templates)
        raise ValueError(
            f"templates {templates!r} requested but this model was built with only "
            f"{self.templates!r} (no text_classifier_factory)"
        )

    def normalize_image(self, image: torch.Tensor) -> torch.Tensor:
        """``(3, H, W)`` uint8 image in ``input_format`` -> ``(3, H, W)`` float32 normalised RGB."""
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"expected a (3, H, W) image, got shape {tuple(image.shape)}")
        image = image.to(self.device, torch.float32)
        if self.input_format == "BGR":
            image = image.flip(0)
        return (image - self.pixel_mean) / self.pixel_std

    def normalize_images(self, batched_inputs: List[Dict]) -> ImageList:
        """Normalised RGB images of a batch, zero-padded (after normalisation) to a common
        size divisible by ``encoder.patch_size``: ``ImageList`` with ``.tensor (B, 3, H', W')``
        and ``.image_sizes`` the unpadded ``(H, W)``."""
        images = [self.normalize_image(x["image"]) for x in batched_inputs]
        return ImageList.from_tensors(images, int(self.encoder.patch_size))

    # ------------------------------------------------------------------ inference
    def encode_logits(self, images: torch.Tensor, text_emb: torch.Tensor,
                      attention_sink: Optional[List[torch.Tensor]] = None,
                      presence: Optional[Tuple[np.ndarray, Optional[torch.Tensor]]] = None) -> torch.Tensor:
        """``(N, 3, h, w)`` normalised windows -> ``(N, S, h/p, w/p)`` patch logits
        ``logit_scale * cosine(patch embedding, synonym embedding)`` (float32). With
        ``attention_sink`` (a list), the last block's attention of each window,
        ``(heads, T + h*w, T + h*w)`` float32 (``T`` = the encoder's prefix tokens), is
        appended to it. ``presence``: with ``OBJECT_PRESENCE`` on, the windows' image's
        :meth:`object_presence_context`; without it each window is its own image."""
        # the encoder casts the images to its own weights' dtype
        if attention_sink is None and self.tta_mode:
            return tta_logits(self.tta_mode, self.encoder, images, text_emb, self.logit_scale, self.tta_weight)
        kwargs = {}
        if getattr(getattr(self.encoder, "spec", None), "feedback", False):
            kwargs["feedback"] = lambda first: first_segmentation_prior(
                first, images, text_emb, self.logit_scale, self.feedback, int(self.encoder.patch_size),
                int(self.encoder.num_prefix_tokens))
        if getattr(self.encoder, "needs_text", False):  # a last block that classifies (FSA, proxy/fsa.py)
            kwargs["text_emb"] = text_emb
        if self.object_presence is not None:  # CASS's object-presence prompt (clip/object_presence.py)
            return self.logit_scale * self._object_presence_logits(images, text_emb, kwargs, presence)
        if self.cls_logit_product:  # CLIPtrase's VOC20 rule (modeling/cluster_vote.py)
            return encode_window_logits(self.encoder, images, text_emb, self.logit_scale, cls_product=True,
                                        feedback=kwargs.get("feedback"))[0]
        if self.feature_surgery:  # CLIP Surgery's text-side feature surgery (clip/surgery.py)
            tokens, grid, attn = self.encoder.forward_tokens(images, **kwargs)
            if attention_sink is not None:
                attention_sink.extend(attn.unbind(0))
            feats = F.normalize(self.encoder.dense_embedding(tokens, grid).float(), dim=1)
            cls = F.normalize(self.encoder.pooled_embedding(tokens).float(), dim=-1)
            return self.logit_scale * feature_surgery(torch.einsum("ndhw,sd->nshw", feats, text_emb),
                                                      cls @ text_emb.T, self.feature_surgery_scale)
        if attention_sink is None:
            feats = self.encoder(images, **kwargs)
        else:
            feats, attn = self.encoder(images, return_attention=True, **kwargs)
            attention_sink.extend(attn.unbind(0))
        feats = F.normalize(feats.float(), dim=1)
        return self.logit_scale * torch.einsum("ndhw,sd->nshw", feats, text_emb)

    def synonym_logits(self, image: torch.Tensor, text_emb: torch.Tensor,
                       attention_sink: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """``(3, H, W)`` normalised image -> ``(S, H, W)`` synonym logits at that size,
        whole-image or sliding-window per the config (``attention_sink``: see ``encode_logits``;
        windows are appended in ``window_grid`` order)."""
        presence = self.object_presence_context(image, text_emb)
        return dense_logits(
            image,
            lambda crops: self.encode_logits(crops, text_emb, attention_sink, presence),
            patch_size=int(self.encoder.patch_size),
            crop_size=self.crop_size if self.sliding_window else None,
            stride=self.stride if self.sliding_window else None,
            batch_size=self.window_batch_size,
            patch_remainder=self.patch_remainder,
        )

    def object_presence_context(self, image: torch.Tensor,
                                text_emb: torch.Tensor) -> Optional[Tuple[np.ndarray, Optional[torch.Tensor]]]:
        """What CASS's object-presence prompt needs once per image, passed to every window's
        :meth:`encode_logits` (``None`` when ``OBJECT_PRESENCE`` is off): the synonyms' cluster ids
        and, with ``GLOBAL image``, the unmodified tower's unit pooled embedding ``(1, D)`` of the
        whole ``(3, H, W)`` normalised image (``None`` with ``GLOBAL window``)."""
        if self.object_presence is None:
            return None
        clusters = text_clusters(text_emb, self.object_presence.cluster_threshold)
        if self._native_encoder is None:
            return clusters, None
        p = int(self._native_encoder.patch_size)
        h, w = image.shape[-2] // p * p, image.shape[-1] // p * p  # conv1 drops a partial patch
        tokens, _, _ = self._native_encoder.forward_tokens(image[None, :, :h, :w])
        return clusters, F.normalize(self._native_encoder.pooled_embedding(tokens).float(), dim=-1)

    def forward(self, batched_inputs: List[Dict]) -> List[Dict[str, torch.Tensor]]:
        """
        Args:
            batched_inputs: dicts with ``image`` (3, H, W) uint8, optional ``height``/``width``
                (output size; default the image size), and ``dataset_name`` or ``vocabulary``
                (+ optional ``background_index``). FG-OVD has its own META_ARCH,
                ``SparseCLIPFGOVD`` (``modeling/fgovd.py``).

        Returns:
            list of ``{"sem_seg": (C, height, width) float32}`` class scores, or of
            ``{"sem_seg_labels": (height, width) long}`` label maps for outputs whose scores
            would exceed ``TEST.SEM_SEG_SCORES_MAX_MB``.
        """
        if not batched_inputs:
            return []
        outputs = []
        with torch.no_grad():
            for x in batched_inputs:
                if self.cluster_vote is not None:  # CLIPtrase's cluster vote (modeling/cluster_vote.py)
                    outputs.append({"sem_seg_labels": self.cluster_vote_maps(x)[1]})
                    continue
                if getattr(self.encoder, "needs_regions", False):  # CorrCLIP (modeling/region_masks.py)
                    from .region_masks import corrclip_labels

                    outputs.append({"sem_seg_labels": corrclip_labels(self, x)})
                    continue
                sink: Optional[List[torch.Tensor]] = [] if self.attention_stats else None
                maps = self.score_maps(x, sink)
                num_classes, out_h, out_w = maps.shape
                if self.label_closing:
                    out = {"sem_seg_labels": close_labels(maps.labels(), self.label_closing)}
                elif num_classes * out_h * out_w * 4 <= self.max_scores_bytes:
                    out = {"sem_seg": maps.scores()}
                else:
                    # The (C, H, W) scores would exceed TEST.SEM_SEG_SCORES_MAX_MB: only the
                    # label map, computed in bands (the evaluator reads either).
                    if not self._warned_labels_only:
                        self._warned_labels_only = True
                        logger.info("output of %dx%d with %d classes: returning the label map "
                                    "'sem_seg_labels' instead of the %.0f MiB of scores "
                                    "(TEST.SEM_SEG_SCORES_MAX_MB = %.0f)", out_w, out_h, num_classes,
                                    num_classes * out_h * out_w * 4 / 2 ** 20,
                                    self.max_scores_bytes / 2 ** 20)
                    out = {"sem_seg_labels": maps.labels()}
                del maps
                if sink is not None:
                    out["attention"] = self.attention_record(sink, tuple(x["image"].shape[-2:]))
                outputs.append(out)
        return outputs

    def score_maps(self, x: Dict, attention_sink: Optional[List[torch.Tensor]] = None) -> ScoreMaps:
        """The class scores of one input at its output size (``height`` x ``width``) as a
        :class:`~sparseclip_d2.modeling.postprocess.ScoreMaps`: working-resolution logits
        from which the probabilities, the label map and the scores are computed in bands of
        output rows (no full-size ``(C, H, W)`` tensor unless asked for).
        ``attention_sink``: see :meth:`encode_logits`."""
        vocabulary, background_index = self._vocabulary(x)
        emb, class_index = self.text_classifier_for(vocabulary, background_index=background_index)
        image = self.normalize_image(x["image"])
        if self.label_propagation is not None:  # LPOSS / LPOSS+ (sparseclip_d2/propagation/)
            logits = self.propagated_logits(x["image"], image, emb)
            if self.label_propagation.settings.reduce_synonyms == "before_resize":
                # LPOSS's order (LABEL_PROPAGATION.REDUCE_SYNONYMS): the max over each class's synonym
                # logits at the working resolution (lposs_eval.py reduce_to_true_classes), then the resize
                logits = max_over_synonyms(logits, class_index, len(vocabulary), dim=0)
                class_index = torch.arange(len(vocabulary), device=logits.device)
        else:
            logits = self.synonym_logits(image, emb, attention_sink)
        out_h, out_w = int(x.get("height", image.shape[-2])), int(x.get("width", image.shape[-1]))
        if self.prob_threshold > 0 and background_index is None:
            self._warn_threshold_ignored(x)
        if self.pamr_steps:
            # As NACLIP's predict: the logits and the normalised image bilinearly resized to
            # the output size, then PAMR (linear in the logits, so the logit scale commutes
            # with it); the band-wise resize below is then the identity.
            logits = self.refine_pamr(image, logits, (out_h, out_w))
        return ScoreMaps(
            logits,
            class_index,
            len(vocabulary),
            prob_threshold=self.prob_threshold,
            area_threshold=self.area_threshold,
            background_index=background_index,
            out_size=(out_h, out_w),
        )

    def propagated_logits(self, raw: torch.Tensor, image: torch.Tensor, text_emb: torch.Tensor) -> torch.Tensor:
        """``(S, H, W)`` synonym logits of one image after label propagation (LPOSS / LPOSS+): the
        windows of :meth:`synonym_logits` encoded by :meth:`encode_logits` and the VFM, propagated
        jointly, merged by the same window loop; LPOSS+ then propagates over the pixels of ``raw``
        (the ``(3, H, W)`` uint8 input in ``input_format``, as RGB / 255)."""
        from .sliding_window import symmetric_pad, window_grid

        lp = self.label_propagation
        p = lp.window_multiple(int(self.encoder.patch_size))
        H, W = image.shape[-2:]
        crop = self.crop_size if self.sliding_window else None
        windows = window_grid(H, W, self.crop_size, self.stride) if self.sliding_window else [(0, H, 0, W)]
        wh, ww = windows[0][1] - windows[0][0], windows[0][3] - windows[0][2]
        pad = symmetric_pad(wh, ww, p) if self.patch_remainder == "pad_crop" else (0, 0, 0, 0)

        def dense(fn):
            return dense_logits(image, fn, patch_size=p, crop_size=crop, stride=self.stride if crop else None,
                                batch_size=self.window_batch_size, patch_remainder=self.patch_remainder)

        rgb = None
        if "pixel_lab" in lp.settings.stages:
            rgb = raw.to(self.device, torch.float32)
            rgb = (rgb.flip(0) if self.input_format == "BGR" else rgb) / 255.0
        presence = self.object_presence_context(image, text_emb)
        return lp(lambda crops: self.encode_logits(crops, text_emb, None, presence), dense, windows, (pad[2], pad[0]),
                  rgb, crop)

    def cluster_vote_maps(self, x: Dict) -> Tuple[ScoreMaps, torch.Tensor]:
        """``(score maps, (height, width) long labels)`` of one input with CLIPtrase's cluster
        vote: the whole image encoded once (block ``cluster_vote.layer``'s self-correlation from
        the same pass), the labels of the score maps' rules, then DBSCAN clusters and the vote
        (``modeling.cluster_vote``); the score maps are those before the vote."""
        from .sliding_window import symmetric_pad

        settings = self.cluster_vote
        vocabulary, background_index = self._vocabulary(x)
        emb, class_index = self.text_classifier_for(vocabulary, background_index=background_index)
        image = self.normalize_image(x["image"])
        p = int(self.encoder.patch_size)
        corr: List[torch.Tensor] = []

        def logits_fn(crops):
            feedback = None
            if getattr(getattr(self.encoder, "spec", None), "feedback", False):
                def feedback(first):
                    return first_segmentation_prior(first, crops, emb, self.logit_scale, self.feedback, p,
                                                    int(self.encoder.num_prefix_tokens))
            logits, c = encode_window_logits(self.encoder, crops, emb, self.logit_scale,
                                             cls_product=self.cls_logit_product, correlation_layer=settings.layer,
                                             feedback=feedback)
            corr.extend(c.unbind(0))
            return logits

        logits = dense_logits(image, logits_fn, patch_size=p, batch_size=1, patch_remainder="pad_crop")
        out_h, out_w = int(x.get("height", image.shape[-2])), int(x.get("width", image.shape[-1]))
        if self.pamr_steps:
            logits = self.refine_pamr(image, logits, (out_h, out_w))
        maps = ScoreMaps(logits, class_index, len(vocabulary), prob_threshold=self.prob_threshold,
                         area_threshold=self.area_threshold, background_index=background_index,
                         out_size=(out_h, out_w))
        labels = maps.labels()
        H, W = image.shape[-2:]
        pad = symmetric_pad(H, W, p)
        grid = ((H + pad[2] + pad[3]) // p, (W + pad[0] + pad[1]) // p)
        assignment = cluster_assignment(corr[0], grid, settings, (out_h, out_w), pad=pad, patch_size=p)
        if assignment is None:  # every patch is DBSCAN noise: the labels stay (as upstream)
            return maps, labels
        return maps, majority_vote(labels, assignment.to(labels.device))

    def _object_presence_logits(self, images: torch.Tensor, text_emb: torch.Tensor, kwargs,
                                presence: Optional[Tuple[np.ndarray, Optional[torch.Tensor]]]) -> torch.Tensor:
        """Cosine logits ``(N, S, h, w)`` of windows with CASS's object-presence adjustment (before
        the logit scale): the image embedding of ``presence`` (:meth:`object_presence_context`),
        or each window's own pooled embedding (``GLOBAL window``, or no ``presence``)."""
        clusters, glob = presence if presence is not None else (None, None)
        if self.object_presence.global_source == "window":
            tokens, grid, _ = self.encoder.forward_tokens(images, **kwargs)
            feats = self.encoder.dense_embedding(tokens, grid)
            glob = F.normalize(self.encoder.pooled_embedding(tokens).float(), dim=-1)
        else:
            feats = self.encoder(images, **kwargs)
        if clusters is None:
            clusters = text_clusters(text_emb, self.object_presence.cluster_threshold)
        elif len(clusters) != text_emb.shape[0]:
            raise ValueError(f"object-presence context of {len(clusters)} synonyms for {text_emb.shape[0]} text "
                             "embeddings: build it with object_presence_context(image, text_emb) of these texts")
        if glob is None:  # encode_logits called without an image's context: the windows are the images
            glob = F.normalize(self._native_pooled(images).float(), dim=-1)
        return object_presence_logits(F.normalize(feats.float(), dim=1), glob, text_emb, clusters,
                                      self.object_presence)

    def _native_pooled(self, images: torch.Tensor) -> torch.Tensor:
        tokens, _, _ = self._native_encoder.forward_tokens(images)
        return self._native_encoder.pooled_embedding(tokens)

    def refine_pamr(self, image: torch.Tensor, logits: torch.Tensor, out_size: Tuple[int, int]) -> torch.Tensor:
        """PAMR-refined ``(S, out_h, out_w)`` logits from ``(S, h, w)`` logits and the ``(3, h, w)``
        normalised image (both bilinearly resized to ``out_size`` first, ``align_corners=False``)."""
        size = (int(out_size[0]), int(out_size[1]))
        img = F.interpolate(image[None].float(), size=size, mode="bilinear", align_corners=False)
        full = F.interpolate(logits[None].float(), size=size, mode="bilinear", align_corners=False)
        return pamr(img, full, self.pamr_steps, self.pamr_dilations)[0]

    def attention_record(self, weights: List[torch.Tensor], image_size: Tuple[int, int]) -> Dict:
        """``output["attention"]`` for the attention-statistics evaluator (per-head weights of
        every window; statistics are averaged over heads there)."""
        spec = self.encoder.spec
        return attention_record(
            weights, image_size, int(self.encoder.patch_size),
            crop_size=self.crop_size if self.sliding_window else None,
            stride=self.stride if self.sliding_window else None,
            source=spec.source, sum_mode=spec.sum_mode,
            num_prefix_tokens=int(self.encoder.num_prefix_tokens), rows_sum=spec.rows_sum_to,
        )

    def _vocabulary(self, x: Dict) -> Tuple[List[str], Optional[int]]:
        if "vocabulary" in x:
            vocabulary = x["vocabulary"]
            if isinstance(vocabulary, str):
                raise ValueError(f"input 'vocabulary' must be a list of class names, got the string {vocabulary!r}")
            vocabulary = list(vocabulary)
            check_vocabulary(vocabulary, "input 'vocabulary'")
            return vocabulary, x.get("background_index")
        if "dataset_name" not in x:
            raise ValueError(
                "an input dict needs 'dataset_name' (a registered dataset with stuff_classes) or "
                f"'vocabulary' (list of class names); got keys {sorted(x)}"
            )
        meta = MetadataCatalog.get(x["dataset_name"])
        classes = meta.get("stuff_classes", None)
        if not classes:
            raise ValueError(f"dataset {x['dataset_name']!r} has no stuff_classes in its metadata")
        classes = list(classes)
        if self.class_names:
            return self._upstream_vocabulary(x["dataset_name"], meta, len(classes))
        check_vocabulary(classes, f"stuff_classes of dataset {x['dataset_name']!r}")
        return classes, meta.get("background_index", None)

    def _upstream_vocabulary(self, dataset_name: str, meta, num_classes: int) -> Tuple[List[str], Optional[int]]:
        """The ``class_names`` set's file for a dataset (its ``class_names_file`` metadata)."""
        key = meta.get("class_names_file", None)
        if not key:
            raise ValueError(
                f"MODEL.SPARSECLIP.CLASS_NAMES={self.class_names!r} but dataset {dataset_name!r} has no "
                "'class_names_file' in its metadata to say which upstream file matches it; use "
                "MODEL.SPARSECLIP.CLASS_NAMES '' for its own class names")
        classes = load_class_names(key, class_set=self.class_names)
        if len(classes) != num_classes:
            raise ValueError(
                f"the {self.class_names!r} class-name file {key!r} has {len(classes)} classes but dataset "
                f"{dataset_name!r} has {num_classes}")
        what = f"the {self.class_names!r} class names of {key!r}"
        if what not in self._checked_vocabularies:  # checked (and duplicates logged) once
            self._checked_vocabularies.add(what)
            check_vocabulary(classes, what, allow_duplicates=True)
        return classes, meta.get("background_index", None)

    def _warn_threshold_ignored(self, x: Dict) -> None:
        key = x.get("dataset_name", "<vocabulary>")
        if key not in self._warned_threshold:
            self._warned_threshold.add(key)
            logger.info(
                "PROB_THRESHOLD=%s not applied to %s: it has no background class.", self.prob_threshold, key
            )


def check_vocabulary(vocabulary: Sequence[str], what: str, allow_duplicates: bool = False) -> None:
    """Raise ``ValueError`` when a segmentation vocabulary is empty, has a class without a
    name, or names one synonym twice (case-insensitive, white space collapsed) - two classes
    with one name would tie and the second could never be predicted. With
    ``allow_duplicates`` (an upstream vocabulary kept as published) a duplicate is logged
    instead: the tie goes to the lower class index, as it does upstream."""
    if not vocabulary:
        raise ValueError(f"{what} is empty: give at least one class name")
    seen: Dict[str, int] = {}
    for c, name in enumerate(vocabulary):
        if not isinstance(name, str):
            raise ValueError(f"{what}: class {c} must be a string, got {name!r}")
        synonyms = [" ".join(p.split()) for p in split_class_name(name)]
        if not any(synonyms):
            raise ValueError(f"{what}: class {c} ({name!r}) has no name")
        for syn in filter(None, synonyms):
            key = syn.lower()
            if key in seen:
                where = "twice in class" if seen[key] == c else f"in class {seen[key]} ({vocabulary[seen[key]]!r}) and class"
                if allow_duplicates:
                    logger.warning("%s: duplicate name %r %s %d, kept as published (ties go to the lower "
                                   "class index)", what, syn, where, c)
                    continue
                raise ValueError(f"{what}: duplicate name {syn!r} {where} {c} ({name!r}); names must be unique")
            seen[key] = c

