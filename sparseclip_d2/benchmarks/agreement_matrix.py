"""The one-page summary of the agreement rows: method x dataset config x input, the lowest figure
of each cell, read from the rows that ``tools/agreement.py`` printed into the method pages
(``docs/agreement/<method>.md``), so that the page says which cells are proven and which are not
run yet. ``python tools/agreement_matrix.py --write docs/agreement/matrix.md`` rewrites it;
``--check`` fails when the written page is not what the method pages give.

A row counts for its cell (config, input) whatever stage-forcing variants it ran with (they are
listed in the cell). A row with a flat stage proves nothing: a cell with flat rows only reads
``flat``. Rows in the older formats of a page (the scratch harnesses' and the family drivers'
tables, e.g. GLA-CLIP's and Talk2DINO's) are not read; those methods are listed below the tables
with their pages.
"""
import os
from typing import Dict, List, Optional, Sequence

from .agreement_pages import COLUMNS, ROW, page_of, row_force  # noqa: F401  (the row format and the pages)

#: the last column: any input not in COLUMNS (``PHOTO@HxW``)
OTHER = "other"


def parse_rows(text: str) -> List[dict]:
    """The driver rows of one page, in page order: config, force (list), input, percent (float),
    classes, flat (bool), not_near_ties (bool), commit."""
    rows = []
    for line in text.splitlines():
        m = ROW.match(line)
        if not m:
            continue
        force = list(row_force(m))
        rows.append({"config": m["config"], "force": force, "input": m["input"], "percent": float(m["percent"]),
                     "classes": int(m["classes"]), "flat": "**flat:" in m["stages"],
                     "not_near_ties": "NOT near-ties" in m["differ"], "commit": f"{m['repo']} {m['commit']}"})
    return rows


def cell(rows: Sequence[dict]) -> str:
    """One cell: the lowest figure over the rows that are not flat, with the variants they ran
    with; ``flat`` when every row is flat; ``·`` when there is none."""
    if not rows:
        return "·"
    proof = [r for r in rows if not r["flat"]]
    if not proof:
        return "flat"
    low = min(proof, key=lambda r: r["percent"])
    text = f"{low['percent']:.3f}"
    if any(r["not_near_ties"] for r in proof):
        text += " **NOT near-ties**"
    variants = sorted({", ".join(r["force"]) for r in proof if r["force"]})
    if variants:
        text += " (" + "; ".join(variants) + ")"
    if len(proof) > 1:
        text += f" ×{len(proof)}"
    return text


def method_table(method: str, configs: Sequence[str], rows: Sequence[dict]) -> List[str]:
    """The table of one method: a line per dataset config (the entry's, then any other config its
    page has rows for), a column per input."""
    others = sorted({r["config"] for r in rows} - set(configs))
    names = list(configs) + others
    has_other = any(r["input"] not in COLUMNS for r in rows)
    cols = list(COLUMNS) + ([OTHER] if has_other else [])
    lines = ["| config | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name in names:
        cells = []
        for col in cols:
            sel = [r for r in rows if r["config"] == name
                   and (r["input"] == col if col != OTHER else r["input"] not in COLUMNS)]
            cells.append(cell(sel))
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return lines


def summary_line(method: str, page: str, configs: Sequence[str], rows: Sequence[dict]) -> str:
    proof = [r for r in rows if not r["flat"]]
    done = {(r["config"], r["input"]) for r in proof}
    configs_with = {c for c, _ in done}
    low = f"{min(r['percent'] for r in proof):.3f}" if proof else "no row"
    return (f"| [{method}]({page}) | {low} | {len(proof)} | {len(configs_with & set(configs))} of "
            f"{len(configs)} | {len([1 for c in configs for i in COLUMNS if (c, i) in done])} of "
            f"{len(configs) * len(COLUMNS)} |")


def render(entries: Dict[str, type], pages_dir: str) -> str:
    """The whole page from the entries (their dataset configs, repository and commit) and the
    method pages in ``pages_dir``."""
    read, unread, pages = {}, [], {}
    for method, e in entries.items():
        configs = list(getattr(e, "configs", None) or {})
        pages[method] = page_of(method, pages_dir)
        path = os.path.join(pages_dir, pages[method])
        text = open(path, encoding="utf-8").read() if os.path.isfile(path) else ""
        rows = parse_rows(text)
        if configs or rows:
            read[method] = (e, configs, rows)
        else:
            unread.append(method)
    out = [
        "# Agreement rows: method x dataset config x input",
        "",
        "Written by `python tools/agreement_matrix.py --write docs/agreement/matrix.md` from the rows that",
        "`tools/agreement.py` printed into each method's page; do not edit by hand. Each cell is the lowest",
        "% of equal pixels over the rows of that config and input (stage-forcing variants in brackets,",
        "`×n` when n rows), `flat` when every row had a flat stage (not a proof), `·` when not run yet.",
        "The inputs are described in [README.md](README.md#inputs); the target is at least 99.99 %, any",
        "differing pixel a float near-tie (a cell marked **NOT near-ties** is a finding, see the page).",
        "",
        "Rerun a cell (the method's page gives its checkout and any `--dino` / `--upstream-python`):",
        "",
        "```bash",
        "python tools/agreement.py --method METHOD --upstream CHECKOUT --configs CONFIG --inputs INPUT \\",
        "    [--force VARIANT ...] --threads 1 --workdir /tmp/agreement",
        "```",
        "",
        "| method | lowest | rows | dataset configs with a row | config x input cells with a row |",
        "|---|---|---|---|---|",
    ]
    out += [summary_line(m, pages[m], configs, rows) for m, (e, configs, rows) in read.items()]
    for method, (e, configs, rows) in read.items():
        out += ["", f"## {method}", "", f"Upstream {e.repo} `{e.commit}`; page [{pages[method]}]({pages[method]}).", ""]
        out += method_table(method, configs, rows)
    if unread:
        out += ["", "## Methods whose rows are in another format", "",
                "Their pages hold rows of their own drivers or feature-level comparisons:",
                ", ".join(f"[{m}]({pages[m]})" for m in unread) + "."]
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    from .entries import entries

    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pages", default=os.path.join(here, "docs", "agreement"), help="the folder of the method pages")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="FILE", help="write the summary page to FILE")
    g.add_argument("--check", metavar="FILE", help="exit 1 when FILE is not the page the method pages give")
    g.add_argument("--print", action="store_true", help="print the summary page")
    g.add_argument("--todo", action="store_true",
                   help="print the rows left to run, one a line: METHOD CONFIG INPUT [VARIANT,...] (earlier rows "
                        "not rerun at a later main first, then the cells with no row; agreement_pages.todo)")
    g.add_argument("--merge", metavar="ROWS_JSONL",
                   help="put the rows of a <workdir>/rows.jsonl of tools/agreement.py into their method pages, "
                        "section 'Rows at main `--commit`' (then rerun with --write)")
    p.add_argument("--methods", nargs="+", default=None, help="with --todo: only these methods")
    p.add_argument("--commit", help="with --merge: the main commit the rows were measured at")
    p.add_argument("--when", help="with --merge: when they were measured, e.g. '2026-12-08 02:00-04:00 UTC'")
    args = p.parse_args(argv)
    if not os.path.isdir(args.pages):
        p.error(f"--pages {args.pages}: no such folder")
    if args.todo or args.merge:
        from . import agreement_pages

        try:
            if args.todo:
                for r in agreement_pages.todo(entries(), args.pages, args.methods):
                    print(r["method"], r["config"], r["input"], ",".join(r["force"]))
                return 0
            if not args.commit or not args.when:
                p.error("--merge needs --commit and --when")
            if not os.path.isfile(args.merge):
                p.error(f"--merge {args.merge}: no such file")
            merged = agreement_pages.merge_jsonl(args.merge, args.pages, agreement_pages.check_commit(args.commit),
                                                 args.when, entries())
        except ValueError as e:
            p.error(str(e))
        for page, n in merged.items():
            print(f"{page}: {n} row(s) merged")
        return 0
    text = render(entries(), args.pages)
    if args.print:
        print(text, end="")
    elif args.write:
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {args.write}")
    else:
        try:
            current = open(args.check, encoding="utf-8").read()
        except OSError as e:
            print(f"agreement_matrix: error: --check {args.check}: {e.strerror}")
            return 1
        if current != text:
            print(f"agreement_matrix: {args.check} is out of date: rerun "
                  f"python tools/agreement_matrix.py --write {args.check}")
            return 1
        print(f"{args.check} is up to date")
    return 0
