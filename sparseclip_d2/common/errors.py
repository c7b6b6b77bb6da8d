"""The one place that turns exceptions into one-line messages, for every entry point.

Every command-line program (``train_net``, the demo, the app, ``plot``,
``prepare_datasets``) runs its ``main`` through :func:`run_cli`:

- a user mistake (:func:`explain` gives its line) ends the program with
  ``PROG: error: <one line>`` on stderr and exit status 2, as argparse's usage errors do;
- Ctrl-C ends it with ``PROG: interrupted: <how to resume>`` and exit status 130;
- anything else (a bug) keeps its traceback. ``SPARSECLIP_TRACEBACK=1`` shows the
  traceback of user mistakes too.

The Python API (``Predictor``) raises the same exceptions; their messages are the same one
line (:class:`UserError` and the library's own ``ValueError`` / ``OSError`` subclasses).

:func:`unknown_name` is the message for a name that is not one of a set (a dataset, a
vocabulary, a config key): the nearest names first, then the project's own names, then how
many others there are. Standard library only.
"""
import difflib
import errno
import os
import re
import sys
from typing import Callable, Iterable, Optional, Union

__all__ = ["UserError", "explain", "one_line", "nearest", "unknown_name", "run_cli", "show_traceback",
           "TRACEBACK_ENV", "STAGE_ATTRIBUTE"]

#: ``SPARSECLIP_TRACEBACK=1`` keeps the traceback of user mistakes (for bug reports).
TRACEBACK_ENV = "SPARSECLIP_TRACEBACK"

# The attribute train_net's ``user_errors`` sets on an exception to name its stage ("config",
# "data", "model"): such an exception is a user mistake whatever its type.
STAGE_ATTRIBUTE = "_sparseclip_user_mistake"


class UserError(ValueError):
    """A mistake in what the user gave (a value, a name, a file); its message is the one
    line an entry point prints. A ``ValueError``, so that ``except ValueError`` still
    catches it."""


def one_line(message) -> str:
    """``message`` (any object) with its white space, newlines included, collapsed."""
    return " ".join(str(message).split())


def show_traceback() -> bool:
    """Whether ``SPARSECLIP_TRACEBACK`` asks for tracebacks of user mistakes too."""
    return os.environ.get(TRACEBACK_ENV, "") not in ("", "0")


def _os_error(e: OSError) -> str:
    """An ``OSError`` as one line naming the path and what to do."""
    path = e.filename
    reason = e.strerror or str(e)
    if path is None or type(e).__str__ is not OSError.__str__:  # a message of ours (OutputFolderError, ...)
        return one_line(e)
    fix = {errno.EACCES: "choose a folder you can write to", errno.EPERM: "choose a folder you can write to",
           errno.EROFS: "the file system is read-only: choose another folder",
           errno.ENOSPC: "the disk is full: free space or choose another folder",
           errno.ENOENT: "check the path"}.get(e.errno, "")
    line = f"{path!r}: {reason}"
    if e.filename2:
        line = f"{path!r} -> {e.filename2!r}: {reason}"
    return f"{line}; {fix}" if fix else line


# Messages of yacs' and detectron2's config merge that mean a mistake in the config (when
# a config was merged without sparseclip_d2.user_config, which names the key and the fix).
_CONFIG_ASSERTIONS = ("Non-existent key", "Non-existent config key", "Override list has odd length",
                      "Type mismatch", "Cannot create a new key", "Invalid version")


def explain(e: BaseException, strict: bool = False) -> Optional[str]:
    """The one-line message of a user mistake, or ``None`` for anything else (a bug, whose
    traceback must stay).

    User mistakes are: an exception marked with a stage by ``train_net`` (``"<stage>:
    <message>"``), :class:`UserError` and every ``ValueError``, ``OSError`` and
    ``KeyError`` (the library raises these for bad values, names and files, each naming the
    value and the fix), the config merge's ``AssertionError`` s, and an ``ImportError``
    naming a missing optional package (the app's Gradio). With ``strict`` only a marked
    exception or a :class:`UserError` is a mistake (``train_net``: it marks each stage's
    mistakes, so that a ``ValueError`` of a bug elsewhere keeps its traceback)."""
    stage = getattr(e, STAGE_ATTRIBUTE, None)
    if strict and stage is None and not isinstance(e, UserError):
        return None
    if isinstance(e, KeyError) and e.args:
        text = one_line(e.args[0])
    elif isinstance(e, OSError):
        text = _os_error(e)
    elif isinstance(e, (ValueError, ImportError)):
        text = one_line(e)
    elif isinstance(e, AssertionError) and any(m in str(e) for m in _CONFIG_ASSERTIONS):
        text = one_line(e)
    elif stage is not None:
        text = one_line(e)
    else:
        return None
    return f"{stage}: {text}" if stage is not None else text


def _variants(choice: str):
    """``choice`` and the runs of its ``_`` / ``.`` / ``-`` separated parts
    (``sparseclip_voc21_val`` -> ``voc21``, ``voc21_val``, ...), compared with a name."""
    parts = [p for p in re.split(r"[_.\-/]", choice) if p]
    yield choice
    for i in range(len(parts)):
        for j in range(i + 1, len(parts) + 1):
            if (i, j) != (0, len(parts)):
                yield "_".join(parts[i:j])


def nearest(name: str, choices: Iterable[str], n: int = 3, cutoff: float = 0.6, parts: bool = True) -> list:
    """Up to ``n`` of ``choices`` closest to ``name`` (case-insensitive), best first: each
    choice scores the best ``difflib`` ratio of ``name`` against the choice or (``parts``) a
    run of its parts, so ``voc99`` finds ``sparseclip_voc21_val`` through ``voc21``."""
    key = str(name).lower()
    scored = []
    for order, choice in enumerate(dict.fromkeys(str(c) for c in choices)):
        variants = _variants(choice) if parts else (choice,)
        best = max(difflib.SequenceMatcher(None, key, v.lower()).ratio() for v in variants)
        if best >= cutoff:
            scored.append((-best, order, choice))
    return [c for _, _, c in sorted(scored)[:n]]


def unknown_name(kind: str, name: str, choices: Iterable[str], *, ours: Optional[Iterable[str]] = None,
                 ours_label: str = "ours", where: str = "", others: str = "", fix: str = "", limit: int = 12) -> str:
    """``unknown <kind> '<name>'<where>; closest: a, b; <ours>; <fix>``: the line for a name
    that is not one of ``choices``.

    Args:
        kind: what the name is (``"dataset"``, ``"vocabulary"``, ``"config key"``).
        choices: every valid name.
        ours: the project's own names, listed (at most ``limit``, after ``ours_label``) after
            the closest; the other choices are counted as ``others`` (``"detectron2 builtins"``).
            ``None``: every choice is listed, as ``valid``.
        where: where the name came from (``" (DATASETS.TEST)"``).
        fix: what else can be given, at the end.
    """
    choices = list(dict.fromkeys(str(c) for c in choices))
    ours_list = choices if ours is None else [c for c in dict.fromkeys(str(c) for c in ours) if c in choices]
    # the project's names are searched first: a near miss of ours beats a builtin's
    close = nearest(name, ours_list, n=3)
    close += [c for c in nearest(name, choices, n=3) if c not in close][:max(0, 3 - len(close))]
    parts = [f"unknown {kind} {str(name)!r}{where}"]
    if close:
        parts.append(f"closest: {', '.join(close)}")
    shown = ours_list[:limit]
    label = "valid" if ours is None else ours_label
    listed = f"{label}: {', '.join(shown)}" + (f" (+{len(ours_list) - limit} more)" if len(ours_list) > limit else "")
    rest = len(choices) - len(ours_list)
    if rest > 0 and others:
        listed += f" (and {rest} {others})"
    if shown:
        parts.append(listed)
    if fix:
        parts.append(fix)
    return "; ".join(parts)


ResumeHint = Union[str, Callable[[], str], None]


def run_cli(prog: str, main: Callable, *args, interrupted: ResumeHint = None, strict: bool = False, **kwargs):
    """Run ``main(*args, **kwargs)`` as the program ``prog``; returns what it returns.

    A user mistake (:func:`explain`) prints ``PROG: error: <line>`` and exits with 2; Ctrl-C
    prints ``PROG: interrupted: <interrupted>`` (a string, or a function called then that
    says how to resume) and exits with 130; a bug's exception propagates with its traceback.
    ``SystemExit`` (argparse, ``sys.exit``) passes through. ``strict``: see :func:`explain`.
    """
    try:
        return main(*args, **kwargs)
    except KeyboardInterrupt:
        if show_traceback():
            raise
        hint = interrupted() if callable(interrupted) else interrupted
        print(f"{prog}: interrupted{': ' + hint if hint else ''}", file=sys.stderr)
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - sorted into mistakes (one line) and bugs (re-raised)
        line = explain(e, strict)
        if line is None or show_traceback():
            raise
        print(f"{prog}: error: {line}", file=sys.stderr)
        sys.exit(2)

