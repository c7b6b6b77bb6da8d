"""The agreement summary page (``tools/agreement_matrix.py``): rows printed by the driver's own
``format_row`` are read back field by field, each cell is the lowest figure of its proof rows,
and ``docs/agreement/matrix.md`` is what the method pages give."""
import os

from sparseclip_d2.benchmarks.agreement import format_row
from sparseclip_d2.benchmarks.agreement_matrix import cell, main, parse_rows, render

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _row(config="m_b16_voc21.yaml", force=(), input_name="voc_wide", percent=100.0, differ=0, flat=(), margin=1e-8):
    return {"config": config, "force": list(force), "upstream_config": "configs/cfg_voc21.py", "input": input_name,
            "resized": [336, 504], "percent": percent, "classes_upstream": 7, "differ": differ,
            "margin_max_differing": margin, "margin_median": 1e-3, "activity_summary": "windows: windows 8",
            "flat": list(flat)}


def test_rows_printed_by_the_driver_are_read_back():
    lines = [format_row(_row(), "o/m abc1234"),
             format_row(_row(force=["prob0", "feedback0"], percent=99.99812, differ=3), "o/m abc1234"),
             format_row(_row(input_name="voc_odd", flat=["probability threshold"]), "o/m abc1234"),
             format_row(_row(input_name="voc@336x504", differ=40, margin=5e-3, percent=99.9), "o/m abc1234"),
             format_row(dict(_row(input_name="arc2017"), activity_summary="cost |a - b| <= 1"), "o/m abc1234"),
             "| `configs/cfg_voc21.py` | `m_b16_voc21.yaml` | on | 0 | 100.0000 (5) | 99.9993 (2) |"]  # older format
    rows = parse_rows("\n".join(["# page", ""] + lines + ["text after"]))
    assert [(r["force"], r["input"], r["percent"], r["flat"], r["not_near_ties"]) for r in rows] == [
        ([], "voc_wide", 100.0, False, False),
        (["prob0", "feedback0"], "voc_wide", 99.998, False, False),
        ([], "voc_odd", 100.0, True, False),
        ([], "voc@336x504", 99.9, False, True),
        ([], "arc2017", 100.0, False, False)]  # a "|" in the stage text does not split the cell
    assert {r["config"] for r in rows} == {"m_b16_voc21.yaml"} and rows[0]["classes"] == 7
    assert rows[0]["commit"] == "o/m abc1234"


def test_a_cell_is_the_lowest_proof_row():
    r = lambda p, flat=False, force=(), nnt=False: {"percent": p, "flat": flat, "force": list(force),
                                                    "not_near_ties": nnt}
    assert cell([]) == "·"
    assert cell([r(100.0, flat=True)]) == "flat"
    assert cell([r(99.5, flat=True), r(100.0)]) == "100.000"  # a flat row proves nothing, so it cannot lower it
    assert cell([r(100.0, force=["prob0"]), r(99.995, force=["prob0", "tlp_off"])]) == \
        "99.995 (prob0; prob0, tlp_off) ×2"
    assert cell([r(99.9, nnt=True)]) == "99.900 **NOT near-ties**"


def test_render_lists_every_dataset_config_and_the_cells_not_run(tmp_path):
    class Entry:
        repo, commit = "o/m", "abc1234"
        configs = {"m_b16_voc21.yaml": "configs/cfg_voc21.py", "m_b16.yaml": "configs/cfg_context59.py"}

    class NoRows:
        repo, commit, configs = "o/n", "def5678", {}

    (tmp_path / "m.md").write_text("\n".join([format_row(_row(), "o/m abc1234"),
                                              format_row(_row(input_name="voc", percent=99.99912, differ=2),
                                                         "o/m abc1234")]))
    (tmp_path / "n_x.md").write_text("feature-level rows only\n")
    text = render({"m": Entry, "nx": NoRows}, str(tmp_path))
    assert "| [m](m.md) | 99.999 | 2 | 1 of 2 | 2 of 8 |" in text
    assert "| `m_b16_voc21.yaml` | 99.999 | · | · | 100.000 |" in text
    assert "| `m_b16.yaml` | · | · | · | · |" in text
    assert "[nx](n_x.md)." in text and "## nx" not in text  # its page found under the name with an underscore


def test_the_committed_summary_page_is_current(capsys, tmp_path):
    assert main(["--check", os.path.join(REPO, "docs", "agreement", "matrix.md")]) == 0, capsys.readouterr().out
    stale = tmp_path / "matrix.md"
    stale.write_text("# an old page\n")
    assert main(["--check", str(stale)]) == 1 and "out of date: rerun" in capsys.readouterr().out
