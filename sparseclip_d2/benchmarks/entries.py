"""The benchmark's entries, in the tool's process: each method's :class:`~sparseclip_d2.methods.registry.UpstreamEntry`
(its upstream repository, commit, marker file, project config, how each side is fed and driven),
registered in :data:`~sparseclip_d2.methods.registry.UPSTREAM` by the method's folder
(``methods/<family>/upstream.py``); the DINO checkout the VFM methods need.

Importing this module imports the methods package (torch and the model code): the upstream
worker never imports it (:func:`.upstream.import_entry` reads its one entry).
"""
from typing import Dict, Tuple

from .checkouts import Checkout

#: the torch.hub DINO code (``facebookresearch/dino``) whose random weights the VFM methods' upstream
#: segmentors load: the tool answers their hub call from a local checkout (``--dino``)
DINO = Checkout(repo="facebookresearch/dino", commit="7c446df", marker="hubconf.py")


def entries() -> Dict[str, type]:
    """``{method: its entry}`` of every registered entry, in registration order."""
    from ..methods import UPSTREAM

    return dict(UPSTREAM)


def entry(method: str) -> type:
    """The entry of ``method`` (``KeyError`` naming the valid ones otherwise)."""
    from ..methods import UPSTREAM

    return UPSTREAM.get(method)


def needs_dino() -> Tuple[str, ...]:
    """The methods whose upstream loads DINO through torch.hub (or its release file): ``--dino`` needed."""
    return tuple(m for m, e in entries().items() if e.needs_dino)


def dino_help() -> str:
    """The help of ``--dino``: what of it each method that needs it uses."""
    uses: Dict[str, list] = {}
    for m, e in entries().items():
        if e.needs_dino:
            uses.setdefault(e.needs_dino, []).append(m)
    why = "; ".join(f"{use} ({', '.join(ms)})" for use, ms in uses.items())
    return f"a {DINO.repo} checkout (commit {DINO.commit}): {why}"


def dino_aliases() -> Tuple[str, ...]:
    """More option strings meaning ``--dino``, as the entries declare them (kept for old command lines)."""
    out = []
    for e in entries().values():
        out += [a for a in e.dino_aliases if a not in out]
    return tuple(out)


def vfm_file(method: str, workdir: str) -> str:
    """The random VFM state dict both sides of ``method`` load (the upstream worker draws it)."""
    return entry(method).vfm_file(workdir)
