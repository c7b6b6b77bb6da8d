#!/usr/bin/env python
"""Which open_clip models DenseCLIPEncoder supports, counted from open_clip itself.

For every name in ``open_clip.list_models()`` the model is built on the meta device (no
memory, no weights; the text tower replaced by a one-layer stub since only the vision
tower is inspected) and its vision tower is classified by
``sparseclip_d2.clip.towers.check_tower``. Prints a Markdown table per tower type with the
counts (the model table of docs/model_zoo.md comes from this output)::

    python tools/supported_models.py [--names]
"""
import argparse
import collections
import logging
import sys
import warnings

import torch

import open_clip
from sparseclip_d2.clip.towers import check_tower

_STUB_TEXT = {"context_length": 8, "vocab_size": 16, "width": 8, "heads": 1, "layers": 1}


def tower_type(visual) -> str:
    trunk = getattr(visual, "trunk", None)
    return type(visual).__name__ if trunk is None else f"timm {type(trunk).__name__}"


def classify(names):
    """``{name: (kind or None, tower type, reason)}``."""
    out = {}
    for name in names:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = open_clip.create_model(name, pretrained=None, device="meta", text_cfg=_STUB_TEXT)
        kind, why = check_tower(model.visual)
        out[name] = (kind, tower_type(model.visual), why)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--names", action="store_true", help="list the model names of each group")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)
    names = open_clip.list_models()
    res = classify(names)
    groups = collections.OrderedDict()
    for name, (kind, ttype, why) in sorted(res.items(), key=lambda kv: (kv[1][0] is None, str(kv[1][0]), kv[1][1])):
        key = (kind or "unsupported", ttype, why.split(": ", 1)[-1].strip() if kind is None else "")
        groups.setdefault(key, []).append(name)
    supported = sum(1 for v in res.values() if v[0])
    print(f"open_clip {open_clip.__version__}: {supported} of {len(names)} model configs supported\n")
    print("| kind | vision tower | models | reason refused |")
    print("|---|---|---|---|")
    for (kind, ttype, why), members in groups.items():
        shown = ", ".join(members) if args.names else f"{members[0]}, ..." if len(members) > 1 else members[0]
        print(f"| {kind} | {ttype} | {len(members)} ({shown}) | {why} |")
    by_kind = collections.Counter(v[0] or "unsupported" for v in res.values())
    print("\n" + ", ".join(f"{k}: {n}" for k, n in sorted(by_kind.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
