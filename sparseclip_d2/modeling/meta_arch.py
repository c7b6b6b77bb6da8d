"""``SparseCLIP``: training-free open-vocabulary semantic segmentation META_ARCH.

One pipeline of registered parts (``sparseclip_d2.methods``) per image; inputs are already
resized by the mapper to the working resolution:

normalise -> the side inputs the encoder declares (``input["region_mask"]`` ...) -> whole-image
or sliding-window windows (``sliding_window.dense_logits``), each through the encoder and the
*logit head* (cosine by default) -> *windows* stages (replace the window loop) -> *logits*
stages (PAMR) -> softmax over synonyms, max per class, background rules
(``postprocess.ScoreMaps``) -> *labels* stages (cluster vote, region vote, label closing).

:meth:`SparseCLIP.predict` is the one prediction path: ``forward``, the ``Predictor``, the demo
and the app all call it. The vocabulary comes from the input: ``vocabulary`` (list of class
names with comma-separated synonyms) or the ``stuff_classes`` of
``MetadataCatalog.get(dataset_name)`` (or the ``CLASS_NAMES`` set's file for it); text
classifiers are built once per (vocabulary, templates, device) and cached.

Other code reuses the parts:

- ``model.encoder``: the dense encoder (``(B, 3, H, W)`` normalised images -> ``(B, D, H/p, W/p)``);
- ``model.head`` / ``model.stages``: the logit head and the post-processing stages;
- ``model.clip_model``: the open_clip model (None when built from parts without it);
- ``model.text_classifier_for(vocabulary, templates=None)`` -> ``(emb (S, D), class_index (S,))``
  on ``model.device``;
- ``model.normalize_images(batched_inputs)`` -> a detectron2 ``ImageList`` of normalised RGB
  float images padded to a multiple of the patch size.
"""
import dataclasses
import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch import nn

from detectron2.config import configurable
from detectron2.data import MetadataCatalog
from detectron2.modeling import META_ARCH_REGISTRY
from detectron2.structures import ImageList

from ..data.image_io import check_input_format
from ..common.activity import active_record, report
from ..common.cache import LRUCache
from ..common.needs import Needs
from ..common.synonyms import split_class_name
from ..data.class_names import CLASS_NAME_SETS, load_class_names
from .attention_record import attention_record
from ..clip.definitions import load_definitions, mix_definitions
from .backbone import build_clip_parts
from ..dense.first_segmentation import FeedbackSettings, first_segmentation_prior
from ..methods import LOGIT_HEADS, SIDE_INPUTS, STAGE_KINDS, STAGES, ImageInputs, LogitHead, Stage, check_parts
from ..methods import plan_from_config
from ..methods.cosine import CosineHead
from .postprocess import ScoreMaps
from ..dense.windows import PATCH_REMAINDER_MODES, WindowLogits, window_logits
from ..clip.definitions import check_definition_options

__all__ = ["SparseCLIP", "PipelineOutput"]

logger = logging.getLogger(__name__)

TextClassifierFn = Callable[[List[str]], Tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass
class PipelineOutput:
    """What :meth:`SparseCLIP.predict` gives for one input.

    Fields:
        score_maps: the class scores before the labels stages (band-wise, ``postprocess.ScoreMaps``).
        labels: ``(H, W)`` long label map after the labels stages, or None when no labels stage
            ran (then it is ``score_maps.labels()``).
        attention: the attention record when asked for (``modeling.attention_record``), else None.
        vocabulary: the class names used.
    """

    score_maps: ScoreMaps
    labels: Optional[torch.Tensor]
    attention: Optional[Dict]
    vocabulary: List[str]

    def label_map(self) -> torch.Tensor:
        return self.labels if self.labels is not None else self.score_maps.labels()


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
        class_names: str = "",
        definitions: Optional[Sequence[Tuple[str, str]]] = None,
        definition_weight: float = 0.0,
        feedback: Optional[FeedbackSettings] = None,
        head: Optional[LogitHead] = None,
        stages: Sequence[Stage] = (),
        side_inputs: Optional[Dict[str, object]] = None,
    ):
        """
        Args:
            encoder: module with ``patch_size``, ``embed_dim`` and ``needs``
                (:class:`~sparseclip_d2.common.needs.Needs`) mapping ``(N, 3, h, w)`` normalised
                images (h, w multiples of ``patch_size``) to ``(N, D, h/p, w/p)`` patch embeddings
                (a ``DenseCLIPEncoder``).
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
            class_names: "" (the dataset's ``stuff_classes``) or an upstream class-name set
                (``sclip``, ``clearclip``, ``naclip``, ``maskclip``) whose file for the dataset's
                ``class_names_file`` replaces them.
            definitions, definition_weight: ``[(name, text)]`` class definitions (background
                excluded) mixed into the synonym embeddings (``clip.definitions``), or None.
            feedback: how the first segmentation of an encoder that needs one (ResCLIP's SFR) is
                made (``dense.first_segmentation``); None = ``FeedbackSettings()``.
            head: the logit head (``methods.LOGIT_HEADS``); None = the cosine head.
            stages: post-processing stages (``methods.STAGES``), run in ``STAGE_KINDS`` order.
            side_inputs: ``{name: SideInput}`` for the side inputs the encoder needs
                (``methods.SIDE_INPUTS``); missing ones are made with their defaults.
        """
        super().__init__()
        try:  # the contract of an encoder, checked once here
            encoder.patch_size, encoder.embed_dim, encoder.needs
        except AttributeError as e:
            raise ValueError(f"encoder {type(encoder).__name__} lacks an attribute of the encoder contract "
                             f"(patch_size, embed_dim, needs): {e}") from None
        check_input_format(input_format)
        if sliding_window and (crop_size <= 0 or stride <= 0 or window_batch_size <= 0):
            raise ValueError(
                f"TEST.SLIDING_WINDOW needs positive CROP_SIZE/STRIDE/BATCH_SIZE, got "
                f"{crop_size}/{stride}/{window_batch_size}"
            )
        if patch_remainder not in PATCH_REMAINDER_MODES:
            raise ValueError(f"MODEL.SPARSECLIP.PATCH_REMAINDER must be one of {', '.join(PATCH_REMAINDER_MODES)}, "
                             f"got {patch_remainder!r}")
        if attention_stats and patch_remainder != "pad_crop":
            raise ValueError(
                f"TEST.ATTENTION_STATS.ENABLED needs MODEL.SPARSECLIP.PATCH_REMAINDER pad_crop (the attention "
                f"record maps patches to pixels with symmetric padding), got {patch_remainder!r}")
        self.class_names = str(class_names or "")
        if self.class_names and self.class_names not in CLASS_NAME_SETS:
            raise ValueError(f"unknown MODEL.SPARSECLIP.CLASS_NAMES {self.class_names!r}; valid: '' (each "
                             f"dataset's packaged names), {', '.join(CLASS_NAME_SETS)}")
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
        self.patch_remainder = patch_remainder
        self.definitions = list(definitions) if definitions else None
        self.definition_weight = float(definition_weight)
        self.feedback = feedback if feedback is not None else FeedbackSettings()
        self.head = head if head is not None else CosineHead()
        ordered = sorted(stages, key=lambda st: STAGE_KINDS.index(st.kind))
        self.stages = nn.ModuleList(ordered)
        check_parts((encoder.needs, type(encoder).__name__), self.head, list(self.stages),
                    sliding_window=self.sliding_window, patch_remainder=patch_remainder,
                    attention_stats=self.attention_stats)
        self.needs = encoder.needs
        for st in self.stages:
            self.needs = self.needs | st.needs
        side_inputs = dict(side_inputs or {})
        for name in self.needs.side_inputs():
            if name not in side_inputs:
                side_inputs[name] = SIDE_INPUTS.get(name)()
        self.side_inputs = side_inputs
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean, dtype=torch.float32).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std, dtype=torch.float32).view(-1, 1, 1), False)
        self.eval()

    @classmethod
    def from_config(cls, cfg):
        sc = cfg.MODEL.SPARSECLIP
        feedback = FeedbackSettings.from_config(cfg)
        if not sc.FEEDBACK.ENABLED and feedback != FeedbackSettings():
            logger.warning("MODEL.SPARSECLIP.FEEDBACK.THRESHOLD/PAMR_*/CONNECTIVITY/SMOOTH_STD = %s change nothing: "
                           "MODEL.SPARSECLIP.FEEDBACK.ENABLED is False", feedback)
        check_definition_options(cfg)
        plan = plan_from_config(cfg)  # every part's keys and their combination, before the weights load
        parts = build_clip_parts(cfg)  # validates every user-facing value before the weights load
        clip_model, encoder = parts.clip_model, parts.encoder
        logit_scale = float(sc.LOGIT_SCALE)  # >= 0, checked by build_clip_parts
        if logit_scale == 0:
            logit_scale = float(clip_model.logit_scale.detach().float().exp())
        head = LOGIT_HEADS.get(plan.head).from_config(cfg, parts)
        stages = [STAGES.get(name).from_config(cfg, parts) for name, _ in plan.stages]
        side_inputs = {name: SIDE_INPUTS.get(name)(cfg) for name in encoder.needs.side_inputs()}
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
            "class_names": sc.CLASS_NAMES,
            "definitions": load_definitions(sc.TEXT.DEFINITIONS) if sc.TEXT.DEFINITIONS else None,
            "definition_weight": sc.TEXT.DEFINITION_WEIGHT,
            "feedback": feedback,
            "head": head,
            "stages": stages,
            "side_inputs": side_inputs,
        }

    @property
    def device(self) -> torch.device:
        return self.pixel_mean.device

    @property
    def records_attention(self) -> bool:
        """Whether :meth:`predict` can return the last block's attention record (the head and
        every stage record it)."""
        return bool(self.head.records_attention and all(st.records_attention for st in self.stages))

    @property
    def head_name(self) -> str:
        """The registered name of the logit head (``methods.LOGIT_HEADS``)."""
        return LOGIT_HEADS.name_of(self.head)

    def stage(self, name: str) -> Optional[Stage]:
        """The stage registered as ``name`` (``methods.STAGES``) if this model runs it, else None."""
        cls = STAGES.get(name)
        return next((st for st in self.stages if type(st) is cls), None)

    def describe(self) -> str:
        """One line: the encoder's attention, then the head and stages that are not the default."""
        parts = [self.encoder.describe()]
        parts += [d for d in [self.head.describe()] + [st.describe() for st in self.stages] if d]
        return ", ".join(parts)

    # ------------------------------------------------------------------ text
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
        key = (tuple(vocabulary), templates, str(self.device), background_index)

        def make() -> Tuple[torch.Tensor, torch.Tensor]:
            classifier = self.text_classifier(templates)
            emb, class_index = self.head.text_embeddings(classifier, list(vocabulary), background_index)
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

    # ------------------------------------------------------------------ images
    def normalize_image(self, image: torch.Tensor) -> torch.Tensor:
        """``(3, H, W)`` uint8 image in ``input_format`` -> ``(3, H, W)`` float32 normalised RGB."""
        if image.dim() != 3 or image.shape[0] != 3:
            raise ValueError(f"expected a (3, H, W) image, got shape {tuple(image.shape)}")
        image = image.to(self.device, torch.float32)
        if self.input_format == "BGR":
            image = image.flip(0)
        return (image - self.pixel_mean) / self.pixel_std

    def rgb01(self, image: torch.Tensor) -> torch.Tensor:
        """``(3, H, W)`` uint8 image in ``input_format`` -> ``(3, H, W)`` float32 RGB / 255."""
        rgb = image.to(self.device, torch.float32)
        return (rgb.flip(0) if self.input_format == "BGR" else rgb) / 255.0

    def normalize_images(self, batched_inputs: List[Dict]) -> ImageList:
        """Normalised RGB images of a batch, zero-padded (after normalisation) to a common
        size divisible by ``encoder.patch_size``: ``ImageList`` with ``.tensor (B, 3, H', W')``
        and ``.image_sizes`` the unpadded ``(H, W)``."""
        images = [self.normalize_image(x["image"]) for x in batched_inputs]
        return ImageList.from_tensors(images, int(self.encoder.patch_size))

    # ------------------------------------------------------------------ the pipeline
    def image_inputs(self, x: Dict) -> ImageInputs:
        """One input dict's vocabulary, text embeddings, normalised image, output size and the
        side inputs the encoder declares (:class:`~sparseclip_d2.methods.ImageInputs`)."""
        vocabulary, background_index = self._vocabulary(x)
        emb, class_index = self.text_classifier_for(vocabulary, background_index=background_index)
        image = self.normalize_image(x["image"])
        out_size = (int(x.get("height", image.shape[-2])), int(x.get("width", image.shape[-1])))
        inputs = ImageInputs(x, vocabulary, background_index, emb, class_index, image, out_size)
        for name, side in self.side_inputs.items():
            full = side.full(self, x, out_size).to(image.device)
            inputs.side_full[name] = full
            inputs.side[name] = side.working(full, tuple(image.shape[-2:]))
            if active_record() is not None:  # regions (or values) of the side input on this image
                n = int(full.unique().numel())
                report(f"side input {name}", n > 1, regions=n)
        return inputs

    def encoder_inputs(self, images: torch.Tensor, text_emb: torch.Tensor, side: Optional[torch.Tensor] = None,
                       windows: Optional[torch.Tensor] = None) -> Dict:
        """The encoder's keyword inputs for a batch of windows, from its declared ``needs``.
        ``windows``: the pixels the ``images`` stand for (``dense_logits``' ``windows``: the whole
        windows of truncated crops), at whose size and guided by which a first segmentation is
        made; None = ``images``."""
        needs: Needs = self.encoder.needs
        kwargs = {}
        if needs.first_segmentation:
            guide = images if windows is None else windows
            kwargs["feedback"] = lambda first: first_segmentation_prior(
                first, guide, text_emb, self.logit_scale, self.feedback, int(self.encoder.patch_size),
                int(self.encoder.num_prefix_tokens))
        if needs.text:
            kwargs["text_emb"] = text_emb
        if needs.whole_windows:
            kwargs["windows"] = images if windows is None else windows
        for name in needs.side_inputs():
            if side is None:
                raise ValueError(f"encoder {type(self.encoder).__name__} needs the side input {name!r} for its "
                                 f"windows: give input[{name!r}]")
            kwargs[self.side_inputs[name].encoder_keyword] = side
        return kwargs

    def window_logits_fn(self, inputs: ImageInputs, attention_sink: Optional[List[torch.Tensor]] = None):
        """``(crops[, side crops][, windows=]) -> (N, S, h/p, w/p)`` logits of windows of ``inputs``' image
        through the encoder and the head (the tapped block's self-correlation collected into
        ``inputs.correlation`` when a stage needs it)."""
        text_emb = inputs.text_emb
        layer = self.needs.correlation_layer
        if inputs.context is None:
            inputs.context = self.head.image_context(self, inputs.image, text_emb)

        def logits_fn(crops: torch.Tensor, side: Optional[torch.Tensor] = None,
                      windows: Optional[torch.Tensor] = None) -> torch.Tensor:
            kwargs = self.encoder_inputs(crops, text_emb, side, windows)
            report("windows", True, windows=int(crops.shape[0]), size=list(crops.shape[-2:]))
            if layer is not None:
                logits, corr = self.head.with_correlation(self, crops, text_emb, kwargs, layer)
                inputs.correlation.extend(corr.unbind(0))
                return logits
            return self.head(self, crops, text_emb, kwargs, attention_sink, inputs.context)

        return logits_fn

    def window_loop(self, inputs: ImageInputs, attention_sink: Optional[List[torch.Tensor]] = None, *,
                    banded: bool = False) -> Union[torch.Tensor, WindowLogits]:
        """``(S, H, W)`` synonym logits of ``inputs``' image at the working size: whole-image or
        sliding-window per the config, windows appended to ``attention_sink`` in ``window_grid`` order.
        ``banded``: as a :class:`~sparseclip_d2.dense.windows.WindowLogits` (the windows' patch
        logits, rows made in bands on demand, bit for bit those of the tensor)."""
        side_name = next(iter(self.side_inputs), None)
        side = inputs.side.get(side_name) if side_name is not None else None
        logits = window_logits(
            inputs.image,
            self.window_logits_fn(inputs, attention_sink),
            patch_size=int(self.encoder.patch_size),
            crop_size=self.crop_size if self.sliding_window else None,
            stride=self.stride if self.sliding_window else None,
            batch_size=self.window_batch_size,
            patch_remainder=self.patch_remainder,
            side=side,
            side_pad_value=self.side_inputs[side_name].pad_value if side_name is not None else 0,
            # a first segmentation is made on the whole window (truncated crops: the encoded part),
            # and an encoder may read it (CASS's second backbone)
            with_windows=bool(self.encoder.needs.first_segmentation or self.encoder.needs.whole_windows),
        )
        return logits if banded else logits.full()

    def working_logits(self, inputs: ImageInputs, attention_sink: Optional[List[torch.Tensor]] = None, *,
                       banded: bool = False) -> Tuple[Union[torch.Tensor, WindowLogits], torch.Tensor]:
        """``((S', H, W) logits at the working size, (S',) class of each row)``: the window loop, or
        the windows stage that replaces it (which may reduce the synonyms to classes). ``banded``:
        the logits may come as a ``WindowLogits`` (rows in bands, see :meth:`window_loop`)."""
        for st in self.stages:
            if st.kind == "windows":
                logits, class_index = st(self, inputs, self.window_logits_fn(inputs))
                break
        else:
            logits, class_index = self.window_loop(inputs, attention_sink, banded=True), inputs.class_index
        if not banded and isinstance(logits, WindowLogits):
            logits = logits.full()
        return logits, class_index

    def image_inputs_for(self, image: torch.Tensor, text_emb: torch.Tensor) -> ImageInputs:
        """:class:`~sparseclip_d2.methods.ImageInputs` of a ``(3, H, W)`` uint8 image (``input_format``)
        and ``(S, D)`` unit text embeddings, each synonym its own class (no side input): for
        :meth:`working_logits` outside :meth:`predict`."""
        normalised = self.normalize_image(image)
        vocabulary = [f"class {i}" for i in range(text_emb.shape[0])]
        return ImageInputs({"image": image}, vocabulary, None, text_emb,
                           torch.arange(text_emb.shape[0], device=text_emb.device), normalised,
                           tuple(normalised.shape[-2:]))

    def predict(self, x: Dict, *, attention: bool = False) -> PipelineOutput:
        """The one prediction path of one input dict (``image`` (3, H, W) uint8 at the working size,
        optional ``height`` / ``width``, ``dataset_name`` or ``vocabulary`` [+ ``background_index``,
        ``vocabulary_as_published``: a published list whose duplicate names are logged, not refused],
        and the side inputs the encoder needs such as ``region_mask``). ``attention``: also the last
        block's attention record (None when the head or a stage does not record it, see
        :attr:`records_attention`)."""
        inputs = self.image_inputs(x)
        recording = active_record() is not None
        if recording:
            self._report_remainder(tuple(inputs.image.shape[-2:]))
        sink: Optional[List[torch.Tensor]] = [] if attention and self.records_attention else None
        # Without a logits stage (which needs the whole tensor) the working logits stay the windows'
        # patch logits and ScoreMaps makes their rows band by band: no (S, h, w) tensor is held
        # (1.37 GB for ADE20K-847's 1281 synonyms at 448 x 597), the labels bit for bit the same.
        banded = not any(st.kind == "logits" for st in self.stages)
        logits, class_index = self.working_logits(inputs, sink, banded=banded)
        if self.prob_threshold > 0 and inputs.background_index is None:
            self._warn_threshold_ignored(x)
        for st in self.stages:
            if st.kind == "logits":
                before = logits
                logits = st(self, inputs, logits)
                if recording:
                    _report_logits_change(STAGES.name_of(st), before, logits)
        maps = ScoreMaps(logits, class_index, len(inputs.vocabulary), prob_threshold=self.prob_threshold,
                         area_threshold=self.area_threshold, background_index=inputs.background_index,
                         out_size=inputs.out_size)
        if recording and self.prob_threshold > 0 and inputs.background_index is not None:
            _report_threshold(maps, self.prob_threshold)
        if recording and self.area_threshold > 0:
            n = int(maps.suppressed().sum())
            report("area threshold", n > 0, suppressed_classes=n)
        labels = None
        for st in self.stages:
            if st.kind == "labels":
                before = maps.labels() if labels is None else labels
                labels = st(self, inputs, before)
                if recording:
                    changed = int((labels != before).sum())
                    report(STAGES.name_of(st), changed > 0, changed_pixels=changed)
        record = self.attention_record(sink, tuple(x["image"].shape[-2:])) if sink is not None else None
        return PipelineOutput(maps, labels, record, inputs.vocabulary)

    def _report_remainder(self, size: Tuple[int, int]) -> None:
        """Stage activity: the working size, its remainder modulo the patch (non-zero: the
        ``PATCH_REMAINDER`` path runs, padding or truncation) and the mode. A property of the
        input, not a stage of the method: never flagged flat."""
        p = int(self.encoder.patch_size)
        rem = [size[0] % p, size[1] % p]
        report("patch remainder", True, size=list(size), remainder=rem, mode=self.patch_remainder)

    def forward(self, batched_inputs: List[Dict]) -> List[Dict[str, torch.Tensor]]:
        """
        Args:
            batched_inputs: dicts as :meth:`predict` takes them. FG-OVD has its own META_ARCH,
                ``SparseCLIPFGOVD`` (``modeling/fgovd.py``).

        Returns:
            list of ``{"sem_seg": (C, height, width) float32}`` class scores, or of
            ``{"sem_seg_labels": (height, width) long}`` label maps after a labels stage or for
            outputs whose scores would exceed ``TEST.SEM_SEG_SCORES_MAX_MB``; with
            ``TEST.ATTENTION_STATS`` also ``"attention"``.
        """
        outputs = []
        with torch.no_grad():
            for x in batched_inputs:
                result = self.predict(x, attention=self.attention_stats)
                outputs.append(self._output(result))
        return outputs

    def _output(self, result: PipelineOutput) -> Dict:
        maps = result.score_maps
        num_classes, out_h, out_w = maps.shape
        if result.labels is not None:
            out = {"sem_seg_labels": result.labels}
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
                            num_classes * out_h * out_w * 4 / 2 ** 20, self.max_scores_bytes / 2 ** 20)
            out = {"sem_seg_labels": maps.labels()}
        if result.attention is not None:
            out["attention"] = result.attention
        return out

    # ------------------------------------------------------------------ pieces for tests and tools
    def score_maps(self, x: Dict) -> ScoreMaps:
        """The class scores of one input before the labels stages (:meth:`predict`'s ``score_maps``)."""
        return self.predict(x).score_maps

    def encode_logits(self, images: torch.Tensor, text_emb: torch.Tensor,
                      attention_sink: Optional[List[torch.Tensor]] = None, context=None) -> torch.Tensor:
        """``(N, 3, h, w)`` normalised windows -> ``(N, S, h/p, w/p)`` logits of the head (no side
        input); ``context``: the head's ``image_context`` of the windows' image (None: each window
        is its own image)."""
        kwargs = self.encoder_inputs(images, text_emb)
        return self.head(self, images, text_emb, kwargs, attention_sink, context)

    def synonym_logits(self, image: torch.Tensor, text_emb: torch.Tensor,
                       attention_sink: Optional[List[torch.Tensor]] = None) -> torch.Tensor:
        """``(3, H, W)`` normalised image -> ``(S, H, W)`` synonym logits of the window loop
        (no side input, no stage)."""
        inputs = ImageInputs({}, [], None, text_emb, torch.zeros(0), image, tuple(image.shape[-2:]))
        return self.window_loop(inputs, attention_sink)

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
            # ``vocabulary_as_published``: an upstream file given as it is (the agreement driver's
            # class file, which may name a word among the background words and as a class too),
            # its duplicates logged, the tie going to the lower class index as upstream's argmax
            check_vocabulary(vocabulary, "input 'vocabulary'", allow_duplicates=bool(x.get("vocabulary_as_published")))
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
        if self.class_names and meta.get("vocabulary_fixed_by", None):
            # a benchmark that fixes its class names (MESS): an upstream set has no file for it
            said = f"fixed vocabulary of {x['dataset_name']}"
            if said not in self._checked_vocabularies:  # said once per dataset
                self._checked_vocabularies.add(said)
                logger.info("MODEL.SPARSECLIP.CLASS_NAMES=%r not applied to %s: its class names are fixed by %s",
                            self.class_names, x["dataset_name"], meta.vocabulary_fixed_by)
        elif self.class_names:
            return self._upstream_vocabulary(x["dataset_name"], meta, len(classes))
        what = f"stuff_classes of dataset {x['dataset_name']!r}"
        if not meta.get("vocabulary_as_published", False):
            check_vocabulary(classes, what)
        elif what not in self._checked_vocabularies:  # a published list (ADE20K-847): duplicates logged once
            self._checked_vocabularies.add(what)
            check_vocabulary(classes, what, allow_duplicates=True)
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


def _report_logits_change(name: str, before: torch.Tensor, after: torch.Tensor) -> None:
    """Stage activity of a logits stage: pixels whose arg-max synonym it changed (``before``
    resized bilinearly to ``after``'s size when the stage resized)."""
    if before.shape[-2:] != after.shape[-2:]:
        before = torch.nn.functional.interpolate(before[None].float(), size=tuple(after.shape[-2:]),
                                                 mode="bilinear", align_corners=False)[0]
    changed = int((before.argmax(0) != after.argmax(0)).sum())
    report(name, changed > 0, changed_pixels=changed)


def _report_threshold(maps: ScoreMaps, threshold: float) -> None:
    """Stage activity of the probability threshold: pixels whose top class probability is below
    it (sent to the background) and above it; active when it sends some but not all pixels."""
    below = total = 0
    for r0, r1, probs, _ in maps.bands():
        best = probs.max(dim=0).values
        below += int((best < threshold).sum())
        total += best.numel()
    report("probability threshold", 0 < below < total, below=below, above=total - below)


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

