#!/usr/bin/env python
"""Open-vocabulary segmentation of your own images with sparseclip_d2 (training-free CLIP).

Examples:

  # one overlay + label map per image, vocabulary on the command line
  python tools/demo.py --input photo.jpg --classes "cat, dog, grass; lawn, sky" --output out/

  # a folder or a glob, the 21 VOC classes of a registered dataset, config overrides
  python tools/demo.py --config-file configs/demo.yaml --input "photos/*.jpg" \\
      --vocabulary sparseclip_voc21_val --output out/ --opts MODEL.DEVICE cpu INPUT.MIN_SIZE_TEST 336

  # one side-by-side figure per image: softmax vs alpha-entmax vs QQ + entmax vs SCLIP
  python tools/demo.py --input photo.jpg --vocabulary voc21 --output out/ \\
      --compare softmax entmax:1.2 qq:entmax:1.2 sclip

Vocabulary (--classes): COMMAS (or newlines) separate classes, SEMICOLONS separate the
synonyms of one class; the first synonym is the name shown. "cat, dog, grass; lawn, sky" is
4 classes, the third scored as the max over "grass" and "lawn". Empty entries and repeated
names are errors. --vocabulary takes a registered dataset (its metadata's stuff_classes and
background class, e.g. sparseclip_voc21_val, sparseclip_demo) or a class-name file shipped
with the package (voc21, context59, ade150, ...).

Outputs in --output (not a folder of the inputs), per input image STEM (names made unique
when stems repeat):
  STEM_overlay.png   the prediction over the photo: class names inside their segments (never
                     over the title, banner or legend), legend of predicted classes with
                     area %, same size as the photo
  STEM_labels.png    raw label map at the ORIGINAL image size: pixel value i = the i-th class
                     of the vocabulary (0-based, in the order given; see classes.txt);
                     8-bit PNG, 16-bit when the vocabulary has more than 256 classes
  STEM_probs.npy     (--save-probs) (C, H, W) float16 class probabilities at the original size:
                     per class the max over its synonyms of the softmax over all synonyms,
                     BEFORE the background rules; STEM_probs.json: the classes and the
                     post-processing the label map applied (area rule, probability threshold,
                     background class); STEM_probs.png: heat maps of the top classes
  classes.txt        one line per class: index, tab, class with its synonyms
With --compare: STEM_compare.png (input + one overlay panel per spec) and one label map per
spec, STEM_labels_SPEC.png (SPEC with non-alphanumerics replaced by "_"); with --save-probs
also STEM_probs_SPEC.npy / .json / .png per spec.
Large photos: labels, probabilities and overlays are computed in bands of rows, so memory
stays bounded (a 12 MP photo with 150 classes and --save-probs peaks near 2.1 GiB with
ViT-B/16 on a CPU; docs/reliability.md).

--compare SPEC syntax: colon-separated tokens, [BASE:]TOKEN[:TOKEN...]. BASE: a baseline
preset (clip, sclip, clearclip, naclip, maskclip) or cfg (the config file's attention);
default clip (QK softmax, full block). TOKENs: a normaliser (softmax, entmax, sparsemax,
random_matched; entmax/random_matched may be followed by the alpha: entmax:1.2), a score
source (qk, qq, kk, vv, identity, qq+kk, ...; the paper's qkv, qqv, kkv, vvv, v-only), or
key=value (alpha, t/temperature, layers, residual, ffn, prior, std/prior_std, sum_mode, seed).
E.g. softmax | entmax:1.2 | qq:entmax:1.2 | clearclip:entmax:1.5 | qq+kk:layers=2 | softmax:t=0.5
The CLIP model is built once; every spec wraps the same weights.

The CLIP weights come from MODEL.SPARSECLIP.CLIP.PRETRAINED (an open_clip tag such as
openai, a local checkpoint, or none). With none the weights are RANDOM: the tool still runs,
but says so in its log and on every image ("RANDOM WEIGHTS - not meaningful").
Runs on the GPU when there is one (MODEL.DEVICE cuda), else on the CPU.

The log shows what the run was given (config keys that differ from the defaults, weights,
vocabulary, method) and one line per image; --verbose adds the arguments. Mistakes (an
unknown config key, an --opts key without its value, an unwritable --output, an unknown
--vocabulary, a bad image) end the run with one "demo.py: error: ..." line and exit status 2;
Ctrl-C with one line (SPARSECLIP_TRACEBACK=1 shows the tracebacks).
"""
import argparse
import glob
import json
import logging
import os
import re
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..common.errors import run_cli
from ..common.io import atomic_write_json
from ..common.logs import console_level, quiet_library_imports
from ..common.outputs import OutputFolder, SkipBad

with quiet_library_imports():
    import detectron2.data  # noqa: F401
    import detectron2.modeling  # noqa: F401
from detectron2.utils.logger import setup_logger

from ..clip import AttentionSpec, parse_attention_specs
from ..data import display_name
from ..data.image_io import ImageReadError, read_image_rgb, parse_vocabulary
from ..predictor import Predictor, build_config, check_image_size, resolve_vocabulary as resolve_vocabulary_value
from ..user_config import changed_keys
from ..utils.overlays import (
    RANDOM_WEIGHTS_BANNER,
    class_colors,
    compare_figure,
    draw_overlay,
    probability_figure,
    label_map_dtype,
    save_label_map,
    save_png,
)

logger = logging.getLogger("sparseclip_d2.demo")

#: The packaged config the demo uses without --config-file (``configs/demo.yaml``).
DEFAULT_CONFIG = "demo"
# What a demo run writes; a folder holding such files but no manifest is refused (common/outputs.py).
DEMO_OUTPUTS = ("classes.txt", "results.json", "*_overlay.png", "*_labels*.png", "*_compare.png", "*_probs*")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".gif", ".ppm", ".pgm", ".pnm")


def get_parser() -> argparse.ArgumentParser:
    """The demo's command-line parser (the module docstring is its help text)."""
    head, _, rest = __doc__.partition("\n")
    parser = argparse.ArgumentParser(
        description=head, epilog=rest, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config-file", default=DEFAULT_CONFIG, metavar="FILE",
                        help="config file, or a packaged config name such as entmax_qq_l14 or baselines/sclip_b16 "
                             f"(default: {DEFAULT_CONFIG}, configs/{DEFAULT_CONFIG}.yaml)")
    parser.add_argument("--input", nargs="+", required=True, metavar="IMG",
                        help="image files, folders (their images, not recursive) or quoted glob patterns")
    parser.add_argument("--output", required=True, metavar="DIR", help="output folder (created)")
    vocab = parser.add_mutually_exclusive_group(required=True)
    vocab.add_argument("--classes", metavar="TEXT",
                       help='classes separated by commas, synonyms by semicolons: "cat, dog, grass; lawn, sky"')
    vocab.add_argument("--vocabulary", metavar="NAME",
                       help="a registered dataset (sparseclip_voc21_val, ...) or a packaged class-name file (voc21, ...)")
    parser.add_argument("--background", metavar="CLASS",
                        help="with --classes: the class (any of its names) that MODEL.SPARSECLIP.PROB_THRESHOLD "
                             "assigns to low-confidence pixels (default: no background rule)")
    parser.add_argument("--compare", nargs="+", metavar="SPEC",
                        help="one figure per image with one panel per attention spec (syntax below)")
    parser.add_argument("--save-probs", action="store_true", help="also write per-class probability maps")
    parser.add_argument("--skip-bad", action="store_true",
                        help="skip images that cannot be read (listed in OUTPUT/results.json and the log); "
                             "without it the first one stops the run, naming the file")
    parser.add_argument("--opacity", type=float, default=0.55, help="mask opacity of the overlays (default 0.55)")
    parser.add_argument("--verbose", action="store_true", help="also log the arguments and every library notice")
    parser.add_argument("--opts", default=[], nargs=argparse.REMAINDER, metavar="KEY VALUE",
                        help="config overrides as KEY VALUE pairs, e.g. MODEL.DEVICE cpu INPUT.MIN_SIZE_TEST 336")
    return parser


def setup_cfg(args):
    """Defaults + ``add_sparseclip_config`` + ``--config-file`` + ``--opts``, validated, device resolved."""
    return build_config(args.config_file, list(args.opts), opts_name="--opts")


def collect_inputs(items: Sequence[str]) -> List[str]:
    """Expand ``--input`` items (files, folders, glob patterns) into image paths, in order,
    without duplicates.

    Raises:
        FileNotFoundError: an item is neither an existing file or folder nor a pattern
            matching files, or a folder holds no image.
    """
    paths: List[str] = []
    for item in items:
        if os.path.isdir(item):
            found = sorted(os.path.join(item, f) for f in os.listdir(item)
                           if f.lower().endswith(IMAGE_EXTENSIONS) and not f.startswith(".")  # .hidden, macOS ._*
                           and os.path.isfile(os.path.join(item, f)))
            if not found:
                raise FileNotFoundError(f"input folder {item!r} holds no image ({', '.join(IMAGE_EXTENSIONS)})")
        elif os.path.isfile(item):
            found = [item]
        elif glob.has_magic(item):
            found = sorted(p for p in glob.glob(os.path.expanduser(item)) if os.path.isfile(p))
            if not found:
                raise FileNotFoundError(f"input pattern {item!r} matches no file")
        else:
            raise FileNotFoundError(f"input image not found: {item!r}")
        for p in found:
            if p not in paths:
                paths.append(p)
    return paths


def check_output_folder(output: str, items: Sequence[str], paths: Sequence[str]) -> None:
    """Refuse an ``--output`` folder that holds input images: the demo would write its PNGs
    among the photos and read them back as inputs on the next run.

    Raises:
        ValueError: naming the folder.
    """
    out = os.path.realpath(output)
    folders = {os.path.realpath(os.path.dirname(p) or ".") for p in paths}
    folders |= {os.path.realpath(i) for i in items if os.path.isdir(i)}
    if out in folders:
        raise ValueError(f"--output {output!r} is a folder of input images; its outputs would be read as "
                         f"inputs next time: choose another folder (e.g. {os.path.join(output, 'sparseclip_out')!r})")


def resolve_vocabulary(args) -> Tuple[List[str], Optional[int], str]:
    """The vocabulary of the run.

    Returns:
        ``(classes, background_index, source)``: class strings with comma-separated synonyms
        (the META_ARCH's format), the background class or None, and a description.

    Raises:
        ValueError: an empty or malformed ``--classes``, an unknown ``--vocabulary`` name, a
            dataset without ``stuff_classes``, or a ``--background`` that is not a class.
    """
    if args.classes is not None:
        try:
            classes, background = resolve_vocabulary_value(parse_vocabulary(args.classes), args.background)
        except ValueError as e:
            if str(e).startswith("background "):
                raise ValueError(f"--{e}") from None
            raise
        return classes, background, "--classes"
    if args.background:
        raise ValueError("--background goes with --classes; a --vocabulary brings its own background class")
    try:
        classes, background = resolve_vocabulary_value(args.vocabulary)
    except ValueError as e:
        raise ValueError(str(e).replace("unknown vocabulary ", "unknown --vocabulary ", 1)) from None
    return classes, background, f"vocabulary {args.vocabulary}"


def describe_attention(predictor: Predictor, spec: AttentionSpec) -> str:
    """The model's one line: its encoder's attention (a second backbone's encoder names its proxy),
    then the logit head and stages that are not the default (``SparseCLIP.describe``)."""
    return predictor.model.describe()


def build_predictors(cfg, specs: Sequence[Tuple[str, AttentionSpec]]) -> List[Predictor]:
    """One :class:`~sparseclip_d2.predictor.Predictor` per spec, all sharing ONE CLIP model
    (built once from ``cfg``; random weights drawn with torch seed ``cfg.SEED``)."""
    base = Predictor(cfg)
    out = []
    for text, spec in specs:
        try:
            out.append(base if spec == base.spec else base.variant(spec))
        except ValueError as e:
            raise ValueError(f"attention spec {text!r}: {e}") from e
    return out


class ProbabilityWriter:
    """Writes ``(C, H, W)`` float16 probabilities to a ``.npy`` file band by band (plain
    seek + write: neither the array nor a memory map of it is ever held in memory)."""

    def __init__(self, path: str, shape: Tuple[int, int, int]):
        self.path, self.shape = path, tuple(int(v) for v in shape)
        self._file = open(path, "wb")
        np.lib.format.write_array_header_2_0(
            self._file, {"descr": np.lib.format.dtype_to_descr(np.dtype("<f2")), "fortran_order": False,
                         "shape": self.shape})
        self._offset = self._file.tell()
        self._file.truncate(self._offset + 2 * int(np.prod(self.shape)))

    def write(self, r0: int, probs: np.ndarray) -> None:
        """Rows ``r0 : r0 + probs.shape[1]`` of every class, ``probs`` ``(C, rows, W)``."""
        c_total, h, w = self.shape
        for c in range(c_total):
            self._file.seek(self._offset + 2 * (c * h * w + r0 * w))
            self._file.write(np.ascontiguousarray(probs[c], dtype="<f2").tobytes())

    def close(self) -> None:
        self._file.close()


class Segmentation:
    """One model's result on one photo, gathered band by band from ``model.score_maps``:
    the label map at the original size, per-class mean probabilities, and probability
    thumbnails (every ``step``-th row and column, long side at most ``thumb_side``)."""

    def __init__(self, labels: np.ndarray, means: np.ndarray, thumbs: np.ndarray, rules: Dict):
        self.labels, self.means, self.thumbs, self.rules = labels, means, thumbs, rules


def segment(predictor: Predictor, inputs: Dict, *, probs_path: Optional[str] = None,
            thumb_side: int = 512) -> Segmentation:
    """Label map, probabilities (written to ``probs_path`` as float16 ``.npy`` when given)
    and probability thumbnails of one photo, computed in bands of output rows, so memory
    holds the working-resolution logits, one band and the (H, W) label map, never the
    (C, H, W) probabilities."""
    with torch.no_grad():
        result = predictor.predict_input(inputs)  # the model's one prediction path
        maps, voted = result.score_maps, result.labels
        num_classes, height, width = maps.shape
        labels = np.empty((height, width), dtype=label_map_dtype(num_classes))
        step = max(1, -(-max(height, width) // thumb_side))
        thumbs = np.zeros((num_classes, -(-height // step), -(-width // step)), dtype=np.float32)
        sums = np.zeros(num_classes, dtype=np.float64)
        writer = ProbabilityWriter(probs_path, maps.shape) if probs_path else None
        try:
            # Progress on large outputs (a 12 MP photo with 150 classes takes minutes on a CPU).
            bands = tqdm.tqdm(maps.bands(), total=maps.num_bands, desc="post-processing", unit="band",
                              disable=num_classes * height * width < 3e8, leave=False)
            for r0, r1, probs, band_labels in bands:
                labels[r0:r1] = band_labels.cpu().numpy()
                p = probs.cpu().numpy()
                sums += p.sum(axis=(1, 2), dtype=np.float64)
                first = (-r0) % step  # band rows on the thumbnail grid (multiples of step)
                if first < r1 - r0:
                    rows = p[:, first::step, ::step]
                    t0 = (r0 + first) // step
                    thumbs[:, t0:t0 + rows.shape[1]] = rows
                if writer is not None:
                    writer.write(r0, p)
                del probs, p
        finally:
            if writer is not None:
                writer.close()
        if voted is not None:  # the labels stages' map replaces the score maps' (as the model's forward)
            labels = voted.cpu().numpy().astype(labels.dtype)
        return Segmentation(labels, sums / float(height * width), thumbs, maps.rules())


def write_probability_metadata(path: str, probs_file: str, vocabulary: Sequence[str], shape, rules: Dict) -> str:
    """The JSON next to a ``STEM_probs*.npy``: what the array holds and which
    post-processing the label map applied on top of it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({
            "file": os.path.basename(probs_file),
            "shape": list(shape),
            "dtype": "float16",
            "content": "class probabilities at the original image size: for each class, the max over "
                       "its synonyms of the softmax over all synonyms (no background rule applied)",
            "classes": list(vocabulary),
            "label_map_postprocessing": rules,
        }, f, indent=2)
    return path


def unique_stems(paths: Sequence[str]) -> List[str]:
    """File stems, made unique (``name``, ``name_2``, ...) when several inputs share one."""
    out, used = [], set()
    for p in paths:
        stem = os.path.splitext(os.path.basename(p))[0] or "image"
        cand, k = stem, 1
        while cand in used:
            k += 1
            cand = f"{stem}_{k}"
        used.add(cand)
        out.append(cand)
    return out


def spec_slug(text: str) -> str:
    """A file-name-safe form of a spec string (``qq:entmax:1.2`` -> ``qq_entmax_1.2``)."""
    return re.sub(r"[^A-Za-z0-9.+=-]+", "_", text).strip("_") or "spec"


def process_image(path: str, stem: str, args, cfg, specs, predictors, vocabulary, background, names, colors,
                  banner, model_tag) -> List[str]:
    """All outputs of one photo (label maps, overlay or comparison figure, probabilities);
    returns the written files."""
    clip = cfg.MODEL.SPARSECLIP.CLIP
    t0 = time.perf_counter()
    image = read_image_rgb(path)
    check_image_size(image.shape[1], image.shape[0], path)
    inputs = predictors[0].prepare(image, vocabulary, background)
    inputs["file_name"] = path  # a side input (a region mask) is read by the image's file name
    image = predictors[0].output_frame(image)  # the label maps are of the centre crop, if any: so are the figures
    files = []
    out = lambda suffix: os.path.join(args.output, stem + suffix)  # noqa: E731
    label_maps, titles, slugs = [], [], set()
    for (text, spec), predictor in zip(specs, predictors):
        slug = "" if not args.compare else spec_slug(text)
        while args.compare and slug in slugs:
            slug += "_"
        slugs.add(slug)
        suffix = f"_{slug}" if slug else ""
        probs_file = out(f"_probs{suffix}.npy") if args.save_probs else None
        result = segment(predictor, inputs, probs_path=probs_file)
        files.append(save_label_map(result.labels, len(vocabulary), out(f"_labels{suffix}.png")))
        if args.save_probs:
            files.append(probs_file)
            files.append(write_probability_metadata(out(f"_probs{suffix}.json"), probs_file, vocabulary,
                                                    (len(vocabulary),) + result.labels.shape, result.rules))
            files.append(save_png(probability_figure(result.thumbs, names, means=result.means, banner=banner,
                                                     title=None if not args.compare else text),
                                  out(f"_probs{suffix}.png")))
        if not args.compare:
            title = f"{clip.NAME}: {describe_attention(predictor, spec)}"
            files.append(save_png(draw_overlay(image, result.labels, names, colors=colors, alpha=args.opacity,
                                               banner=banner, title=title), out("_overlay.png")))
        else:
            label_maps.append(result.labels)
            titles.append(f"{text}\n{describe_attention(predictor, spec)}")
        del result
    if args.compare:
        fig = compare_figure(image, label_maps, titles, names, colors=colors, banner=banner,
                             suptitle=f"{os.path.basename(path)} - {model_tag}")
        files.append(save_png(fig, out("_compare.png")))
    logger.info("%s: %dx%d, %.2fs -> %s", path, image.shape[1], image.shape[0], time.perf_counter() - t0,
                ", ".join(os.path.basename(f) for f in files))
    return files


def run(args) -> Dict[str, List[str]]:
    """Run the demo for parsed arguments. Returns ``{input path: [written files]}``."""
    cfg = setup_cfg(args)
    vocabulary, background, vocab_source = resolve_vocabulary(args)
    names = [display_name(c) for c in vocabulary]
    if args.compare:
        specs = parse_attention_specs(args.compare, AttentionSpec.from_config(cfg))
    else:
        spec = AttentionSpec.from_config(cfg)
        specs = [("cfg", spec)]
    paths = collect_inputs(args.input)
    check_output_folder(args.output, args.input, paths)
    folder = OutputFolder(args.output, "demo.py", stale_patterns=DEMO_OUTPUTS,  # one run at a time
                          option="--output").acquire()
    if not 0.0 <= args.opacity <= 1.0:
        raise ValueError(f"--opacity must be in [0, 1], got {args.opacity}")
    changed = changed_keys(cfg)
    logger.info("config %s; keys that differ from the defaults (%d): %s", args.config_file, len(changed),
                ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in changed))
    logger.info("vocabulary (%s): %d classes: %s%s", vocab_source, len(vocabulary), ", ".join(names),
                f"; background class {names[background]!r}" if background is not None else "")
    start = time.perf_counter()
    predictors = build_predictors(cfg, specs)
    logger.info("%d image(s); attention: %s", len(paths),
                "; ".join(f"{t} = {describe_attention(p, s)}" for (t, s), p in zip(specs, predictors)))
    random_weights = predictors[0].random_weights
    clip = cfg.MODEL.SPARSECLIP.CLIP
    logger.info("built %s (%s) with %d attention variant(s) on %s in %.1fs", clip.NAME, clip.PRETRAINED,
                len(predictors), cfg.MODEL.DEVICE, time.perf_counter() - start)
    banner = RANDOM_WEIGHTS_BANNER if random_weights else None
    if random_weights:  # the builder has warned once; every image carries the banner
        logger.info("random weights (MODEL.SPARSECLIP.CLIP.PRETRAINED=%r): every image is marked %r",
                    clip.PRETRAINED, RANDOM_WEIGHTS_BANNER)

    folder.begin({"vocabulary": list(vocabulary), "inputs": list(paths)})  # removes the earlier run's files
    with open(os.path.join(args.output, "classes.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{i}\t{c}\n" for i, c in enumerate(vocabulary))
    folder.record([os.path.join(args.output, "classes.txt")])
    skip = SkipBad(getattr(args, "skip_bad", False), (ImageReadError, FileNotFoundError), logger)
    colors = class_colors(len(vocabulary))
    model_tag = f"{clip.NAME} ({'random weights' if random_weights else clip.PRETRAINED}), short side {cfg.INPUT.MIN_SIZE_TEST}"
    written: Dict[str, List[str]] = {}
    with logging_redirect_tqdm(loggers=[logging.getLogger(), logging.getLogger("sparseclip_d2"),
                                        logging.getLogger("fvcore")]):  # log lines never split a bar
        for path, stem in tqdm.tqdm(list(zip(paths, unique_stems(paths))), disable=len(paths) < 2, desc="demo",
                                    unit="img"):
            with skip.guard(path):
                written[path] = process_image(path, stem, args, cfg, specs, predictors, vocabulary, background,
                                              names, colors, banner, model_tag)
                folder.record(written[path])
    skip.summary(len(paths))
    folder.record([atomic_write_json(os.path.join(args.output, "results.json"),
                                     {"vocabulary": list(vocabulary), "outputs": written, "skipped": skip.skipped,
                                      "random_weights": bool(random_weights)})])
    if random_weights:
        logger.info("random weights: the %d image(s) in %s show a random model, not the method", len(paths),
                    args.output)
    return written


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, List[str]]:
    """Parse ``argv`` (default ``sys.argv[1:]``), set up logging and run; errors propagate."""
    args = get_parser().parse_args(argv)
    setup_logger(name="fvcore")
    setup_logger(name="sparseclip_d2")
    console_level(("fvcore", "sparseclip_d2"), logging.DEBUG if args.verbose else logging.INFO)
    logger.debug("Arguments: %s", args)
    return run(args)


def cli_main() -> None:
    """The console entry point: bad input, vocabulary, spec or config give one error line and
    exit status 2, as train_net's user mistakes and argparse's usage errors do; Ctrl-C one
    line (``sparseclip_d2.common.errors.run_cli``)."""
    run_cli("demo.py", main, interrupted="the images finished so far are in --output (results.json is written "
                                         "at the end); run the same command again to redo them all")


if __name__ == "__main__":
    cli_main()
