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
