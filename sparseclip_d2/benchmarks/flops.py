"""FLOPs of one image and the machine's fp32 matmul peak, for the methods benchmark (not a test).

- :func:`count_flops`: the floating-point operations of one call of a side's ``run()``, counted with
  fvcore's ``FlopCountAnalysis`` handles on every operator of that same call as it runs (seen at
  torch's dispatch: a ``FlopCountAnalysis`` trace drops every operator whose result does not
  reach the traced output, e.g. through numpy or a data sample: tried here, it counted 0 FLOPs of
  a matmul whose result the call did not return), with the operators no handle counts named with
  how often they ran; work done outside torch (numpy, scikit-learn, faiss, scipy) is not seen. fvcore counts one fused
  multiply-add as one "flop" (fvcore/nn/flop_count.py, ``FlopCountAnalysis`` docstring); this
  module reports FLOPs as two per multiply-add (:data:`FLOPS_PER_MAC`), the unit of the matmul
  peak below, so that the two can be divided. fvcore 0.1.5 has no handle for
  ``aten::scaled_dot_product_attention``, ``aten::baddbmm`` nor ``nn.MultiheadAttention``'s fused
  ``aten::_native_multi_head_attention``: they are counted by this module's own handles
  (:func:`sdpa_macs`, :func:`baddbmm_macs`, :func:`mha_macs`; their multiply-adds only, as fvcore's
  ``matmul`` handle counts).
- :func:`matmul_peak_gflops`: the best fp32 GFLOP/s of an ``n x n`` by ``n x n`` ``torch.mm`` at
  the given torch thread count (``2 n^3`` FLOPs a product), the yardstick of the "share of peak"
  columns.

torch and fvcore are imported inside the functions: the worker imports this module before it
builds.
"""
import time
from typing import Callable, Dict

#: FLOPs per multiply-add: fvcore's count is in multiply-adds
FLOPS_PER_MAC = 2


def _shape(value):
    from fvcore.nn.jit_handles import get_shape

    return get_shape(value)


def sdpa_macs(inputs, outputs) -> int:
    """Multiply-adds of a scaled-dot-product attention kernel ``(q, k, v, ...)``: ``q @ k^T`` and
    ``attn @ v``, i.e. ``prod(batch) * L * S * (E + Ev)`` for q ``(..., L, E)``, k ``(..., S, E)``,
    v ``(..., S, Ev)`` (the softmax and scaling are element-wise and not counted, as fvcore's
    matmul handles count none)."""
    q, k, v = (_shape(x) for x in inputs[:3])
    batch = 1
    for d in q[:-2]:
        batch *= d
    return batch * q[-2] * k[-2] * (q[-1] + v[-1])


def baddbmm_macs(inputs, outputs) -> int:
    """Multiply-adds of ``aten::baddbmm(input, b1, b2, ...)``: the batched product ``b1 @ b2`` of
    ``(B, n, m)`` by ``(B, m, p)``, ``B * n * m * p`` (the added ``input`` is element-wise)."""
    b1, b2 = _shape(inputs[1]), _shape(inputs[2])
    return b1[0] * b1[1] * b1[2] * b2[2]


def mha_macs(inputs, outputs) -> int:
    """Multiply-adds of ``aten::_native_multi_head_attention(query, key, value, embed_dim, num_head,
    qkv_weight, qkv_bias, proj_weight, proj_bias, ...)`` (``nn.MultiheadAttention``'s fused
    inference path, batch first): the q, k, v projections ``(L + 2 S) E^2``, ``q @ k^T`` and
    ``attn @ v`` ``2 L S E`` (over all heads) and the output projection ``L E^2``, per batch item,
    for query ``(B, L, E)`` and key / value ``(B, S, E)``."""
    q, k = _shape(inputs[0]), _shape(inputs[1])
    batch = 1
    for d in q[:-2]:
        batch *= d
    length, source, embed = q[-2], k[-2], q[-1]
    return batch * ((length + 2 * source) * embed * embed + 2 * length * source * embed + length * embed * embed)


class _Value:
    """What fvcore's handles read of a ``torch._C.Value`` (``isCompleteTensor``, ``type().sizes()``,
    ``toIValue``), over an argument or result of an operator as it runs."""

    def __init__(self, x):
        self.x = x

    def isCompleteTensor(self):  # noqa: N802  (fvcore's name)
        import torch

        return isinstance(self.x, torch.Tensor)

    def type(self):
        shape = list(self.x.shape)
        return type("T", (), {"sizes": lambda _self: shape})()

    def toIValue(self):  # noqa: N802  (fvcore's name)
        return self.x


#: operators that only move, view, cast or allocate data (no arithmetic), beyond fvcore's own
#: ignore list (fvcore/nn/jit_analysis.py ``_IGNORED_OPS``), as they appear at dispatch
MOVE_OPS = frozenset("aten::" + n for n in (
    "_to_copy", "clone", "_unsafe_view", "as_strided", "alias", "lift_fresh", "detach_", "empty_like",
    "empty_strided", "new_empty_strided", "resize_", "set_", "fill_", "zero_", "scalar_tensor",
    "_local_scalar_dense", "item", "is_nonzero", "index_select", "index_put", "_index_put_impl_",
    "repeat", "flip", "unfold", "col2im", "im2col", "masked_select", "slice_scatter", "select_scatter",
    "expand_as", "view_as", "diagonal", "_reshape_alias", "lift_fresh_copy", "unsqueeze_copy",
    "squeeze_copy", "t_copy", "permute_copy", "view_copy", "transpose_copy", "split_copy", "_pin_memory",
    "resolve_conj", "resolve_neg", "constant_pad_nd", "reflection_pad2d", "replication_pad2d"))


def _handles():
    """``{dispatch operator: (handle, argument adapter)}``: fvcore's default handles
    (fvcore/nn/flop_count.py ``_DEFAULT_SUPPORTED_OPS``) under the names their operators take at
    dispatch (``linear``, ``matmul`` and ``einsum`` reach it as ``mm`` / ``addmm`` / ``bmm``), and
    this module's (:func:`sdpa_macs`, :func:`baddbmm_macs`)."""
    import importlib

    fvcore_ops = importlib.import_module("fvcore.nn.flop_count")._DEFAULT_SUPPORTED_OPS
    same = lambda a: a  # noqa: E731
    return {
        "aten::mm": (fvcore_ops["aten::mm"], same),
        "aten::addmm": (fvcore_ops["aten::addmm"], same),
        "aten::bmm": (fvcore_ops["aten::bmm"], same),
        "aten::baddbmm": (baddbmm_macs, same),
        # aten::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding,
        # groups): the first 9 of aten::_convolution's 12, which fvcore's handle checks the count of
        "aten::convolution": (fvcore_ops["aten::_convolution"], lambda a: a + [None] * (12 - len(a))),
        "aten::native_layer_norm": (fvcore_ops["aten::layer_norm"], same),  # weight at 2, as layer_norm
        "aten::native_group_norm": (fvcore_ops["aten::instance_norm"], same),  # weight at 1: norm_flop_counter(1)
        "aten::native_batch_norm": (fvcore_ops["aten::batch_norm"], same),  # training at 5, as batch_norm
        # (input, weight, bias, running_mean, running_var, momentum, eps): batch_norm with training=False
        "aten::_native_batch_norm_legit_no_training": (fvcore_ops["aten::batch_norm"],
                                                        lambda a: a[:5] + [_Value(False)]),
        "aten::upsample_bilinear2d": (fvcore_ops["aten::upsample_bilinear2d"], same),
        "aten::upsample_nearest2d": (fvcore_ops["aten::upsample_nearest2d"], same),
        "aten::_adaptive_avg_pool2d": (fvcore_ops["aten::adaptive_avg_pool2d"], same),
        "aten::grid_sampler_2d": (fvcore_ops["aten::grid_sampler"], same),
        "aten::_native_multi_head_attention": (mha_macs, same),
        "aten::_scaled_dot_product_flash_attention_for_cpu": (sdpa_macs, same),
        "aten::_scaled_dot_product_flash_attention": (sdpa_macs, same),
        "aten::_scaled_dot_product_efficient_attention": (sdpa_macs, same),
        "aten::_scaled_dot_product_cudnn_attention": (sdpa_macs, same),
        "aten::_scaled_dot_product_attention_math": (sdpa_macs, same),
    }


def count_flops(run: Callable[[], object]) -> Dict[str, object]:
    """FLOPs of one call of ``run()`` (no arguments, as a worker's side is built): every operator
    that runs is seen at torch's dispatch (``TorchDispatchMode``), so nothing is lost to a trace's
    dead-code elimination or to a detour through numpy, and counted by fvcore's handle for it
    (:func:`_handles`).

    Returns:
        ``{"gflops": FLOPs / 1e9 (two per multiply-add), "unsupported": {op: times it ran}}``: the
        operators no handle counts, except those fvcore ignores (``_IGNORED_OPS``) and
        :data:`MOVE_OPS`; ``{"error": "<why>"}`` where the call fails under the counter.
    """
    import importlib

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    handles = _handles()
    ignored = set(importlib.import_module("fvcore.nn.jit_analysis")._IGNORED_OPS) | MOVE_OPS
    counts = {"macs": 0}
    unsupported: Dict[str, int] = {}

    def positional(func, args, kwargs):
        out = []
        for i, a in enumerate(func._schema.arguments):
            if i < len(args):
                out.append(args[i])
            elif a.name in kwargs:
                out.append(kwargs[a.name])
            else:
                out.append(a.default_value if a.has_default_value() else None)
        return out

    class Counter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func._schema.name
            if name not in handles:
                # Under torch.inference_mode (CorrCLIP's upstream predict) the autograd keys are
                # excluded, so a composite operator (aten::linear, aten::matmul, aten::layer_norm,
                # aten::scaled_dot_product_attention, ...) reaches this mode whole, before the
                # decomposition that autograd's key otherwise runs first; its kernel then ran
                # below the mode, unseen. Run its decomposition (the composite kernel itself, so the
                # same values) with the mode on, so its parts are counted (as torch's own
                # torch/utils/flop_counter.py FlopCounterMode does).
                with self:
                    out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
            out = func(*args, **kwargs)
            if name in handles:
                handle, adapt = handles[name]
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                value = handle(adapt([_Value(x) for x in positional(func, args, kwargs)]), [_Value(x) for x in outs])
                counts["macs"] += sum(value.values()) if hasattr(value, "values") else value
            elif name not in ignored and name.rstrip("_") not in ignored:
                unsupported[name] = unsupported.get(name, 0) + 1
            return out

    try:
        with torch.no_grad(), Counter():
            run()
    except Exception as e:  # noqa: BLE001  (any failure becomes the cell's reason)
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"}
    unsupported = dict(sorted(unsupported.items(), key=lambda kv: (-kv[1], kv[0])))
    return {"gflops": FLOPS_PER_MAC * counts["macs"] / 1e9, "unsupported": unsupported}


def matmul_flops(n: int) -> int:
    """FLOPs of one ``n x n`` by ``n x n`` product: ``n^3`` multiply-adds, two FLOPs each."""
    return FLOPS_PER_MAC * n ** 3


def matmul_peak_gflops(threads: int, n: int = 1024, reps: int = 5, device: str = "cpu", dtype: str = "fp32") -> float:
    """The best GFLOP/s of ``torch.mm`` on ``n x n`` matrices over ``reps`` timed products (after one
    untimed), with ``threads`` torch threads (restored after), on ``device`` in ``dtype`` (``fp32``
    or ``fp16``; CUDA: each product bracketed by ``torch.cuda.synchronize``)."""
    import torch

    if n < 1 or reps < 1 or threads < 1:
        raise ValueError(f"matmul_peak_gflops: n, reps and threads must be at least 1, got {n}, {reps}, {threads}")
    if dtype not in ("fp32", "fp16"):
        raise ValueError(f"matmul_peak_gflops: dtype {dtype!r}; valid: fp32, fp16")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(0)
        kind = torch.float16 if dtype == "fp16" else torch.float32
        a = torch.randn(n, n, generator=g).to(device, kind)
        b = torch.randn(n, n, generator=g).to(device, kind)
        out = torch.empty(n, n, device=device, dtype=kind)
        torch.mm(a, b, out=out)
        best = float("inf")
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            sync()
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return matmul_flops(n) / best / 1e9
