"""Figures of a sweep (matplotlib, Agg backend), each from the rows of
:func:`sparseclip_d2.analysis.tables.flatten_records`:

- :func:`alpha_depth_heatmap`: a metric over two run parameters (default alpha x number of
  entmax layers), values written in the cells, the best cell outlined;
- :func:`gain_scatter`: entmax gain (entmax metric - softmax metric of the same setting)
  against the softmax run's non-class attention mass, one point per setting, with the
  least-squares line, its slope and Pearson r;
- :func:`same_class_bars`: same-class attention mass per source, softmax vs entmax;
- :func:`resolution_curves`: a metric against the resolution, one line per
  (backbone, source, normaliser) and one panel per dataset.

Every figure says "RANDOM WEIGHTS (smoke test)" in its title when any plotted run used
random CLIP weights. :func:`save_figure` writes PNG and PDF.
"""
import logging
import os
from collections import OrderedDict, defaultdict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "axis_value",
    "filter_rows",
    "alpha_depth_heatmap",
    "gain_scatter",
    "same_class_bars",
    "resolution_curves",
    "save_figure",
]

logger = logging.getLogger(__name__)

RANDOM_NOTE = "RANDOM WEIGHTS (smoke test, numbers meaningless)"
#: Columns that identify a setting apart from the normaliser (pairs softmax and entmax runs).
SETTING_COLUMNS = ("dataset", "backbone", "source", "block", "resolution", "num_layers")
LABELS = {
    "alpha": "entmax alpha (1 = softmax)",
    "num_layers": "layers with entmax (last N)",
    "resolution": "resolution (short side, px)",
    "non_class_mass": "non-class attention mass (softmax)",
    "same_class_mass": "same-class attention mass (excl. self)",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def axis_value(row: Dict[str, Any], key: str) -> Any:
    """A row's value of a plotting axis; ``alpha`` is 1.0 for softmax runs."""
    if key == "alpha":
        if row.get("normalizer") == "softmax":
            return 1.0
        return row.get("alpha")
    if key in row:
        return row[key]
    return row.get(f"param.{key}")


def filter_rows(rows: Sequence[Dict[str, Any]], where: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """Rows whose columns equal every ``where`` value (compared as strings)."""
    where = where or {}
    out = []
    for r in rows:
        if all(str(axis_value(r, k)) == str(v) for k, v in where.items()):
            out.append(r)
    return out


def _one_dataset(rows: Sequence[Dict[str, Any]], dataset: Optional[str]) -> Tuple[str, List[Dict[str, Any]]]:
    names = list(OrderedDict.fromkeys(r["dataset"] for r in rows))
    if not names:
        raise ValueError("no successful runs to plot (is the JSON-lines file empty, or did every run fail?)")
    if dataset is None:
        dataset = names[0]
    if dataset not in names:
        raise ValueError(f"dataset {dataset!r} is not in the sweep; valid: {', '.join(names)}")
    return dataset, [r for r in rows if r["dataset"] == dataset]


def _title(ax_or_fig, text: str, rows: Sequence[Dict[str, Any]]) -> None:
    if any(r.get("random_weights") for r in rows):
        text = f"{text}\n{RANDOM_NOTE}"
    if hasattr(ax_or_fig, "set_title"):
        ax_or_fig.set_title(text, fontsize=10)
    else:
        ax_or_fig.suptitle(text, fontsize=11)


def _metric(rows: Sequence[Dict[str, Any]], metric: Optional[str]) -> str:
    if metric:
        if not any(metric in r for r in rows):
            have = sorted({k for r in rows for k, v in r.items() if isinstance(v, (int, float))
                           and not isinstance(v, bool)})
            raise ValueError(f"metric {metric!r} is not in the sweep's rows; numeric columns: {', '.join(have)}")
        return metric
    return rows[0]["metric"]


def _sort_key(v: Any):
    return (0, float(v)) if isinstance(v, (int, float)) else (1, str(v))


def alpha_depth_heatmap(rows: Sequence[Dict[str, Any]], *, metric: Optional[str] = None,
                        dataset: Optional[str] = None, x: str = "num_layers", y: str = "alpha"):
    """Heatmap of ``metric`` over the run parameters ``y`` (rows) x ``x`` (columns).

    Raises:
        ValueError: two runs fall into one cell (another parameter varies: filter the rows).
    """
    plt = _pyplot()
    dataset, rows = _one_dataset(rows, dataset)
    metric = _metric(rows, metric)
    cells: Dict[Tuple[Any, Any], float] = {}
    for r in rows:
        key = (axis_value(r, y), axis_value(r, x))
        if None in key or r.get(metric) is None:
            continue
        if key in cells:
            raise ValueError(
                f"two runs have {y}={key[0]}, {x}={key[1]} on {dataset}: another parameter varies; "
                "select one setting (plot.py --where KEY=VALUE)")
        cells[key] = float(r[metric])
    if not cells:
        raise ValueError(f"no run has {x!r}, {y!r} and {metric!r} on {dataset}")
    ys = sorted({k[0] for k in cells}, key=_sort_key)
    xs = sorted({k[1] for k in cells}, key=_sort_key)
    grid = np.full((len(ys), len(xs)), np.nan)
    for (yv, xv), v in cells.items():
        grid[ys.index(yv), xs.index(xv)] = v
    fig, ax = plt.subplots(figsize=(max(6.4, 2.5 + 0.8 * len(xs)), max(4.2, 1.8 + 0.42 * len(ys))),
                           constrained_layout=True)
    im = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    fig.colorbar(im, ax=ax, label=f"{metric} ({dataset})")
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ylabels = [("1 (softmax)" if (y == "alpha" and v == 1.0) else f"{v:g}" if isinstance(v, float) else str(v))
               for v in ys]
    ax.set_yticks(range(len(ys)), ylabels)
    ax.set_xlabel(LABELS.get(x, x))
    ax.set_ylabel(LABELS.get(y, y))
    finite = np.where(np.isfinite(grid), grid, -np.inf)
    bi, bj = np.unravel_index(int(np.argmax(finite)), grid.shape)
    lo, hi = np.nanmin(grid), np.nanmax(grid)
    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(grid[i, j]):
                bright = (grid[i, j] - lo) / (hi - lo) > 0.6 if hi > lo else False
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8,
                        color="black" if bright else "white")
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=3,
                           label=f"best cell: {grid[bi, bj]:.2f} ({ylabels[bi]}, {x} {xs[bj]})"))
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False)
    _title(fig, f"{metric} on {dataset}", rows)
    return fig


def _pairs(rows: Sequence[Dict[str, Any]], alpha: float, metric: str):
    """(setting, softmax row, entmax row) for every setting that has both."""
    soft, ent = {}, {}
    for r in rows:
        key = tuple(r.get(c) for c in SETTING_COLUMNS)
        if r.get("normalizer") == "softmax":
            soft[key] = r
        elif r.get("normalizer") == "entmax" and r.get("alpha") is not None and abs(r["alpha"] - alpha) < 1e-9:
            ent[key] = r
    return [(k, soft[k], ent[k]) for k in soft if k in ent and soft[k].get(metric) is not None
            and ent[k].get(metric) is not None]


def gain_scatter(rows: Sequence[Dict[str, Any]], *, metric: Optional[str] = None, alpha: float = 1.2):
    """Entmax gain vs the softmax run's non-class mass, with the least-squares line.

    Settings (``SETTING_COLUMNS``) with a softmax and an entmax-``alpha`` run each give a point
    ``(non_class_mass of softmax, metric(entmax) - metric(softmax))``; colour = dataset,
    marker = source.
    """
    plt = _pyplot()
    if not rows:
        raise ValueError("no successful runs to plot")
    metric = _metric(rows, metric)
    pairs = [(k, s, e) for k, s, e in _pairs(rows, alpha, metric) if s.get("non_class_mass") is not None]
    if not pairs:
        raise ValueError(
            f"no setting has both a softmax run and an entmax alpha={alpha} run with attention statistics "
            "(run the sweep with attention_stats: true)")
    fig, ax = plt.subplots(figsize=(6.4, 4.6), constrained_layout=True)
    datasets = list(OrderedDict.fromkeys(k[0] for k, _, _ in pairs))
    sources = list(OrderedDict.fromkeys(str(k[2]) for k, _, _ in pairs))
    markers = "osD^v<>PX*"
    colors = plt.get_cmap("tab10")
    xs, ys = [], []
    seen = set()
    for k, s, e in pairs:
        xv, yv = float(s["non_class_mass"]), float(e[metric]) - float(s[metric])
        xs.append(xv)
        ys.append(yv)
        di, si = datasets.index(k[0]), sources.index(str(k[2]))
        label = f"{k[0]} / {k[2]}"
        ax.scatter([xv], [yv], color=colors(di % 10), marker=markers[si % len(markers)], s=50,
                   label=label if label not in seen else None, edgecolor="black", linewidth=0.5)
        seen.add(label)
    xs_a, ys_a = np.array(xs), np.array(ys)
    if len(xs) >= 2 and np.ptp(xs_a) > 0:
        slope, intercept = np.polyfit(xs_a, ys_a, 1)
        r = float(np.corrcoef(xs_a, ys_a)[0, 1]) if np.ptp(ys_a) > 0 else float("nan")
        line_x = np.linspace(xs_a.min(), xs_a.max(), 50)
        ax.plot(line_x, slope * line_x + intercept, color="gray", linestyle="--",
                label=f"least squares: slope {slope:.3g}, r = {r:.2f} (n = {len(xs)})")
    else:
        logger.warning("gain scatter: fewer than two distinct x values, no least-squares line")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel(LABELS["non_class_mass"])
    ax.set_ylabel(f"entmax gain: {metric}(alpha {alpha:g}) - {metric}(softmax)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    _title(ax, "Entmax gain vs non-class attention mass of the softmax baseline", [p for _, p, _ in pairs])
    return fig


def same_class_bars(rows: Sequence[Dict[str, Any]], *, dataset: Optional[str] = None, alpha: float = 1.2,
                    stat: str = "same_class_mass"):
    """Bars of an attention statistic per source: softmax vs entmax-``alpha`` (mean over the
    runs of each (source, normaliser) when other parameters vary; error bars = min..max)."""
    plt = _pyplot()
    dataset, rows = _one_dataset(rows, dataset)
    groups: Dict[Tuple[str, str], List[float]] = defaultdict(list)
    for r in rows:
        if r.get(stat) is None:
            continue
        if r.get("normalizer") == "softmax":
            groups[(str(r["source"]), "softmax")].append(float(r[stat]))
        elif r.get("normalizer") == "entmax" and r.get("alpha") is not None and abs(r["alpha"] - alpha) < 1e-9:
            groups[(str(r["source"]), f"entmax {alpha:g}")].append(float(r[stat]))
    if not groups:
        raise ValueError(f"no softmax / entmax alpha={alpha} run with {stat!r} on {dataset} "
                         "(run the sweep with attention_stats: true)")
    sources = list(OrderedDict.fromkeys(s for s, _ in groups))
    kinds = ["softmax", f"entmax {alpha:g}"]
    fig, ax = plt.subplots(figsize=(max(5.6, 1.8 + 1.1 * len(sources)), 4.4), constrained_layout=True)
    width = 0.38
    colors = {"softmax": "#7f7f7f", kinds[1]: "#d62728"}
    for ki, kind in enumerate(kinds):
        xs, means, lo, hi = [], [], [], []
        for si, s in enumerate(sources):
            vals = groups.get((s, kind))
            if not vals:
                continue
            m = float(np.mean(vals))
            xs.append(si + (ki - 0.5) * width)
            means.append(m)
            lo.append(m - min(vals))
            hi.append(max(vals) - m)
        if xs:
            bars = ax.bar(xs, means, width, label=kind, color=colors[kind], yerr=[lo, hi], capsize=3)
            for b, m in zip(bars, means):
                ax.text(b.get_x() + b.get_width() / 2, b.get_height() / 2, f"{m:.3f}", ha="center",
                        va="center", fontsize=8, color="white", fontweight="bold")
    ax.set_xticks(range(len(sources)), sources)
    ax.set_xlabel("score source")
    ax.set_ylabel(LABELS.get(stat, stat))
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    _title(ax, f"{stat} per source on {dataset}" + ("" if all(len(v) == 1 for v in groups.values())
                                                      else " (mean; bars: min..max)"), rows)
    return fig


def resolution_curves(rows: Sequence[Dict[str, Any]], *, metric: Optional[str] = None, x: str = "resolution"):
    """``metric`` against ``x`` (default the resolution), one line per (backbone, source,
    normaliser, alpha), one panel per dataset."""
    plt = _pyplot()
    if not rows:
        raise ValueError("no successful runs to plot")
    metric = _metric(rows, metric)
    datasets = list(OrderedDict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.6 * len(datasets), 4.0), constrained_layout=True,
                             squeeze=False)
    for ax, ds in zip(axes[0], datasets):
        lines: Dict[str, List[Tuple[Any, float]]] = defaultdict(list)
        for r in rows:
            if r["dataset"] != ds or r.get(metric) is None or axis_value(r, x) is None:
                continue
            norm = r["normalizer"] if r.get("alpha") is None or r["normalizer"] != "entmax" else f"entmax {r['alpha']:g}"
            lines[f"{r['backbone']} {r['source']} {norm}"].append((axis_value(r, x), float(r[metric])))
        for label, pts in lines.items():
            pts.sort(key=lambda p: _sort_key(p[0]))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.set_xlabel(LABELS.get(x, x))
        ax.set_ylabel(f"{metric}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_title(ds, fontsize=10)
        xs = sorted({axis_value(r, x) for r in rows if r["dataset"] == ds and axis_value(r, x) is not None},
                    key=_sort_key)
        if xs and all(isinstance(v, (int, float)) for v in xs):
            ax.set_xticks(xs)
    _title(fig, f"{metric} vs {LABELS.get(x, x)}", rows)
    return fig


def save_figure(fig, path: str, formats: Sequence[str] = ("png", "pdf"), dpi: int = 150) -> List[str]:
    """Save ``fig`` as ``<path stem>.<fmt>`` for each format; returns the paths."""
    plt = _pyplot()
    stem, ext = os.path.splitext(path)
    if ext.lstrip(".") in ("png", "pdf", "svg"):
        path = stem
    os.makedirs(os.path.dirname(os.path.abspath(path)) or ".", exist_ok=True)
    out = []
    for fmt in formats:
        p = f"{path}.{fmt}"
        fig.savefig(p, dpi=dpi)
        out.append(p)
    plt.close(fig)
    return out
