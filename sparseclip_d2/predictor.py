"""``Predictor``: image + vocabulary -> label map, probabilities and attention, from Python.

In the spirit of detectron2's ``DefaultPredictor``: built once from a config (a
``CfgNode``, a config file, or a packaged config name such as ``entmax_qq_l14``), it takes
images in any common form and size and a vocabulary with synonyms::

    from sparseclip_d2 import Predictor
    predictor = Predictor.from_config("entmax_qq_l14", weights="~/.cache/clip/ViT-L-14.pt")
    pred = predictor("photo.jpg", ["cat", "dog", ["grass", "lawn"], "sky"])
    pred.labels            # (H, W) int64 numpy class indices at the photo's size
    pred.probabilities()   # (C, H, W) float32 numpy class probabilities
    predictor("photo.jpg", "cat, dog, grass; lawn, sky")  # the demo's --classes text works too

Results are numpy arrays (``labels`` and ``probabilities()`` alike). Images with a side
below :data:`MIN_IMAGE_SIDE` px are refused (the app uses the same minimum). Mistakes in
the config (an unknown key, an override without its value), the image or the vocabulary
raise a ``ValueError`` / ``OSError`` whose message is one line naming the value and the fix
(:mod:`sparseclip_d2.common.errors`).

The image is resized as the test mapper does (``INPUT.MIN_SIZE_TEST`` / ``MAX_SIZE_TEST`` /
``INPUT.RESIZE_MODE``) and the prediction returned at its original size. The CLIP model is
built once; :meth:`Predictor.variant` gives predictors with another attention (a preset
such as ``sclip`` or a spec such as ``qq:entmax:1.2``) that share its weights and text
embeddings (the demo's ``--compare`` and the app are built on it).
"""
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from . import require_detectron2

require_detectron2("sparseclip_d2.predictor")

from .common.logs import quiet_library_imports  # noqa: E402

with quiet_library_imports():  # torch's FutureWarnings about detectron2's import-time torch.jit.script
    from detectron2.config import CfgNode, get_cfg  # noqa: E402
    from detectron2.data import DatasetCatalog, MetadataCatalog  # noqa: E402

from .clip import AttentionSpec, describe_spec, is_random_weights, parse_attention_specs  # noqa: E402
from .common.errors import unknown_name  # noqa: E402
from .common.synonyms import SYNONYM_SEPARATORS, split_class_name  # noqa: E402
from .config import add_sparseclip_config, check_sparseclip_config  # noqa: E402
from .data import available_class_name_files, display_name, load_class_names  # noqa: E402
from .data.image_io import parse_vocabulary, read_image_rgb, to_rgb_array  # noqa: E402
from .data.mapper import output_frame, test_augmentations  # noqa: E402
from .model_zoo import resolve_config_file  # noqa: E402
from .modeling import SparseCLIP, resolve_device  # noqa: E402
from .modeling.postprocess import ScoreMaps  # noqa: E402
from .user_config import merge_user_config  # noqa: E402

__all__ = ["Predictor", "Prediction", "build_config", "resolve_vocabulary", "to_rgb_image", "check_image_size",
           "MIN_IMAGE_SIDE"]

#: The smallest image side the Predictor, the demo and the app accept, in pixels: below it
#: a ViT sees less than one 16 px patch of real content, so the map would be an upsampled
#: guess (a 1x1 image gave a 1x1 map of one class).
MIN_IMAGE_SIDE = 16

logger = logging.getLogger(__name__)

ImageLike = Union[str, os.PathLike, np.ndarray, torch.Tensor, "PIL.Image.Image"]  # noqa: F821
VocabularyLike = Union[str, Sequence[Union[str, Sequence[str]]]]


def build_config(config: Union[str, os.PathLike, CfgNode, None] = "demo", opts: Sequence = (), *,
                 weights: Optional[str] = None, device: Optional[str] = None, opts_name: str = "opts") -> CfgNode:
    """A frozen, validated sparseclip_d2 config.

    Args:
        config: a ``CfgNode`` (used as is, after ``opts``), a config file, or a packaged
            config name (``entmax_qq_l14``, ``baselines/sclip_b16``; see
            :func:`sparseclip_d2.model_zoo.list_configs`).
        opts: overrides ``[KEY, VALUE, ...]`` merged last.
        weights: sets ``MODEL.SPARSECLIP.CLIP.PRETRAINED`` (a tag, a file such as
            ``~/.cache/clip/ViT-L-14.pt``, ``hf:/dir``, or ``none`` for random weights).
        device: sets ``MODEL.DEVICE`` (default: the config's, falling back to the CPU
            when it asks for CUDA and there is none).
        opts_name: how ``opts`` were given, in error messages (``--opts`` for the demo and the app).
    Raises:
        ConfigError (a ValueError): an unknown key (naming the closest), an override
            without its value, a value of the wrong type; FileNotFoundError: no such config.
    """
    if isinstance(config, CfgNode):
        cfg = config.clone()
        if "SPARSECLIP" not in cfg.MODEL:
            raise ValueError("the config has no MODEL.SPARSECLIP keys: build it with add_sparseclip_config(cfg)")
        cfg.defrost()
    else:
        cfg = get_cfg()
        add_sparseclip_config(cfg)
        merge_user_config(cfg, resolve_config_file(config if config is not None else "demo"))
    merge_user_config(cfg, None, list(opts), opts_name=opts_name)  # integer literals accepted for float keys
    if weights is not None:
        cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED = str(weights)
    if device is not None:
        cfg.MODEL.DEVICE = str(device)
    check_sparseclip_config(cfg)
    cfg.MODEL.DEVICE = resolve_device(cfg.MODEL.DEVICE)
    cfg.freeze()
    return cfg


def to_rgb_image(image: ImageLike, name: str = "<image>") -> np.ndarray:
    """Any supported image as ``(H, W, 3)`` uint8 RGB (float input 0-1 is rounded to 8 bits);
    see :func:`_rgb_array` for the forms. Raises ValueError for an image with a side below
    :data:`MIN_IMAGE_SIDE`."""
    rgb = _rgb_array(image, name)
    check_image_size(rgb.shape[1], rgb.shape[0], name)
    return rgb


def _rgb_array(image: ImageLike, name: str = "<image>") -> np.ndarray:
    """Any supported image as ``(H, W, 3)`` uint8 RGB (float input 0-1 is rounded to 8 bits).

    Accepts a file path (read with :func:`~sparseclip_d2.data.image_io.read_image_rgb`:
    EXIF orientation, grayscale, alpha, 16-bit handled), a PIL image, or an array / tensor
    ``(H, W)``, ``(H, W, 3)`` or a tensor ``(3, H, W)``: uint8 0-255 or float 0-1, RGB.

    Raises:
        ValueError / OSError naming the problem and the accepted forms.
    """
    if isinstance(image, (str, os.PathLike)):
        return read_image_rgb(os.fspath(image))
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover - Pillow is a dependency
        Image = None
    if Image is not None and isinstance(image, Image.Image):
        return to_rgb_array(image, name)
    if isinstance(image, torch.Tensor):
        arr = image.detach().cpu()
        if arr.dim() == 3 and arr.shape[0] in (1, 3) and arr.shape[-1] not in (1, 3):
            arr = arr.permute(1, 2, 0)
        arr = arr.numpy()
    elif isinstance(image, np.ndarray):
        arr = image
    else:
        raise ValueError(f"{name}: unsupported image type {type(image).__name__}; valid: a file path, a PIL image, "
                         "a numpy array or torch tensor (H, W[, 3]) / tensor (3, H, W), uint8 0-255 or float 0-1, RGB")
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3 or arr.shape[2] not in (1, 3):
        raise ValueError(f"{name}: image array of shape {tuple(arr.shape)}; valid: (H, W), (H, W, 3), or a tensor "
                         "(3, H, W) with RGB channels")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"{name}: empty image of shape {tuple(arr.shape)}")
    if arr.shape[2] == 1:
        arr = np.repeat(arr, 3, axis=2)
    if arr.dtype == np.uint8:
        return np.ascontiguousarray(arr)
    if np.issubdtype(arr.dtype, np.floating):
        if not np.isfinite(arr).all() or arr.min() < 0.0 or arr.max() > 1.0:
            raise ValueError(f"{name}: float image values must lie in [0, 1] (got [{np.nanmin(arr):.3g}, "
                             f"{np.nanmax(arr):.3g}]); pass uint8 0-255 or float 0-1")
        # Rounded to 8 bits: the resize and the model then see exactly what a saved photo gives.
        return np.ascontiguousarray(np.round(arr.astype(np.float64) * 255.0).astype(np.uint8))
    raise ValueError(f"{name}: image dtype {arr.dtype}; valid: uint8 (0-255) or float (0-1)")


def check_image_size(width: int, height: int, name: str = "<image>") -> None:
    """Raise ValueError when a side of a ``width`` x ``height`` image is below
    :data:`MIN_IMAGE_SIDE` (the Predictor, the demo and the app share this minimum)."""
    if min(int(width), int(height)) < MIN_IMAGE_SIDE:
        raise ValueError(f"{name} is {width}x{height} px: both sides must be at least {MIN_IMAGE_SIDE} px "
                         "(smaller than one ViT patch); upsample it or use a larger image")


def vocabulary_names() -> Tuple[List[str], List[str]]:
    """``(every vocabulary name, sparseclip_d2's own)``: the packaged class-name files and the
    registered segmentation datasets (those with ``stuff_classes``); ours are the files and
    the ``sparseclip_*`` datasets."""
    files = list(available_class_name_files())
    seg = sorted(d for d in DatasetCatalog.list() if MetadataCatalog.get(d).get("stuff_classes", None))
    return files + seg, files + [d for d in seg if d.startswith("sparseclip_")]


def unknown_vocabulary(name: str) -> str:
    """The message of a vocabulary name that is neither a class-name file nor a registered
    segmentation dataset (nearest names first, ours before detectron2's)."""
    names, ours = vocabulary_names()
    return unknown_name("vocabulary", name, names, ours=ours, ours_label="sparseclip_d2's",
                        others="detectron2 datasets",
                        fix="or classes as text, commas between classes and semicolons between synonyms "
                            "('cat, dog; puppy, sky'), or a list of class names")


def resolve_vocabulary(vocabulary: VocabularyLike, background: Optional[Union[int, str]] = None
                       ) -> Tuple[List[str], Optional[int]]:
    """``(classes, background_index)`` in the META_ARCH's format: one string per class with
    comma-separated synonyms (the first is the display name).

    Args:
        vocabulary: a list whose items are class names (``"cat"``), synonyms separated by
            ``,`` or ``;`` (``"grass, lawn"``, :mod:`sparseclip_d2.common.synonyms`) or lists of
            synonyms (``["grass", "lawn"]``); the demo's ``--classes`` text (``"cat, dog,
            grass; lawn"``: commas between classes, semicolons between synonyms,
            :func:`~sparseclip_d2.data.image_io.parse_vocabulary`); or the name of a
            registered segmentation dataset (``sparseclip_voc21_val``) or of a packaged
            class-name file (``voc21``, ``ade150``), which bring their background class.
        background: with classes: the class (index or any of its names) that
            ``MODEL.SPARSECLIP.PROB_THRESHOLD`` gives low-confidence pixels.
    Raises:
        ValueError: an empty vocabulary or class, an unknown name (naming the closest), a bad
            background.
    """
    if isinstance(vocabulary, str) and re.search(r"[,;\n]", vocabulary) and not (
            vocabulary.strip() in DatasetCatalog.list() or vocabulary.strip() in available_class_name_files()):
        vocabulary = parse_vocabulary(vocabulary)  # the demo's text: a string with separators is never a name
    if isinstance(vocabulary, str):
        if background is not None:
            raise ValueError("background goes with classes; a named vocabulary brings its own")
        name = vocabulary.strip()
        if name in DatasetCatalog.list():
            meta = MetadataCatalog.get(name)
            classes = meta.get("stuff_classes", None)
            if not classes:
                raise ValueError(f"dataset {name!r} has no stuff_classes in its metadata (not a segmentation dataset)")
            return list(classes), meta.get("background_index", None)
        if name in available_class_name_files():
            classes = load_class_names(name)
            return classes, (0 if display_name(classes[0]).lower() == "background" else None)
        raise ValueError(unknown_vocabulary(name))
    classes = []
    for i, item in enumerate(list(vocabulary)):
        if isinstance(item, str):
            synonyms = split_class_name(item)  # the one synonym rule: ';' or ',' inside a class
        elif isinstance(item, (list, tuple)) and all(isinstance(s, str) for s in item):
            synonyms = [s.strip() for s in item]
            if any(sep in s for s in synonyms for sep in SYNONYM_SEPARATORS):
                raise ValueError(f"vocabulary class {i}: a synonym may not contain a comma or semicolon ({item!r})")
        else:
            raise ValueError(f"vocabulary class {i}: {item!r} is neither a name nor a list of synonyms (strings)")
        if not synonyms or any(not s for s in synonyms):
            raise ValueError(f"vocabulary class {i} ({item!r}) has an empty name")
        classes.append(", ".join(synonyms))
    if not classes:
        raise ValueError("the vocabulary is empty: give at least one class name")
    index = None
    if background is not None:
        if isinstance(background, int) and not isinstance(background, bool):
            if not 0 <= background < len(classes):
                raise ValueError(f"background index {background} outside [0, {len(classes)})")
            index = background
        else:
            key = " ".join(str(background).split()).lower()
            matches = [i for i, c in enumerate(classes) if key in [s.lower() for s in split_class_name(c)]]
            if not matches:
                raise ValueError(f"background {background!r} is none of the classes: "
                                 f"{', '.join(display_name(c) for c in classes)}")
            index = matches[0]
    return classes, index


@dataclass
class Prediction:
    """One image's result.

    Every array it gives is a numpy array: ``labels`` and :meth:`probabilities`.

    Attributes:
        labels: ``(H, W)`` int64 numpy label map at the input's size (after the background
            rules): value ``i`` is ``classes[i]``.
        classes: the vocabulary, one string per class with comma-separated synonyms.
        names: display names (first synonym of each class).
        score_maps: the :class:`~sparseclip_d2.modeling.postprocess.ScoreMaps` behind it
            (band-wise probabilities for large images).
        attention: with ``attention=True``: the last block's attention record
            (``docs/diagnostics.md``: ``weights`` per window ``(heads, N, N)``, ``grids``,
            ``num_prefix_tokens``, ...), else ``None``.
        method: the attention spec text of the predictor that made it.
        random_weights: True when the CLIP weights are random (the numbers mean nothing).
    """

    labels: np.ndarray
    classes: List[str]
    names: List[str]
    score_maps: ScoreMaps = field(repr=False)
    attention: Optional[Dict] = field(default=None, repr=False)
    method: str = "cfg"
    random_weights: bool = False

    def probabilities(self) -> np.ndarray:
        """``(C, H, W)`` float32 numpy class probabilities at the input's size (a numpy array
        like :attr:`labels`): per class the max over its synonyms of the softmax over all
        synonyms, before the background rules."""
        c, h, w = self.score_maps.shape
        out = np.empty((c, h, w), dtype=np.float32)
        for r0, r1, probs, _ in self.score_maps.bands():
            out[:, r0:r1] = probs.float().cpu().numpy()
        return out

    def rules(self) -> Dict:
        """The post-processing the label map applied (area rule, threshold, background)."""
        return self.score_maps.rules()


class Predictor:
    """Dense open-vocabulary prediction with a frozen CLIP (see the module docstring).

    Args:
        cfg: a config from :func:`build_config` (frozen, validated).
        method: an attention spec replacing the config's (``"sclip"``,
            ``"qq:entmax:1.2"``, an :class:`~sparseclip_d2.clip.AttentionSpec`); ``None``
            keeps the config's.
    """

    def __init__(self, cfg: CfgNode, method: Union[None, str, AttentionSpec] = None, *, _base: "Predictor" = None):
        self.cfg = cfg
        self.input_format = cfg.INPUT.FORMAT
        config_spec = AttentionSpec.from_config(cfg)
        if method is None:
            self.method, spec = "cfg", config_spec
        elif isinstance(method, AttentionSpec):
            self.method, spec = describe_spec(method), method
        else:
            self.method, spec = parse_attention_specs([str(method)], config_spec)[0]
        self.spec = spec
        if _base is None:
            if is_random_weights(cfg.MODEL.SPARSECLIP.CLIP.PRETRAINED):
                seed = cfg.SEED if cfg.SEED >= 0 else 0
                torch.manual_seed(seed)  # reproducible random-weight predictions
                logger.info("random weights of %s drawn with torch seed %d (SEED)", cfg.MODEL.SPARSECLIP.CLIP.NAME, seed)
            self._kwargs = SparseCLIP.from_config(cfg)
            self._config_encoder = self._kwargs["encoder"]
        else:
            self._kwargs, self._config_encoder = _base._kwargs, _base._config_encoder
        base = self._config_encoder
        if spec == config_spec:
            encoder = base
        else:
            try:
                encoder = base.with_spec(spec)  # a second backbone's encoder keeps it (methods/proxyclip/encoder.py)
            except ValueError as e:
                raise ValueError(f"attention spec {self.method!r}: {e}") from e
        self.model = SparseCLIP(**dict(self._kwargs, encoder=encoder)).to(torch.device(cfg.MODEL.DEVICE))
        if _base is not None:
            self.model.share_text_cache(_base.model)  # one encoding of each vocabulary for all variants
        self.random_weights = bool(self._kwargs["random_weights"])
        self._augmentations = test_augmentations(cfg)

    @classmethod
    def from_config(cls, config: Union[str, os.PathLike, CfgNode, None] = "demo", *, weights: Optional[str] = None,
                    opts: Sequence = (), device: Optional[str] = None,
                    method: Union[None, str, AttentionSpec] = None) -> "Predictor":
        """Build from a config name / file / ``CfgNode`` (:func:`build_config`), optionally
        with other weights, overrides, device and attention ``method``."""
        return cls(build_config(config, opts, weights=weights, device=device), method)

    def variant(self, method: Union[str, AttentionSpec]) -> "Predictor":
        """A predictor with another attention that shares this one's CLIP weights and text
        classifier (nothing is rebuilt or copied)."""
        return Predictor(self.cfg, method, _base=self)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def describe(self) -> str:
        """``"<model name>: <attention>, <head and stages>"`` for titles and logs."""
        return f"{self.cfg.MODEL.SPARSECLIP.CLIP.NAME}: {self.model.describe()}"

    @property
    def records_attention(self) -> bool:
        """Whether ``attention=True`` gives an attention record (see ``SparseCLIP.records_attention``)."""
        return self.model.records_attention

    def prepare(self, image_rgb: np.ndarray, classes: Optional[List[str]] = None, background: Optional[int] = None,
                *, dataset_name: Optional[str] = None) -> Dict:
        """The META_ARCH input of one ``(H, W, 3)`` RGB photo: resized (or centre-cropped) as the test
        mapper does (``data.mapper.test_augmentations``), channels in ``INPUT.FORMAT``, output size
        = the original size (the crop's with ``INPUT.CENTER_CROP_TEST``); the vocabulary as
        ``classes`` (+ ``background``) or as a registered ``dataset_name``."""
        h, w = image_rgb.shape[:2]
        check_image_size(w, h, "image")
        image = image_rgb
        for aug in self._augmentations:
            image = aug.get_transform(image).apply_image(image)
        if int(self.cfg.INPUT.CENTER_CROP_TEST):
            h, w = image.shape[:2]
        short = min(image.shape[:2])
        min_size = self.cfg.INPUT.MIN_SIZE_TEST
        if short < min(min_size, min(h, w)) / 4:
            logger.warning(
                "%dx%d image (aspect ratio %.0f:1) is processed at %dx%d: INPUT.MAX_SIZE_TEST=%d caps the long "
                "side, so the short side is %d px instead of INPUT.MIN_SIZE_TEST=%d and the prediction is "
                "coarse; crop the image or raise INPUT.MAX_SIZE_TEST", w, h, max(h, w) / min(h, w),
                image.shape[1], image.shape[0], self.cfg.INPUT.MAX_SIZE_TEST, short, min_size)
        if self.input_format == "BGR":
            image = image[:, :, ::-1]
        tensor = torch.as_tensor(np.ascontiguousarray(image.transpose(2, 0, 1)))
        out = {"image": tensor, "height": h, "width": w}
        if dataset_name is not None:
            out["dataset_name"] = dataset_name
        else:
            out.update(vocabulary=classes, background_index=background)
        return out

    def output_frame(self, image_rgb: np.ndarray) -> np.ndarray:
        """The image a prediction's label map is aligned with (the centre crop, or the image)."""
        return output_frame(self.cfg, image_rgb)

    def predict_input(self, inputs: Dict, *, attention: bool = False):
        """The model's :meth:`~sparseclip_d2.modeling.SparseCLIP.predict` of one prepared input."""
        with torch.no_grad():
            return self.model.predict(inputs, attention=attention)

    def __call__(self, images: Union[ImageLike, Sequence[ImageLike]], vocabulary: VocabularyLike, *,
                 background: Optional[Union[int, str]] = None, attention: bool = False,
                 region_mask: Union[None, np.ndarray, torch.Tensor, Sequence] = None
                 ) -> Union[Prediction, List[Prediction]]:
        """Predict one image (returns a :class:`Prediction`) or a list of images (returns a
        list). The vocabulary's text embeddings are computed once and cached.

        Args:
            images: see :func:`to_rgb_image`; a ``list``/``tuple`` is a batch.
            vocabulary, background: see :func:`resolve_vocabulary` (a list, the demo's text
                ``"cat, dog; puppy"``, or a name); a registered dataset's name gives its classes
                as ``train_net`` does (``MODEL.SPARSECLIP.CLASS_NAMES`` applied).
            attention: also return the last block's attention record (None where the method's
                parts do not record one: :attr:`records_attention`).
            region_mask: the per-image region map of an encoder that needs one (CorrCLIP): an
                ``(H, W)`` integer map at the image's size (a list for a batch); by default it is read
                from ``MODEL.SPARSECLIP.PROXY.CORRCLIP.MASK_DIR`` by the image file's name.
        """
        classes, bg = resolve_vocabulary(vocabulary, background)
        dataset = vocabulary.strip() if isinstance(vocabulary, str) and vocabulary.strip() in DatasetCatalog.list() \
            else None
        batch = isinstance(images, (list, tuple))
        items = list(images) if batch else [images]
        if batch and not items:
            raise ValueError("an empty list of images")
        masks = self._region_masks(region_mask, len(items), batch)
        results = []
        for i, image in enumerate(items):
            label = image if isinstance(image, (str, os.PathLike)) else f"image {i}"
            rgb = to_rgb_image(image, str(label))
            inputs = self.prepare(rgb, classes, bg, dataset_name=dataset)
            if isinstance(image, (str, os.PathLike)):
                inputs["file_name"] = os.fspath(image)
            if masks[i] is not None:
                inputs["region_mask"] = torch.as_tensor(np.asarray(masks[i]))
            out = self.predict_input(inputs, attention=attention)
            used = out.vocabulary
            results.append(Prediction(labels=out.label_map().cpu().numpy(), classes=list(used),
                                      names=[display_name(c) for c in used], score_maps=out.score_maps,
                                      attention=out.attention, method=self.method, random_weights=self.random_weights))
        return results if batch else results[0]

    @staticmethod
    def _region_masks(region_mask, count: int, batch: bool) -> List:
        if region_mask is None:
            return [None] * count
        if not batch:
            return [region_mask]
        if not isinstance(region_mask, (list, tuple)) or len(region_mask) != count:
            raise ValueError(f"region_mask with a batch of {count} images must be a list of {count} (H, W) maps")
        return list(region_mask)
