"""The attention row under a pixel (``sparseclip_d2/analysis/patch_attention.py``) with a
sliding window, on a record written here by hand: which window and token a pixel lands in,
and where the row's map is placed (the app's test covers whole-image inference)."""
import numpy as np
import pytest
import torch

from sparseclip_d2.analysis.patch_attention import attention_at, query_token


def record():
    # A 50x61 resized image, patch 16, two 50x40 windows at x 0..40 and 21..61: each pads to
    # 64x48 (symmetric_pad: 7 px top and bottom, 4 px left and right), a 4x3 grid after 1 CLS token.
    g = torch.Generator().manual_seed(0)
    weights = [torch.rand(2, 13, 13, generator=g) for _ in range(2)]
    return {"image_size": (50, 61), "patch_size": 16, "boxes": [(0, 50, 0, 40), (0, 50, 21, 61)],
            "grids": [(4, 3), (4, 3)], "weights": weights, "num_prefix_tokens": 1}


def test_the_nearest_window_and_its_padded_grid():
    rec = record()
    # x = 30 is in both windows; window 0's centre (x 20) is nearer than window 1's (x 41).
    q = query_token(rec, 30, 10, (50, 61))
    assert (q["window"], q["patch"], q["token"]) == (0, ((10 + 7) // 16, (30 + 4) // 16), 1 + 1 * 3 + 2)
    q = query_token(rec, 35, 10, (50, 61))  # nearer window 1's centre
    assert (q["window"], q["patch"], q["token"]) == (1, (1, (35 - 21 + 4) // 16), 1 + 1 * 3 + 1)
    # A photo twice the size: pixel (61, 21) maps by its centre to (floor(61.5 / 2), floor(21.5 / 2)) = (30, 10).
    assert query_token(rec, 61, 21, (100, 122))["resized_xy"] == (30, 10)
    with pytest.raises(ValueError, match="outside the 122x100 photo"):
        query_token(rec, 122, 0, (100, 122))


def test_the_row_map_lies_on_its_window():
    rec = record()
    labels = np.zeros((50, 61), dtype=np.int64)
    labels[:, 30:] = 1
    a = attention_at(rec, labels, 35, 10)
    row = rec["weights"][1][:, a["query"]["token"], :].double()
    np.testing.assert_array_equal(a["row"], row.float().numpy())
    patch_means = (row / row.sum(-1, keepdim=True))[:, 1:].mean(0).reshape(4, 3).numpy()
    assert a["map"].shape == (50, 61) and not a["map"][:, :21].any()  # 0 left of window 1
    # Pixel (y, x) of window 1 is pixel (y + 7, x - 21 + 4) of its padded 64x48 grid.
    for y, x in ((0, 21), (8, 30), (49, 60), (25, 44)):
        assert a["map"][y, x] == pytest.approx(patch_means[(y + 7) // 16, (x - 21 + 4) // 16], abs=1e-12)
    assert a["num_tokens"] == 13 and 1 <= a["support"] <= 13 and 0 <= a["same_class_mass"] <= 1
