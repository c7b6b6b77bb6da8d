"""The agreement pages as a work list and a merge target (``tools/agreement_matrix.py --todo`` /
``--merge``): the rows left to run and the page after a merge are checked against hand-written
expectations on a small page."""
import json

import pytest

from sparseclip_d2.benchmarks.agreement import format_row
from sparseclip_d2.benchmarks.agreement_matrix import main, parse_rows
from sparseclip_d2.benchmarks.agreement_pages import RERUN_NOTE, TABLE_HEADER, TABLE_RULE, merge, todo


def _row(config, input_name, force=(), percent=100.0, flat=()):
    return {"method": "m", "config": config, "force": list(force), "upstream_config": "configs/cfg_voc21.py",
            "input": input_name, "resized": [336, 504], "percent": percent, "classes_upstream": 7, "differ": 0,
            "margin_max_differing": None, "margin_median": 1e-3, "activity_summary": "windows: windows 8",
            "flat": list(flat)}


def _line(*a, **k):
    return format_row(_row(*a, **k), "o/m abc1234")


class Entry:
    repo, commit = "o/m", "abc1234"
    configs = {"m_voc21.yaml": "configs/cfg_voc21.py", "m_voc20.yaml": "configs/cfg_voc20.py"}


PAGE = "\n".join([
    "# m", "", "## Rerun a row", "", "text", "",
    "## Rows at main `1111111` (`tools/agreement.py`)", "", TABLE_HEADER, TABLE_RULE,
    _line("m_voc21.yaml", "voc", ["prob0"]),
    "",
    "## Earlier rows (before `0000000`)", "", TABLE_HEADER, TABLE_RULE,
    _line("m_voc21.yaml", "voc", ["prob0"], percent=99.9),   # rerun above
    _line("m_voc21.yaml", "voc_odd", ["prob0"]),              # not rerun
    _line("m_voc21.yaml", "arc2017", flat=["probability threshold"]),  # flat: proves nothing
    "", "### A finding", "", "prose", ""])


def test_todo_lists_earlier_rows_not_rerun_then_empty_cells_with_the_variants_in_use(tmp_path):
    (tmp_path / "m.md").write_text(PAGE)
    got = [(r["method"], r["config"], r["input"], r["force"]) for r in todo({"m": Entry}, str(tmp_path))]
    assert got == [
        ("m", "m_voc21.yaml", "voc_odd", ["prob0"]),
        # voc21: voc has a proof row; arc2017's only row is flat; voc_odd is counted (its earlier row)
        ("m", "m_voc21.yaml", "arc2017", ["prob0"]),
        ("m", "m_voc21.yaml", "voc_wide", ["prob0"]),
        # voc20 has no row: the method's variant
        ("m", "m_voc20.yaml", "voc", ["prob0"]), ("m", "m_voc20.yaml", "arc2017", ["prob0"]),
        ("m", "m_voc20.yaml", "voc_odd", ["prob0"]), ("m", "m_voc20.yaml", "voc_wide", ["prob0"])]
    with pytest.raises(ValueError, match="unknown method.*valid: m"):
        todo({"m": Entry}, str(tmp_path), ["nope"])


def test_merge_puts_rows_in_the_commit_section_and_drops_the_rows_they_replace():
    new_odd = _line("m_voc21.yaml", "voc_odd", ["prob0"], percent=99.995)
    new_wide = _line("m_voc20.yaml", "voc_wide", ["prob0"])
    text = merge(PAGE + "\n", "m", [new_odd, new_wide], "2222222", "2026-12-08 02:00 UTC")
    lines = text.splitlines()
    head = lines.index("## Rows at main `2222222` (`tools/agreement.py`)")
    assert lines.index("## Rerun a row") < head < lines.index("## Rows at main `1111111` (`tools/agreement.py`)")
    assert lines[head + 8:head + 12] == [TABLE_HEADER, TABLE_RULE, new_odd, new_wide]
    assert "2026-12-08 02:00 UTC" in lines[head + 2] and "--method m " in lines[head + 5]
    earlier = lines.index("## Earlier rows (before `0000000`)")
    # the voc_odd row left the earlier table; the two others stay, and so does the prose
    assert lines[earlier + 2:earlier + 6] == [TABLE_HEADER, TABLE_RULE, _line("m_voc21.yaml", "voc", ["prob0"],
                                                                             percent=99.9),
                                             _line("m_voc21.yaml", "arc2017", flat=["probability threshold"])]
    assert "### A finding" in lines and text.endswith("\n")
    assert len(parse_rows(text)) == 5
    # merging into an existing section replaces its row of the same key, in place of none other
    again = merge(text, "m", [_line("m_voc21.yaml", "voc_odd", ["prob0"], percent=100.0)], "2222222", "later")
    rows = parse_rows(again)
    assert [(r["config"], r["input"], r["percent"]) for r in rows[:2]] == [
        ("m_voc20.yaml", "voc_wide", 100.0), ("m_voc21.yaml", "voc_odd", 100.0)]
    assert again.count("## Rows at main `2222222`") == 1 and len(rows) == 5


def test_a_table_left_empty_says_its_rows_were_rerun():
    text = merge(PAGE, "m", [_line("m_voc21.yaml", "voc", ["prob0"])], "1111111", "x")
    assert RERUN_NOTE not in text  # the earlier table keeps two rows
    text = merge(text, "m", [_line("m_voc21.yaml", "voc_odd", ["prob0"]),
                             _line("m_voc21.yaml", "arc2017", flat=["probability threshold"])], "1111111", "x")
    lines = text.splitlines()
    earlier = lines.index("## Earlier rows (before `0000000`)")
    assert lines[earlier + 2] == RERUN_NOTE and lines.count(TABLE_HEADER) == 1
    assert [(r["input"]) for r in parse_rows(text)] == ["voc", "voc_odd", "arc2017"]
    with pytest.raises(ValueError, match="not a row of tools/agreement.py"):
        merge(PAGE, "m", ["| a | b |"], "1111111", "x")


def test_the_command_line_merges_a_rows_file_and_refuses_bad_input(tmp_path, capsys, monkeypatch):
    import sparseclip_d2.benchmarks.entries as entries_mod

    monkeypatch.setattr(entries_mod, "entries", lambda: {"m": Entry})
    (tmp_path / "m.md").write_text(PAGE)
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text(json.dumps(_row("m_voc20.yaml", "voc", ["prob0"])) + "\n")
    assert main(["--pages", str(tmp_path), "--merge", str(jsonl), "--commit", "abcdef1", "--when", "now"]) == 0
    assert "m.md: 1 row(s) merged" in capsys.readouterr().out
    assert "## Rows at main `abcdef1`" in (tmp_path / "m.md").read_text()
    with pytest.raises(SystemExit):
        main(["--pages", str(tmp_path), "--merge", str(jsonl), "--commit", "main", "--when", "now"])
    assert "--commit 'main'" in capsys.readouterr().err
    jsonl.write_text(json.dumps(dict(_row("m_voc20.yaml", "voc"), method="other")) + "\n")
    with pytest.raises(SystemExit):
        main(["--pages", str(tmp_path), "--merge", str(jsonl), "--commit", "abcdef1", "--when", "now"])
    assert "rows.jsonl:1: method 'other' is not an agreement entry; valid: m" in capsys.readouterr().err
    assert main(["--pages", str(tmp_path), "--todo", "--methods", "m"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "m m_voc21.yaml voc_odd prob0"
