"""dense_logits upsamples window logits in groups of channels (large vocabularies): the result is
bit for bit that of upsampling all channels at once, summing per window and dividing by the count."""
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.dense import windows
from sparseclip_d2.dense.windows import dense_logits, window_grid


def _reference(image, fn, patch, crop, stride, remainder):
    """The whole-vocabulary algorithm written out: every window's logits upsampled at once."""
    _, H, W = image.shape
    grid = window_grid(H, W, crop, stride)
    wh, ww = grid[0][1] - grid[0][0], grid[0][3] - grid[0][2]
    summed, count = None, torch.zeros(1, H, W)
    for (y1, y2, x1, x2) in grid:
        crop_img = image[:, y1:y2, x1:x2][None]
        if remainder == "pad_crop":
            pad = windows.symmetric_pad(wh, ww, patch)
            padded = F.pad(crop_img, pad)
            up = F.interpolate(fn(padded).float(), size=padded.shape[-2:], mode="bilinear", align_corners=False)
            up = up[:, :, pad[2]:pad[2] + wh, pad[0]:pad[0] + ww]
        else:  # pad_corner
            padded = F.pad(crop_img, (0, (-ww) % patch, 0, (-wh) % patch))
            up = F.interpolate(fn(padded).float(), size=(wh, ww), mode="bilinear", align_corners=False)
        summed = torch.zeros(up.shape[1], H, W) if summed is None else summed
        summed[:, y1:y2, x1:x2] += up[0]
        count[:, y1:y2, x1:x2] += 1
    return summed / count


@pytest.mark.parametrize("remainder", ["pad_crop", "pad_corner"])
def test_channel_groups_equal_one_upsampling(monkeypatch, remainder):
    torch.manual_seed(0)
    image = torch.randn(3, 37, 45)
    weight = torch.randn(150, 3)  # 150 "synonyms": groups of 64, 64, 22

    def fn(crops):  # (N, 3, h, w) -> (N, 29, h/4, w/4) patch logits
        pooled = F.avg_pool2d(crops, 4)
        return torch.einsum("kc,nchw->nkhw", weight, pooled)

    expected = _reference(image, fn, 4, 20, 9, remainder)
    monkeypatch.setattr(windows, "_UPSAMPLE_ELEMENTS", 100)  # always grouped
    monkeypatch.setattr(windows, "_UPSAMPLE_GROUP_ELEMENTS", 64 * 24 * 24)  # groups of 64 channels
    got = dense_logits(image, fn, patch_size=4, crop_size=20, stride=9, batch_size=1, patch_remainder=remainder)
    assert torch.equal(got, expected)
    # a batch of windows: grouped per window, within float32 rounding of the batched call
    got2 = dense_logits(image, fn, patch_size=4, crop_size=20, stride=9, batch_size=3, patch_remainder=remainder)
    torch.testing.assert_close(got2, expected, rtol=0, atol=1e-6)
    monkeypatch.setattr(windows, "_UPSAMPLE_ELEMENTS", 1 << 27)  # one call
    assert torch.equal(dense_logits(image, fn, patch_size=4, crop_size=20, stride=9, batch_size=1,
                                    patch_remainder=remainder), expected)
