"""Sweep records -> flat rows, CSV / Markdown tables, and the join with the paper's numbers.

A *row* is one (run, dataset) pair of a sweep's JSON-lines file with the paper's
descriptors (:func:`describe`): ``backbone`` (``B/16``, ``L/14`` or the open_clip name),
``source`` (paper names ``qkv``, ``qqv``, ``kkv``, ``vvv``, ``qq+kk``, ``v-only``), ``block``
(``full``, ``drop_ffn``, ``drop_residual``, ``drop_both``), ``resolution``, ``normalizer``
(``softmax``, ``entmax``, ``softmax_temperature_0.5``, ``random_matched``, ``sparsemax``,
``none`` for the value path) and ``alpha`` (None for softmax), plus the run's metrics and
attention statistics.
"""
import csv
import io
import math
import os
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "PAPER_CSV",
    "STAT_COLUMNS",
    "describe",
    "short_dataset",
    "primary_metric",
    "flatten_records",
    "write_csv",
    "markdown_table",
    "load_paper_results",
    "compare_with_paper",
    "write_tables",
]

#: The paper's numbers, shipped as package data.
PAPER_CSV = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference",
                         "paper_results.csv")
STAT_COLUMNS = ("same_class_mass", "non_class_mass", "background_mass", "support_size", "perplexity")
_SOURCE_TO_PAPER = {"qk": "qkv", "qq": "qqv", "kk": "kkv", "vv": "vvv", "identity": "v-only"}
_PAPER_BACKBONES = {"ViT-B-16-quickgelu": "B/16", "ViT-L-14-quickgelu": "L/14", "ViT-B-16": "B/16",
                    "ViT-L-14": "L/14"}


def short_dataset(name: str) -> str:
    """``sparseclip_voc21_val`` -> ``voc21``; ``sparseclip_fgovd_hard`` -> ``fgovd_hard``."""
    s = name[len("sparseclip_"):] if name.startswith("sparseclip_") else name
    return s[: -len("_val")] if s.endswith("_val") else s


def _canonical_source(source: Any) -> str:
    try:
        from sparseclip_d2.attention import canonical_source

        return canonical_source(str(source))
    except Exception:  # an unknown or custom source: keep it as written
        return str(source)


def describe(config: Dict[str, Any], dataset: str = "") -> Dict[str, Any]:
    """The paper's descriptors of a run from its config summary (see the module docstring)."""
    name = str(config.get("backbone") or "")
    src = _canonical_source(config.get("source", "qk"))
    paper_src = "+".join(_SOURCE_TO_PAPER.get(t, t) if "+" not in src else t for t in src.split("+"))
    residual, ffn = bool(config.get("residual", True)), bool(config.get("ffn", True))
    block = {(True, True): "full", (True, False): "drop_ffn", (False, True): "drop_residual",
             (False, False): "drop_both"}[(residual, ffn)]
    norm = str(config.get("normalizer", "softmax"))
    temperature = float(config.get("temperature", 1.0) or 1.0)
    alpha = config.get("alpha")
    if src == "identity":
        norm, alpha = "none", None
    elif norm == "softmax":
        alpha = None
        if temperature != 1.0:
            norm = f"softmax_temperature_{temperature:g}"
    elif norm == "sparsemax":
        alpha = 2.0
    resolution = config.get("fgovd_resolution") if dataset.startswith("fgovd") else config.get("resolution")
    return OrderedDict(
        backbone=_PAPER_BACKBONES.get(name, name), source=paper_src, block=block,
        resolution=int(resolution) if resolution is not None else None, normalizer=norm,
        alpha=float(alpha) if alpha is not None else None,
        num_layers=config.get("num_layers"),
    )


def primary_metric(metrics: Dict[str, Any]) -> Optional[str]:
    """The headline metric of a dataset entry: mIoU, else mHME, else top1."""
    for k in ("mIoU", "mHME", "top1"):
        if k in metrics:
            return k
    return None


def flatten_records(records: Iterable[Dict[str, Any]], *, latest_only: bool = True) -> List[Dict[str, Any]]:
    """One row per (successful run, dataset).

    Args:
        records: JSON-lines records of :func:`sparseclip_d2.analysis.sweep.run_one`.
        latest_only: keep only the last ``ok`` record of each run key.
    """
    ok = [r for r in records if r.get("status") == "ok"]
    if latest_only:
        by_key: "OrderedDict[str, Dict]" = OrderedDict()
        for r in ok:
            by_key.pop(r["run_key"], None)
            by_key[r["run_key"]] = r
        ok = list(by_key.values())
    rows = []
    for r in ok:
        for dname, metrics in (r.get("datasets") or {}).items():
            ds = short_dataset(dname)
            row = OrderedDict(run=r["run_name"], group=r.get("group", ""), dataset=ds)
            for k, v in (r.get("params") or {}).items():
                row[f"param.{k}"] = v if not isinstance(v, list) else ",".join(map(str, v))
            row.update(describe(r.get("config") or {}, ds))
            metric = primary_metric(metrics)
            row["metric"] = metric
            row["value"] = metrics.get(metric) if metric else None
            for k, v in metrics.items():
                row[k] = v
            row["random_weights"] = bool(r.get("random_weights", False))
            row["partial"] = bool(r.get("partial", False))
            row["run_key"] = r["run_key"]
            rows.append(row)
    return rows


def _columns(rows: Sequence[Dict[str, Any]]) -> List[str]:
    cols: "OrderedDict[str, None]" = OrderedDict()
    for r in rows:
        for k in r:
            cols[k] = None
    return list(cols)


def write_csv(rows: Sequence[Dict[str, Any]], path: str, columns: Optional[Sequence[str]] = None) -> str:
    """Write rows as CSV (union of their keys as columns, in first-seen order)."""
    columns = list(columns) if columns is not None else _columns(rows)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    os.replace(tmp, path)
    return path


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}f}" if abs(v) >= 1 or v == 0 else f"{v:.4f}"
    return str(v).replace("|", "\\|")


def markdown_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str], *, title: str = "",
                   note: str = "") -> str:
    """A GitHub Markdown table of ``columns`` of ``rows``."""
    out = io.StringIO()
    if title:
        out.write(f"## {title}\n\n")
    if note:
        out.write(note.rstrip() + "\n\n")
    out.write("| " + " | ".join(columns) + " |\n")
    out.write("|" + "|".join("---" for _ in columns) + "|\n")
    for r in rows:
        out.write("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |\n")
    return out.getvalue()


def _random_note(rows: Sequence[Dict[str, Any]]) -> str:
    if any(r.get("random_weights") for r in rows):
        return ("**RANDOM WEIGHTS**: some runs used random CLIP weights (`random_weights: yes`); their "
                "numbers are a smoke test and mean nothing.")
    return ""


def sweep_markdown(rows: Sequence[Dict[str, Any]], title: str) -> str:
    """The sweep's Markdown table: run parameters, dataset, headline metric, attention stats."""
    params = [c for c in _columns(rows) if c.startswith("param.")]
    cols = ["run"] + params + ["dataset", "metric", "value"]
    cols += [c for c in STAT_COLUMNS if any(c in r for r in rows)]
    cols += ["random_weights"]
    partial = any(r.get("partial") for r in rows)
    note = _random_note(rows)
    if partial:
        note += "\n\n**PARTIAL**: some runs evaluated only the first TEST.MAX_IMAGES images."
    return markdown_table(rows, cols, title=title, note=note)


# ------------------------------------------------------------------------------ the paper
def load_paper_results(path: str = PAPER_CSV) -> List[Dict[str, Any]]:
    """Rows of the paper's numbers (columns table, backbone, source, block, resolution,
    normalizer, alpha, dataset, metric, value)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["resolution"] = int(r["resolution"])
        r["alpha"] = float(r["alpha"]) if r["alpha"] else None
        r["value"] = float(r["value"])
    return rows


def _join_key(d: Dict[str, Any], dataset: str, metric: str) -> Tuple:
    alpha = d.get("alpha")
    return (d.get("backbone"), d.get("source"), d.get("block"), d.get("resolution"), d.get("normalizer"),
            None if alpha is None else round(float(alpha), 4), dataset, metric)


def compare_with_paper(rows: Sequence[Dict[str, Any]], paper: Optional[Sequence[Dict[str, Any]]] = None
                       ) -> List[Dict[str, Any]]:
    """Join our rows with the paper's numbers on (backbone, source, block, resolution,
    normalizer, alpha, dataset, metric).

    Every metric of ours the paper reports (mIoU; FG-OVD top1 per split, mHME) gives one
    output row ``{run, dataset, metric, ..., ours, paper, diff (ours - paper), paper_tables}``;
    rows without a paper number have ``paper`` None. The paper repeats some numbers in two
    tables (e.g. Tables 1 and 4); ``paper_tables`` lists them.
    """
    paper = load_paper_results() if paper is None else paper
    index: Dict[Tuple, Dict[str, Any]] = {}
    for p in paper:
        key = _join_key(p, p["dataset"], p["metric"])
        entry = index.setdefault(key, {"value": p["value"], "tables": []})
        if abs(entry["value"] - p["value"]) > 1e-9:
            entry.setdefault("conflict", []).append(p["value"])
        entry["tables"].append(str(p["table"]))
    out = []
    for r in rows:
        metrics = [m for m in ("mIoU", "top1", "mHME") if m in r and r.get(m) is not None]
        for m in metrics:
            hit = index.get(_join_key(r, r["dataset"], m))
            ours = float(r[m])
            row = OrderedDict(
                run=r["run"], dataset=r["dataset"], backbone=r.get("backbone"), source=r.get("source"),
                block=r.get("block"), resolution=r.get("resolution"), normalizer=r.get("normalizer"),
                alpha=r.get("alpha"), metric=m, ours=ours,
                paper=hit["value"] if hit else None,
                diff=(ours - hit["value"]) if hit else None,
                paper_tables=";".join(sorted(set(hit["tables"]), key=int)) if hit else "",
                random_weights=r.get("random_weights", False),
            )
            out.append(row)
    return out


def write_tables(records: Sequence[Dict[str, Any]], out_dir: str, *, title: str = "sweep",
                 compare_paper: bool = False) -> Dict[str, str]:
    """Write ``results.csv`` and ``results.md`` (and with ``compare_paper``
    ``compare_paper.csv`` / ``compare_paper.md``) into ``out_dir``; returns their paths."""
    rows = flatten_records(records)
    paths = {"csv": write_csv(rows, os.path.join(out_dir, "results.csv"))}
    md = os.path.join(out_dir, "results.md")
    with open(md, "w") as f:
        f.write(sweep_markdown(rows, title))
    paths["md"] = md
    if compare_paper:
        cmp_rows = compare_with_paper(rows)
        paths["compare_csv"] = write_csv(cmp_rows, os.path.join(out_dir, "compare_paper.csv"))
        cols = ["run", "dataset", "backbone", "source", "block", "resolution", "normalizer", "alpha", "metric",
                "ours", "paper", "diff", "paper_tables"]
        matched = sum(r["paper"] is not None for r in cmp_rows)
        note = (f"Ours vs the paper (arXiv 2607.07135v2; numbers shipped in "
                f"sparseclip_d2/reference/paper_results.csv). {matched} of {len(cmp_rows)} rows have a paper "
                "number; diff = ours - paper.\n\n" + _random_note(cmp_rows))
        cmp_md = os.path.join(out_dir, "compare_paper.md")
        with open(cmp_md, "w") as f:
            f.write(markdown_table(cmp_rows, cols, title=f"{title}: ours vs paper", note=note))
        paths["compare_md"] = cmp_md
    return paths
