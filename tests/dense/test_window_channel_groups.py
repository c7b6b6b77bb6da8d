"""dense_logits upsamples window logits in groups of channels (large vocabularies): the result is
bit for bit that of upsampling all channels at once, summing per window and dividing by the count."""
import pytest
import torch
import torch.nn.functional as F

from sparseclip_d2.dense import windows
from sparseclip_d2.dense.windows import dense_logits
from test_window_logits_bands import _reference  # the whole-image algorithm written out (patch 4)


@pytest.mark.parametrize("remainder", ["pad_crop", "pad_corner"])
def test_channel_groups_equal_one_upsampling(monkeypatch, remainder):
    torch.manual_seed(0)
    image = torch.randn(3, 37, 45)
    weight = torch.randn(150, 3)  # 150 "synonyms": groups of 64, 64, 22

    def fn(crops):  # (N, 3, h, w) -> (N, 29, h/4, w/4) patch logits
        pooled = F.avg_pool2d(crops, 4)
        return torch.einsum("kc,nchw->nkhw", weight, pooled)

    expected = _reference(image, fn, 20, 9, remainder)
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
