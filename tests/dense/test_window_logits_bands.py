"""WindowLogits: the sliding-window logits kept as the windows' patch logits, rows made in bands.

Every band must be bit for bit the rows of the whole-image algorithm (written out here again, one
window at a time), and within float32 rounding of a float64 hand computation of the bilinear
upsampling; the band cache must never make more rows than a band."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.dense import windows
from sparseclip_d2.dense.windows import WindowLogits, dense_logits, symmetric_pad, window_grid, window_logits

PATCH = 4


def _fn_factory(channels: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(channels, 3, generator=g)

    def fn(crops):  # (N, 3, h, w) -> (N, K, h / 4, w / 4) patch logits
        return torch.einsum("kc,nchw->nkhw", weight, F.avg_pool2d(crops, PATCH))
    return fn


def _reference(image, fn, crop, stride, remainder):
    """The whole-image algorithm written out (float32): each window alone, all channels at once."""
    _, H, W = image.shape
    grid = window_grid(H, W, crop, stride)
    wh, ww = grid[0][1] - grid[0][0], grid[0][3] - grid[0][2]
    summed, count = None, torch.zeros(1, H, W)
    for (y1, y2, x1, x2) in grid:
        win = image[:, y1:y2, x1:x2][None]
        if remainder == "pad_crop":
            pad = symmetric_pad(wh, ww, PATCH)
            padded = F.pad(win, pad)
            up = F.interpolate(fn(padded), size=padded.shape[-2:], mode="bilinear", align_corners=False)
            up = up[:, :, pad[2]:pad[2] + wh, pad[0]:pad[0] + ww]
        elif remainder == "pad_corner":
            padded = F.pad(win, (0, (-ww) % PATCH, 0, (-wh) % PATCH))
            up = F.interpolate(fn(padded), size=(wh, ww), mode="bilinear", align_corners=False)
        else:  # truncate
            kept = win[:, :, :wh - wh % PATCH, :ww - ww % PATCH]
            up = F.interpolate(fn(kept), size=(wh, ww), mode="bilinear", align_corners=False)
        summed = torch.zeros(up.shape[1], H, W) if summed is None else summed
        summed[:, y1:y2, x1:x2] += up[0]
        count[:, y1:y2, x1:x2] += 1
    return summed / count


def _bilinear64(x: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Bilinear resize (align_corners=False, PyTorch's edge rule) of (K, h, w) in float64, by hand."""
    def axis(n_in, n_out):
        src = np.maximum((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(int), n_in - 1)
        i1 = np.minimum(i0 + 1, n_in - 1)
        return i0, i1, src - i0
    y0, y1, ly = axis(x.shape[1], out_h)
    x0, x1, lx = axis(x.shape[2], out_w)
    top = x[:, y0][:, :, x0] * (1 - lx) + x[:, y0][:, :, x1] * lx
    bottom = x[:, y1][:, :, x0] * (1 - lx) + x[:, y1][:, :, x1] * lx
    return top * (1 - ly)[:, None] + bottom * ly[:, None]


def _hand64(image, fn, crop, stride):
    """pad_crop sliding-window logits in float64 (patch logits from the same fn, then by hand)."""
    _, H, W = image.shape
    grid = window_grid(H, W, crop, stride)
    wh, ww = grid[0][1] - grid[0][0], grid[0][3] - grid[0][2]
    left, right, top, bottom = symmetric_pad(wh, ww, PATCH)
    summed, count = None, np.zeros((H, W))
    for (y1, y2, x1, x2) in grid:
        padded = F.pad(image[:, y1:y2, x1:x2][None], (left, right, top, bottom))
        patch = fn(padded)[0].double().numpy()
        up = _bilinear64(patch, wh + top + bottom, ww + left + right)[:, top:top + wh, left:left + ww]
        summed = np.zeros((patch.shape[0], H, W)) if summed is None else summed
        summed[:, y1:y2, x1:x2] += up
        count[y1:y2, x1:x2] += 1
    return summed / count


@pytest.mark.parametrize("remainder", ["pad_crop", "pad_corner", "truncate"])
@pytest.mark.parametrize("grouped", [False, True])
def test_every_band_is_bit_for_bit_the_rows_of_the_whole_image(monkeypatch, remainder, grouped):
    torch.manual_seed(0)
    image = torch.randn(3, 37, 45)
    fn = _fn_factory(150)  # 150 channels: groups of 64, 64, 22 when grouped
    expected = _reference(image, fn, 22, 9, remainder)
    if grouped:  # the large-vocabulary path: per window, groups of 64 channels
        monkeypatch.setattr(windows, "_UPSAMPLE_ELEMENTS", 100)
        monkeypatch.setattr(windows, "_UPSAMPLE_GROUP_ELEMENTS", 64 * 24 * 24)
    lazy = window_logits(image, fn, patch_size=PATCH, crop_size=22, stride=9, batch_size=1,
                         patch_remainder=remainder)
    assert isinstance(lazy, WindowLogits) and tuple(lazy.shape) == (150, 37, 45)
    assert torch.equal(lazy.full(), expected)
    for rows in (1, 5, 13):  # bands of 1, 5 and 13 rows, also bands cut inside every window
        got = torch.cat([lazy.rows(r, min(r + rows, 37)) for r in range(0, 37, rows)], dim=1)
        assert torch.equal(got, expected), rows
    assert torch.equal(lazy.rows(20, 21), expected[:, 20:21])  # one row in the middle
    assert torch.equal(dense_logits(image, fn, patch_size=PATCH, crop_size=22, stride=9, batch_size=1,
                                    patch_remainder=remainder), expected)


def test_batched_windows_bands_equal_the_batched_whole():
    # Several windows per upsampling call (the small-vocabulary path): the band makes the same
    # calls (whole batches), so its rows are those of the batched whole bit for bit.
    torch.manual_seed(1)
    image = torch.randn(3, 40, 52)
    fn = _fn_factory(7, seed=1)
    lazy = window_logits(image, fn, patch_size=PATCH, crop_size=24, stride=8, batch_size=3)
    whole = lazy.full()
    got = torch.cat([lazy.rows(r, min(r + 3, 40)) for r in range(0, 40, 3)], dim=1)
    assert torch.equal(got, whole)
    torch.testing.assert_close(whole, _reference(image, fn, 24, 8, "pad_crop"), rtol=0, atol=1e-6)


def test_bands_match_a_float64_hand_computation():
    torch.manual_seed(2)
    image = torch.randn(3, 30, 41)
    fn = _fn_factory(5, seed=2)
    lazy = window_logits(image, fn, patch_size=PATCH, crop_size=18, stride=7, batch_size=2, band_rows=4)
    got = torch.cat([lazy.band(r, min(r + 2, 30)) for r in range(0, 30, 2)], dim=1)
    np.testing.assert_allclose(got.double().numpy(), _hand64(image, fn, 18, 7), rtol=0, atol=2e-6)


def test_band_cache_makes_at_most_band_rows_and_walks_down(monkeypatch):
    torch.manual_seed(3)
    image = torch.randn(3, 33, 20)
    fn = _fn_factory(3, seed=3)
    monkeypatch.setattr(windows, "_ROW_BAND_ELEMENTS", 3 * 20 * 8)  # 8 rows of 3 x 20 per band
    lazy = window_logits(image, fn, patch_size=PATCH, crop_size=16, stride=8)
    assert lazy.band_rows == 8
    made = []
    rows = lazy.rows
    monkeypatch.setattr(lazy, "rows", lambda a, b: made.append((a, b)) or rows(a, b))
    whole = lazy.full()
    made.clear()
    for r in range(0, 32):  # overlapping 2-row requests walking down, as ScoreMaps reads them
        assert torch.equal(lazy.band(r, r + 2), whole[:, r:r + 2])
    assert made == [(0, 8), (7, 15), (14, 22), (21, 29), (28, 33)]
    assert all(b - a <= 8 for a, b in made)
    with pytest.raises(ValueError, match="outside the 33 rows"):
        lazy.rows(30, 34)


def test_inconsistent_channel_count_is_a_clear_error():
    calls = []

    def fn(crops):
        calls.append(1)
        return torch.zeros(crops.shape[0], 2 + len(calls), 4, 4)

    with pytest.raises(ValueError, match="returned 4 channels"):
        window_logits(torch.zeros(3, 16, 32), fn, patch_size=PATCH, crop_size=16, stride=16, batch_size=1)
