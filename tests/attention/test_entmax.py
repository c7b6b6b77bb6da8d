"""Exactness and shape handling of sparseclip_d2.attention.alpha_entmax.

Everything is checked against an independent float64 bisection reference (run to
convergence) and, where they apply, against torch.softmax and the entmax package.
Every test runs for both backends: the fused CPU kernel and the pure torch path
(``SPARSECLIP_ENTMAX_KERNEL=0``).  On Linux x86-64 with a C++ compiler the kernel must
build: a build failure fails the kernel tests instead of silently testing the fallback.
"""
import logging
import math
import platform
import shutil
import sys

import pytest
import torch

from sparseclip_d2.attention import _entmax_cpu
from sparseclip_d2.attention.entmax import alpha_entmax, entmax_backend

entmax = pytest.importorskip("entmax")

ATOL = 1e-5


def _kernel_must_build() -> bool:
    return (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")
            and shutil.which("c++") is not None)


@pytest.fixture(autouse=True, params=["cpu-kernel", "torch"])
def backend(request, monkeypatch):
    """Runs each test with the CPU kernel and with the pure torch path."""
    if request.param == "torch":
        monkeypatch.setenv(_entmax_cpu.ENV_VAR, "0")
    else:
        monkeypatch.setenv(_entmax_cpu.ENV_VAR, "1")
        if _kernel_must_build():
            _entmax_cpu.load_kernel(raise_errors=True)  # a broken build fails here
        elif _entmax_cpu.load_kernel() is None:
            pytest.skip("the CPU kernel cannot be built on this platform")
    assert entmax_backend() == request.param
    return request.param


def entmax_bisect_reference(x: torch.Tensor, alpha: float, dim: int = -1) -> torch.Tensor:
    """alpha-entmax by float64 bisection on the threshold, run to convergence.

    Independent of the implementation under test: p_i = [(alpha-1) x_i - tau]_+^(1/(alpha-1))
    with tau in [max - 1, max] (scaled formulation), 200 halvings of the bracket (far
    past float64 resolution).  x: any shape; returns float64 of x's shape.
    """
    z = x.double().movedim(dim, -1) * (alpha - 1.0)
    zmax = z.amax(-1, keepdim=True)
    lo, hi = zmax - 1.0, zmax.clone()
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        mass = torch.clamp(z - mid, min=0.0).pow(1.0 / (alpha - 1.0)).sum(-1, keepdim=True)
        lo = torch.where(mass >= 1.0, mid, lo)
        hi = torch.where(mass >= 1.0, hi, mid)
    p = torch.clamp(z - lo, min=0.0).pow(1.0 / (alpha - 1.0))
    p = p / p.sum(-1, keepdim=True)
    return p.movedim(-1, dim)


def assert_exact(p: torch.Tensor, ref: torch.Tensor, dim: int = -1, atol: float = ATOL):
    """max |p - ref| <= atol, rows sum to 1, exact zeros wherever the reference is zero."""
    assert p.shape == ref.shape
    diff = (p.double() - ref).abs().max().item()
    assert diff <= atol, f"max abs difference {diff:.3g} > {atol}"
    sums = p.double().sum(dim)
    assert (sums - 1).abs().max().item() <= atol
    assert bool((p[ref == 0] == 0).all()), "non-zero where the reference is exactly zero"


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("alpha", [1.05, 1.2, 1.33, 1.5, 1.8, 2.0])
@pytest.mark.parametrize("scale", [1.0, 3.0, 8.0])
def test_random_rows_match_reference(alpha, scale):
    x = torch.randn(2, 3, 9, 61, generator=_gen(1)) * scale
    assert_exact(alpha_entmax(x, alpha), entmax_bisect_reference(x, alpha))


@pytest.mark.parametrize("alpha", [1.1, 1.2, 1.5])
def test_attention_sized_rows(alpha):
    # A few rows of a 197-token attention map (ViT-B/16 at 224 px).
    x = torch.randn(1, 2, 20, 197, generator=_gen(2)) * 3
    assert_exact(alpha_entmax(x, alpha), entmax_bisect_reference(x, alpha))


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0])
def test_peaked_rows_are_one_hot(alpha):
    x = torch.randn(5, 50, generator=_gen(3))
    x[torch.arange(5), torch.arange(5) * 7] += 30.0
    p = alpha_entmax(x, alpha)
    assert_exact(p, entmax_bisect_reference(x, alpha))
    expected = torch.zeros_like(x)
    expected[torch.arange(5), torch.arange(5) * 7] = 1.0
    assert torch.equal(p, expected)


@pytest.mark.parametrize("alpha", [1.2, 1.5, 2.0])
def test_ties(alpha):
    x = torch.tensor([[2.0, 2.0, 2.0, 0.0, -1.0],
                      [0.5, 0.5, 0.5, 0.5, 0.5],
                      [3.0, 1.0, 3.0, 1.0, 3.0]])
    p = alpha_entmax(x, alpha)
    assert_exact(p, entmax_bisect_reference(x, alpha))
    torch.testing.assert_close(p[1], torch.full((5,), 0.2))
    assert torch.allclose(p[0, :3], p[0, :1].expand(3)) and torch.equal(p[2, 0], p[2, 2])


@pytest.mark.parametrize("alpha", [1.05, 1.5, 2.0])
def test_neg_inf_entries_are_exact_zeros(alpha):
    x = torch.randn(4, 30, generator=_gen(4))
    x[:, 1::3] = -math.inf
    x[2, 1:] = -math.inf  # only one finite entry
    p = alpha_entmax(x, alpha)
    assert bool((p[:, 1::3] == 0).all())
    assert p[2, 0] == 1.0
    assert not torch.isnan(p).any()
    assert_exact(p, entmax_bisect_reference(x.masked_fill(x.isinf(), -1e30), alpha))


@pytest.mark.parametrize("alpha", [1.0, 1.5, 2.0])
def test_all_neg_inf_row_raises(alpha):
    x = torch.randn(3, 8)
    x[1] = -math.inf
    with pytest.raises(ValueError, match="entirely -inf"):
        alpha_entmax(x, alpha)


def test_nan_or_pos_inf_raises():
    x = torch.randn(3, 8)
    x[0, 2] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        alpha_entmax(x, 1.5)
    x[0, 2] = math.inf
    with pytest.raises(ValueError, match="inf"):
        alpha_entmax(x, 1.5)


@pytest.mark.parametrize("alpha", [0.9, 2.5, -1.0, math.nan])
def test_alpha_out_of_range(alpha):
    with pytest.raises(ValueError, match=r"alpha must be in \[1, 2\], got " + str(alpha)):
        alpha_entmax(torch.randn(2, 4), alpha)


@pytest.mark.parametrize("alpha", [1.0, 1.2, 1.5, 2.0])
def test_rows_of_length_one(alpha):
    x = torch.randn(4, 3, 1, generator=_gen(5)) * 10
    assert torch.equal(alpha_entmax(x, alpha), torch.ones_like(x))


@pytest.mark.parametrize("dtype,atol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("alpha", [1.0, 1.2, 1.5, 2.0])
def test_half_inputs_computed_in_float32(dtype, atol, alpha):
    x = (torch.randn(3, 7, 45, generator=_gen(6)) * 3).to(dtype)
    p = alpha_entmax(x, alpha)
    assert p.dtype == dtype and p.shape == x.shape
    assert not torch.isnan(p).any()
    # Reference on the exact same (half-representable) values, rounded like the output.
    ref = entmax_bisect_reference(x.float(), alpha) if alpha > 1 else torch.softmax(
        x.double(), -1)
    assert (p.double() - ref).abs().max().item() <= atol
    assert torch.equal(p, ref.to(dtype)) or (p.double() - ref.to(dtype).double()).abs().max() \
        <= torch.finfo(dtype).eps


def test_alpha_one_is_softmax():
    x = torch.randn(4, 5, 33, generator=_gen(7)) * 3
    torch.testing.assert_close(alpha_entmax(x, 1.0), torch.softmax(x, -1))
    torch.testing.assert_close(alpha_entmax(x, 1, dim=1), torch.softmax(x, 1))


def test_alpha_15_is_entmax15_and_2_is_sparsemax():
    x = torch.randn(6, 4, 70, generator=_gen(8)) * 3
    p15 = alpha_entmax(x, 1.5)
    assert (p15 - entmax.entmax15(x, dim=-1)).abs().max() <= ATOL
    p2 = alpha_entmax(x, 2.0)
    assert (p2 - entmax.sparsemax(x, dim=-1)).abs().max() <= ATOL
    # Same supports as the sort-based exact algorithms.
    assert torch.equal(p15 > 0, entmax.entmax15(x, dim=-1) > 0)
    assert torch.equal(p2 > 0, entmax.sparsemax(x, dim=-1) > 0)


def test_matches_entmax_bisect():
    x = torch.randn(5, 40, generator=_gen(9)) * 2
    p = alpha_entmax(x, 1.3)
    ref = entmax.entmax_bisect(x.double(), alpha=1.3, dim=-1, n_iter=100)
    assert (p.double() - ref).abs().max() <= ATOL


def test_alpha_to_one_approaches_softmax():
    x = torch.randn(8, 50, generator=_gen(10)) * 2
    soft = torch.softmax(x.double(), -1)
    dists = []
    for alpha in [1.1, 1.01, 1.001, 1.0001]:
        p = alpha_entmax(x, alpha)
        assert_exact(p, entmax_bisect_reference(x, alpha))
        dists.append((p.double() - soft).abs().max().item())
    assert all(a > b for a, b in zip(dists, dists[1:])), dists
    assert dists[-1] < 1e-3


@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2])
def test_other_dims(dim):
    x = torch.randn(7, 9, 11, generator=_gen(11)) * 3
    p = alpha_entmax(x, 1.4, dim=dim)
    assert p.shape == x.shape and p.is_contiguous()
    assert_exact(p, entmax_bisect_reference(x, 1.4, dim=dim), dim=dim)
    expected = alpha_entmax(x.movedim(dim, -1).contiguous(), 1.4).movedim(-1, dim)
    torch.testing.assert_close(p, expected, rtol=0, atol=1e-7)


def test_non_contiguous_inputs():
    base = torch.randn(6, 40, 30, generator=_gen(12)) * 3
    for x in (base.transpose(1, 2), base[:, ::2, 1::3], base.permute(2, 0, 1)):
        assert not x.is_contiguous()
        p = alpha_entmax(x, 1.5)
        assert_exact(p, entmax_bisect_reference(x, 1.5))


def test_mixed_sparse_and_dense_rows():
    """Peaked rows take the compacted path, flat rows the full-length path."""
    x = torch.randn(40, 64, generator=_gen(13)) * 0.05  # flat rows: all candidates
    x[::2] *= 100.0  # spread rows: few candidates
    for alpha in [1.2, 1.5, 2.0]:
        assert_exact(alpha_entmax(x, alpha), entmax_bisect_reference(x, alpha))


def test_float64_input_and_large_exponent():
    x = torch.randn(3, 4, 50, generator=_gen(14), dtype=torch.float64) * 3
    p = alpha_entmax(x, 1.25)
    assert p.dtype == torch.float64
    assert_exact(p, entmax_bisect_reference(x, 1.25), atol=1e-9)
    # r = 1/(alpha-1) = 200 is solved in float64 even for float32 inputs.
    assert_exact(alpha_entmax(x.float(), 1.005), entmax_bisect_reference(x.float(), 1.005))


@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (2, 0, 4)])
def test_empty_tensors(shape):
    x = torch.randn(shape)
    assert alpha_entmax(x, 1.5).shape == x.shape


def test_non_float_input_raises():
    with pytest.raises(ValueError, match="floating-point"):
        alpha_entmax(torch.ones(2, 3, dtype=torch.long), 1.5)


def test_backend_dispatch(backend, monkeypatch):
    """CPU float32/16 inputs with alpha in (1, 2] reach the kernel; nothing else does."""
    calls = []
    real = _entmax_cpu.entmax_rows

    def spy(x2d, r):
        calls.append((tuple(x2d.shape), x2d.dtype, r))
        return real(x2d, r)

    monkeypatch.setattr(_entmax_cpu, "entmax_rows", spy)
    x = torch.randn(3, 5, 17, generator=_gen(15))
    alpha_entmax(x, 1.5)
    alpha_entmax(x.half(), 1.2, dim=1)
    alpha_entmax(x, 1.0)
    alpha_entmax(x.double(), 1.5)
    if backend == "torch":
        assert calls == []
    else:
        assert calls == [((15, 17), torch.float32, 2.0), ((51, 5), torch.float32, 5.0)]


@pytest.mark.parametrize("alpha", [1.2, 1.33, 1.5, 2.0])
@pytest.mark.parametrize("kind", ["randn*3", "peaked"])
def test_attention_map_785(alpha, kind):
    """Full rows of a 785-token map (ViT-B/16 at 448 px), as benchmarked."""
    g = _gen(16)
    x = torch.randn(1, 2, 64, 785, generator=g) * 3
    if kind == "peaked":
        x[..., torch.randint(0, 785, (64,), generator=g)] += 12.0
    assert_exact(alpha_entmax(x, alpha), entmax_bisect_reference(x, alpha))


@pytest.mark.parametrize("alpha", [1.05, 1.1, 1.2, 1.5])
@pytest.mark.parametrize("scale", [0.3, 1.0])
@pytest.mark.parametrize("length", [785, 1025])
def test_flat_rows(alpha, scale, length):
    """Flat (dense) rows where nearly every entry is a candidate, as in early ViT blocks."""
    x = torch.randn(1, 2, 24, length, generator=_gen(20)) * scale
    assert_exact(alpha_entmax(x, alpha), entmax_bisect_reference(x, alpha))


def test_backends_agree(backend):
    x = torch.randn(4, 6, 120, generator=_gen(17)) * 4
    x[0, :, ::5] = -math.inf
    for alpha in [1.05, 1.2, 1.5, 1.7, 2.0]:
        p = alpha_entmax(x, alpha, dim=-1)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(_entmax_cpu.ENV_VAR, "0")
            q = alpha_entmax(x, alpha, dim=-1)
        assert (p - q).abs().max() <= 2e-6
        assert torch.equal(p > 1e-6, q > 1e-6)


def test_error_in_one_row_of_many():
    x = torch.randn(50, 40, generator=_gen(18))
    x[37, 3] = math.nan
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        alpha_entmax(x, 1.2)
    x[11] = -math.inf  # the all -inf message wins, as in the torch path
    with pytest.raises(ValueError, match="entirely -inf"):
        alpha_entmax(x, 1.2)
    x = torch.randn(50, 40, generator=_gen(18))
    x[5, 0] = math.inf
    with pytest.raises(ValueError, match="NaN or \\+inf"):
        alpha_entmax(x, 2.0)


def test_kernel_build_failure_falls_back_once(monkeypatch, caplog, tmp_path):
    """A kernel that cannot be built logs one warning and leaves the torch path."""
    monkeypatch.setenv(_entmax_cpu.ENV_VAR, "1")
    monkeypatch.setattr(_entmax_cpu, "_module", None)
    monkeypatch.setattr(_entmax_cpu, "_failed", False)
    monkeypatch.setattr(_entmax_cpu, "_SOURCE", tmp_path / "missing.cpp")
    x = torch.randn(6, 33, generator=_gen(19)) * 3
    with caplog.at_level(logging.WARNING, logger=_entmax_cpu.__name__):
        p1 = alpha_entmax(x, 1.5)
        p2 = alpha_entmax(x, 1.2)
        assert entmax_backend() == "torch"
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "unavailable" in warnings[0].getMessage()
    assert_exact(p1, entmax_bisect_reference(x, 1.5))
    assert_exact(p2, entmax_bisect_reference(x, 1.2))
    with pytest.raises(FileNotFoundError):
        _entmax_cpu.load_kernel(raise_errors=True)
