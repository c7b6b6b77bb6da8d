"""Rules the source keeps (docs/architecture.md, docs/writing_a_method.md), read with ``ast``:

- no function body over 80 lines, except the declarative default table ``add_sparseclip_config``;
- no capability probes (``getattr`` / ``hasattr`` on a model, an encoder, a head, a stage or a
  predictor) where the pipeline is run: ``modeling/``, ``predictor.py``, ``cli/``, ``app/``; a part
  declares what it needs (``common/needs.py``) instead.
"""
import ast
from pathlib import Path

import pytest

import sparseclip_d2

PACKAGE = Path(sparseclip_d2.__file__).resolve().parent
MAX_LINES = 80
DECLARATIVE_TABLES = {("config.py", "add_sparseclip_config")}
PIPELINE_CALLERS = ["modeling", "predictor.py", "cli", "app"]
# Names that hold a model or one of its parts in the pipeline's callers.
PART_HOLDERS = ("model", "encoder", "head", "stage", "stages", "predictor", "base")


def _files(where):
    path = PACKAGE / where
    return sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _body_lines(node) -> int:
    body = node.body
    first = body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        if len(body) == 1:
            return 0
        first = body[1]
    return node.end_lineno - first.lineno + 1


def _long_functions():
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                rel = str(path.relative_to(PACKAGE))
                if (rel, node.name) not in DECLARATIVE_TABLES and _body_lines(node) > MAX_LINES:
                    out.append(f"{rel}:{node.lineno} {node.name} ({_body_lines(node)} lines)")
    return out


def test_body_lines_counts_code_after_the_docstring():
    tree = ast.parse('def f():\n    """doc\n    more"""\n    a = 1\n    b = 2\n')
    assert _body_lines(tree.body[0]) == 2
    long = "def g():\n" + "".join(f"    x{i} = {i}\n" for i in range(MAX_LINES + 1))
    assert _body_lines(ast.parse(long).body[0]) == MAX_LINES + 1


def test_no_function_over_80_lines():
    assert _long_functions() == []


def _probes(path: Path, root: Path = PACKAGE):
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = node.args[0] if node.args else None
            names = (ast.unparse(target) if target is not None else "").split("(")[0].split(".")
            if any(n in PART_HOLDERS for n in names):  # model, self.encoder, predictor.model.head ...
                out.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return out


def test_a_probe_of_a_part_is_found(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f(model, args):\n    getattr(model.encoder, 'needs_text', False)\n"
                 "    hasattr(self.head, 'records_attention')\n    getattr(args, 'skip_bad', False)\n")
    assert [p.split(" ", 1)[1] for p in _probes(f, tmp_path)] == [
        "getattr(model.encoder, 'needs_text', False)", "hasattr(self.head, 'records_attention')"]


@pytest.mark.parametrize("where", PIPELINE_CALLERS)
def test_no_capability_probes_where_the_pipeline_runs(where):
    found = [p for f in _files(where) for p in _probes(f)]
    assert found == []


# --------------------------------------------------------------- one place per method

METHODS = PACKAGE / "methods"
# Files allowed to name any method, each for one reason. The presets are the one registry of
# attention presets (data in the layer whose API reads them, docs/writing_a_method.md); class-name
# sets and prompt-template sets are named after the upstream that published them (the names are
# the values users give CLASS_NAMES / TEXT.TEMPLATES). The family folders are found, not listed
# (``methods/__init__.py``), so no list of them names a method.
NAMING_ALLOWED = {
    "clip/spec.py": "the one registry of presets",
    "data/class_names.py": "class-name sets named after the upstream that published them",
    "clip/templates.py": "prompt-template sets named after their source",
}
_WORD = __import__("re").compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_KEY_LIKE = __import__("re").compile(r"^[\w./:-]+$")


def _squash(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def method_names():
    """``{squashed name}`` of every method: the family folders and the presets (``clip`` aside)."""
    from sparseclip_d2.clip.spec import PRESETS

    families = {p.name for p in METHODS.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    presets = {name.split("_")[0] for name in PRESETS if name != "clip"}
    return {_squash(n) for n in families | presets}


def names_in(text: str, names) -> set:
    """The method names ``text`` contains: short names (5 letters or fewer) as whole words of an
    identifier (``FSAEncoder`` -> FSA, Encoder; ``cass_input``), longer ones anywhere in it
    (``ProxyCLIPEncoder``, ``CLIPtrase``)."""
    words = {w.lower() for w in _WORD.findall(text)}
    flat = _squash(text)
    return {n for n in names if (n in words if len(n) <= 5 else n in flat)}


def _docstring_lines(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                out.update(range(first.lineno, first.end_lineno + 1))
    return out


def named_methods(source: str, names):
    """``[(line, token, {names})]``: identifiers (names, attributes, imported modules) and key-like
    string literals (no spaces: a registry key, a config value, a path) that name a method.
    Comments, docstrings and prose strings (messages citing upstream) are not counted."""
    import io
    import tokenize

    docs = _docstring_lines(ast.parse(source))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME:
            text = tok.string
        elif tok.type == tokenize.STRING and tok.start[0] not in docs:
            text = tok.string.strip("\"'rbfu")
            if not _KEY_LIKE.match(text):
                continue
        else:
            continue
        found = names_in(text, names)
        if found:
            out.append((tok.start[0], tok.string, found))
    return out


def _own_names(rel: str):
    """The names a file may use: its family's (and those it is built on) under methods/<family>/."""
    parts = rel.split("/")
    if parts[0] != "methods" or len(parts) < 3:
        return set()
    init = (METHODS / parts[1] / "__init__.py").read_text(encoding="utf-8")
    builds_on = ()
    for node in ast.parse(init).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "BUILDS_ON" for t in node.targets):
            builds_on = ast.literal_eval(node.value)
    return {_squash(parts[1])} | {_squash(b) for b in builds_on}


def test_names_in_finds_identifiers_and_keys_not_prose():
    names = {"fsa", "proxyclip", "cliptrase", "sclip", "resclip"}
    assert names_in("FSAEncoder", names) == {"fsa"}
    assert names_in("ProxyCLIPEncoder", names) == {"proxyclip"}
    assert names_in("CLIPtrase", names) == {"cliptrase"}
    assert names_in("resclip_rcs", names) == {"resclip"}  # not sclip: a whole word only
    assert names_in("sparseclip_d2", names) == set()
    src = ('"""FSA in a docstring."""\n# ProxyCLIP in a comment\nx = "cites ResCLIP in a message"\n'
           'y = FSAEncoder\nz = "cliptrase"\nfrom .methods.resclip import a\n')
    assert [(line, found) for line, _, found in named_methods(src, names)] == [
        (4, {"fsa"}), (5, {"cliptrase"}), (6, {"resclip"})]


def test_no_file_outside_a_method_folder_names_the_method():
    """A method lives in its folder (``methods/<family>/``, or its preset in
    ``clip/spec.py``); generic code reaches it through a registry and names none."""
    names = method_names()
    assert {"fsa", "cass", "proxyclip", "corrclip", "lposs", "sclip", "naclip", "resclip"} <= names
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE))
        if rel in NAMING_ALLOWED:
            continue
        own = _own_names(rel)
        for line, token, found in named_methods(path.read_text(encoding="utf-8"), names):
            if found - own:
                bad.append(f"{rel}:{line} {token} names {', '.join(sorted(found - own))}")
    assert bad == [], "\n".join(bad)
