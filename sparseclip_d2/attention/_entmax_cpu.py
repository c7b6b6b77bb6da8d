"""Loader for the fused CPU alpha-entmax kernel (``csrc/entmax_cpu.cpp``).

The kernel is JIT-compiled with ``torch.utils.cpp_extension.load`` on the first CPU call
(into torch's extension cache: ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``,
so a warm-up run at install time makes later loads instant) and cached for the process.
On x86-64 CPUs with AVX2 and FMA it is built with ``-mavx2 -mfma`` under its own name
(``sparseclip_entmax_cpu_avx2``): about 1.3-1.5x faster on dense rows than the SSE2 build.
Any failure to build or load it logs one warning and disables the kernel for the rest of
the process; :func:`sparseclip_d2.attention.entmax.alpha_entmax` then uses its pure
torch path.  Setting the environment variable ``SPARSECLIP_ENTMAX_KERNEL=0`` forces the
torch path (read on every call, so tests can switch backends).
"""
import logging
import os
import threading
import time
from pathlib import Path
from typing import Optional, Tuple

import torch

__all__ = ["ENV_VAR", "kernel_enabled", "load_kernel", "entmax_rows"]

logger = logging.getLogger(__name__)

ENV_VAR = "SPARSECLIP_ENTMAX_KERNEL"
_SOURCE = Path(__file__).resolve().parent / "csrc" / "entmax_cpu.cpp"
_EXTENSION_NAME = "sparseclip_entmax_cpu"
_CFLAGS = ["-O3", "-fopenmp"]


def _cpu_flags() -> set:
    """The CPU's feature flags from /proc/cpuinfo (empty where unavailable)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _build_config():
    """(extension name, extra cflags): AVX2 + FMA code where this CPU has both.

    The kernel is built on the machine that runs it; the AVX2 build gets its own
    extension name so that a torch extension cache shared with a CPU lacking AVX2 never
    hands that CPU the AVX2 binary.  Doubles the vector width of the Newton sums.
    """
    import platform

    if platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= _cpu_flags():
        return _EXTENSION_NAME + "_avx2", _CFLAGS + ["-mavx2", "-mfma"]
    return _EXTENSION_NAME, list(_CFLAGS)

_lock = threading.Lock()
_module = None
_failed = False


def kernel_enabled() -> bool:
    """False when ``SPARSECLIP_ENTMAX_KERNEL`` is set to 0 (or off/false/no)."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "off", "false", "no")


def load_kernel(raise_errors: bool = False):
    """The compiled extension module, or None when it cannot be built/loaded.

    Builds at most once per process.  After a failure, later calls return None at once
    (the failure is logged once, as a warning); ``raise_errors=True`` re-raises the
    build error instead (used by the tests so that a broken build is not hidden).
    """
    global _module, _failed
    if _module is not None:
        return _module
    if _failed and not raise_errors:
        return None
    with _lock:
        if _module is not None:
            return _module
        try:
            from torch.utils import cpp_extension

            if not _SOURCE.is_file():
                raise FileNotFoundError(f"kernel source {_SOURCE} is missing")
            logger.info("alpha_entmax: building/loading the CPU kernel %s (first use may "
                        "compile for ~1 min)", _build_config()[0])
            start = time.perf_counter()
            name, cflags = _build_config()
            module = cpp_extension.load(
                name=name, sources=[str(_SOURCE)], extra_cflags=cflags,
                extra_ldflags=["-fopenmp"], verbose=False)
            logger.info("alpha_entmax: CPU kernel ready in %.1f s", time.perf_counter() - start)
        except Exception as exc:  # any build/load problem: fall back for good
            if not _failed:
                logger.warning("alpha_entmax: the fused CPU kernel is unavailable (%s: %s); "
                               "using the pure torch implementation",
                               type(exc).__name__, exc)
            _failed = True
            if raise_errors:
                raise
            return None
        _module = module
        _failed = False
        return module


def entmax_rows(x2d: torch.Tensor, r: float) -> Optional[Tuple[torch.Tensor, int]]:
    """alpha-entmax over the rows of ``x2d`` with the kernel, or None if unavailable.

    Args:
        x2d: (N, L) float32, contiguous, CPU.
        r: 1 / (alpha - 1) >= 1.

    Returns:
        ``(p, code)``: p (N, L) float32; code has bit 1 set when a row is entirely
        ``-inf`` and bit 2 when a row holds NaN or ``+inf`` (p is then meaningless).
    """
    module = load_kernel()
    if module is None:
        return None
    out, code = module.entmax_rows(x2d, float(r))
    return out, int(code)
