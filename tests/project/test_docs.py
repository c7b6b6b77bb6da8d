"""Every file, config and command the docs name exists.

Scans README.md and docs/*.md for repository paths (``configs/...yaml``, ``tools/*.py``,
``scripts/*.sh``, ``tests/*.py``, ``docs/...``, ``sparseclip_d2/...``), expanding the brace
patterns the docs use (``configs/paper/{b16,l14}_{qkv,qqv}_softmax.yaml``), and checks each
one exists; ``--flags`` of the commands the docs show must be options their tool accepts.
``docs/upstream_agreement.md``, ``docs/methods.md`` and the pages of ``docs/agreement/`` also name the upstream repositories' own files
(``configs/cfg_voc21.py`` of SCLIP, mmseg's ``tools/test.py``): there only this project's
kinds of file are checked (``.yaml`` configs, ``docs/``, ``sparseclip_d2/``, ``tests/``).
An output stem a command writes (``-o docs/figures/NAME``) must exist with some suffix.
"""
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md")) + sorted((ROOT / "docs" / "agreement").glob("*.md"))
_PATH = re.compile(r"(?<![\w./-])((?:configs|tools|scripts|tests|docs|sparseclip_d2)/[\w./{},+*-]*[\w}*])")
# Paths the docs name on purpose that are not in a clean checkout.
_MADE_BY_RUNS = ("output/", "datasets/")


def _expand(pattern: str):
    parts = re.split(r"(\{[^{}]*\})", pattern)
    choices = [p[1:-1].split(",") if p.startswith("{") else [p] for p in parts]
    return ["".join(c) for c in itertools.product(*choices)]


def _ours(doc: Path, path: str) -> bool:
    if doc.name not in ("upstream_agreement.md", "methods.md") and doc.parent.name != "agreement":
        return True
    return path.endswith(".yaml") or path.startswith(("docs/", "sparseclip_d2/", "tests/"))


def _named_paths():
    for doc in DOCS:
        for line_no, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in _PATH.finditer(line):
                raw = m.group(1).rstrip(".,:;")
                if raw.startswith(_MADE_BY_RUNS):
                    continue
                for path in _expand(raw):
                    if _ours(doc, path):
                        yield doc.relative_to(ROOT), line_no, path


def test_every_named_path_exists():
    missing = []
    for doc, line_no, path in _named_paths():
        if "*" in path or not Path(path).suffix:  # a glob, or an output stem written with a suffix
            if not list(ROOT.glob(path if "*" in path else path + ".*")) and not (ROOT / path).is_dir():
                missing.append(f"{doc}:{line_no}: {path} (matches nothing)")
        elif not (ROOT / path).exists():
            missing.append(f"{doc}:{line_no}: {path}")
    assert not missing, "docs name paths that do not exist:\n" + "\n".join(missing)


def _commands():
    """``(doc, tool, [--flags])`` of every ``python tools/X.py ...`` command in a code block."""
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8").replace("\\\n", " ")
        for block in re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S):
            for line in block.splitlines():
                m = re.search(r"python\s+(tools/\w+\.py)(.*)", line)
                if m:
                    yield doc.relative_to(ROOT), m.group(1), re.findall(r"(?<![\w-])(--[a-z][\w-]*)", m.group(2))


@pytest.mark.parametrize("tool", sorted({t for _, t, _ in _commands()}))
def test_command_flags_exist(tool):
    helps = subprocess.run([sys.executable, str(ROOT / tool), "--help"], capture_output=True, text=True,
                           cwd=str(ROOT), timeout=600)
    assert helps.returncode == 0, helps.stderr[-2000:]
    bad = [f"{doc}: {flag}" for doc, t, flags in _commands() if t == tool for flag in flags
           if flag not in helps.stdout]
    assert not bad, f"{tool} has no such options: {bad}"
