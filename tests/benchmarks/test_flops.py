"""The benchmark's FLOP counter, matmul peak and table arithmetic (sparseclip_d2/benchmarks/flops.py,
report.py) against hand counts on tiny cases."""
import itertools

import pytest
import torch

from sparseclip_d2.benchmarks import flops as F
from sparseclip_d2.benchmarks.report import add_rates, markdown_table, targets


def _count(fn):
    with torch.no_grad():
        out = F.count_flops(fn)
    assert "error" not in out, out
    return out


def test_linear_is_two_flops_per_multiply_add():
    """Linear 8 -> 4 on 3 rows: 3 * 8 * 4 = 96 multiply-adds = 192 FLOPs; its bias add is inside addmm."""
    lin, x = torch.nn.Linear(8, 4), torch.randn(3, 8)
    out = _count(lambda: lin(x))
    assert out["gflops"] * 1e9 == pytest.approx(192, rel=1e-12) and out["unsupported"] == {}


def test_matmul_einsum_and_baddbmm_by_hand():
    a, b, c = torch.randn(2, 3, 4), torch.randn(2, 4, 5), torch.randn(2, 3, 5)
    assert _count(lambda: a @ b)["gflops"] * 1e9 == pytest.approx(2 * 2 * 3 * 4 * 5, rel=1e-12)
    einsum = _count(lambda: torch.einsum("bij,bjk->bik", a, b))["gflops"]
    assert einsum * 1e9 == pytest.approx(2 * 2 * 3 * 4 * 5, rel=1e-12)
    assert _count(lambda: torch.baddbmm(c, a, b))["gflops"] * 1e9 == pytest.approx(2 * 2 * 3 * 4 * 5, rel=1e-12)


def test_convolution_by_hand():
    """Conv 3 -> 4, 3 x 3, padding 1 on 8 x 8: 4 * 3 * 9 multiply-adds per output pixel, 64 pixels."""
    conv, im = torch.nn.Conv2d(3, 4, 3, padding=1), torch.randn(1, 3, 8, 8)
    assert _count(lambda: conv(im))["gflops"] * 1e9 == pytest.approx(2 * 4 * 3 * 9 * 64, rel=1e-12)


def test_attention_kernels_by_hand():
    """SDPA: q k^T and attn v, L * S * (E + Ev) per (batch, head); nn.MultiheadAttention's fused path:
    the projections (L + 2 S) E^2 + L E^2 and 2 L S E."""
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 6)
    sdpa = _count(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert sdpa["gflops"] * 1e9 == pytest.approx(2 * (2 * 3) * 5 * 7 * (4 + 6), rel=1e-12)
    assert F.sdpa_macs([F._Value(q), F._Value(k), F._Value(v)], []) == 2 * 3 * 5 * 7 * (4 + 6)
    mha, x = torch.nn.MultiheadAttention(8, 2, batch_first=True).eval(), torch.randn(3, 5, 8)
    out = _count(lambda: mha(x, x, x, need_weights=False))
    assert out["gflops"] * 1e9 == pytest.approx(2 * 3 * ((5 + 2 * 5) * 64 + 2 * 5 * 5 * 8 + 5 * 64), rel=1e-12)


def test_composite_operators_under_inference_mode_are_counted_by_their_parts():
    """Under torch.inference_mode (CorrCLIP's upstream predict) aten::linear, aten::matmul,
    aten::layer_norm and SDPA reach the counter whole; their parts are counted as without it."""
    lin, norm, x = torch.nn.Linear(8, 4), torch.nn.LayerNorm(8), torch.randn(3, 8)
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    q, k, v = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 7, 4), torch.randn(2, 3, 7, 6)

    def run():
        lin(norm(x))
        a @ b
        torch.nn.functional.scaled_dot_product_attention(q, k, v)

    with torch.inference_mode():
        out = F.count_flops(run)
    # linear 3 * 8 * 4, layer norm fvcore's 5 per element (3 * 8), matmul 2 * 3 * 4 * 5, SDPA as above
    expected = 2 * (3 * 8 * 4 + 5 * 3 * 8 + 2 * 3 * 4 * 5 + (2 * 3) * 5 * 7 * (4 + 6))
    assert out["gflops"] * 1e9 == pytest.approx(expected, rel=1e-12)
    assert not any(op in out["unsupported"] for op in ("aten::linear", "aten::matmul", "aten::layer_norm",
                                                       "aten::scaled_dot_product_attention")), out


def test_uncounted_operators_are_named_and_data_movement_is_not():
    x = torch.randn(3, 8)
    out = _count(lambda: (torch.softmax(x, -1) + torch.from_numpy(x.numpy().copy())).exp().t().contiguous())
    assert out["gflops"] == 0
    assert out["unsupported"] == {"aten::_softmax": 1, "aten::add": 1, "aten::exp": 1}


def test_a_failing_call_gives_its_reason():
    def boom():
        raise ValueError("no such weights file")
    assert F.count_flops(boom) == {"error": "ValueError: no such weights file"}


def test_matmul_peak_is_the_best_product_over_its_time(monkeypatch):
    """A clock that advances 0.5 s per product except one of 0.25 s: the peak is 2 n^3 / 0.25 s."""
    ticks = itertools.accumulate([0.0, 0.5, 0.0, 0.25, 0.0, 0.5])  # start/stop pairs: 0.5, 0.25, 0.5 s
    monkeypatch.setattr(F.time, "perf_counter", lambda: next(ticks))
    assert F.matmul_flops(16) == 2 * 16 ** 3
    assert F.matmul_peak_gflops(1, n=16, reps=3) == pytest.approx(2 * 16 ** 3 / 0.25 / 1e9)
    monkeypatch.undo()
    real = F.matmul_peak_gflops(1, n=64, reps=2)
    assert 0 < real < 1e5 and torch.get_num_threads() >= 1
    with pytest.raises(ValueError, match="at least 1"):
        F.matmul_peak_gflops(0)


def test_rates_share_of_peak_and_targets_by_hand():
    row = dict(method="m", config="m.yaml", input="8x8", project_s=2.0, upstream_s=4.0, ratio=0.5,
               project_peak_rss_mib=100, upstream_peak_rss_mib=120, rss_ratio=100 / 120, threads=1,
               load_min=1.0, load_max=2.0, sliding=True,
               project_flops={"gflops": 10.0, "unsupported": {}}, upstream_flops={"error": "X: y"})
    add_rates([row], peak_gflops_s=20.0)
    assert row["project_gflops_s"] == 5.0 and row["project_peak_share"] == 0.25
    assert row["upstream_gflops"] is None and row["upstream_peak_share"] is None
    assert targets(row) == "time met (<= 0.7), RSS met"
    row.update(ratio=0.75, rss_ratio=1.2)
    assert targets(row) == "time MISSED (<= 0.7), RSS MISSED"
    table = markdown_table([row])
    assert "| 10.0 / not countable (below) | 5.0 / - | 25.0/- |" in table


def test_the_doc_keeps_its_hand_written_notes(tmp_path):
    """--doc rewrites the table and keeps the text from the notes marker on."""
    from sparseclip_d2.benchmarks.report import NOTES_MARKER, write_doc

    row = dict(method="m", config="m.yaml", input="8x8", project_s=2.0, upstream_s=4.0, ratio=0.5,
               project_peak_rss_mib=100, upstream_peak_rss_mib=120, rss_ratio=100 / 120, threads=1,
               load_min=1.0, load_max=2.0, sliding=False, project_flops={"gflops": 10.0, "unsupported": {"aten::exp": 2}},
               upstream_flops=None)
    add_rates([row], 20.0)
    doc = tmp_path / "efficiency.md"
    doc.write_text("old table\n" + NOTES_MARKER + "\nwhy GEM misses\n")
    write_doc(str(doc), [row], [18.0, 20.0], 1, "python tools/benchmark_methods.py --doc x")
    text = doc.read_text()
    assert "old table" not in text and text.endswith(NOTES_MARKER + "\nwhy GEM misses\n")
    assert "18.0 and 20.0 GFLOP/s" in text and "| 2.00 / 4.00 | 0.50 |" in text and "`exp` x2" in text
