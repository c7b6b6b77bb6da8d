"""Gradients of sparseclip_d2.attention.alpha_entmax on both backends.

The closed-form backward is checked three independent ways: torch.autograd.gradcheck
(finite differences of our own float64 forward), central finite differences of the float64
bisection reference of tests/attention/test_entmax.py, and the entmax package's autograd
(``entmax_bisect`` / ``sparsemax``).  The CPU kernel computes float32 forwards only; its
gradients must equal the float64 torch path's to float32 accuracy, and must exist: a
result that requires grad but has no ``grad_fn`` (zero gradients, silently) is the bug
this file guards against.
"""
import pytest
import torch

from sparseclip_d2.attention import _entmax_cpu
from sparseclip_d2.attention.entmax import alpha_entmax, entmax_backend

from test_entmax import _kernel_must_build, entmax_bisect_reference

entmax = pytest.importorskip("entmax")

ALPHAS = [1.1, 1.2, 1.5, 1.8, 2.0]


@pytest.fixture(params=["cpu-kernel", "torch"])
def backend(request, monkeypatch):
    monkeypatch.setenv(_entmax_cpu.ENV_VAR, "0" if request.param == "torch" else "1")
    if request.param == "cpu-kernel":
        if _kernel_must_build():
            _entmax_cpu.load_kernel(raise_errors=True)
        elif _entmax_cpu.load_kernel() is None:
            pytest.skip("the CPU kernel cannot be built on this platform")
    assert entmax_backend() == request.param
    return request.param


def _scores(shape, seed=0, scale=3.0, dtype=torch.float64):
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale).to(dtype)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_gradcheck_float64(alpha, monkeypatch):
    monkeypatch.setenv(_entmax_cpu.ENV_VAR, "0")
    x = _scores((3, 7), seed=1).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: alpha_entmax(t, alpha, dim=-1), (x,), eps=1e-6, atol=1e-5)
    y = _scores((4, 5, 2), seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: alpha_entmax(t, alpha, dim=1), (y,), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_backward_matches_finite_differences_of_bisection(alpha, monkeypatch):
    """J^T v from our backward == central differences of the independent bisection forward."""
    monkeypatch.setenv(_entmax_cpu.ENV_VAR, "0")
    x = _scores((2, 6), seed=3)
    v = _scores((2, 6), seed=4, scale=1.0)
    xg = x.clone().requires_grad_()
    (alpha_entmax(xg, alpha) * v).sum().backward()
    eps = 1e-6
    fd = torch.zeros_like(x)
    for idx in range(x.numel()):
        d = torch.zeros(x.numel(), dtype=torch.float64)
        d[idx] = eps
        d = d.view_as(x)
        fp = (entmax_bisect_reference(x + d, alpha) * v).sum()
        fm = (entmax_bisect_reference(x - d, alpha) * v).sum()
        fd.view(-1)[idx] = (fp - fm) / (2 * eps)
    assert (xg.grad - fd).abs().max().item() <= 1e-6


@pytest.mark.parametrize("alpha", ALPHAS)
def test_gradients_match_entmax_package(alpha, backend):
    dtype = torch.float32 if backend == "cpu-kernel" else torch.float64
    x = _scores((2, 3, 40), seed=5, dtype=dtype)
    v = _scores((2, 3, 40), seed=6, scale=1.0, dtype=dtype)
    ours = x.clone().requires_grad_()
    p = alpha_entmax(ours, alpha, dim=-1)
    assert p.grad_fn is not None, "the result dropped the autograd graph"
    (p * v).sum().backward()
    ref = x.double().clone().requires_grad_()
    rp = entmax.sparsemax(ref, dim=-1) if alpha == 2.0 else entmax.entmax_bisect(ref, alpha, dim=-1, n_iter=200)
    (rp * v.double()).sum().backward()
    tol = 2e-4 if dtype == torch.float32 else 1e-8
    assert ours.grad.dtype == dtype
    assert (ours.grad.double() - ref.grad).abs().max().item() <= tol


def test_kernel_gradient_equals_torch_path(monkeypatch):
    """The float32 CPU-kernel forward and the float64 torch forward give the same gradient."""
    if not _kernel_must_build():
        pytest.skip("the CPU kernel is only required on Linux x86-64 with a C++ compiler")
    x = _scores((12, 197), seed=7, scale=4.0)
    v = _scores((12, 197), seed=8, scale=1.0)
    grads = {}
    for env, dtype in (("1", torch.float32), ("0", torch.float64)):
        monkeypatch.setenv(_entmax_cpu.ENV_VAR, env)
        t = x.to(dtype).requires_grad_()
        (alpha_entmax(t, 1.2) * v.to(dtype)).sum().backward()
        grads[env] = t.grad.double()
    assert (grads["1"] - grads["0"]).abs().max().item() <= 1e-4


def test_half_precision_input_gets_a_gradient(backend):
    x = _scores((3, 16), seed=9, dtype=torch.bfloat16).requires_grad_()
    p = alpha_entmax(x, 1.5)
    p.sum().backward()  # rows sum to 1: the gradient of the sum is 0 up to rounding
    assert x.grad is not None and x.grad.dtype == torch.bfloat16
    assert x.grad.float().abs().max().item() <= 1e-2


def test_softmax_alpha_one_keeps_torch_graph(backend):
    x = _scores((2, 5), seed=10, dtype=torch.float32).requires_grad_()
    p = alpha_entmax(x, 1.0)
    assert p.grad_fn is not None
    p[:, 0].sum().backward()
    xs = x.detach().clone().requires_grad_()
    torch.softmax(xs, -1)[:, 0].sum().backward()
    assert torch.allclose(x.grad, xs.grad, atol=1e-7)


def test_no_graph_without_grad(backend):
    x = _scores((2, 5), dtype=torch.float32).requires_grad_()
    with torch.no_grad():
        assert alpha_entmax(x, 1.2).grad_fn is None
    assert alpha_entmax(x.detach(), 1.2).grad_fn is None


def test_second_order_is_an_error(backend):
    x = _scores((2, 5), dtype=torch.float32).requires_grad_()
    (g,) = torch.autograd.grad(alpha_entmax(x, 1.5)[:, 0].sum(), x, create_graph=True)
    with pytest.raises(RuntimeError):
        g.sum().backward()


def test_attention_weights_backpropagate_to_queries(backend):
    """Through the attention layer: q of a prompt/adapter before the last block gets gradients."""
    from sparseclip_d2.attention import attention_weights

    q = _scores((1, 2, 9, 8), seed=11, scale=1.0, dtype=torch.float32).requires_grad_()
    k = _scores((1, 2, 9, 8), seed=12, scale=1.0, dtype=torch.float32)
    v = _scores((1, 2, 9, 8), seed=13, scale=1.0, dtype=torch.float32)
    w = attention_weights(q, k, v, source="qk", normalizer="entmax", alpha=1.2)
    (w @ v).pow(2).sum().backward()
    assert q.grad is not None and q.grad.abs().sum().item() > 0
