"""Replaying a choice the upstream code made, for the agreement driver only (docs/agreement/README.md).

Some steps have several equally good answers, and each implementation returns its own. A linear
assignment whose cost matrix has two minimisers of the same total is one: scipy returns one of
them, and a cost matrix that differs in the last float bit (another summation order) can make it
return the other. Under random weights this happens (a head matching by spectra), and the two sides of
an agreement row then diverge for a reason that says nothing about the rest of the code.

The driver records upstream's choice in its worker and replays it on the project side::

    with replaying({"assignment": [recorded, ...]}) as replay:   # the driver's project worker
        model.predict(x)
    replay.log       # one entry per call: replayed or refused, and why
    replay.unused()  # recorded calls the project never asked for

A part that makes such a choice asks for the recorded one (:func:`replayed_assignment`); outside
:func:`replaying` it gets its own answer back unchanged, so nothing changes for any other caller.
A recorded assignment is used only where it is proven to be a tie: its total cost on the
project's own cost matrix equals the project's own minimiser's within ``tol``
(:func:`assignment_cost_tie`); otherwise the replay is refused, the project's own answer kept, and
the log says by how much the costs differ.

Standard library only (the common layer); the cost matrix is anything indexable as ``cost[i][j]``.
"""
import contextlib
import contextvars
import math
from typing import Dict, Iterator, List, Optional, Sequence

__all__ = ["Replay", "replaying", "active_replay", "assignment_cost_tie", "replayed_assignment", "replayed_value",
           "FLOAT32_EPS"]

#: float32's machine epsilon (2 ** -23): the cost matrices compared are float32, as upstream stores them
FLOAT32_EPS = 2.0 ** -23


class Replay:
    """Recorded choices, ``{name: [one per call, in call order]}``, handed out one per call."""

    def __init__(self, choices: Dict[str, Sequence]):
        self.choices = {name: list(calls) for name, calls in choices.items()}
        self.used = {name: 0 for name in self.choices}
        self.log: List[Dict] = []

    def take(self, name: str):
        """The next recorded choice of ``name``, or None when ``name`` was not recorded;
        ``RuntimeError`` when the project asks more often than upstream chose."""
        if name not in self.choices:
            return None
        i = self.used[name]
        if i >= len(self.choices[name]):
            raise RuntimeError(f"replay of {name!r}: the project asks for call {i + 1}, but upstream made "
                               f"{len(self.choices[name])} such calls: the two sides do not run the same steps")
        self.used[name] = i + 1
        return self.choices[name][i]

    def unused(self) -> Dict[str, int]:
        """``{name: recorded calls never asked for}`` (empty when the calls matched one to one)."""
        return {n: len(c) - self.used[n] for n, c in self.choices.items() if len(c) > self.used[n]}


_REPLAY: contextvars.ContextVar = contextvars.ContextVar("sparseclip_replay", default=None)


def active_replay() -> Optional[Replay]:
    """The replay in force, or None."""
    return _REPLAY.get()


@contextlib.contextmanager
def replaying(choices: Dict[str, Sequence]) -> Iterator[Replay]:
    """Replay ``choices`` (``{name: [per call]}``) for the ``with`` block: the driver's option."""
    replay = Replay(choices)
    token = _REPLAY.set(replay)
    try:
        yield replay
    finally:
        _REPLAY.reset(token)


def replayed_value(name: str):
    """The next recorded value of ``name`` under :func:`replaying` (logged), or None: a choice with
    no better or worse answer to check, such as the random generator's state a call starts from
    (replaying it gives both sides the same random draws, as a shared seed would)."""
    replay = _REPLAY.get()
    value = replay.take(name) if replay is not None else None
    if value is not None:
        replay.log.append(dict(name=name, call=replay.used[name], replayed=True))
    return value


def _total(cost, rows: Sequence[int], cols: Sequence[int]) -> float:
    return math.fsum(float(cost[int(r)][int(c)]) for r, c in zip(rows, cols))


def assignment_cost_tie(cost, rows: Sequence[int], own: Sequence[int], other: Sequence[int],
                        tol: Optional[float] = None) -> Dict:
    """Whether assignment ``other`` costs what ``own`` costs on ``cost`` (rows ``rows`` to columns
    ``own`` / ``other``), within ``tol``.

    ``tol`` defaults to the float32 rounding of the sums: ``4 * n * eps32 * max |cost entry used|``
    (``n`` entries per sum, each stored in float32). Returns ``{"own", "other", "delta", "tol",
    "tie", "differs"}``: the two totals (float64 sums), ``other - own``, the tolerance, whether
    ``|delta| <= tol``, and how many rows the two assign differently. ``ValueError`` when
    ``other`` is not a permutation of ``own``'s columns (then it is no assignment of this matrix).
    """
    rows, own, other = [int(r) for r in rows], [int(c) for c in own], [int(c) for c in other]
    if len(other) != len(own) or sorted(other) != sorted(own):
        raise ValueError(f"recorded assignment {other} is not an assignment of the same columns as {own}")
    if tol is None:
        big = max(abs(float(cost[r][c])) for r, c in list(zip(rows, own)) + list(zip(rows, other)))
        tol = 4 * len(rows) * FLOAT32_EPS * max(big, 1.0)
    a, b = _total(cost, rows, own), _total(cost, rows, other)
    return dict(own=a, other=b, delta=b - a, tol=float(tol), tie=abs(b - a) <= tol,
                differs=sum(x != y for x, y in zip(own, other)))


def replayed_assignment(name: str, cost, rows: Sequence[int], cols: Sequence[int]) -> List[int]:
    """The columns to use for a linear assignment: ``cols`` (the project's own minimiser of
    ``cost``), or, under :func:`replaying` with ``name`` recorded, upstream's recorded columns for
    this call when they are a proven cost tie (:func:`assignment_cost_tie`); a recorded choice that
    is not a tie is refused (``cols`` kept). Either way the call is logged in :attr:`Replay.log`:
    the tie check's figures, ``replayed`` (bool) and, where upstream also recorded its cost
    matrix (``{"cols": [...], "cost": [[...]]}``), ``cost_diff``: the largest entry difference."""
    replay = _REPLAY.get()
    recorded = replay.take(name) if replay is not None else None
    if recorded is None:
        return [int(c) for c in cols]
    up_cols = recorded["cols"] if isinstance(recorded, dict) else recorded
    check = assignment_cost_tie(cost, rows, cols, up_cols)
    entry = dict(name=name, call=replay.used[name], replayed=check["tie"], **check)
    if isinstance(recorded, dict) and recorded.get("cost") is not None:
        theirs = recorded["cost"]
        entry["cost_diff"] = max(abs(float(cost[i][j]) - float(theirs[i][j]))
                                 for i in range(len(theirs)) for j in range(len(theirs[i])))
    replay.log.append(entry)
    return [int(c) for c in up_cols] if check["tie"] else [int(c) for c in cols]
