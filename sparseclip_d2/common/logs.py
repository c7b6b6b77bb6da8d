"""Quiet third-party notices that repeat what sparseclip_d2 already says, and plain log text.

Everything here uses the public ``logging`` / ``warnings`` APIs on named loggers for the
duration of a ``with`` block; nothing outlives the block and no library class is changed.
"""
import contextlib
import logging
import sys
import warnings
from typing import Iterable, Iterator, Sequence

__all__ = ["console_level", "dropping_log_records", "quiet_library_imports"]


class _DropContaining(logging.Filter):
    def __init__(self, fragments: Sequence[str]):
        super().__init__()
        self.fragments = tuple(fragments)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record is not ours to judge: let it through
            return True
        return not any(f in message for f in self.fragments)


@contextlib.contextmanager
def dropping_log_records(logger_name: str, *fragments: str) -> Iterator[None]:
    """Inside the block, records of logger ``logger_name`` (``""`` = the root logger)
    whose message contains one of ``fragments`` are dropped; all others pass.

    For the root logger a ``NullHandler`` is attached while the block runs when the root
    has no handler, so that the module-level ``logging.warning(...)`` calls of libraries
    (open_clip's) do not call ``logging.basicConfig`` as a side effect, which would make
    every later propagated record print a second time in the ``LEVEL:name:`` format.
    """
    log = logging.getLogger(logger_name)
    flt = _DropContaining(fragments)
    null = None
    if logger_name == "" and not log.handlers:
        null = logging.NullHandler()
        log.addHandler(null)
    log.addFilter(flt)
    try:
        yield
    finally:
        log.removeFilter(flt)
        if null is not None:
            log.removeHandler(null)


@contextlib.contextmanager
def quiet_library_imports() -> Iterator[None]:
    """For imports of detectron2 / fvcore in the command-line tools: torch >= 2.10 answers
    each ``torch.jit.script`` they run at import time with a FutureWarning (printed twice
    per start), which is not ours to fix and says nothing about the run."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`torch.jit.script` is deprecated", category=FutureWarning)
        yield


def console_level(logger_names: Iterable[str], level: int) -> None:
    """Set ``level`` on the handlers of the named loggers that write to the terminal
    (``sys.stdout`` / ``sys.stderr``); handlers writing to files (detectron2's ``log.txt``)
    keep theirs. detectron2's ``setup_logger`` gives both DEBUG: with ``logging.INFO`` here
    the terminal shows a run's summary while the file still gets every record."""
    for name in logger_names:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (
                    sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
                handler.setLevel(level)
