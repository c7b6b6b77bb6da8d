"""Overlay text sized by the short side, and CJK class names drawn with a font that has
them (or a warning naming them)."""
import logging

import numpy as np
import pytest
from PIL import Image, ImageDraw

from sparseclip_d2.utils import overlays as vis
from sparseclip_d2.utils.overlays import RANDOM_WEIGHTS_BANNER, draw_overlay


def covered_rows(overlay, image):
    """Fraction of the rows of the top half where the overlay differs from the plain blend
    in more than half of the columns (banner / title bars span the width)."""
    diff = np.abs(overlay.astype(int) - image.astype(int)).sum(-1) > 0
    return float((diff.mean(1) > 0.5).mean())


def test_panorama_title_and_banner_stay_small():
    h, w = 100, 20000
    image = np.full((h, w, 3), 128, np.uint8)
    labels = np.zeros((h, w), np.int64)
    labels[:, w // 2:] = 1
    plain = draw_overlay(image, labels, ["sky", "sea"], alpha=0.0, legend=False, max_segment_labels=0)
    out = draw_overlay(image, labels, ["sky", "sea"], alpha=0.0, legend=False, max_segment_labels=0,
                       banner=RANDOM_WEIGHTS_BANNER, title="ViT-B-16: QK softmax, full block")
    # banner (full width) 1.2 x 9 px + padding; before: text from the long side, 92 % of the rows
    assert covered_rows(out, plain) < 0.25
    # an ordinary photo keeps its text size (2.8 % of the short side)
    photo = np.full((375, 500, 3), 128, np.uint8)
    lab = np.zeros((375, 500), np.int64)
    a = draw_overlay(photo, lab, ["sky"], alpha=0.0, legend=False, max_segment_labels=0, banner="X" * 3)
    band = (np.abs(a.astype(int) - 128).sum(-1) > 0).mean(1) > 0.99
    assert 14 <= int(band.sum()) <= 22  # 1.2 x 10.5 px text + 2 x 2 px padding


def _draws_like_a_box(path, ch, size=40):
    """True when ``ch`` drawn with the font at ``path`` equals the font's missing-glyph box."""
    font = vis._font(size, path=path)

    def render(text):
        im = Image.new("L", (3 * size, 2 * size))
        ImageDraw.Draw(im).text((5, 5), text, font=font, fill=255)
        return np.asarray(im)

    return np.array_equal(render(ch), render("\U000F0000"))  # a private-use code point no font has


def test_cjk_names_get_a_font_that_has_them_or_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(vis, "_font_warned", set())
    assert vis.font_path_for("sky grass") == vis._dejavu()
    with caplog.at_level(logging.WARNING, logger=vis.__name__):
        path = vis.font_path_for("猫 犬")
    if path != vis._dejavu():  # a CJK font is installed (scripts/setup.sh installs one)
        assert not _draws_like_a_box(path, "猫") and not caplog.records
    else:
        assert any("猫" in r.getMessage() and "fonts-wqy-microhei" in r.getMessage() for r in caplog.records)
    assert _draws_like_a_box(vis._dejavu(), "猫")  # what happened before: DejaVu has no CJK glyphs


def test_no_cjk_font_warns_once_naming_the_characters(caplog, monkeypatch):
    monkeypatch.setattr(vis, "_font_warned", set())
    monkeypatch.setattr(vis, "_candidate_fonts", lambda: [])
    image = np.zeros((64, 64, 3), np.uint8)
    labels = np.zeros((64, 64), np.int64)
    with caplog.at_level(logging.WARNING, logger=vis.__name__):
        draw_overlay(image, labels, ["猫"])
        draw_overlay(image, labels, ["猫"])
    lines = [r.getMessage() for r in caplog.records if r.name == vis.__name__]
    assert len(lines) == 1 and "'猫'" in lines[0] and "U+732B" in lines[0]


def test_wrap_to_width_by_hand():
    chars = len  # one unit per character
    assert vis.wrap_to_width("aa bb cc", chars, 5) == ["aa bb", "cc"]
    assert vis.wrap_to_width("aa bb cc", chars, 100) == ["aa bb cc"]
    assert vis.wrap_to_width("a\nbb cc dd", chars, 5) == ["a", "bb cc", "dd"]
    assert vis.wrap_to_width("abcdefgh ij", chars, 3) == ["abc", "def", "gh", "ij"]
    assert vis.wrap_to_width("x abcdefg", chars, 3) == ["x", "abc", "def", "g"]


def _title_box_columns(out, plain, rows):
    """Columns, within ``rows``, where the overlay is black and the plain blend is not."""
    black = (out[rows].astype(int).sum(-1) == 0) & (plain[rows].astype(int).sum(-1) > 0)
    return np.flatnonzero(black.any(0))


def test_long_title_wraps_inside_the_image():
    # GEM's description in the demo's title ran off the right edge of a 500 px photo.
    h, w = 375, 500
    image = np.full((h, w, 3), 200, np.uint8)
    labels = np.zeros((h, w), np.int64)
    kw = dict(alpha=0.0, legend=False, max_segment_labels=0)
    plain = draw_overlay(image, labels, ["sky"], **kw)
    title = ("ViT-B-16: GEM, self-self attention over q, k and v with the ensemble of the three paths, "
             "temperature 0.1 from the token count, two iterations of the geometry-aware block")
    out = draw_overlay(image, labels, ["sky"], title=title, **kw)
    cols = _title_box_columns(out, plain, slice(0, h // 2))
    assert cols.size and cols.max() < w - 2  # the box ends inside the image (before: column w - 1)
    rows = np.flatnonzero(((out.astype(int).sum(-1) == 0) & (plain.astype(int).sum(-1) > 0)).any(1))
    one = draw_overlay(image, labels, ["sky"], title="ViT-B-16: GEM", **kw)
    one_rows = np.flatnonzero(((one.astype(int).sum(-1) == 0) & (plain.astype(int).sum(-1) > 0)).any(1))
    assert rows.size > 1.5 * one_rows.size  # two lines or more (before: one line, cut at the edge)
    assert rows.max() < h // 2
