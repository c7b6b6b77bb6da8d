"""MESS's per-dataset and per-domain tables from this project's results (``results.json`` /
sweep records), averaged the way MESS's own ``mess/evaluation/mess_evaluation.py``
(mess-benchmark 0.2 = blumenstiel/MESS ``cc701b5``) averages them:

- one row per dataset of MESS's ``dataset_names`` (its order), a missing one counted as NaN;
- the four PAXRay binary tasks (``paxray_sem_seg_test_*``) replaced by one row, PAXRay-4, their
  mean (``combine_paxray``);
- ``Mean``: the mean over the (22) dataset rows, NaN left out (pandas ``mean``);
- per domain (``dataset_domains``: General, Earth Monitoring, Medical Sciences, Engineering,
  Agriculture and Biology) the mean of its rows, NaN left out; the ``Mean`` row is its own
  domain, ``Mean``;
- written rounded to 2 decimals.

The dataset names, display names and domains are read from MESS's module (pandas is
imported with it); the averaging is ours (standard library), so that a sweep's records need
no ``.pth`` files. ``tests/evaluation/test_mess_benchmark.py`` checks it against MESS's script.
"""
import math
import os
from collections import OrderedDict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..common.io import atomic_write_text

__all__ = ["MESS_TABLE_METRICS", "PAXRAY_COMBINED", "mess_catalog", "mess_tables", "write_mess_tables",
           "mess_results_of_records"]

#: The metrics written by default: MESS's script defaults to mIoU; CoI-mIoU is what MESS adds.
MESS_TABLE_METRICS = ("mIoU", "CoI-mIoU")
#: MESS's key of the combined PAXRay row and the prefix of its four parts (mess_evaluation.py combine_paxray).
PAXRAY_COMBINED = "paxray_combined"
_PAXRAY_PART = "paxray_sem_seg_test_"


def mess_catalog() -> Tuple["OrderedDict[str, str]", Dict[str, str]]:
    """``(dataset id -> display name, in MESS's order; dataset id -> domain)`` from MESS."""
    from mess.evaluation.mess_evaluation import dataset_domains, dataset_names

    return OrderedDict(dataset_names), dict(dataset_domains)


def _nanmean(values: Sequence[float]) -> float:
    kept = [v for v in values if v is not None and not math.isnan(v)]
    return sum(kept) / len(kept) if kept else float("nan")


def _value(metrics: Mapping[str, Any], metric: str) -> float:
    v = metrics.get(metric) if metrics else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def mess_tables(per_model: Mapping[str, Mapping[str, Mapping[str, Any]]],
                metrics: Sequence[str] = MESS_TABLE_METRICS) -> Dict[str, Any]:
    """MESS's tables of ``per_model`` (model -> dataset id -> metric -> value).

    Returns:
        ``{"datasets": [display names..., "Mean"], "domains": [domains..., "Mean"],
        "per_dataset": {metric: {model: {display name: value}}},
        "per_domain": {metric: {model: {domain: value}}}}`` (unrounded; NaN where nothing was measured).
    """
    names, domains = mess_catalog()
    parts = [d for d in names if d.startswith(_PAXRAY_PART)]
    rows: List[Tuple[str, str]] = []  # (display name, domain) in MESS's order, PAXRay-4 in place of its parts
    for d, display in names.items():
        if d in parts:
            continue
        rows.append((display, domains[d]))
    domain_order = list(OrderedDict.fromkeys(dom for _, dom in rows)) + ["Mean"]
    out = {"datasets": [r[0] for r in rows] + ["Mean"], "domains": domain_order, "per_dataset": {}, "per_domain": {}}
    for metric in metrics:
        per_dataset, per_domain = OrderedDict(), OrderedDict()
        for model, results in per_model.items():
            values = OrderedDict()
            for d, display in names.items():
                if d in parts:
                    continue
                if d == PAXRAY_COMBINED:
                    values[display] = _nanmean([_value(results.get(p), metric) for p in parts])
                else:
                    values[display] = _value(results.get(d), metric)
            mean = _nanmean(list(values.values()))
            by_domain = OrderedDict((dom, _nanmean([values[n] for n, dm in rows if dm == dom]))
                                    for dom in domain_order[:-1])
            by_domain["Mean"] = mean
            values["Mean"] = mean
            per_dataset[model], per_domain[model] = values, by_domain
        out["per_dataset"][metric], out["per_domain"][metric] = per_dataset, per_domain
    return out


def _cell(v: float) -> str:
    return "-" if v is None or math.isnan(v) else f"{round(v, 2):.2f}"


def _csv_field(text: str) -> str:
    return f'"{text}"' if any(c in text for c in ',"\n') else text


def write_mess_tables(per_model: Mapping[str, Mapping[str, Mapping[str, Any]]], out_dir: str,
                      metrics: Sequence[str] = MESS_TABLE_METRICS, note: str = "") -> Dict[str, str]:
    """Write ``mess_domains_<metric>.csv`` (model x domain, as MESS's ``domain_results_<metric>.csv``),
    ``mess_datasets_<metric>.csv`` (model x dataset, as its ``results_<metric>.csv``) and one
    ``mess.md`` with both, rounded to 2 decimals ("-" where nothing was measured).

    Returns:
        the paths written, by name.
    """
    tables = mess_tables(per_model, metrics)
    paths: Dict[str, str] = {}
    md = ["# MESS: per-domain and per-dataset means", "",
          "Averaged as MESS's `mess/evaluation/mess_evaluation.py` (mess-benchmark 0.2): PAXRay-4 = the mean of its "
          "four binary tasks; Mean = the mean over the datasets; a domain = the mean of its datasets; datasets "
          "not measured are left out of the means (\"-\")." + (f" {note}" if note else ""), ""]
    for metric in metrics:
        for kind, columns in (("domains", tables["domains"]), ("datasets", tables["datasets"])):
            rows = tables[f"per_{kind[:-1]}"][metric]
            lines = [",".join(["Model"] + [_csv_field(c) for c in columns])]
            lines += [",".join([_csv_field(m)] + [_cell(r[c]) for c in columns]) for m, r in rows.items()]
            paths[f"{kind}_{metric}"] = atomic_write_text(os.path.join(out_dir, f"mess_{kind}_{metric}.csv"),
                                                          "\n".join(lines) + "\n")
            md += [f"## {metric} per {kind[:-1]}", "", "| model | " + " | ".join(columns) + " |",
                   "|---|" + "---|" * len(columns)]
            md += ["| " + " | ".join([m] + [_cell(r[c]) for c in columns]) + " |" for m, r in rows.items()]
            md.append("")
    paths["md"] = atomic_write_text(os.path.join(out_dir, "mess.md"), "\n".join(md))
    return paths


def mess_results_of_records(records: Sequence[Mapping[str, Any]],
                            run_keys: Optional[Sequence[str]] = None) -> "OrderedDict[str, Dict[str, Dict]]":
    """``model (run name) -> dataset id -> metrics`` of the ``ok`` sweep records whose datasets
    include a MESS one (a results.json entry with ``benchmark`` "MESS"); empty when none does."""
    out: "OrderedDict[str, Dict[str, Dict]]" = OrderedDict()
    keys = None if run_keys is None else set(run_keys)
    for r in records:
        if r.get("status") != "ok" or (keys is not None and r.get("run_key") not in keys):
            continue
        datasets = {d: m for d, m in (r.get("datasets") or {}).items() if m.get("benchmark") == "MESS"}
        if datasets:
            out.setdefault(str(r.get("run_name")), {}).update(datasets)
    return out
