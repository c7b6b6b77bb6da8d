#!/usr/bin/env python
"""Benchmark ``sparseclip_d2.attention.alpha_entmax`` against torch.softmax and the entmax
package, plus its peak extra memory and its end-to-end cost in a dense ViT-B/16 forward.

One run prints (and optionally writes as JSON):

1. for attention logits of shape (1, 12, L, L), L in --sizes, alpha in --alphas and the
   input kinds in --kinds (``randn*3``: q.k/sqrt(d)-like logits; ``peaked``: the same plus
   one dominant key per row; ``randn*S`` for any scale S, e.g. ``randn*0.5``: flat rows
   where nearly every entry is in the support), the median time of torch.softmax, alpha_entmax with each
   backend (``kernel``: the fused CPU kernel; ``torch``: the pure torch path, forced with
   SPARSECLIP_ENTMAX_KERNEL=0), entmax.entmax_bisect(alpha) and the exact sort-based
   entmax.entmax15 (alpha 1.5) / entmax.sparsemax (alpha 2), and the ratios; timings of
   softmax and both backends are interleaved so that load from other processes hits all
   alike;
2. peak extra memory of alpha_entmax (each backend), from the torch profiler's allocation events
   (allocations minus frees, in time order; the output tensor included), in units of the
   input's size;
3. the forward time of sparseclip_d2.clip.DenseCLIPEncoder (ViT-B-16-quickgelu, random
   weights) at --e2e-size px with alpha-entmax (alpha --e2e-alpha) on the last 1 and 5
   blocks, divided by the same forward with softmax in those blocks (default backend).

Example::

    python tools/benchmark_entmax.py                       # full table (~5 min on 2 cores)
    python tools/benchmark_entmax.py --sizes 785 --alphas 1.2 1.5 --no-e2e
    python tools/benchmark_entmax.py --backends kernel --no-baselines --no-memory
    # the kernel against another version of its source (e.g. main's), in the same run
    git show main:sparseclip_d2/attention/csrc/entmax_cpu.cpp > /tmp/entmax_main.cpp
    python tools/benchmark_entmax.py --no-baselines --no-memory --no-e2e \
        --reference-source /tmp/entmax_main.cpp --reference-cflags="-O3 -fopenmp -mavx2 -mfma" \
        --reference-ldflags=-fopenmp

With ``--reference-source`` the ``ref`` column times that source's kernel (built like this
one, under its own content-addressed name), called directly on the (12 L, L) rows,
interleaved with the others, and ``kern/ref`` is this kernel's time over it.
"""
import argparse
import contextlib
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sparseclip_d2.attention import _entmax_cpu  # noqa: E402
from sparseclip_d2.attention.entmax import alpha_entmax, entmax_backend  # noqa: E402
from sparseclip_d2.common.io import atomic_write_json  # noqa: E402

logger = logging.getLogger("benchmark_entmax")

BACKENDS = ("kernel", "torch")


@contextlib.contextmanager
def backend_env(backend: str):
    """Select alpha_entmax's backend ("kernel" or "torch") via SPARSECLIP_ENTMAX_KERNEL."""
    old = os.environ.get(_entmax_cpu.ENV_VAR)
    os.environ[_entmax_cpu.ENV_VAR] = "1" if backend == "kernel" else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(_entmax_cpu.ENV_VAR, None)
        else:
            os.environ[_entmax_cpu.ENV_VAR] = old


def entmax_with(backend: str, x: torch.Tensor, alpha: float) -> torch.Tensor:
    with backend_env(backend):
        return alpha_entmax(x, alpha)


def make_logits(kind: str, length: int, heads: int = 12, seed: int = 0) -> torch.Tensor:
    """Attention logits (1, heads, L, L) float32 of the given kind (randn*3 or peaked)."""
    g = torch.Generator().manual_seed(seed)
    if kind.startswith("randn*") and kind != "randn*3":
        # randn*S: flat (dense) rows for small S, e.g. randn*0.5.
        try:
            scale = float(kind[len("randn*"):])
        except ValueError:
            raise ValueError(f"unknown input kind {kind!r}; valid: randn*S, peaked") from None
        return torch.randn(1, heads, length, length, generator=g) * scale
    x = torch.randn(1, heads, length, length, generator=g) * 3.0
    if kind == "peaked":
        col = torch.randint(0, length, (1, heads, length, 1), generator=g)
        x.scatter_add_(-1, col, torch.full(col.shape, 12.0))
    elif kind != "randn*3":
        raise ValueError(f"unknown input kind {kind!r}; valid: randn*S, peaked")
    return x


def available_backends() -> dict:
    """Which backends can run here (builds the kernel on first use)."""
    with backend_env("kernel"):
        return {"kernel": entmax_backend() == "cpu-kernel", "torch": True}


def median_times(fns: dict, reps: int) -> dict:
    """Median seconds of each callable; one warm-up each, then ``reps`` interleaved rounds."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_extra_memory(fn, x: torch.Tensor) -> float:
    """Peak bytes allocated (net of frees) while ``fn(x)`` runs, over ``x``'s bytes.

    Uses the CPU profiler's memory events (each allocation and free, in time order).
    """
    from torch.profiler import ProfilerActivity, profile

    fn(x)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(x)
        del out
    # Allocations are attributed to ops (self memory, so nested ops are not counted
    # twice), frees to "[memory]" events; order them by time.
    events = sorted((ev.time_range.start, ev.cpu_memory_usage if ev.name == "[memory]"
                     else ev.self_cpu_memory_usage) for ev in prof.events())
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak / (x.numel() * x.element_size())


def bench_kernels(args) -> list:
    try:
        import entmax
    except ImportError as e:
        raise SystemExit(f"error: the baselines of this benchmark need the `entmax` package: pip install -e '.[bench]' ({e})")

    results = []
    header = (f"{'L':>5} {'input':>8} {'alpha':>5} | {'softmax':>8} {'kernel':>8} "
              f"{'torch':>8} {'bisect':>8} {'sort':>8} | {'kern/sm':>7} {'torch/sm':>8} "
              f"{'bis/kern':>8} {'sort/kern':>9}")
    if args.reference is not None:
        header += f" | {'ref':>8} {'kern/ref':>8}"
    print("Times: median ms over interleaved runs; shape (1, 12, L, L) float32, "
          f"{torch.get_num_threads()} threads; kernel backend available: "
          f"{available_backends()['kernel']}")
    print(header)
    print("-" * len(header))
    for length in args.sizes:
        for kind in args.kinds:
            x = make_logits(kind, length)
            for alpha in args.alphas:
                fns = {"softmax": lambda: torch.softmax(x, -1)}
                for backend in args.backends:
                    fns[backend] = lambda b=backend: entmax_with(b, x, alpha)
                if args.reference is not None and alpha > 1.0:
                    rows2d = x.reshape(-1, length)
                    r = 1.0 / (alpha - 1.0)
                    fns["ref"] = lambda: args.reference.entmax_rows(rows2d, r)
                fast = median_times(fns, args.reps)
                slow = {}
                if kind == "randn*3" and not args.no_baselines:
                    slow_fns = {"bisect": lambda: entmax.entmax_bisect(x, alpha=alpha, dim=-1)}
                    if alpha == 1.5:
                        slow_fns["sort"] = lambda: entmax.entmax15(x, dim=-1)
                    elif alpha == 2.0:
                        slow_fns["sort"] = lambda: entmax.sparsemax(x, dim=-1)
                    slow = median_times(slow_fns, args.baseline_reps)
                row = {"L": length, "input": kind, "alpha": alpha, **fast, **slow}
                results.append(row)

                def ms(key):
                    return f"{1e3 * row[key]:8.1f}" if key in row else f"{'-':>8}"

                def ratio(a, b, width):
                    return (f"{row[a] / row[b]:{width}.2f}" if a in row and b in row
                            else f"{'-':>{width}}")

                print(f"{length:5d} {kind:>8} {alpha:5.2f} | {ms('softmax')} {ms('kernel')} "
                      f"{ms('torch')} {ms('bisect')} {ms('sort')} | "
                      f"{ratio('kernel', 'softmax', 7)} {ratio('torch', 'softmax', 8)} "
                      f"{ratio('bisect', 'kernel', 8)} {ratio('sort', 'kernel', 9)}"
                      + (f" | {ms('ref')} {ratio('kernel', 'ref', 8)}"
                         if args.reference is not None else ""),
                      flush=True)
    return results


def bench_memory(args) -> list:
    rows = []
    print("\nPeak extra memory of alpha_entmax (profiler allocation events; output "
          "included), in units of the input's size:")
    for length in args.sizes:
        x = make_logits("randn*3", length)
        for alpha in args.alphas:
            for backend in args.backends:
                units = peak_extra_memory(lambda t: entmax_with(backend, t, alpha), x)
                rows.append({"L": length, "alpha": alpha, "backend": backend,
                             "peak_extra_input_units": units})
                print(f"  L={length:5d} alpha={alpha:4.2f} {backend:>6}: {units:.2f} x input",
                      flush=True)
    soft = peak_extra_memory(lambda t: torch.softmax(t, -1), make_logits("randn*3", 785))
    print(f"  (torch.softmax at L=785: {soft:.2f} x input)")
    rows.append({"L": 785, "alpha": 1.0, "softmax_peak_extra_input_units": soft})
    return rows


def bench_end_to_end(args) -> list:
    from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, build_clip

    torch.manual_seed(0)
    model = build_clip("ViT-B-16-quickgelu", "none")
    visual = model.visual
    images = torch.randn(1, 3, args.e2e_size, args.e2e_size)
    rows = []
    print(f"\nEnd to end: DenseCLIPEncoder ViT-B-16-quickgelu (random weights), "
          f"{args.e2e_size} px, median of {args.e2e_reps} interleaved forwards, "
          f"alpha_entmax backend {entmax_backend()!r}")
    for layers in args.e2e_layers:
        encoders = {
            name: DenseCLIPEncoder(visual, AttentionSpec(normalizer=name, alpha=args.e2e_alpha,
                                                         num_layers=layers))
            for name in ("softmax", "entmax")
        }
        with torch.no_grad():
            t = median_times({name: (lambda e=e: e(images)) for name, e in encoders.items()},
                             args.e2e_reps)
        ratio = t["entmax"] / t["softmax"]
        rows.append({"layers": layers, "alpha": args.e2e_alpha, "softmax_s": t["softmax"],
                     "entmax_s": t["entmax"], "ratio": ratio})
        print(f"  last {layers} block(s): softmax {t['softmax']:.3f} s, entmax "
              f"{t['entmax']:.3f} s, ratio {ratio:.3f}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[197, 785, 1025])
    parser.add_argument("--alphas", type=float, nargs="+", default=[1.2, 1.5, 2.0])
    parser.add_argument("--kinds", nargs="+", default=["randn*3", "peaked"])
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS),
                        help="alpha_entmax backends to time")
    parser.add_argument("--e2e-layers", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--reps", type=int, default=9, help="runs of softmax / each backend")
    parser.add_argument("--baseline-reps", type=int, default=3,
                        help="runs of the (slow) entmax package functions")
    parser.add_argument("--no-baselines", action="store_true",
                        help="skip the entmax package timings")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--no-e2e", action="store_true")
    parser.add_argument("--e2e-size", type=int, default=448)
    parser.add_argument("--e2e-alpha", type=float, default=1.2)
    parser.add_argument("--e2e-reps", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("--reference-source", type=Path, default=None,
                        help="another version of csrc/entmax_cpu.cpp to time beside this one")
    parser.add_argument("--reference-cflags", default=None,
                        help="its compiler flags, space-separated (default: this kernel's)")
    parser.add_argument("--reference-ldflags", default="",
                        help="its linker flags, space-separated")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch.set_num_threads (default: torch's default)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    print("load average (1, 5, 15 min) at start: %.2f %.2f %.2f" % os.getloadavg())

    args.reference = None
    if args.reference_source is not None:
        base, flags = _entmax_cpu._build_config()
        args.reference = _entmax_cpu.build_kernel(
            args.reference_source, base_name=base + "_ref",
            cflags=args.reference_cflags.split() if args.reference_cflags else flags,
            ldflags=args.reference_ldflags.split())
        print(f"reference kernel: {args.reference_source} built as {args.reference.__name__}")
    backends = available_backends()
    if "kernel" in args.backends and not backends["kernel"]:
        print("the CPU kernel is unavailable (see the warning above): timing the torch "
              "backend only")
        args.backends = [b for b in args.backends if b != "kernel"]
    report = {"threads": torch.get_num_threads(), "torch": torch.__version__,
              "load_average": list(os.getloadavg()), "backends": backends,
              "kernels": bench_kernels(args)}
    if not args.no_memory:
        report["memory"] = bench_memory(args)
    if not args.no_e2e:
        report["end_to_end"] = bench_end_to_end(args)
    print("load average (1, 5, 15 min) at end: %.2f %.2f %.2f" % os.getloadavg())
    if args.json:
        atomic_write_json(str(args.json), report, allow_nan=True)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
