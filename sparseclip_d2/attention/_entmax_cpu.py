"""Loader for the fused CPU alpha-entmax kernel (``csrc/entmax_cpu.cpp``).

The kernel is compiled with ``torch.utils.cpp_extension.load`` under a content-addressed
name, ``sparseclip_entmax_cpu[_avx2]_<hash>``, where the hash covers the source text, the
compiler flags, the compiler (``$CXX``), torch's version and install folder, the Python
ABI and include folder; its build directory is ``<root>/<name>`` with root
``$SPARSECLIP_KERNEL_DIR``, else ``$TORCH_EXTENSIONS_DIR/sparseclip_d2``, else
``~/.cache/sparseclip_d2/kernels``.  The source is copied into that folder
(``<build dir>/entmax_cpu.cpp``, written once, never overwritten) and compiled from
there, so the ``build.ninja`` torch writes holds no checkout path: two checkouts with the
same kernel inputs write the same ``build.ninja`` and reuse one build (no rebuild
ping-pong); checkouts or venvs whose inputs differ never share a build directory (no
build lock held by the other one, never a ``.so`` built from other source).  ``scripts/setup.sh`` builds it ahead of
time (:func:`build_kernel`); otherwise the first CPU call builds it (just in time), with
a log line before the build starts and one every 15 s while it runs.

On x86-64 CPUs with AVX2 and FMA it is built with ``-mavx2 -mfma`` (about 1.3-1.5x faster
on dense rows than the SSE2 build; the flags are part of the hash).  It is compiled with
``-fopenmp-simd`` (the ``omp simd`` loop pragmas only; no OpenMP runtime is linked) and
splits rows over ``torch.get_num_threads()`` threads itself.
Any failure to build or load it logs one warning and disables the kernel for the rest of
the process; :func:`sparseclip_d2.attention.entmax.alpha_entmax` then uses its pure
torch path.  Setting the environment variable ``SPARSECLIP_ENTMAX_KERNEL=0`` forces the
torch path (read on every call, so tests can switch backends).
"""
import hashlib
import json
import logging
import os
import platform
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from ..common.logs import dropping_log_records

__all__ = ["ENV_VAR", "DIR_ENV_VAR", "kernel_enabled", "kernel_spec", "kernel_is_built",
           "build_kernel", "load_kernel", "entmax_rows"]

logger = logging.getLogger(__name__)

ENV_VAR = "SPARSECLIP_ENTMAX_KERNEL"
DIR_ENV_VAR = "SPARSECLIP_KERNEL_DIR"
_SOURCE = Path(__file__).resolve().parent / "csrc" / "entmax_cpu.cpp"
_EXTENSION_NAME = "sparseclip_entmax_cpu"
_CFLAGS = ["-O3", "-fopenmp-simd"]
_HEARTBEAT_S = 15.0
# Typical duration of a cold build (measured 40-100 s on 2 shared cores); only announced.
_TYPICAL_BUILD = "about 1 min"


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


def _build_config() -> Tuple[str, List[str]]:
    """(base extension name, extra cflags): AVX2 + FMA code where this CPU has both."""
    if platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma"} <= _cpu_flags():
        return _EXTENSION_NAME + "_avx2", _CFLAGS + ["-mavx2", "-mfma"]
    return _EXTENSION_NAME, list(_CFLAGS)


def _kernel_root() -> Path:
    """Directory holding the kernel builds (see the module docstring)."""
    explicit = os.environ.get(DIR_ENV_VAR)
    if explicit:
        return Path(explicit).expanduser()
    torch_root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if torch_root:
        return Path(torch_root).expanduser() / "sparseclip_d2"
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(cache).expanduser() / "sparseclip_d2" / "kernels"


def kernel_spec(source: Optional[Path] = None, base_name: Optional[str] = None,
                cflags: Optional[Sequence[str]] = None,
                ldflags: Sequence[str] = ()) -> Tuple[str, List[str], Path]:
    """(extension name, cflags, build directory) of the kernel built from ``source``.

    The name ends with the first 16 hex digits of a SHA-256 over everything the binary
    depends on: the source bytes, the flags, ``$CXX``, torch's version and git revision,
    its install folder, the Python ABI tag and include folder, and the machine type.
    """
    source = Path(source) if source is not None else _SOURCE
    default_name, default_flags = _build_config()
    base_name = base_name or default_name
    cflags = list(cflags) if cflags is not None else default_flags
    inputs = {
        "cflags": cflags,
        "ldflags": list(ldflags),
        "cxx": os.environ.get("CXX", "c++"),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", ""),
        # build.ninja holds torch's and Python's include folders: two venvs with the same
        # torch version elsewhere on disk must not rewrite each other's build.ninja
        "torch_dir": str(Path(torch.__file__).resolve().parent),
        "python_include": sysconfig.get_paths().get("include", ""),
        "python": sys.implementation.cache_tag,
        "machine": platform.machine(),
    }
    digest = hashlib.sha256(source.read_bytes())
    digest.update(json.dumps(inputs, sort_keys=True).encode())
    name = f"{base_name}_{digest.hexdigest()[:16]}"
    return name, cflags, _kernel_root() / name


def kernel_is_built(source: Optional[Path] = None) -> bool:
    """True when the kernel for the current inputs is already compiled (loads in ~1 s)."""
    name, _, build_dir = kernel_spec(source)
    return any((build_dir / (name + ext)).is_file() for ext in (".so", ".pyd"))


def _place_source(source: Path, build_dir: Path) -> Path:
    """The copy of ``source`` inside ``build_dir`` that the build compiles (see the module
    docstring). Created once with an exclusive link of a complete temporary file, so
    concurrent builders never see half a file and an existing copy is never rewritten
    (its mtime stays, so ninja sees nothing new). A copy whose bytes differ from
    ``source`` (a hash collision or a hand edit) is an error, not silently rebuilt."""
    target = build_dir / source.name
    data = source.read_bytes()
    if not target.exists():
        fd, tmp = tempfile.mkstemp(dir=build_dir, prefix="." + source.name + ".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, target)  # atomic, fails if another builder placed it first
            except FileExistsError:
                pass
        finally:
            os.remove(tmp)
    if target.read_bytes() != data:
        raise RuntimeError(f"kernel source copy {target} differs from {source}; delete {build_dir} "
                           "to rebuild it")
    return target


def build_kernel(source: Optional[Path] = None, base_name: Optional[str] = None,
                 cflags: Optional[Sequence[str]] = None, ldflags: Sequence[str] = ()):
    """Compile (or load the cached build of) the kernel from ``source``; returns the module.

    Raises whatever the compiler or loader raises.  Logs before a compilation starts and
    every 15 s while it runs (a cold build takes about a minute).  ``base_name``,
    ``cflags`` and ``ldflags`` let the benchmark build another version side by side.
    """
    # torch/utils/cpp_extension.py logs "No CUDA runtime is found, using CUDA_HOME=..." at
    # import on machines without CUDA: about CUDA extensions, irrelevant to this CPU kernel.
    with dropping_log_records("torch.utils.cpp_extension", "No CUDA runtime is found"):
        from torch.utils import cpp_extension

    source = Path(source) if source is not None else _SOURCE
    if not source.is_file():
        raise FileNotFoundError(f"kernel source {source} is missing")
    name, flags, build_dir = kernel_spec(source, base_name, cflags, ldflags)
    cold = not any((build_dir / (name + ext)).is_file() for ext in (".so", ".pyd"))
    build_dir.mkdir(parents=True, exist_ok=True)
    placed = _place_source(source, build_dir)
    start = time.perf_counter()
    done = threading.Event()
    if cold:
        logger.info("alpha_entmax: compiling the CPU kernel %s in %s (%s; once per kernel "
                    "source, flags and torch version)", name, build_dir, _TYPICAL_BUILD)

        def heartbeat():
            while not done.wait(_HEARTBEAT_S):
                logger.info("alpha_entmax: still compiling the CPU kernel (%.0f s elapsed, "
                            "typically %s)", time.perf_counter() - start, _TYPICAL_BUILD)

        threading.Thread(target=heartbeat, name="entmax-build-heartbeat", daemon=True).start()
    try:
        module = cpp_extension.load(name=name, sources=[str(placed)], extra_cflags=flags,
                                    extra_ldflags=list(ldflags) or None,
                                    build_directory=str(build_dir), verbose=False)
    finally:
        done.set()
    if cold:
        logger.info("alpha_entmax: CPU kernel compiled in %.1f s", time.perf_counter() - start)
    return module


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
    build error instead (used by setup.sh and the tests so that a broken build is not
    hidden).
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
            module = build_kernel()
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
