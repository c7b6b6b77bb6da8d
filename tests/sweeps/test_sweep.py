"""tools/sweep.py: expansion, aliases, run keys, a 2x2 sweep on sparseclip_demo (tiny random
model) that resumes without re-running, CSV/Markdown tables and the paper join."""
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
        [PY, os.path.join(REPO, "tools", "sweep.py"), sweep_file, "--output", out, *extra_args], capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
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
    from sparseclip_d2.sweeps import expand_params, load_base_config

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
    from sparseclip_d2.sweeps import load_base_config, load_sweep, merge_run_config, run_key

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


def test_base_config_with_an_integer_for_a_float_key_loads_as_train_net_reads_it(tmp_path):
    """``ALPHA: 2`` in a base config: train_net accepts it (merge_config), so the sweep does
    too (it used yacs' merge_from_file, which refuses "Type mismatch (float vs int)")."""
    from sparseclip_d2.sweeps import load_base_config, load_sweep

    base = tmp_path / "base.yaml"
    base.write_text(f"_BASE_: {os.path.join(REPO, 'configs', 'demo.yaml')}\n"
                    "MODEL:\n  SPARSECLIP:\n    ATTENTION:\n      ALPHA: 2\n")
    cfg = load_base_config(str(base))
    assert cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA == 2.0 and isinstance(cfg.MODEL.SPARSECLIP.ATTENTION.ALPHA, float)
    f = tmp_path / "s.yaml"
    f.write_text(f"base: {base}\nvariants: [{{name: a, source: qq}}]\n")
    sweep = load_sweep(str(f), identify_data=False)
    assert len(sweep.runs) == 1 and not sweep.invalid_runs


def test_tiny_sweep_runs_resumes_and_tables(tmp_path_factory):
    from sparseclip_d2.sweeps import read_jsonl

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
    from sparseclip_d2.sweeps import append_jsonl, finished_keys, read_jsonl

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
    from sparseclip_d2.sweeps import load_sweep, planned_config
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
    from sparseclip_d2.sweeps import load_sweep

    sweep = load_sweep(os.path.join(REPO, "configs", "sweeps", "alpha_depth.yaml"), identify_data=False)
    assert len(sweep.runs) == 13 * 5 and not sweep.invalid_runs
    norms = {dict(r.opts)["MODEL.SPARSECLIP.ATTENTION.NORMALIZER"] for r in sweep.runs if r.params["alpha"] == 1}
    assert norms == {"softmax"}
    # softmax on the last 2..5 blocks is plain CLIP there: each such run is flagged
    flagged = [(r.params["alpha"], r.params["num_layers"]) for r in sweep.runs if r.warnings]
    assert flagged == [(1, 2), (1, 3), (1, 4), (1, 5)]


# ------------------------------------------------------------------ validation, failures, resume keys
def _sweep_cli(sweep_file, out, *extra, check=None):
    env = dict(os.environ, SPARSECLIP_TEXT_CACHE="off", PYTHONPATH=REPO)
    proc = subprocess.run([PY, os.path.join(REPO, "tools", "sweep.py"), str(sweep_file), "--output", str(out), *extra],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
    if check is not None:
        assert proc.returncode == check, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_dry_run_lists_every_invalid_run_with_its_error(tmp_path):
    """A typo in a source, a depth beyond the model and a negative temperature are found before
    anything runs, each run named with the error the run itself would raise."""
    f = tmp_path / "typo.yaml"
    f.write_text(f"base: {os.path.join(REPO, 'configs', 'demo.yaml')}\n"
                 "fixed: {backbone: sparseclip-tiny-vit, pretrained: none}\n"
                 "variants:\n"
                 "  - {name: typo, source: qx}\n"
                 "  - {name: deep, num_layers: 100}\n"
                 "  - {name: cold, temperature: -1}\n"
                 "  - {name: fine, source: kk}\n"
                 "  - {name: idle, source: qq, normalizer: softmax, num_layers: 2}\n")
    proc = _sweep_cli(f, tmp_path / "out", "--dry-run", check=2)
    lines = proc.stdout.splitlines()
    row = {ln.split()[2]: i for i, ln in enumerate(lines) if ln[:7].strip() in ("INVALID", "todo", "done")}
    assert lines[row["typo:source=qx"]].startswith("INVALID")
    assert "unknown attention source 'qx'" in lines[row["typo:source=qx"] + 1]
    assert lines[row["deep:num_layers=100"]].startswith("INVALID")
    assert "num_layers=100 is outside [1, 2]" in lines[row["deep:num_layers=100"] + 1]
    assert "temperature must be > 0, got -1" in lines[row["cold:temperature=-1"] + 1]
    assert lines[row["fine:source=kk"]].startswith("todo")
    idle = "idle:source=qq,normalizer=softmax,num_layers=2"
    assert lines[row[idle]].startswith("todo") and "warning: num_layers=2 changes nothing" in lines[row[idle] + 1]
    assert "5 runs, 0 finished, 3 invalid" in proc.stdout
    # without --dry-run nothing runs either
    proc = _sweep_cli(f, tmp_path / "out", check=2)
    assert "3 run(s) of the sweep are invalid" in proc.stderr and "nothing was run" in proc.stderr
    assert not os.path.exists(tmp_path / "out" / "results.jsonl")


def _write_base(folder, logit_scale="50.0", comment=""):
    """A copy of configs/demo.yaml (and its base) whose LOGIT_SCALE and comments we can change."""
    import shutil

    shutil.copy(os.path.join(REPO, "configs", "Base-SparseCLIP.yaml"), folder / "Base-SparseCLIP.yaml")
    text = open(os.path.join(REPO, "configs", "demo.yaml")).read()
    text = text.replace("    PROB_THRESHOLD: 0.75", f"    PROB_THRESHOLD: 0.75\n    LOGIT_SCALE: {logit_scale}")
    (folder / "demo.yaml").write_text(comment + text)


def test_failed_run_error_config_change_stale_records_and_killed_run(tmp_path):
    """End to end with tools/train_net.py (tiny random CLIP, softmax: no entmax kernel):

    1. a run that raises inside train_net is recorded with its own exception (type, message,
       traceback), shown on the console and listed in results.md as failed;
    2. a comment added to the base config changes no key (nothing reruns but the failure);
    3. a changed value in the base config reruns, and the old records are reported stale and
       left out of the tables (one row per run of the current sweep);
    4. a run killed mid-way (--timeout) leaves no results.json, is recorded as killed and
       reruns when the sweep is resumed.
    """
    from sparseclip_d2.sweeps import read_jsonl

    _write_base(tmp_path)
    f = tmp_path / "s.yaml"
    f.write_text("base: demo.yaml\n"
                 "fixed: {backbone: sparseclip-tiny-vit, pretrained: none, resolution: 64, normalizer: softmax}\n"
                 "variants: [{name: good}, {name: bad, precision: fp8}]\n")
    out = tmp_path / "out"
    # 1. the failing run
    proc = _sweep_cli(f, out, check=1)
    recs = read_jsonl(str(out / "results.jsonl"))
    assert [(r["run_name"], r["status"]) for r in recs] == [("good:base", "ok"), ("bad:precision=fp8", "failed")]
    err = recs[1]["error"]
    assert err["type"] == "ValueError" and "fp8" in err["message"] and "Traceback" in err["traceback"]
    assert "fp8" in proc.stderr and "run bad:precision=fp8 failed" in proc.stderr
    bad_dir = recs[1]["output_dir"]
    assert os.path.isfile(os.path.join(bad_dir, "error.json")) and not os.path.exists(os.path.join(bad_dir, "results.json"))
    md = (out / "results.md").read_text()
    assert "| bad:precision=fp8 |" in md and "| failed |" in md and "ValueError:" in md and "fp8" in md
    good_key = recs[0]["run_key"]
    # 2. a comment changes nothing; the failure is retried and fails again
    _write_base(tmp_path, comment="# a comment\n")
    proc = _sweep_cli(f, out, check=1)
    assert "runs: 2 total, 1 already finished, 0 ok, 1 failed" in proc.stdout
    # 3. another LOGIT_SCALE: new keys; old records are stale
    _write_base(tmp_path, logit_scale="40.0")
    proc = _sweep_cli(f, out, "--no-retry-failed", check=1)
    assert "runs: 2 total, 0 already finished, 1 ok, 1 failed" in proc.stdout
    assert "stale: 3 record(s)" in proc.stdout
    recs = read_jsonl(str(out / "results.jsonl"))
    assert len(recs) == 5 and recs[-2]["run_key"] != good_key
    csv_lines = (out / "results.csv").read_text().strip().splitlines()
    assert len(csv_lines) == 3  # header, good (its one dataset), bad (failed)
    assert "3 record(s) of results.jsonl belong to runs that are not in the current sweep" in (out / "results.md").read_text()
    # 4. killed mid-way: a new setting, one second per run
    _write_base(tmp_path, logit_scale="30.0")
    proc = _sweep_cli(f, out, "--no-retry-failed", "--timeout", "1", check=1)
    killed = read_jsonl(str(out / "results.jsonl"))[-2:]
    assert [r["status"] for r in killed] == ["failed", "failed"]
    assert killed[0]["error"]["exit"] == "timed out after 1 s and was killed"
    assert not os.path.exists(os.path.join(killed[0]["output_dir"], "results.json"))
    good_line = [ln for ln in (out / "results.md").read_text().splitlines() if ln.startswith("| good:base |")]
    assert len(good_line) == 1 and "| failed |" in good_line[0] and "timed out after 1 s and was killed" in good_line[0]
    proc = _sweep_cli(f, out, check=1)  # resumed: the killed good run reruns and finishes
    assert "runs: 2 total, 0 already finished, 1 ok, 1 failed" in proc.stdout
    final = read_jsonl(str(out / "results.jsonl"))[-2:]
    assert final[0]["status"] == "ok" and final[0]["run_key"] == killed[0]["run_key"]


def test_train_net_removes_an_earlier_result_and_records_its_exception(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "results.json").write_text('{"sparseclip_demo": {"mIoU": 99.0}}')
    env = dict(os.environ, SPARSECLIP_TEXT_CACHE="off", PYTHONPATH=REPO)
    proc = subprocess.run([PY, os.path.join(REPO, "tools", "train_net.py"), "--eval-only", "--config-file",
                           os.path.join(REPO, "configs", "demo.yaml"), "MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit",
                           "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none", "MODEL.SPARSECLIP.CLIP.PRECISION", "fp8",
                           "OUTPUT_DIR", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=3600)
    assert proc.returncode != 0
    assert not (out / "results.json").exists()  # the earlier result is gone, not left beside the new config.yaml
    err = json.loads((out / "error.json").read_text())
    assert err["type"] == "ValueError" and "fp8" in err["message"] and err["traceback"].startswith("Traceback")
    assert (out / "config.yaml").exists()


def test_paper_join_matches_every_setting_the_paper_varies():
    """Depth 2 (and any other setting outside the paper's protocol) gets no paper number and
    says why; the paper's controls and partial runs are joined and marked."""
    from sparseclip_d2.analysis.tables import compare_with_paper, flatten_records

    def rec(key, datasets, partial=False, **config):
        return {"run_key": key, "run_name": key, "status": "ok", "random_weights": False, "partial": partial,
                "config": dict(PAPER_SETTINGS, **config), "datasets": datasets}

    voc = {"sparseclip_voc21_val": {"mIoU": 20.0}}
    records = [
        rec("depth1", voc, normalizer="entmax"),
        rec("depth2", voc, normalizer="entmax", num_layers=2),
        rec("t0.5", voc, resolution=224, temperature=0.5),                      # Table 3 control
        rec("entmax_t0.5", voc, resolution=224, normalizer="entmax", temperature=0.5),
        rec("prior", voc, normalizer="entmax", prior="gaussian"),
        rec("sum_then_norm", voc, source="qq+kk", sum_mode="sum_then_normalize"),
        rec("qk_sum_mode", voc, sum_mode="sum_then_normalize"),                 # cannot matter for qk
        rec("templates", voc, templates="openai_imagenet"),
        rec("sliding", voc, sliding=True),
        rec("thr", {"sparseclip_voc21_val": {"mIoU": 1.0}, "sparseclip_context59_val": {"mIoU": 2.0}},
            prob_threshold=0.5),                                                 # only VOC21 has a threshold
        rec("partial", voc, partial=True),
        {"run_key": "failed", "run_name": "failed", "status": "failed", "error": {"type": "ValueError", "message": "x"}},
    ]
    cmp = {(r["run"], r["dataset"]): r for r in compare_with_paper(flatten_records(records, include_failed=True))}
    assert cmp[("depth1", "voc21")]["paper"] == 23.25
    d2 = cmp[("depth2", "voc21")]
    assert d2["paper"] is None and d2["paper_row"] == "" and d2["no_paper_row"].startswith("num_layers=2")
    assert cmp[("t0.5", "voc21")]["paper"] == 19.41
    assert "Table 3: B/16 qkv full 224px softmax_temperature_0.5 voc21 mIoU" in cmp[("t0.5", "voc21")]["paper_row"]
    assert cmp[("entmax_t0.5", "voc21")]["paper"] is None
    assert cmp[("entmax_t0.5", "voc21")]["no_paper_row"] == "the paper has no number for this setting"
    assert cmp[("prior", "voc21")]["no_paper_row"].startswith("prior=gaussian_5")
    assert cmp[("sum_then_norm", "voc21")]["no_paper_row"].startswith("sum_mode=sum_then_normalize")
    assert cmp[("qk_sum_mode", "voc21")]["paper"] == 13.35
    assert cmp[("templates", "voc21")]["no_paper_row"].startswith("templates=openai_imagenet")
    assert cmp[("sliding", "voc21")]["no_paper_row"].startswith("sliding=True")
    assert cmp[("thr", "voc21")]["paper"] is None and cmp[("thr", "context59")]["paper"] == 8.11
    assert cmp[("partial", "voc21")]["paper"] == 13.35 and cmp[("partial", "voc21")]["partial"] is True
    assert not any(k[0] == "failed" for k in cmp)


def test_tables_one_row_per_run_of_the_current_sweep(tmp_path):
    from sparseclip_d2.analysis.tables import write_tables

    def ok(key, value):
        return {"run_key": key, "run_name": key, "status": "ok", "config": dict(PAPER_SETTINGS),
                "datasets": {"sparseclip_voc21_val": {"mIoU": value}}}

    records = [ok("a", 1.0), {"run_key": "b", "run_name": "b", "status": "failed", "error": {"type": "E", "message": "m"}},
               ok("b", 2.0), ok("a", 3.0), ok("old", 4.0)]
    paths = write_tables(records, str(tmp_path), compare_paper=True, run_keys=["a", "b", "missing"])
    assert paths["stale"] == 1
    lines = open(paths["csv"]).read().strip().splitlines()
    assert len(lines) == 3 and lines[1].startswith("a,") and ",3.0," in lines[1] and lines[2].startswith("b,")
    md = open(paths["compare_md"]).read()
    assert "| a | voc21 |" in md and "| old |" not in md and "1 record(s) of results.jsonl" in md


def test_code_fingerprint_ignores_comments_and_docstrings(tmp_path):
    from sparseclip_d2.sweeps.identity import python_code as _python_code

    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('def f(x):\n    """Doc."""\n    return x + 1\n')
    b.write_text('# a comment\ndef f(x):\n    """Another doc."""\n\n    return x + 1  # same code\n')
    c.write_text('def f(x):\n    """Doc."""\n    return x + 2\n')
    assert _python_code(str(a)) == _python_code(str(b)) != _python_code(str(c))


# ---------------------------------------------------------------- progress while a run runs
def _child(tmp_path, body):
    """A real subprocess running ``body`` (Python source) with RUN (a run folder) and GO paths defined."""
    run, go = tmp_path / "run", tmp_path / "go"
    run.mkdir(exist_ok=True)
    src = f"import json, os, time\nRUN, GO = {str(run)!r}, {str(go)!r}\n" + body
    return subprocess.Popen([sys.executable, "-c", src]), run, go


def test_sweep_relays_the_progress_file_of_a_run(tmp_path, caplog):
    """The board reads a running process's progress.json (not its log), logs a changed line
    once, and gives a sweep ETA."""
    import threading
    import time

    from sparseclip_d2.sweeps.progress import ProgressBoard

    progress = {"state": "running", "images_done": 11, "images_total": 50, "dataset": "d", "datasets_done": 0,
                "datasets_total": 1, "elapsed_s": 10.0, "eta_s": 51.0, "updated": 0.0, "pid": 0}
    # the child writes the progress file, then waits until the test lets it finish
    proc, run, go = _child(tmp_path, f"json.dump({progress!r}, open(os.path.join(RUN, 'progress.json'), 'w'))\n"
                                     "while not os.path.exists(GO):\n    time.sleep(0.05)\n")
    start = time.time()
    board = ProgressBoard(total=3, parallel=1, interval=0.05, clock=lambda: start)  # the board's clock stands still
    board.start("alpha=1.5", str(run))
    with caplog.at_level("INFO", logger="sparseclip_d2.sweeps.progress"):
        deadline = time.time() + 300  # generous: only a broken relay takes this long
        while "11/50 images, ETA 0:00:51" not in caplog.text and time.time() < deadline:
            board.report(force=True)
            time.sleep(0.05)
        for _ in range(5):
            board.report(force=True)  # an unchanged line is not repeated
    go.write_text("")
    assert proc.wait(300) == 0
    assert "run alpha=1.5: 11/50 images, ETA 0:00:51" in caplog.text
    assert caplog.text.count("11/50 images") == 1
    # sweep ETA: 51 s left of this run + 2 waiting runs of 10 + 51 s each, one at a time: 173 s
    assert "sweep: 1 running, 2 waiting, 0 finished; sweep ETA 0:02:53" in caplog.text
    assert board.eta() == 51.0 + 2 * 61.0


def test_sweep_eta_and_progress_lines():
    from sparseclip_d2.sweeps.progress import progress_line, sweep_eta

    assert progress_line(None) is None
    assert progress_line({"state": "running", "images_done": 0, "images_total": 8, "eta_s": None}) == \
        "0/8 images, starting"
    assert progress_line({"state": "evaluated", "images_done": 8, "images_total": 8, "eta_s": 0.0}) == \
        "8/8 images, evaluated"
    assert progress_line({"state": "failed", "images_done": 0, "images_total": None}) == "failed"
    assert progress_line({"state": "ok", "images_done": 8, "images_total": 8, "eta_s": 0.0}) == "8/8 images, ok"
    assert progress_line({"state": "failed", "images_done": 3, "images_total": 8, "eta_s": 1.0, "returncode": -9}) \
        == "3/8 images, failed (exit code -9)"
    # finished runs took 100 and 200 s: 2 waiting runs of 150 s + 30 s left, 2 at a time
    running = [{"images_done": 5, "images_total": 10, "elapsed_s": 30.0, "eta_s": 30.0}, None]
    assert sweep_eta(running, 2, [100.0, 200.0], 2) == (30.0 + 2 * 150.0) / 2
    assert sweep_eta([None], 3, [], 1) is None


def test_sweep_run_past_its_timeout_is_killed(tmp_path):
    from sparseclip_d2.sweeps.runner import wait_with_timeout

    proc, _, _ = _child(tmp_path, "time.sleep(600)\n")
    assert wait_with_timeout(proc, timeout=1.0) is None
    assert proc.poll() is not None  # killed and reaped


@pytest.mark.parametrize("opts, key", [
    (["MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS", "5"], "MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS: num_layers=5"),
    (["MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS", "[1]"], "MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS: mix_layers [1]"),
    (["MODEL.SPARSECLIP.PARALLEL.LAYERS", "5"], "MODEL.SPARSECLIP.PARALLEL.LAYERS: parallel_layers=5"),
])
def test_validate_names_the_config_key_of_each_depth_error(opts, key):
    """A run's depth errors are labelled with the key that holds the bad value (the sweep's
    dry run and its INVALID lines show this), not always ATTENTION.NUM_LAYERS."""
    from detectron2.config import get_cfg

    from sparseclip_d2.config import add_sparseclip_config, merge_config
    from sparseclip_d2.sweeps.validate import validate_config

    cfg = get_cfg()
    add_sparseclip_config(cfg)
    merge_config(cfg, os.path.join(REPO, "configs", "demo.yaml"),
                 ["MODEL.SPARSECLIP.CLIP.NAME", "sparseclip-tiny-vit", "MODEL.SPARSECLIP.CLIP.PRETRAINED", "none"] + opts)
    errors, _ = validate_config(cfg)
    assert len(errors) == 1 and errors[0].startswith(key), errors
