"""The benchmark's entries, in the tool's process: each method's :class:`~sparseclip_d2.methods.registry.UpstreamEntry`
(its upstream repository, commit, marker file, project config, how each side is fed and driven),
registered in :data:`~sparseclip_d2.methods.registry.UPSTREAM` by the method's folder
(``methods/<family>/upstream.py``); the torch.hub checkouts (DINO, DINOv2) the VFM methods need.

Importing this module imports the methods package (torch and the model code): the upstream
worker never imports it (:func:`.upstream.import_entry` reads its one entry).
"""
from typing import Dict, Tuple

from .checkouts import Checkout

#: the torch.hub DINO code (``facebookresearch/dino``) whose random weights the VFM methods' upstream
#: segmentors load: the tool answers their hub call from a local checkout (``--dino``)
DINO = Checkout(repo="facebookresearch/dino", commit="7c446df", marker="hubconf.py")
#: the torch.hub DINOv2 code whose ``dinov2_vitb14_reg`` Talk2DINO's upstream loads
#: (lorebianchi98/Talk2DINO @ 4918c2d ``dinotext.py``; the commit of its agreement rows, docs/agreement/talk2dino.md)
DINOV2 = Checkout(repo="facebookresearch/dinov2", commit="b8931f7", marker="dinov2/hub/backbones.py")
#: the hub checkouts by the name of their option (``--dino``, ``--dinov2``): an entry's ``hub``
HUBS = {"dino": DINO, "dinov2": DINOV2}


def entries() -> Dict[str, type]:
    """``{method: its entry}`` of every registered entry, in registration order."""
    from ..methods import UPSTREAM

    return dict(UPSTREAM)


def entry(method: str) -> type:
    """The entry of ``method`` (``KeyError`` naming the valid ones otherwise)."""
    from ..methods import UPSTREAM

    return UPSTREAM.get(method)


def needs_dino(hub: str = "") -> Tuple[str, ...]:
    """The methods whose upstream loads a torch.hub checkout (``hub``'s only, when given): ``--<hub>`` needed."""
    return tuple(m for m, e in entries().items() if e.needs_dino and (not hub or hub_of(m) == hub))


def hub_of(method: str) -> str:
    """The name of the hub checkout ``method``'s upstream loads (a key of :data:`HUBS`); ``ValueError``
    naming the valid ones when its entry declares another."""
    name = entry(method).hub
    if name not in HUBS:
        raise ValueError(f"the upstream entry of {method!r} declares hub {name!r}; valid: {', '.join(HUBS)}")
    return name


def hubs() -> Tuple[str, ...]:
    """The hub checkouts some registered entry needs, in :data:`HUBS` order."""
    used = {hub_of(m) for m in needs_dino()}
    return tuple(h for h in HUBS if h in used)


def dino_help(hub: str = "dino") -> str:
    """The help of ``--<hub>``: what of it each method that needs it uses."""
    uses: Dict[str, list] = {}
    for m in needs_dino(hub):
        uses.setdefault(entry(m).needs_dino, []).append(m)
    why = "; ".join(f"{use} ({', '.join(ms)})" for use, ms in uses.items())
    return f"a {HUBS[hub].repo} checkout (commit {HUBS[hub].commit}): {why}"


def dino_aliases() -> Tuple[str, ...]:
    """More option strings meaning ``--dino``, as the entries declare them (kept for old command lines)."""
    out = []
    for e in entries().values():
        out += [a for a in e.dino_aliases if a not in out]
    return tuple(out)


def vfm_file(method: str, workdir: str) -> str:
    """The random VFM state dict both sides of ``method`` load (the upstream worker draws it)."""
    return entry(method).vfm_file(workdir)
