"""Where one image's time goes, on either side of a benchmark row, without knowing the side's code:
torch's global module hooks (``register_module_forward_pre_hook`` / ``register_module_forward_hook``)
time every ``nn.Module`` call of one run, so the same reader serves the project's parts and an
upstream checkout's classes.

For each module class (its ``__name__``): the **inclusive** seconds of its outermost calls (a class
nested in itself, such as a ``Sequential`` in a ``Sequential``, is counted once), the **exclusive**
seconds (inclusive minus the module children it called: its own tensor work, e.g. a block's residual
adds, or a ``Linear``'s matmul) and the number of calls; and the seconds spent **outside any module**
(plain functions: window loops, upsampling, post-processing, numpy / scipy / faiss work). Hook
overhead (two clock reads per call) is in the figures; they are for telling stages apart, not for
timing (the timed images run without hooks).

torch is imported inside :func:`profile_modules`: every worker imports this module's caller.
"""
import time
from typing import Callable, Dict, List


def profile_modules(run: Callable[[], object], top: int = 8) -> Dict[str, object]:
    """Run ``run()`` once under ``torch.no_grad`` with global module hooks; returns ``{"total_s",
    "outside_s", "inclusive": [[class, seconds, calls], ...], "exclusive": [[class, seconds, calls],
    ...]}``, each list the ``top`` classes by seconds, largest first (every class when ``top`` is 0)."""
    import torch
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    stack: List[list] = []  # [class name, start, seconds of module children]
    inclusive: Dict[str, float] = {}
    exclusive: Dict[str, float] = {}
    calls: Dict[str, int] = {}
    open_names: Dict[str, int] = {}  # class -> calls of it now on the stack (outermost counted once)
    top_level = [0.0]

    def pre(module, args):
        name = type(module).__name__
        open_names[name] = open_names.get(name, 0) + 1
        stack.append([name, time.perf_counter(), 0.0])

    def post(module, args, output):
        if not stack:  # a hook pair cut by an exception inside a module: nothing to close
            return
        name, t0, children = stack.pop()
        dt = time.perf_counter() - t0
        open_names[name] -= 1
        if not open_names[name]:
            inclusive[name] = inclusive.get(name, 0.0) + dt
        exclusive[name] = exclusive.get(name, 0.0) + dt - children
        calls[name] = calls.get(name, 0) + 1
        if stack:
            stack[-1][2] += dt
        else:
            top_level[0] += dt

    hooks = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
    try:
        with torch.no_grad():
            t0 = time.perf_counter()
            run()
            total = time.perf_counter() - t0
    finally:
        for h in hooks:
            h.remove()

    def ranked(table):
        rows = sorted(([name, round(s, 4), calls[name]] for name, s in table.items()), key=lambda r: -r[1])
        return rows[:top] if top else rows
    return {"total_s": round(total, 4), "outside_s": round(total - top_level[0], 4),
            "inclusive": ranked(inclusive), "exclusive": ranked(exclusive)}
