"""Figures of a sweep (matplotlib, Agg backend), each from the rows of
:func:`sparseclip_d2.analysis.tables.flatten_records`:

- :func:`alpha_depth_heatmap`: a metric over two run parameters (default alpha x number of
  entmax layers), values written in the cells, the best cell outlined;
- :func:`gain_scatter`: entmax gain (entmax metric - softmax metric of the same setting)
  against the softmax run's non-class attention mass, one point per setting, with the
  least-squares line, its slope and Pearson r (or why there is none);
- :func:`same_class_bars`: same-class attention mass per setting, softmax vs entmax;
- :func:`resolution_curves`: a metric against the resolution, one line per setting and one
  panel per dataset.

A *setting* is every setting column of a row (:data:`SETTING_COLUMNS`): runs that differ in
any of them are never pooled, and legends name the columns that differ. Every figure says
"RANDOM WEIGHTS (smoke test)" in its title when any plotted run used random CLIP weights,
and marks partial runs (TEST.MAX_IMAGES). :func:`save_figure` writes PNG and PDF.
"""
import logging
import os
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .tables import SETTING_KEYS

__all__ = [
    "SETTING_COLUMNS",
    "setting_of",
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
PARTIAL_NOTE = "PARTIAL runs marked (first TEST.MAX_IMAGES images)"
LABELS = {
    "alpha": "entmax alpha (1 = softmax)",
    "num_layers": "layers with entmax (last N)",
    "resolution": "resolution (short side, px)",
    "non_class_mass": "non-class attention mass (softmax)",
    "same_class_mass": "same-class attention mass (excl. self)",
}
#: Columns that tell two series / settings apart: the dataset and every setting of a row.
SETTING_COLUMNS = ("dataset",) + tuple(SETTING_KEYS)


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


def _ok(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in rows if r.get("status", "ok") == "ok"]


def _one_dataset(rows: Sequence[Dict[str, Any]], dataset: Optional[str]) -> Tuple[str, List[Dict[str, Any]]]:
    rows = _ok(rows)
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
    if any(r.get("partial") for r in rows):
        text = f"{text}\n{PARTIAL_NOTE}"
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


def _fmt_value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def setting_of(row: Dict[str, Any], exclude: Sequence[str] = ()) -> Tuple:
    """The row's setting (:data:`SETTING_COLUMNS` minus ``exclude``) as a hashable tuple of pairs."""
    return tuple((k, row.get(k)) for k in SETTING_COLUMNS if k not in exclude)


def _varying(settings: Sequence[Tuple]) -> List[str]:
    """Keys whose value differs between ``settings`` (tuples of pairs)."""
    keys = [k for k, _ in settings[0]] if settings else []
    return [k for i, k in enumerate(keys) if len({s[i][1] for s in settings}) > 1]


def _label(setting: Tuple, keys: Sequence[str]) -> str:
    d = dict(setting)
    parts = [f"{k}={_fmt_value(d[k])}" for k in keys if d.get(k) is not None]
    return ", ".join(parts) or "all runs"


def alpha_depth_heatmap(rows: Sequence[Dict[str, Any]], *, metric: Optional[str] = None,
                        dataset: Optional[str] = None, x: str = "num_layers", y: str = "alpha"):
    """Heatmap of ``metric`` over the run parameters ``y`` (rows) x ``x`` (columns); partial
    runs' cells are hatched and their values starred.

    Raises:
        ValueError: two runs fall into one cell (the message names the settings that differ:
            filter the rows with ``plot.py --where``).
    """
    plt = _pyplot()
    dataset, rows = _one_dataset(rows, dataset)
    metric = _metric(rows, metric)
    rows = [r for r in rows if None not in (axis_value(r, y), axis_value(r, x)) and r.get(metric) is not None]
    others = _varying(list(OrderedDict.fromkeys(setting_of(r, (x, y, "normalizer", "alpha")) for r in rows)))
    if others:
        raise ValueError(f"the runs on {dataset} differ in {', '.join(others)} besides {y} and {x}: a heatmap shows "
                         "one setting; select it (plot.py --where KEY=VALUE)")
    cells: Dict[Tuple[Any, Any], Dict[str, Any]] = {}
    for r in rows:
        key = (axis_value(r, y), axis_value(r, x))
        if None in key or r.get(metric) is None:
            continue
        if key in cells:
            other = cells[key]
            diff = _varying([setting_of(other, (x, y, "normalizer")), setting_of(r, (x, y, "normalizer"))])
            raise ValueError(
                f"two runs have {y}={key[0]}, {x}={key[1]} on {dataset}: they differ in {', '.join(diff) or 'nothing'}"
                "; select one setting (plot.py --where KEY=VALUE)")
        cells[key] = r
    if not cells:
        raise ValueError(f"no run has {x!r}, {y!r} and {metric!r} on {dataset}")
    ys = sorted({k[0] for k in cells}, key=_sort_key)
    xs = sorted({k[1] for k in cells}, key=_sort_key)
    grid = np.full((len(ys), len(xs)), np.nan)
    partial = np.zeros((len(ys), len(xs)), dtype=bool)
    for (yv, xv), r in cells.items():
        grid[ys.index(yv), xs.index(xv)] = float(r[metric])
        partial[ys.index(yv), xs.index(xv)] = bool(r.get("partial"))
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
    from matplotlib.patches import Rectangle

    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(grid[i, j]):
                bright = (grid[i, j] - lo) / (hi - lo) > 0.6 if hi > lo else False
                ax.text(j, i, f"{grid[i, j]:.2f}" + ("*" if partial[i, j] else ""), ha="center", va="center",
                        fontsize=8, color="black" if bright else "white")
                if partial[i, j]:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="white",
                                           linewidth=0))
    handles = [ax.add_patch(Rectangle((bj - 0.5, bi - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=3,
                                      label=f"best cell: {grid[bi, bj]:.2f} ({ylabels[bi]}, {x} {xs[bj]})"))]
    if partial.any():
        handles.append(Rectangle((0, 0), 1, 1, fill=False, hatch="//", edgecolor="gray",
                                 label="* partial run (first TEST.MAX_IMAGES images)"))
    ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False)
    _title(fig, f"{metric} on {dataset}", rows)
    return fig


def _pairs(rows: Sequence[Dict[str, Any]], alpha: float, metric: str):
    """(setting, softmax row, entmax row) for every setting (all settings but the normaliser
    and alpha) that has both."""
    soft, ent = {}, {}
    for r in _ok(rows):
        key = setting_of(r, ("normalizer", "alpha"))
        if r.get("normalizer") == "softmax":
            if key in soft:
                raise ValueError(f"two softmax runs with the same setting: {soft[key]['run']!r} and {r['run']!r}")
            soft[key] = r
        elif r.get("normalizer") == "entmax" and r.get("alpha") is not None and abs(r["alpha"] - alpha) < 1e-9:
            if key in ent:
                raise ValueError(f"two entmax runs with the same setting: {ent[key]['run']!r} and {r['run']!r}")
            ent[key] = r
    return [(k, soft[k], ent[k]) for k in soft if k in ent and soft[k].get(metric) is not None
            and ent[k].get(metric) is not None]


def gain_scatter(rows: Sequence[Dict[str, Any]], *, metric: Optional[str] = None, alpha: float = 1.2):
    """Entmax gain vs the softmax run's non-class mass, with the least-squares line.

    Each setting (every setting column but the normaliser and alpha) with a softmax and an
    entmax-``alpha`` run gives a point ``(non_class_mass of softmax, metric(entmax) -
    metric(softmax))``, labelled with the settings that differ between points (one legend
    entry each); points involving a partial run are hollow. The line, its slope and Pearson
    r are drawn when they exist; otherwise the figure says why (fewer than two points, equal
    x values, or r undefined because all gains are equal).
    """
    plt = _pyplot()
    rows = _ok(rows)
    if not rows:
        raise ValueError("no successful runs to plot")
    metric = _metric(rows, metric)
    pairs = [(k, s, e) for k, s, e in _pairs(rows, alpha, metric) if s.get("non_class_mass") is not None]
    if not pairs:
        raise ValueError(
            f"no setting has both a softmax run and an entmax alpha={alpha} run with attention statistics "
            "(run the sweep with attention_stats: true)")
    fig, ax = plt.subplots(figsize=(7.2, 4.8), constrained_layout=True)
    varying = _varying([k for k, _, _ in pairs])
    markers = "osD^v<>PX*"
    colors = plt.get_cmap("tab10")
    xs, ys = [], []
    for i, (k, s, e) in enumerate(pairs):
        xv, yv = float(s["non_class_mass"]), float(e[metric]) - float(s[metric])
        xs.append(xv)
        ys.append(yv)
        part = bool(s.get("partial") or e.get("partial"))
        c = colors(i % 10)
        ax.scatter([xv], [yv], marker=markers[i % len(markers)], s=60, linewidth=1.2,
                   facecolor="none" if part else c, edgecolor=c if part else "black",
                   label=_label(k, varying) + (" (partial)" if part else ""))
    xs_a, ys_a = np.array(xs), np.array(ys)
    why = None
    if len(xs) < 2:
        why = f"no least-squares line: {len(xs)} setting with both runs (need 2)"
    elif np.ptp(xs_a) == 0:
        why = "no least-squares line: every setting has the same non-class mass"
    if why is None:
        slope, intercept = np.polyfit(xs_a, ys_a, 1)
        r_text = (f"r = {float(np.corrcoef(xs_a, ys_a)[0, 1]):.2f}" if np.ptp(ys_a) > 0
                  else "r undefined (all gains equal)")
        line_x = np.linspace(xs_a.min(), xs_a.max(), 50)
        ax.plot(line_x, slope * line_x + intercept, color="gray", linestyle="--",
                label=f"least squares: slope {slope:.3g}, {r_text} (n = {len(xs)})")
    else:
        logger.warning("gain scatter: %s", why)
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xlabel(LABELS["non_class_mass"])
    ax.set_ylabel(f"entmax gain: {metric}(alpha {alpha:g}) - {metric}(softmax)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    _title(ax, "Entmax gain vs non-class attention mass of the softmax baseline" + (f"\n{why}" if why else ""),
           [p for _, p, _ in pairs] + [e for _, _, e in pairs])
    return fig


def same_class_bars(rows: Sequence[Dict[str, Any]], *, dataset: Optional[str] = None, alpha: float = 1.2,
                    stat: str = "same_class_mass"):
    """Bars of an attention statistic per setting: softmax vs entmax-``alpha``.

    One group of bars per setting (the source and every other setting that varies, named
    under the group); runs are never pooled. Bars of partial runs are hatched.

    Raises:
        ValueError: no run has the statistic, or two runs share a setting and normaliser.
    """
    plt = _pyplot()
    dataset, rows = _one_dataset(rows, dataset)
    kinds = ["softmax", f"entmax {alpha:g}"]
    cells: Dict[Tuple[Tuple, str], Dict[str, Any]] = {}
    for r in rows:
        if r.get(stat) is None:
            continue
        if r.get("normalizer") == "softmax":
            kind = kinds[0]
        elif r.get("normalizer") == "entmax" and r.get("alpha") is not None and abs(r["alpha"] - alpha) < 1e-9:
            kind = kinds[1]
        else:
            continue
        key = (setting_of(r, ("normalizer", "alpha")), kind)
        if key in cells:
            raise ValueError(f"runs {cells[key]['run']!r} and {r['run']!r} have the same setting and normaliser "
                             f"on {dataset}; select one (plot.py --where KEY=VALUE)")
        cells[key] = r
    if not cells:
        raise ValueError(f"no softmax / entmax alpha={alpha} run with {stat!r} on {dataset} "
                         "(run the sweep with attention_stats: true)")
    settings = list(OrderedDict.fromkeys(k for k, _ in cells))
    varying = _varying(settings)
    if "source" not in varying:
        varying = ["source"] + varying
    labels = [_label(st, varying).replace(", ", "\n") for st in settings]
    fig, ax = plt.subplots(figsize=(max(5.6, 1.8 + 1.3 * len(settings)), 4.8), constrained_layout=True)
    width = 0.38
    colors = {kinds[0]: "#7f7f7f", kinds[1]: "#d62728"}
    any_partial = False
    for ki, kind in enumerate(kinds):
        for si, st in enumerate(settings):
            r = cells.get((st, kind))
            if r is None:
                continue
            part = bool(r.get("partial"))
            any_partial |= part
            v = float(r[stat])
            b = ax.bar([si + (ki - 0.5) * width], [v], width, color=colors[kind], hatch="//" if part else None,
                       edgecolor="black" if part else None)[0]
            ax.text(b.get_x() + b.get_width() / 2, b.get_height() / 2, f"{v:.3f}", ha="center", va="center",
                    fontsize=8, color="white", fontweight="bold")
    from matplotlib.patches import Patch

    handles = [Patch(color=colors[k], label=k) for k in kinds if any(kk == k for _, kk in cells)]
    if any_partial:
        handles.append(Patch(facecolor="white", edgecolor="black", hatch="//", label="partial run"))
    ax.set_xticks(range(len(settings)), labels, fontsize=8)
    ax.set_ylabel(LABELS.get(stat, stat))
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    _title(ax, f"{stat} on {dataset}, one group per setting", rows)
    return fig


def resolution_curves(rows: Sequence[Dict[str, Any]], *, metric: Optional[str] = None, x: str = "resolution"):
    """``metric`` against ``x`` (default the resolution), one line per setting (every setting
    column but ``x``; the legend names the settings that differ), one panel per dataset.

    A setting with one ``x`` value has no curve: it is left out and the panel says how many
    were (no one-point legend entries). Partial runs' points are hollow.
    """
    plt = _pyplot()
    rows = _ok(rows)
    if not rows:
        raise ValueError("no successful runs to plot")
    metric = _metric(rows, metric)
    datasets = list(OrderedDict.fromkeys(r["dataset"] for r in rows))
    fig, axes = plt.subplots(1, len(datasets), figsize=(5.6 * len(datasets), 4.4), constrained_layout=True,
                             squeeze=False)
    drawn = 0
    exclude = (x, "dataset") + (("resolution",) if x != "resolution" else ())
    for ax, ds in zip(axes[0], datasets):
        lines: "OrderedDict[Tuple, List[Dict[str, Any]]]" = OrderedDict()
        for r in rows:
            if r["dataset"] != ds or r.get(metric) is None or axis_value(r, x) is None:
                continue
            lines.setdefault(setting_of(r, exclude), []).append(r)
        curves = {k: v for k, v in lines.items() if len({axis_value(r, x) for r in v}) > 1}
        single = len(lines) - len(curves)
        for k, pts in curves.items():
            xs = [axis_value(r, x) for r in pts]
            if len(set(xs)) != len(xs):
                raise ValueError(f"two runs of one setting share {x}={xs} on {ds}; select one (plot.py --where)")
        varying = _varying(list(curves)) if len(curves) > 1 else []
        for i, (k, pts) in enumerate(curves.items()):
            pts = sorted(pts, key=lambda r: _sort_key(axis_value(r, x)))
            color = plt.get_cmap("tab10")(i % 10)
            label = _label(k, varying) if varying else _label(k, ["backbone", "source", "normalizer"])
            ax.plot([axis_value(r, x) for r in pts], [float(r[metric]) for r in pts], color=color, label=label)
            for r in pts:
                part = bool(r.get("partial"))
                ax.scatter([axis_value(r, x)], [float(r[metric])], color=color, zorder=3,
                           facecolor="none" if part else color, s=36)
            drawn += 1
        ax.set_xlabel(LABELS.get(x, x))
        ax.set_ylabel(f"{metric}")
        ax.grid(alpha=0.3)
        if curves:
            handles, _ = ax.get_legend_handles_labels()
            if any(r.get("partial") for pts in curves.values() for r in pts):
                from matplotlib.lines import Line2D

                handles.append(Line2D([], [], marker="o", linestyle="none", markerfacecolor="none",
                                      markeredgecolor="gray", label="partial run (hollow)"))
            ax.legend(handles=handles, fontsize=7)
        ax.set_title(ds + (f"\n({single} setting(s) with a single {x} not drawn)" if single else ""), fontsize=10)
        xs = sorted({axis_value(r, x) for r in rows if r["dataset"] == ds and axis_value(r, x) is not None},
                    key=_sort_key)
        if xs and all(isinstance(v, (int, float)) for v in xs):
            ax.set_xticks(xs)
    if not drawn:
        raise ValueError(f"no setting has more than one {x} value: nothing to draw as a curve")
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
