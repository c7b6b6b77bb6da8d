"""The methods benchmark's table: achieved GFLOP/s and share of the matmul peak added to the rows
(:func:`add_rates`), the Markdown table (:func:`markdown_table`) and the whole document with the
command that made it (:func:`write_doc`, ``docs/efficiency.md``).

Standard library only.
"""
import datetime
import os
import platform
import shlex
import sys

#: the targets of issue 46, checked per row by :func:`targets`
TIME_RATIO_TARGET = 0.8
SLIDING_TIME_RATIO_TARGET = 0.7


def _gflops(counted):
    return counted.get("gflops") if counted else None


def add_rates(rows, peak_gflops_s: float) -> None:
    """Each row's ``<side>_gflops`` (FLOPs of one image / 1e9), ``<side>_gflops_s`` (that over the
    side's median seconds per image) and ``<side>_peak_share`` (that over ``peak_gflops_s``), in
    place; None where a side has no count or no time."""
    for r in rows:
        if r.get("failed"):
            continue
        for side in ("project", "upstream"):
            g = _gflops(r.get(f"{side}_flops"))
            s = r.get(f"{side}_s")
            r[f"{side}_gflops"] = g
            r[f"{side}_gflops_s"] = g / s if g is not None and s else None
            r[f"{side}_peak_share"] = r[f"{side}_gflops_s"] / peak_gflops_s if r[f"{side}_gflops_s"] is not None else None
        r["peak_gflops_s"] = peak_gflops_s


def targets(r) -> str:
    """Which of issue 46's targets the row meets: time ratio <= 0.8 (<= 0.7 for a sliding-window
    config) and peak RSS at or below upstream's; "-" without an upstream side."""
    if r.get("failed") or r.get("ratio") is None:
        return "-"
    limit = SLIDING_TIME_RATIO_TARGET if r.get("sliding") else TIME_RATIO_TARGET
    time_ok = r["ratio"] <= limit
    rss_ok = r["rss_ratio"] is not None and r["rss_ratio"] <= 1.0
    return (f"time {'met' if time_ok else 'MISSED'} (<= {limit}), "
            f"RSS {'met' if rss_ok else 'MISSED'}")


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _flops_cell(r, side):
    counted = r.get(f"{side}_flops")
    if counted is None:
        return "-"
    if "error" in counted:
        return "not countable (below)"
    return format(counted["gflops"], ".1f")


def gpu_table(rows) -> str:
    """The rows of a ``--device cuda`` run as a Markdown table: images per second, peak GPU memory
    (``torch.cuda.max_memory_allocated``), their ratios, FLOPs and share of the GPU's matmul peak
    in the run's dtype."""
    lines = ["| method | config | input | dtype | images/s project / upstream | time ratio | peak GPU MiB project / "
             "upstream | GPU memory ratio | GFLOPs/img project / upstream | % of matmul peak project / upstream |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("failed"):
            lines.append(f"| {r['method']} | `{r['config']}` | failed: {r['failed']} |" + " |" * 7)
            continue
        ips = "/".join(_fmt(1 / r[f"{s}_s"] if r.get(f"{s}_s") else None, ".2f") for s in ("project", "upstream"))
        pg, ug = r.get("project_gpu_mib"), r.get("upstream_gpu_mib")
        share = "/".join(_fmt(None if r.get(f"{s}_peak_share") is None else 100 * r[f"{s}_peak_share"], ".1f")
                         for s in ("project", "upstream"))
        why = f" ({r['upstream_skipped']})" if r.get("upstream_skipped") else ""
        lines.append(
            f"| {r['method']} | `{r['config']}` | {r['input']} | {r['dtype']} | {ips}{why} | {_fmt(r['ratio'], '.2f')} | "
            f"{_fmt(pg, '.0f')} / {_fmt(ug, '.0f')} | {_fmt(pg / ug if pg and ug else None, '.2f')} | "
            f"{_flops_cell(r, 'project')} / {_flops_cell(r, 'upstream')} | {share} |")
    return "\n".join(lines)


def markdown_table(rows) -> str:
    """The rows as a Markdown table (project / upstream side by side in each cell); a ``--device cuda``
    run's as :func:`gpu_table`."""
    if rows and rows[0].get("device") == "cuda":
        return gpu_table(rows)
    lines = ["| method | config | input | s/img project / upstream | time ratio | peak RSS MiB project / upstream | "
             "RSS ratio | GFLOPs/img project / upstream | GFLOP/s project / upstream | % of matmul peak "
             "project / upstream | threads | load average | targets |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("failed"):
            lines.append(f"| {r['method']} | `{r['config']}` | failed: {r['failed']} |" + " |" * 10)
            continue
        share = "/".join(_fmt(None if r.get(f"{s}_peak_share") is None else 100 * r[f"{s}_peak_share"], ".1f")
                         for s in ("project", "upstream"))
        lines.append(
            f"| {r['method']} | `{r['config']}`{' (sliding window)' if r.get('sliding') else ''} | {r['input']} | "
            f"{r['project_s']:.2f} / {_fmt(r['upstream_s'], '.2f')} | {_fmt(r['ratio'], '.2f')} | "
            f"{r['project_peak_rss_mib']} / {_fmt(r['upstream_peak_rss_mib'], 'd')} | {_fmt(r['rss_ratio'], '.2f')} | "
            f"{_flops_cell(r, 'project')} / {_flops_cell(r, 'upstream')} | "
            f"{_fmt(r.get('project_gflops_s'), '.1f')} / {_fmt(r.get('upstream_gflops_s'), '.1f')} | {share} | "
            f"{r['threads']} | {r['load_min']:.1f}-{r['load_max']:.1f} | {targets(r)} |")
    return "\n".join(lines)


def uncounted_section(rows) -> str:
    """Per method and side: the operators no FLOP handle counts (times each ran in one image), or
    why the side could not be counted."""
    out = []
    for r in rows:
        if r.get("failed"):
            continue
        for side in ("project", "upstream"):
            counted = r.get(f"{side}_flops")
            if counted is None:
                continue
            if "error" in counted:
                out.append(f"- {r['method']}, {side}: not countable: {counted['error']}")
            else:
                ops = ", ".join(f"`{op.replace('aten::', '')}` x{n}" for op, n in counted["unsupported"].items())
                out.append(f"- {r['method']}, {side}: {ops or 'none'}")
    return "\n".join(out)


def _classes(entries, n: int = 5) -> str:
    return ", ".join(f"{name} {sec:.2f} s (x{calls})" for name, sec, calls in entries[:n])


def profile_section(rows) -> str:
    """Per method and side, where one more image's time went (``--profile``;
    :func:`.stages.profile_modules`): the total under hooks, the seconds outside any module, and the
    module classes by exclusive and by inclusive seconds. "" when no row was profiled."""
    out = []
    for r in rows:
        for side in ("project", "upstream"):
            prof = r.get(f"{side}_profile")
            if not prof:
                continue
            out.append(f"- **{r['method']}, {side}**: {prof['total_s']:.2f} s under hooks, "
                       f"{prof['outside_s']:.2f} s outside any module. Exclusive: {_classes(prof['exclusive'])}. "
                       f"Inclusive: {_classes(prof['inclusive'])}.")
    if not out:
        return ""
    return ("\n## Where the time goes (`--profile`)\n\nOne more image per side after the timed ones, with torch's "
            "global module hooks (`benchmarks/stages.py`): seconds by module class, exclusive (its own work, "
            "children excluded) and inclusive (its outermost calls), and outside any module (plain functions: "
            "window loops, resizes, post-processing, numpy / scipy work).\n\n" + "\n".join(out) + "\n")


def command_line(argv=None) -> str:
    """The command that made the table, as it would be typed (``tools/benchmark_methods.py`` and its
    arguments, with ``OMP_NUM_THREADS`` where set)."""
    words = list(sys.argv[1:] if argv is None else argv)
    omp = os.environ.get("OMP_NUM_THREADS")
    prefix = f"OMP_NUM_THREADS={omp} " if omp else ""
    return prefix + "python tools/benchmark_methods.py " + " ".join(shlex.quote(w) for w in words)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


#: the line after which an existing ``--doc`` file's text is hand-written and kept on rewriting
NOTES_MARKER = "<!-- notes below this line are kept when --doc rewrites the table -->"


def _kept_notes(path: str) -> str:
    """The hand-written tail of ``path`` from :data:`NOTES_MARKER` on ("" without one)."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return ""
    at = text.find(NOTES_MARKER)
    return "\n" + text[at:] if at >= 0 else ""


def _peaks_text(peaks) -> str:
    if len(peaks) == 1:
        return (f"{peaks[0]:.1f} GFLOP/s at the start (the run wrote this file before its end, where a "
                f"second figure is taken)")
    return (f"{' and '.join(f'{p:.1f}' for p in peaks)} GFLOP/s at the start and the end; the larger, "
            f"{max(peaks):.1f}, is the yardstick")


def write_doc(path: str, rows, peaks, threads: int, command: str) -> None:
    """``path`` (Markdown): how the table was made (the command, the machine, the matmul peaks at
    the start and end of the run), the table, the targets, the operators no handle counts; an
    existing file's text from :data:`NOTES_MARKER` on is kept after it."""
    peak = max(peaks)
    notes = _kept_notes(path)
    if rows and rows[0].get("device") == "cuda":
        text = f"""# Efficiency on a GPU: every method against its upstream ({rows[0]['dtype']})

Written by `tools/benchmark_methods.py --device cuda --doc {path}` (issue 46; `tools/benchmark_methods_gpu.sh`
runs it in fp32 and fp16); do not edit by hand, rerun:

    {command}

Made {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}. **Random weights.**
Images/s is 1 / the median seconds per image (each image bracketed by `torch.cuda.synchronize`);
peak GPU memory is `torch.cuda.max_memory_allocated` of each side's worker; fp16 runs both sides
under `torch.autocast('cuda', float16)`. Matmul peak: {' and '.join(f'{p:.0f}' for p in peaks)} GFLOP/s
(`torch.mm` 4096 x 4096 in {rows[0]['dtype']}, start and end of the run). Columns as in docs/efficiency.md.

{markdown_table(rows)}

## Operators no FLOP handle counts

{uncounted_section(rows)}
{profile_section(rows)}""" + notes
        with open(path, "w") as f:
            f.write(text)
        return
    text = f"""# Efficiency of every method against its upstream

Written by `tools/benchmark_methods.py --doc {path}` (issue 46); do not edit by hand, rerun:

    {command}

Made {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')} on {_cpu_name()}
({os.cpu_count()} logical CPUs), {threads} torch thread(s) per side, Python {platform.python_version()}.
**Random weights** (CLIP ViT-B/16 and any VFM, seed 0): these are costs, not accuracies.

How each column is measured (`sparseclip_d2/benchmarks/`; docs/model_zoo.md, "The newer methods
against their upstream loops"):

- **s/img**: median over the timed images of each side, after one warm-up, the two sides
  alternating (project, upstream, then upstream, project, ...) in their own worker processes.
- **peak RSS**: `VmHWM` of each side's worker over building, warm-up and the timed images.
- **GFLOPs/img**: one more image per side after the timed ones, every operator counted as it
  runs by fvcore's `FlopCountAnalysis` handles (`benchmarks/flops.py`: matmuls, convolutions,
  norms, resizes; scaled-dot-product attention, `baddbmm` and `nn.MultiheadAttention`'s fused
  kernel by the project's own handles), two FLOPs per multiply-add. Element-wise operators (softmax, add, exp, ...) have no handle in fvcore
  and are named below per method with how often they ran; they are not in the figure.
- **GFLOP/s**: GFLOPs/img over s/img. **% of matmul peak**: that over this machine's best fp32
  `torch.mm` of 1024 x 1024 matrices at the same thread count, measured in the same run:
  {_peaks_text(peaks)}.
- **load average**: the 1-minute load average of the machine before each timed image (lowest -
  highest). Other work ran on the machine meanwhile; both sides of a row shared it alike.
- **targets** (issue 46): time ratio <= {TIME_RATIO_TARGET} (<= {SLIDING_TIME_RATIO_TARGET} for a sliding-window
  config) and peak RSS at or below upstream's.

{markdown_table(rows)}

## Operators no FLOP handle counts

{uncounted_section(rows)}
{profile_section(rows)}""" + notes
    with open(path, "w") as f:
        f.write(text)
