"""Sweep records -> flat rows, CSV / Markdown tables, and the join with the paper's numbers.

A *row* is one (run, dataset) pair of a sweep's JSON-lines file with the run's settings
(:func:`describe`, columns :data:`SETTING_KEYS`): the paper's descriptors ``backbone``
(``B/16``, ``L/14`` or the open_clip name), ``source`` (``qkv``, ``qqv``, ``kkv``, ``vvv``,
``qq+kk``, ``v-only``), ``block`` (``full``, ``drop_ffn``, ``drop_residual``, ``drop_both``),
``resolution``, ``normalizer`` (``softmax``, ``entmax``, ``random_matched``, ``sparsemax``,
``none`` for the value path; ``<normalizer>_temperature_<T>`` when T != 1) and ``alpha`` (None
when unused), and every other setting that can change a result (``num_layers``, ``prior``,
``sum_mode``, ``templates``, ``sliding``, ``prob_threshold``, ...), plus the run's metrics,
attention statistics, ``status`` (ok / failed) and ``partial``.
"""
import csv
import io
import math
import os
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..attention import paper_source_name
from ..common.io import atomic_write_text
from .mess_tables import mess_results_of_records, write_mess_tables

__all__ = [
    "PAPER_CSV",
    "STAT_COLUMNS",
    "SEM_SEG_EXTRA_COLUMNS",
    "SETTING_KEYS",
    "describe",
    "short_dataset",
    "primary_metric",
    "select_records",
    "flatten_records",
    "write_csv",
    "markdown_table",
    "load_paper_results",
    "paper_protocol_mismatch",
    "compare_with_paper",
    "write_tables",
]

#: The paper's numbers, shipped as package data.
PAPER_CSV = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference",
                         "paper_results.csv")
STAT_COLUMNS = ("same_class_mass", "non_class_mass", "background_mass", "support_size", "perplexity")
#: Segmentation metrics shown beside the headline one when a run reports them
#: (sparseclip_d2/evaluation/sem_seg_metrics.py): the share of classes with zero IoU, the boundary IoU.
SEM_SEG_EXTRA_COLUMNS = ("zero_IoU_share", "boundary_IoU")
#: Columns of a row that describe the run's setting (everything but the metrics).
SETTING_KEYS = ("backbone", "pretrained", "source", "block", "resolution", "normalizer", "alpha", "num_layers",
                "prior", "sum_mode", "templates", "sliding", "logit_scale", "prob_threshold", "area_threshold",
                "fgovd_protocol")
_PAPER_BACKBONES = {"ViT-B-16-quickgelu": "B/16", "ViT-L-14-quickgelu": "L/14", "ViT-B-16": "B/16",
                    "ViT-L-14": "L/14"}
_BLOCKS = {(True, True): "full", (True, False): "drop_ffn", (False, True): "drop_residual",
           (False, False): "drop_both"}


def short_dataset(name: str) -> str:
    """``sparseclip_voc21_val`` -> ``voc21``; ``sparseclip_fgovd_hard`` -> ``fgovd_hard``."""
    s = name[len("sparseclip_"):] if name.startswith("sparseclip_") else name
    return s[: -len("_val")] if s.endswith("_val") else s


def _paper_source(source: Any) -> str:
    try:
        return paper_source_name(str(source))
    except ValueError:  # an unknown or custom source: keep it as written
        return str(source)


def describe(config: Dict[str, Any], dataset: str = "") -> Dict[str, Any]:
    """A run's settings (:data:`SETTING_KEYS`) from its config summary, in the paper's terms
    (see the module docstring). Settings that cannot matter are None (``sum_mode`` of a
    single source, ``prior_std`` without a prior, ``alpha`` of softmax)."""
    name = str(config.get("backbone") or "")
    paper_src = _paper_source(config.get("source", "qk"))
    block = _BLOCKS[(bool(config.get("residual", True)), bool(config.get("ffn", True)))]
    norm = str(config.get("normalizer", "softmax"))
    temperature = float(config.get("temperature", 1.0) or 1.0)
    alpha = config.get("alpha")
    if paper_src == "v-only":
        norm, alpha = "none", None
    else:
        if norm == "softmax":
            alpha = None
        elif norm == "sparsemax":
            alpha = 2.0
        if temperature != 1.0:
            norm = f"{norm}_temperature_{temperature:g}"
    resolution = config.get("fgovd_resolution") if dataset.startswith("fgovd") else config.get("resolution")
    prior = config.get("prior") or "none"
    if prior != "none" and config.get("prior_std") is not None:
        prior = f"{prior}_{float(config['prior_std']):g}"
    return OrderedDict(
        backbone=_PAPER_BACKBONES.get(name, name), pretrained=config.get("pretrained"), source=paper_src,
        block=block, resolution=int(resolution) if resolution is not None else None, normalizer=norm,
        alpha=float(alpha) if alpha is not None else None,
        num_layers=config.get("num_layers"), prior=prior,
        sum_mode=config.get("sum_mode") if "+" in paper_src else None,
        templates=config.get("templates"), sliding=config.get("sliding"),
        logit_scale=config.get("logit_scale"), prob_threshold=config.get("prob_threshold"),
        area_threshold=config.get("area_threshold"),
        fgovd_protocol=config.get("fgovd_protocol") if dataset.startswith("fgovd") else None,
    )


def primary_metric(metrics: Dict[str, Any]) -> Optional[str]:
    """The headline metric of a dataset entry: mIoU, else mHME, else top1."""
    for k in ("mIoU", "mHME", "top1"):
        if k in metrics:
            return k
    return None


def select_records(records: Iterable[Dict[str, Any]], run_keys: Optional[Sequence[str]] = None
                   ) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """``(current, stale)``: one record per run key (its last ``ok`` record, else its last
    record), in the order of ``run_keys`` (the current sweep file's runs; None = every key in
    file order), and the records of keys outside ``run_keys`` (other settings, other data,
    other code: reported, never tabulated)."""
    records = list(records)
    wanted = None if run_keys is None else set(run_keys)
    best: "OrderedDict[str, Dict[str, Any]]" = OrderedDict()
    stale = []
    for r in records:
        key = r.get("run_key")
        if wanted is not None and key not in wanted:
            stale.append(r)
            continue
        prev = best.get(key)
        if prev is None or r.get("status") == "ok" or prev.get("status") != "ok":
            best[key] = r
    order = list(run_keys) if run_keys is not None else list(best)
    return [best[k] for k in order if k in best], stale


def flatten_records(records: Iterable[Dict[str, Any]], *, run_keys: Optional[Sequence[str]] = None,
                    include_failed: bool = False) -> List[Dict[str, Any]]:
    """One row per (run, dataset) of the selected records (:func:`select_records`), with
    ``status`` ok; with ``include_failed`` also one row per failed run (``status`` failed,
    ``error`` its one-line summary).

    Args:
        records: JSON-lines records of :func:`sparseclip_d2.analysis.sweep.run_one`.
        run_keys: the runs to tabulate (the current sweep's); None = every run key.
    """
    from .sweep import error_summary

    current, _ = select_records(records, run_keys)
    rows = []
    for r in current:
        if r.get("status") != "ok":
            if include_failed:
                row = OrderedDict(run=r.get("run_name"), group=r.get("group", ""), dataset="-", status="failed")
                for k, v in (r.get("params") or {}).items():
                    row[f"param.{k}"] = v if not isinstance(v, list) else ",".join(map(str, v))
                row["error"] = error_summary(r.get("error"))
                row["run_key"] = r.get("run_key")
                rows.append(row)
            continue
        for dname, metrics in (r.get("datasets") or {}).items():
            ds = short_dataset(dname)
            row = OrderedDict(run=r["run_name"], group=r.get("group", ""), dataset=ds, status="ok")
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
            row["max_images"] = r.get("max_images")
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
    """Write rows as CSV (union of their keys as columns, in first-seen order), atomically."""
    columns = list(columns) if columns is not None else _columns(rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in columns})
    return atomic_write_text(path, buf.getvalue())


def _fmt(v: Any, digits: int = 2) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.{digits}f}" if abs(v) >= 1 or v == 0 else f"{v:.4f}"
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[Dict[str, Any]], columns: Sequence[str], *, title: str = "",
                   note: str = "") -> str:
    """A GitHub Markdown table of ``columns`` of ``rows``."""
    out = io.StringIO()
    if title:
        out.write(f"## {title}\n\n")
    if note.strip():
        out.write(note.strip() + "\n\n")
    out.write("| " + " | ".join(columns) + " |\n")
    out.write("|" + "|".join("---" for _ in columns) + "|\n")
    for r in rows:
        out.write("| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |\n")
    return out.getvalue()


def _notes(rows: Sequence[Dict[str, Any]], stale: int = 0) -> str:
    notes = []
    if any(r.get("random_weights") for r in rows):
        notes.append("**RANDOM WEIGHTS**: some runs used random CLIP weights (`random_weights: yes`); their "
                     "numbers are a smoke test and mean nothing.")
    if any(r.get("partial") for r in rows):
        notes.append("**PARTIAL**: runs marked `partial: yes` evaluated only the first TEST.MAX_IMAGES images "
                     "(`max_images`); their numbers are not comparable with full runs.")
    if any(r.get("status") == "failed" for r in rows):
        notes.append("**FAILED** runs are listed with their error (the full traceback is in results.jsonl and the "
                     "run's stderr.txt).")
    if stale:
        notes.append(f"{stale} record(s) of results.jsonl belong to runs that are not in the current sweep file "
                     "(changed settings, data, code or versions) and are left out.")
    return "\n\n".join(notes)


def sweep_markdown(rows: Sequence[Dict[str, Any]], title: str, stale: int = 0) -> str:
    """The sweep's Markdown table: run parameters, dataset, status, headline metric, attention
    stats, partial / random-weight marks, failures with their error."""
    params = [c for c in _columns(rows) if c.startswith("param.")]
    cols = ["run"] + params + ["dataset", "status", "metric", "value"]
    cols += [c for c in SEM_SEG_EXTRA_COLUMNS if any(c in r for r in rows)]
    cols += [c for c in STAT_COLUMNS if any(c in r for r in rows)]
    cols += ["partial", "random_weights"]
    if any(r.get("status") == "failed" for r in rows):
        cols.append("error")
    return markdown_table(rows, cols, title=title, note=_notes(rows, stale))


# ------------------------------------------------------------------------------ the paper
def load_paper_results(path: str = PAPER_CSV) -> List[Dict[str, Any]]:
    """Rows of the paper's numbers (columns table, backbone, source, block, resolution,
    normalizer, alpha, dataset, metric, value), each with its ``line`` in the CSV."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for i, r in enumerate(rows, 2):
        r["resolution"] = int(r["resolution"])
        r["alpha"] = float(r["alpha"]) if r["alpha"] else None
        r["value"] = float(r["value"])
        r["line"] = i
    return rows


#: Settings the paper's tables hold fixed, which reference/paper_results.csv does not list:
#: (setting, required value, datasets it applies to (None = all), why). Sources:
#: /work/shared/protocol.md section 1 (main setting: entmax in the last 1 layer; sum
#: variants normalise each term then sum; "mIoU @ thr=0.75" on VOC21; templates and sliding
#: window unknown, most likely single template and no sliding window: assumed, as the
#: configs/paper/*.yaml files do).
PAPER_PROTOCOL = (
    ("num_layers", 1, None, "the paper's tables are all depth 1 (its depth study is a figure without numbers)"),
    ("prior", "none", None, "the paper's rows have no attention prior"),
    ("sum_mode", "normalize_then_sum", None, "the paper normalises each term of a sum source, then sums"),
    ("templates", "single", None, "assumed single-template prompts (the paper's templates are unknown)"),
    ("sliding", False, None, "assumed whole-image inference (no sliding window)"),
    ("prob_threshold", 0.75, ("voc21",), "the paper's VOC21 numbers use a background threshold of 0.75"),
    ("fgovd_protocol", "dense", ("fgovd_hard", "fgovd_medium", "fgovd_easy", "fgovd_trivial", "fgovd_mHME"),
     "the paper's FG-OVD numbers use RoIAlign on the dense features"),
)


def paper_protocol_mismatch(row: Dict[str, Any]) -> Optional[str]:
    """Why a row's settings are outside the paper's protocol (:data:`PAPER_PROTOCOL`), or None."""
    out = []
    for key, required, datasets, why in PAPER_PROTOCOL:
        if datasets is not None and row.get("dataset") not in datasets:
            continue
        value = row.get(key)
        if key == "sum_mode" and value is None:  # a single source: sum_mode cannot matter
            continue
        if value is None:
            out.append(f"{key} unknown")
            continue
        same = (abs(float(value) - float(required)) < 1e-9 if isinstance(required, float)
                else str(value).lower() == str(required).lower())
        if not same:
            out.append(f"{key}={value} ({why})")
    return "; ".join(out) or None


def _join_key(d: Dict[str, Any], dataset: str, metric: str) -> Tuple:
    alpha = d.get("alpha")
    return (d.get("backbone"), d.get("source"), d.get("block"), d.get("resolution"), d.get("normalizer"),
            None if alpha is None else round(float(alpha), 4), dataset, metric)


def _paper_row_name(p: Dict[str, Any], tables: Sequence[str], lines: Sequence[int]) -> str:
    norm = p["normalizer"] + (f" alpha={p['alpha']:g}" if p["alpha"] is not None else "")
    t = "Table " + "/".join(tables)
    return (f"{t}: {p['backbone']} {p['source']} {p['block']} {p['resolution']}px {norm} {p['dataset']} "
            f"{p['metric']} (paper_results.csv line {'/'.join(map(str, lines))})")


def compare_with_paper(rows: Sequence[Dict[str, Any]], paper: Optional[Sequence[Dict[str, Any]]] = None
                       ) -> List[Dict[str, Any]]:
    """Join our rows with the paper's numbers.

    A row matches a paper row when the CSV's columns agree (backbone, source, block,
    resolution, normaliser incl. temperature, alpha, dataset, metric) **and** the row's other
    settings are those the paper holds fixed (:data:`PAPER_PROTOCOL`: depth 1, no prior,
    normalise-then-sum, single template, whole image, VOC21 threshold 0.75, dense FG-OVD).
    Never the nearest row: otherwise ``paper`` is None and ``no_paper_row`` says why.

    Every metric of ours the paper reports (mIoU; FG-OVD top1 per split, mHME) gives one
    output row ``{run, dataset, ..., metric, ours, paper, diff (ours - paper), paper_row,
    no_paper_row, zero_IoU_share, boundary_IoU (ours, on mIoU rows, when reported), partial,
    random_weights}``; ``paper_row`` names the paper's table(s) and the
    CSV line(s) (the paper repeats some numbers in two tables).
    """
    paper = load_paper_results() if paper is None else paper
    index: Dict[Tuple, Dict[str, Any]] = {}
    for p in paper:
        key = _join_key(p, p["dataset"], p["metric"])
        entry = index.setdefault(key, {"value": p["value"], "tables": [], "lines": [], "row": p})
        if abs(entry["value"] - p["value"]) > 1e-9:
            raise ValueError(f"paper_results.csv lines {entry['lines']} and {p.get('line')} give two values for "
                             f"{key}: {entry['value']} and {p['value']}")
        entry["tables"].append(str(p["table"]))
        entry["lines"].append(p.get("line"))
    out = []
    for r in rows:
        if r.get("status", "ok") != "ok":
            continue
        metrics = [m for m in ("mIoU", "top1", "mHME") if m in r and r.get(m) is not None]
        for m in metrics:
            mismatch = paper_protocol_mismatch(r)
            hit = None if mismatch else index.get(_join_key(r, r["dataset"], m))
            reason = mismatch
            if hit is None and reason is None:
                reason = "the paper has no number for this setting"
            ours = float(r[m])
            row = OrderedDict(
                run=r["run"], dataset=r["dataset"], backbone=r.get("backbone"), source=r.get("source"),
                block=r.get("block"), resolution=r.get("resolution"), normalizer=r.get("normalizer"),
                alpha=r.get("alpha"), num_layers=r.get("num_layers"), metric=m, ours=ours,
                paper=hit["value"] if hit else None,
                diff=(ours - hit["value"]) if hit else None,
                paper_row=(_paper_row_name(hit["row"], sorted(set(hit["tables"]), key=int), hit["lines"])
                           if hit else ""),
                no_paper_row=reason or "",
                **{c: r.get(c) for c in SEM_SEG_EXTRA_COLUMNS if m == "mIoU"},  # ours only: the paper has none
                partial=bool(r.get("partial", False)),
                random_weights=bool(r.get("random_weights", False)),
            )
            out.append(row)
    return out


def write_tables(records: Sequence[Dict[str, Any]], out_dir: str, *, title: str = "sweep",
                 compare_paper: bool = False, run_keys: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Write ``results.csv`` and ``results.md`` (and with ``compare_paper``
    ``compare_paper.csv`` / ``compare_paper.md``; with runs on MESS's datasets MESS's tables,
    ``mess.md`` and ``mess_{domains,datasets}_<metric>.csv``) into ``out_dir`` from the records of
    ``run_keys`` (the current sweep's runs; None = every run key), atomically.

    Returns:
        the paths written, plus ``"stale"``: the number of records left out.
    """
    current_rows = flatten_records(records, run_keys=run_keys, include_failed=True)
    _, stale = select_records(records, run_keys)
    paths: Dict[str, Any] = {"csv": write_csv(current_rows, os.path.join(out_dir, "results.csv"))}
    paths["md"] = atomic_write_text(os.path.join(out_dir, "results.md"),
                                    sweep_markdown(current_rows, title, stale=len(stale)))
    if compare_paper:
        cmp_rows = compare_with_paper(current_rows)
        paths["compare_csv"] = write_csv(cmp_rows, os.path.join(out_dir, "compare_paper.csv"))
        cols = ["run", "dataset", "backbone", "source", "block", "resolution", "normalizer", "alpha", "num_layers",
                "metric", "ours", "paper", "diff", "paper_row", "no_paper_row"]
        cols += [c for c in SEM_SEG_EXTRA_COLUMNS if any(r.get(c) is not None for r in cmp_rows)]
        cols += ["partial"]
        matched = sum(r["paper"] is not None for r in cmp_rows)
        note = (f"Ours vs the paper (arXiv 2607.07135v2; numbers shipped in "
                f"sparseclip_d2/reference/paper_results.csv). {matched} of {len(cmp_rows)} rows have a paper "
                "number (a row without one says why in `no_paper_row`); diff = ours - paper.\n\n"
                + _notes(cmp_rows + [r for r in current_rows if r.get("status") == "failed"], stale=len(stale)))
        paths["compare_md"] = atomic_write_text(
            os.path.join(out_dir, "compare_paper.md"),
            markdown_table(cmp_rows, cols, title=f"{title}: ours vs paper", note=note))
    current = select_records(records, run_keys)[0]
    mess = mess_results_of_records(current)
    if mess:  # runs on MESS's datasets: MESS's per-domain and per-dataset tables (analysis/mess_tables.py)
        random = sorted(str(r.get("run_name")) for r in current
                        if r.get("status") == "ok" and r.get("random_weights") and str(r.get("run_name")) in mess)
        partial = sorted(str(r.get("run_name")) for r in current
                         if r.get("status") == "ok" and r.get("partial") and str(r.get("run_name")) in mess)
        note = " ".join(
            ([f"**RANDOM WEIGHTS** in {', '.join(random)}: those numbers mean nothing (a smoke run)."] if random else [])
            + ([f"**PARTIAL** (TEST.MAX_IMAGES) in {', '.join(partial)}: not MESS's numbers."] if partial else []))
        paths.update({f"mess_{k}": v for k, v in write_mess_tables(mess, out_dir, note=note).items()})
    paths["stale"] = len(stale)
    return paths
