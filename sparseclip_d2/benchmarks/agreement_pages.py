"""The method pages of ``docs/agreement/`` as a work list and as the place rows land.

- :func:`todo`: what is left to run. First every row of an ``## Earlier rows`` section that no
  ``## Rows at main`` section has rerun (same config, stage-forcing variants and input); then every
  (dataset config, input) cell of the summary page with no proof row, with the variants that the
  config's rows (else the method's) already use, so that the row exercises the same stages.
- :func:`merge`: the rows that ``tools/agreement.py`` wrote to ``<workdir>/rows.jsonl`` go into the
  page's ``## Rows at main `COMMIT` `` section (made above the older row sections when missing). A
  row replaces the row of the same key in every other section; an older table left with no row
  says so instead of showing an empty table.

``python tools/agreement_matrix.py --todo`` prints the list (``METHOD CONFIG INPUT [VARIANT,...]``,
one cell a line) and ``--merge ROWS.jsonl --commit C --when W`` merges. The summary page is then
rewritten with ``--write``.
"""
import collections
import json
import os
import re
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


#: a row as :func:`sparseclip_d2.benchmarks.agreement.format_row` prints it
ROW = re.compile(
    r"^\| `(?P<config>[^`]+\.yaml)`(?: \+ (?P<force>[^|]+?))? \| `[^`]*` \| (?P<input>\S+) (?P<h>\d+) x (?P<w>\d+) \| "
    r"(?P<percent>\d+\.\d+) \((?P<classes>\d+)\)(?P<differ>[^|]*)\| (?P<stages>[^|]*)\| (?P<repo>\S+) (?P<commit>\w+) \|\s*$")

#: the inputs of the columns, in order (``sparseclip_d2.benchmarks.agreement.DEFAULT_INPUTS``); any
#: other (``PHOTO@HxW``) goes to the last column
COLUMNS = ("voc", "arc2017", "voc_odd", "voc_wide")


def row_force(match: "re.Match") -> Tuple[str, ...]:
    """The stage-forcing variants of a :data:`ROW` match (``+ prob0, feedback0``), in page order."""
    return tuple(f.strip() for f in (match["force"] or "").split(",") if f.strip())


def page_of(method: str, pages_dir: str) -> str:
    """The page of ``method`` in ``pages_dir``: ``<method>.md``, else the page whose name is the
    method's with underscores (``clip_surgery.md`` for ``clipsurgery``)."""
    if not os.path.isfile(os.path.join(pages_dir, method + ".md")) and os.path.isdir(pages_dir):
        for name in sorted(os.listdir(pages_dir)):
            if name.endswith(".md") and name[:-3].replace("_", "") == method:
                return name
    return method + ".md"

CURRENT = "## Rows at main `{commit}` (`tools/agreement.py`)"
CURRENT_PREFIX = "## Rows at main `"
EARLIER_PREFIX = "## Earlier rows"
TABLE_HEADER = ("| project config (+ stage forcing) | upstream config | input, resized | "
                "agreement (classes) [differing px] | stage activity | upstream |")
TABLE_RULE = "|---|---|---|---|---|---|"
RERUN_NOTE = ("Every row of this table was rerun at a later main (the section above); the table is in the "
              "page's git history.")

Key = Tuple[str, Tuple[str, ...], str]


def _key(config: str, force: Iterable[str], input_name: str) -> Key:
    return config, tuple(force), input_name


def page_rows(text: str) -> List[dict]:
    """Every driver row of a page with its line number and the ``## `` heading it is under."""
    rows, heading = [], ""
    for i, line in enumerate(text.splitlines()):
        if line.startswith("## "):
            heading = line
        m = ROW.match(line)
        if m:
            rows.append({"line": i, "heading": heading, "key": _key(m["config"], row_force(m), m["input"]),
                         "flat": "**flat:" in m["stages"]})
    return rows


def todo(entries: Dict[str, type], pages_dir: str, methods: Optional[Sequence[str]] = None) -> List[dict]:
    """The rows left to run, earlier rows first, as ``{method, config, input, force}``."""
    unknown = sorted(set(methods or ()) - set(entries))
    if unknown:
        raise ValueError(f"unknown method(s) {', '.join(unknown)}; valid: {', '.join(sorted(entries))}")
    earlier, cells = [], []
    for method, e in entries.items():
        configs = list(getattr(e, "configs", None) or {})
        if (methods and method not in methods) or not configs:
            continue
        path = os.path.join(pages_dir, page_of(method, pages_dir))
        rows = page_rows(open(path, encoding="utf-8").read()) if os.path.isfile(path) else []
        current = {r["key"] for r in rows if r["heading"].startswith(CURRENT_PREFIX)}
        seen = set()
        for r in rows:
            if r["heading"].startswith(EARLIER_PREFIX) and not r["flat"] and r["key"] not in current \
                    and r["key"] not in seen:
                seen.add(r["key"])
                config, force, input_name = r["key"]
                earlier.append({"method": method, "config": config, "input": input_name, "force": list(force)})
        proof = [r for r in rows if not r["flat"]]
        method_force = _most_common(r["key"][1] for r in proof)
        for config in configs:
            config_force = _most_common(r["key"][1] for r in proof if r["key"][0] == config)
            force = config_force if config_force is not None else method_force
            for input_name in COLUMNS:
                if not any(r["key"][0] == config and r["key"][2] == input_name for r in proof):
                    cells.append({"method": method, "config": config, "input": input_name,
                                  "force": list(force or ())})
    return earlier + cells


def _most_common(forces: Iterable[Tuple[str, ...]]) -> Optional[Tuple[str, ...]]:
    """The most frequent variant set (the first met on a tie); None when there is none."""
    counts = collections.Counter(forces)
    if not counts:
        return None
    best = max(counts.values())
    return next(f for f in counts if counts[f] == best)


def _section_lines(method: str, commit: str, when: str) -> List[str]:
    return [CURRENT.format(commit=commit), "",
            f"Measured {when} on the CPU in fp32 with 1 torch thread, on a shared 2-core machine, by this "
            "command with each row's config, input and stage-forcing variant (the section \"Rerun a row\" "
            "gives the checkout and any `--dino` / `--upstream-python`):", "",
            "```bash",
            f"python tools/agreement.py --method {method} --upstream <checkout> --configs <CONFIG> "
            "--inputs <INPUT> [--force VARIANT] --threads 1",
            "```", "", TABLE_HEADER, TABLE_RULE]


def merge(text: str, method: str, lines: Sequence[str], commit: str, when: str) -> str:
    """``text`` with the driver rows ``lines`` in its ``## Rows at main `commit` `` section."""
    new = {}
    for line in lines:
        m = ROW.match(line)
        if not m:
            raise ValueError(f"not a row of tools/agreement.py: {line!r}")
        new[_key(m["config"], row_force(m), m["input"])] = line
    heading = CURRENT.format(commit=commit)
    rows = page_rows(text)
    out = text.splitlines()
    drop = {r["line"] for r in rows if r["key"] in new}  # superseded, in whatever section they are
    if heading not in out:
        at = next((i for i, l in enumerate(out) if l.startswith((CURRENT_PREFIX, EARLIER_PREFIX))), len(out))
        block = _section_lines(method, commit, when) + [""]
        out[at:at] = block
        drop = {i + len(block) if i >= at else i for i in drop}
    start = out.index(heading)
    end = next((i for i in range(start + 1, len(out)) if out[i].startswith("## ")), len(out))
    last = max((i for i in range(start, end) if out[i].startswith("|")), default=None)
    if last is None:
        raise ValueError(f"section {heading!r} of the {method} page has no table")
    kept = [out[i] for i in range(start, last + 1) if i not in drop]
    body = kept + list(new.values())
    out = ([out[i] for i in range(start) if i not in drop] + body
           + [out[i] for i in range(last + 1, len(out)) if i not in drop])
    return "\n".join(_empty_tables_noted(out)) + ("\n" if text.endswith("\n") else "")


def _empty_tables_noted(lines: List[str]) -> List[str]:
    """An agreement table (header and rule) with no row left becomes :data:`RERUN_NOTE`."""
    out, i = [], 0
    while i < len(lines):
        if lines[i] == TABLE_HEADER and i + 1 < len(lines) and lines[i + 1] == TABLE_RULE and \
                (i + 2 >= len(lines) or not lines[i + 2].startswith("|")):
            out.append(RERUN_NOTE)
            i += 2
            continue
        out.append(lines[i])
        i += 1
    return out


def merge_jsonl(path: str, pages_dir: str, commit: str, when: str, entries: Dict[str, type]) -> Dict[str, int]:
    """Every row of a ``rows.jsonl`` into its method's page; returns the rows merged per page.
    A key measured twice keeps its last row."""
    from .agreement import format_row

    by_method: Dict[str, Dict[Key, str]] = collections.defaultdict(dict)
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            method = row.get("method")
            if method not in entries:
                raise ValueError(f"{path}:{n}: method {method!r} is not an agreement entry; valid: "
                                 f"{', '.join(sorted(entries))}")
            e = entries[method]
            by_method[method][_key(row["config"], row["force"], row["input"])] = format_row(
                row, f"{e.repo} {e.commit}")
    merged = {}
    for method, rows in by_method.items():
        page = os.path.join(pages_dir, page_of(method, pages_dir))
        if not os.path.isfile(page):
            raise ValueError(f"{path}: no page {page} for method {method}")
        text = open(page, encoding="utf-8").read()
        with open(page, "w", encoding="utf-8") as f:
            f.write(merge(text, method, list(rows.values()), commit, when))
        merged[os.path.basename(page)] = len(rows)
    return merged


_COMMIT = re.compile(r"^[0-9a-f]{7,40}$")


def check_commit(commit: str) -> str:
    if not _COMMIT.match(commit):
        raise ValueError(f"--commit {commit!r}: give the main commit the rows were measured at (7-40 hex digits)")
    return commit
