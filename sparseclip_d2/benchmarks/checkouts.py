"""Upstream checkouts, read without importing their code: what names one (:class:`Checkout`), the
check that a path is the named repository (:func:`check_upstream`), the ``model`` dict of an mmseg-style config
(:func:`upstream_config`), a dataset class's ``CLASSES`` (:func:`dataset_classes`) and a
``cls_*.txt`` vocabulary (:func:`read_vocabulary`).

Standard library only: both the tool's process and the upstream worker import it.
"""
import dataclasses
import os


@dataclasses.dataclass(frozen=True)
class Checkout:
    """An upstream checkout a method needs besides its own (``--dino``): the repository
    (``owner/name``), the commit and a file only that checkout has. A method's entry
    (``UpstreamEntry``) declares the same three."""

    repo: str
    commit: str
    marker: str


def check_upstream(method: str, path, checkout, option=None) -> str:
    """The absolute path of a ``checkout`` (anything with ``repo``, ``commit`` and ``marker``: a
    method's entry or a :class:`Checkout`) that ``method`` needs, given as ``--<option>`` (default:
    ``--<method>``); ``SystemExit`` naming the option, the path, the file that was looked for and
    how to fetch the repository otherwise."""
    repo, commit, marker = checkout.repo, checkout.commit, checkout.marker
    option = option or method
    fetch = f"fetch it with: git clone https://github.com/{repo} && git -C {repo.split('/')[1]} checkout {commit}"
    if not path:
        raise SystemExit(f"--{option}: the path of a {repo} checkout is required for method "
                         f"{method!r} (or pass --project-only); {fetch}")
    path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(path):
        raise SystemExit(f"--{option} {path}: no such directory; {fetch}")
    if not os.path.isfile(os.path.join(path, marker)):
        raise SystemExit(f"--{option} {path}: not a checkout of {repo} (it has no {marker}); {fetch}")
    return path


def upstream_config(path: str, rel: str) -> dict:
    """The ``model`` dict of an mmseg-style upstream config file over its ``_base_``."""
    def read(p):
        ns = {"dict": dict}
        exec(compile(open(p).read(), p, "exec"), ns)
        return ns
    ns = read(os.path.join(path, rel))
    model = {}
    bases = ns.get("_base_", [])
    for base in [bases] if isinstance(bases, str) else bases:  # one file, or a list (LPOSS's dataset configs)
        model.update(read(os.path.normpath(os.path.join(os.path.dirname(os.path.join(path, rel)), base))).get("model", {}))
    model.update(ns.get("model", {}))  # {} for a dataset config without a model (LPOSS's)
    return model


def upstream_short_side(path: str, rel: str):
    """The short side of the ``Resize`` step of an mmseg-style config's ``test_pipeline``
    (``scale=(long, short)``), or None when it has none."""
    def read(p):
        ns = {"dict": dict}
        exec(compile(open(p).read(), p, "exec"), ns)
        return ns
    ns = read(os.path.join(path, rel))
    for step in ns.get("test_pipeline", []) or []:
        if isinstance(step, dict) and step.get("type") == "Resize" and "scale" in step:
            return int(min(step["scale"]))
        # mmseg 0.x (LPOSS's dataset configs): MultiScaleFlipAug(img_scale=(long, short), transforms=[Resize(keep_ratio)])
        if isinstance(step, dict) and step.get("type") == "MultiScaleFlipAug" and isinstance(step.get("img_scale"), tuple):
            return int(min(step["img_scale"]))
    return None


def dataset_classes(path: str, rel: str, cls: str):
    """``CLASSES`` of class ``cls`` in the checkout's ``rel`` file, or the file's module-level list or
    tuple named ``cls`` (MaskCLIP's ``prompt_engineering.py`` ``voc_classes``), read without importing it."""
    import ast

    tree = ast.parse(open(os.path.join(path, rel)).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for st in node.body:
                if isinstance(st, ast.Assign) and any(getattr(t, "id", "") == "CLASSES" for t in st.targets):
                    return list(ast.literal_eval(st.value))
    for st in tree.body:
        if (isinstance(st, ast.Assign) and any(getattr(t, "id", "") == cls for t in st.targets)
                and isinstance(st.value, (ast.List, ast.Tuple))):
            return list(ast.literal_eval(st.value))
    raise SystemExit(f"{os.path.join(path, rel)}: no class {cls} with a CLASSES tuple, nor a list {cls}")


def read_vocabulary(path: str):
    """Class names of an upstream ``cls_*.txt`` file: one class a line, its synonyms split by
    ``", "`` (ProxyCLIP's files: ``"; "``), as the project's vocabularies write them (``", "``)."""
    with open(path) as f:
        return [line.strip().replace("; ", ", ") for line in f.read().split("\n") if line.strip()]
