"""What each stage of the pipeline did on one input: the stage-activity record.

A part reports what it did with :func:`report` (a no-op unless a record is being taken); the
caller that wants the record opens one with :func:`recording`::

    with recording() as record:
        model.predict(x)
    record.flat()          # the stages that did nothing on this input

Every report names a stage, says whether the stage changed anything on this call (``active``) and
gives the figures that show it (``labels=5``, ``changed=1234``, ...). Calls for the same stage
(one per window, say) are merged: the stage is active when any call was, each figure is kept as
the list of the calls' values. The record is what the agreement driver prints beside each row
(a row whose stage was flat exercised nothing of it: ``docs/agreement/README.md``).

The record lives in a :mod:`contextvars` variable, so a part reports without being handed it;
nothing is recorded, and nothing is computed for it, outside :func:`recording` (parts check
:func:`active_record` before computing a figure that costs anything).
"""
import contextlib
import contextvars
from typing import Dict, Iterator, List, Optional

__all__ = ["ActivityRecord", "recording", "report", "active_record"]


class ActivityRecord:
    """Per-stage activity of one input (or several: calls merge), in the order stages first reported."""

    def __init__(self):
        self.stages: Dict[str, Dict] = {}

    def add(self, stage: str, active: bool, **figures) -> None:
        """One report of ``stage``: whether it changed anything this call and its figures."""
        rec = self.stages.setdefault(stage, {"active": False, "calls": 0, "figures": {}})
        rec["active"] = bool(rec["active"] or active)
        rec["calls"] += 1
        for key, value in figures.items():
            rec["figures"].setdefault(key, []).append(value)

    def active(self, stage: str) -> bool:
        """Whether ``stage`` reported and was active (``KeyError`` naming the reported ones if it never reported)."""
        if stage not in self.stages:
            raise KeyError(f"stage {stage!r} reported nothing; reported: {', '.join(self.stages) or 'none'}")
        return self.stages[stage]["active"]

    def flat(self) -> List[str]:
        """The stages that reported and never changed anything."""
        return [name for name, rec in self.stages.items() if not rec["active"]]

    def as_dict(self) -> Dict[str, Dict]:
        """``{stage: {"active", "calls", "figures"}}`` (JSON-ready when the figures are)."""
        return {name: {"active": rec["active"], "calls": rec["calls"], "figures": dict(rec["figures"])}
                for name, rec in self.stages.items()}

    def summary(self) -> str:
        """One line: each stage with its figures (one value when every call gave the same, the
        range otherwise), ``FLAT`` after a stage that did nothing."""
        parts = []
        for name, rec in self.stages.items():
            figs = []
            for key, values in rec["figures"].items():
                if all(v == values[0] for v in values):
                    shown = f"{values[0]}"
                elif all(isinstance(v, (int, float)) for v in values):
                    shown = f"{min(values)}-{max(values)}"
                else:
                    shown = "/".join(str(v) for v in values)
                figs.append(f"{key} {shown}")
            calls = f" x{rec['calls']}" if rec["calls"] > 1 else ""
            parts.append(f"{name}{calls}: {', '.join(figs)}" + ("" if rec["active"] else " FLAT"))
        return "; ".join(parts)


_RECORD: contextvars.ContextVar = contextvars.ContextVar("sparseclip_activity", default=None)


def active_record() -> Optional[ActivityRecord]:
    """The record being taken, or None (then :func:`report` does nothing)."""
    return _RECORD.get()


def report(stage: str, active: bool, **figures) -> None:
    """Report what ``stage`` did (see :class:`ActivityRecord.add`); nothing outside :func:`recording`."""
    record = _RECORD.get()
    if record is not None:
        record.add(stage, active, **figures)


@contextlib.contextmanager
def recording(record: Optional[ActivityRecord] = None) -> Iterator[ActivityRecord]:
    """Take an activity record (a new one unless ``record`` is given) for the ``with`` block."""
    record = ActivityRecord() if record is None else record
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)
