"""tools/sweep.py: expansion, aliases, run keys, a 2x2 sweep on sparseclip_demo (tiny random
model) that resumes without re-running, CSV/Markdown tables and the paper join."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

SWEEP = """
name: tiny
base: {base}
fixed:
  backbone: sparseclip-tiny-vit
  pretrained: none
  attention_stats: true
  source: qq
grid:
  alpha: [1, 1.2]
  resolution: [64, 96]
"""


def run_tiny_sweep(base_dir, extra_args=()):
    """Run (or resume) the 2x2 tiny sweep under ``base_dir``; returns (out dir, stdout)."""
    os.makedirs(base_dir, exist_ok=True)
    sweep_file = os.path.join(base_dir, "tiny.yaml")
    with open(sweep_file, "w") as f:
        f.write(SWEEP.format(base=os.path.join(REPO, "configs", "demo.yaml")))
    out = os.path.join(base_dir, "out")
    env = dict(os.environ, SPARSECLIP_TEXT_CACHE="off", PYTHONPATH=REPO)
    proc = subprocess.run(
        [PY, os.path.join(REPO, "tools", "sweep.py"), sweep_file, "--output", out, *extra_args], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, proc.stdout


# stdout of the first run of the shared tiny sweep in this pytest session, whichever test
# file (this one or test_plots.py) triggered it
_FIRST_RUN_STDOUT = []


def tiny_sweep_dir(tmp_path_factory):
    """The tiny sweep's output folder, shared by the test files of one session (resumed, so
    the second caller runs nothing)."""
    out, stdout = run_tiny_sweep(str(tmp_path_factory.getbasetemp() / "tiny_sweep"))
    if not _FIRST_RUN_STDOUT:
        _FIRST_RUN_STDOUT.append(stdout)
    return out


def test_expand_aliases(tmp_path):
    from sparseclip_d2.analysis.sweep import expand_params, load_base_config

    cfg = load_base_config(os.path.join(REPO, "configs", "demo.yaml"))
    opts = dict(expand_params({"alpha": 1, "num_layers": 3, "backbone": "L/14", "block": "drop_both"}, cfg))
    assert opts["MODEL.SPARSECLIP.ATTENTION.NORMALIZER"] == "softmax"
    assert opts["MODEL.SPARSECLIP.CLIP.NAME"] == "ViT-L-14-quickgelu"
    assert (opts["MODEL.SPARSECLIP.BLOCK.RESIDUAL"], opts["MODEL.SPARSECLIP.BLOCK.FFN"]) == (False, False)
    opts = dict(expand_params({"normalizer": "random_matched", "alpha": 1.2}, cfg))
    assert opts["MODEL.SPARSECLIP.ATTENTION.NORMALIZER"] == "random_matched"
    assert dict(expand_params({"alpha": 1.3}, cfg))["MODEL.SPARSECLIP.ATTENTION.NORMALIZER"] == "entmax"
    opts = dict(expand_params({"sliding": True, "resolution": 336}, cfg))
    assert opts["INPUT.MIN_SIZE_TEST"] == 336 and opts["TEST.SLIDING_WINDOW.CROP_SIZE"] == 336
    assert "TEST.SLIDING_WINDOW.CROP_SIZE" not in dict(expand_params({"resolution": 336}, cfg))
    with pytest.raises(ValueError, match="unknown sweep key 'alfa'"):
        expand_params({"alfa": 1.2}, cfg)
    with pytest.raises(ValueError, match="do not merge"):
        expand_params({"MODEL.SPARSECLIP.ATTENTION.NOPE": 1}, cfg)
    with pytest.raises(ValueError, match="unknown block variant"):
        expand_params({"block": "half"}, cfg)


def test_load_sweep_product_and_keys(tmp_path):
    from sparseclip_d2.analysis.sweep import load_base_config, load_sweep, merge_run_config, run_key

    f = tmp_path / "s.yaml"
    f.write_text(f"base: {os.path.join(REPO, 'configs', 'demo.yaml')}\n"
                 "variants: [{name: a, source: qq}, {name: b, source: kk}]\n"
                 "grid: {alpha: [1, 1.2, 1.5], num_layers: [1, 2]}\n")
    sweep = load_sweep(str(f), identify_data=False)
    assert len(sweep.runs) == 12 and len({r.key for r in sweep.runs}) == 12
    assert sweep.runs[0].name == "a:source=qq,alpha=1,num_layers=1"
    assert not sweep.invalid_runs
    # softmax on 2 layers is plain CLIP in the earlier block: a warning, not an error
    assert [r.name for r in sweep.runs if r.warnings] == ["a:source=qq,alpha=1,num_layers=2",
                                                        "b:source=kk,alpha=1,num_layers=2"]
    # the key depends on the merged config, not on the order of the overrides
    r = sweep.runs[3]
    cfg = merge_run_config(load_base_config(sweep.base), list(reversed(r.opts)))
    assert run_key(cfg, r.identity) == r.key
    f.write_text(f"base: {os.path.join(REPO, 'configs', 'demo.yaml')}\ngrid: {{alpha: 1.2}}\n")
    with pytest.raises(ValueError, match="non-empty list"):
        load_sweep(str(f))


def test_tiny_sweep_runs_resumes_and_tables(tmp_path_factory):
    from sparseclip_d2.analysis.sweep import read_jsonl

    base = str(tmp_path_factory.getbasetemp() / "tiny_sweep")
    out = tiny_sweep_dir(tmp_path_factory)
    stdout = _FIRST_RUN_STDOUT[0]
    jsonl = os.path.join(out, "results.jsonl")
    records = read_jsonl(jsonl)
    assert len(records) == 4 and all(r["status"] == "ok" for r in records), stdout
    assert "runs: 4 total, 0 already finished, 4 ok, 0 failed" in stdout
    for r in records:
        assert r["random_weights"] is True
        demo = r["datasets"]["sparseclip_demo"]
        for k in ("mIoU", "same_class_mass", "non_class_mass", "support_size", "perplexity"):
            assert isinstance(demo[k], float), (k, demo)
        assert r["config"]["resolution"] == r["params"]["resolution"]
        assert r["config"]["normalizer"] == ("softmax" if r["params"]["alpha"] == 1 else "entmax")
        # softmax rows are full; entmax 1.2 rows are sparser
        grid = {64: 4 * 6, 96: 6 * 8}[r["params"]["resolution"]]  # 500x375 photo -> 85x64 (padded to 96x64), 128x96
        if r["params"]["alpha"] == 1:
            assert demo["support_size"] == pytest.approx(1 + grid)
        else:
            assert demo["support_size"] < 1 + grid
    # resume: nothing re-runs, the file keeps 4 lines
    mtimes = {r["run_key"]: os.path.getmtime(os.path.join(r["output_dir"], "results.json")) for r in records}
    _, stdout2 = run_tiny_sweep(base, ["--compare-paper"])
    assert "runs: 4 total, 4 already finished, 0 ok, 0 failed" in stdout2
    assert len(read_jsonl(jsonl)) == 4
    for r in records:
        assert os.path.getmtime(os.path.join(r["output_dir"], "results.json")) == mtimes[r["run_key"]]
    with open(os.path.join(out, "results.csv")) as f:
        lines = f.read().strip().splitlines()
    assert len(lines) == 5 and "same_class_mass" in lines[0] and "mIoU" in lines[0]
    md = open(os.path.join(out, "results.md")).read()
    assert "RANDOM WEIGHTS" in md and md.count("\n| alpha=") == 4
    cmp_md = open(os.path.join(out, "compare_paper.md")).read()
    assert "0 of 4 rows have a paper number" in cmp_md  # a tiny model on the demo photo is not in the paper


def test_killed_sweep_resumes_partially(tmp_path):
    """A truncated last line (a killed writer) is skipped; only runs without an ok line re-run."""
    from sparseclip_d2.analysis.sweep import append_jsonl, finished_keys, read_jsonl

    p = str(tmp_path / "r.jsonl")
    append_jsonl(p, {"run_key": "a", "status": "ok"})
    append_jsonl(p, {"run_key": "b", "status": "failed"})
    with open(p, "a") as f:
        f.write('{"run_key": "c", "sta')
    recs = read_jsonl(p)
    assert [r["run_key"] for r in recs] == ["a", "b"]
    assert finished_keys(recs) == {"a"}


#: A run's config summary with the settings the paper holds fixed (B/16 qkv softmax 448 px).
PAPER_SETTINGS = {"backbone": "ViT-B-16-quickgelu", "pretrained": "openai", "source": "qk", "normalizer": "softmax",
                  "alpha": 1.2, "temperature": 1.0, "num_layers": 1, "prior": "none", "prior_std": 5.0,
                  "sum_mode": "normalize_then_sum", "residual": True, "ffn": True, "resolution": 448,
                  "fgovd_resolution": 224, "fgovd_protocol": "dense", "sliding": False, "templates": "single",
                  "logit_scale": 50.0, "prob_threshold": 0.75, "area_threshold": 0.0}


def test_paper_join():
    from sparseclip_d2.analysis.tables import compare_with_paper, describe, flatten_records

    rec = {
        "run_key": "k", "run_name": "x", "status": "ok", "random_weights": False, "params": {"alpha": 1.2},
        "config": dict(PAPER_SETTINGS, normalizer="entmax", alpha=1.2),
        "datasets": {"sparseclip_voc21_val": {"mIoU": 20.25}, "sparseclip_ade20k_val": {"mIoU": 3.0}},
    }
    rows = flatten_records([rec])
    assert [r["dataset"] for r in rows] == ["voc21", "ade20k"]
    cmp = compare_with_paper(rows)
    voc = cmp[0]
    # Paper Tables 1, 4 and 6: B/16 qkv full 448 entmax 1.2 VOC21 mIoU 23.25 (CSV lines 3, 147, 192)
    assert voc["paper"] == 23.25 and voc["paper_row"].startswith("Table 1/4/6: B/16 qkv full 448px entmax alpha=1.2")
    assert voc["diff"] == pytest.approx(20.25 - 23.25)
    assert cmp[1]["paper"] == 2.16
    d = describe({"backbone": "ViT-B-16-quickgelu", "source": "qk", "normalizer": "softmax", "temperature": 0.5,
                  "residual": True, "ffn": True, "resolution": 224})
    assert (d["normalizer"], d["alpha"]) == ("softmax_temperature_0.5", None)
    d = describe({"source": "identity", "residual": False, "ffn": False, "normalizer": "softmax"})
    assert (d["source"], d["normalizer"], d["block"]) == ("v-only", "none", "drop_both")


@pytest.mark.parametrize("name", ["main_table", "block_variants", "controls", "resolution"])
def test_shipped_sweeps_match_paper_rows(name):
    """Every (run, dataset) of the paper-reproduction sweeps has a paper number to compare with."""
    from sparseclip_d2.analysis.sweep import load_sweep, planned_config
    from sparseclip_d2.analysis.tables import compare_with_paper, describe, short_dataset

    sweep = load_sweep(os.path.join(REPO, "configs", "sweeps", f"{name}.yaml"), identify_data=False)
    assert not sweep.invalid_runs and not any(r.warnings for r in sweep.runs)
    rows = []
    for run in sweep.runs:
        config, datasets = planned_config(sweep, run)
        for ds in datasets:
            rows.append(dict(describe(config, short_dataset(ds)), run=run.name, dataset=short_dataset(ds), mIoU=0.0))
    cmp = compare_with_paper(rows)
    missing = [(r["run"], r["dataset"]) for r in cmp if r["paper"] is None]
    assert not missing and len(cmp) == len(rows)


def test_alpha_depth_sweep_grid():
    from sparseclip_d2.analysis.sweep import load_sweep

    sweep = load_sweep(os.path.join(REPO, "configs", "sweeps", "alpha_depth.yaml"), identify_data=False)
    assert len(sweep.runs) == 13 * 5 and not sweep.invalid_runs
    norms = {dict(r.opts)["MODEL.SPARSECLIP.ATTENTION.NORMALIZER"] for r in sweep.runs if r.params["alpha"] == 1}
    assert norms == {"softmax"}
    # softmax on the last 2..5 blocks is plain CLIP there: each such run is flagged
    flagged = [(r.params["alpha"], r.params["num_layers"]) for r in sweep.runs if r.warnings]
    assert flagged == [(1, 2), (1, 3), (1, 4), (1, 5)]
