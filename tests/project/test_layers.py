"""The three layers of docs/architecture.md hold at runtime and in the source.

- ``sparseclip_d2.attention`` imports with torch only, ``sparseclip_d2.clip`` with torch and
  open_clip: checked in fresh interpreters where detectron2 (and open_clip) cannot be
  imported.
- No module imports a module of a higher layer, and the package's import graph (lazy
  imports inside functions included) has no cycle: checked by reading every module's
  imports with ``ast``.
"""
import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, List, Set

import pytest

import sparseclip_d2

PACKAGE_DIR = Path(sparseclip_d2.__file__).resolve().parent
REPO = PACKAGE_DIR.parent

# Layer of each subpackage / top-level module (a module may import its own layer and below).
LAYERS = {
    "common": 0,      # standard library only: bounded cache, atomic writes
    "attention": 1,   # torch (+ fvcore registries)
    "clip": 2,        # + open_clip
    "proxy": 2,       # the second backbone: torch, timm and the clip layer; no detectron2
    "propagation": 2,  # label propagation (LPOSS): numpy, scipy, faiss and the proxy layer; no detectron2
    "dense": 2,       # dense-prediction ops on windows, logits and label maps; no detectron2
    "methods": 3,     # the pipeline's registered parts (heads, stages, side inputs) over the layers below
    "config": 4,      # detectron2 from here on; validates the parts' keys through methods
    "user_config": 4,  # config merging with one-line errors, the keys that differ from the defaults
    "data": 4,
    "modeling": 5,    # the META_ARCHs run the parts
    "evaluation": 6,
    "model_zoo": 0,   # standard library only: finds the packaged configs
    "analysis": 7,    # tools' helpers: tables, plots, figures
    "sweeps": 7,      # the sweep package (spec, validation, identity, launchers, store)
    "prepare": 7,     # dataset preparation behind tools/prepare_datasets.py (conversions, check)
    "benchmarks": 7,  # the methods benchmark behind tools/benchmark_methods.py
    "utils": 7,
    "predictor": 7,   # the Python API: modeling + data + figures' helpers
    "cli": 8,         # the command-line programs
    "app": 8,         # the interactive Gradio app (on the Predictor)
}
# Third-party packages a layer must not import.
FORBIDDEN = {0: ("torch", "detectron2", "open_clip"), 1: ("detectron2", "open_clip"), 2: ("detectron2",)}


def _block_script(blocked, body):
    return textwrap.dedent(
        f"""
        import importlib.abc, sys
        BLOCKED = {tuple(blocked)!r}
        class _Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
                return None
        sys.meta_path.insert(0, _Block())
        """
    ) + textwrap.dedent(body)


def _run(code):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=str(REPO))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_attention_layer_imports_with_torch_only():
    out = _run(_block_script(("detectron2", "open_clip"), """
        import torch
        from sparseclip_d2.attention import alpha_entmax, attention_weights
        p = alpha_entmax(torch.tensor([[0.0, 1.0, 5.0]]), alpha=1.5, dim=-1)
        assert abs(float(p.sum()) - 1.0) < 1e-6 and float(p[0, 0]) == 0.0
        import sparseclip_d2
        assert sparseclip_d2.HAS_DETECTRON2 is False
        print(sorted(m for m in sys.modules if m.startswith(("detectron2", "open_clip"))))
    """))
    assert out.strip() == "[]"


def test_clip_layer_imports_without_detectron2():
    out = _run(_block_script(("detectron2",), """
        from sparseclip_d2.clip import AttentionSpec, DenseCLIPEncoder, build_clip
        spec = AttentionSpec.preset("sclip")
        print(spec.source, sorted(m for m in sys.modules if m.startswith("detectron2")))
    """))
    assert out.strip() == "qq+kk []"


def test_detectron2_parts_say_how_to_install_it():
    out = _run(_block_script(("detectron2",), """
        import sparseclip_d2
        for what in ("sparseclip_d2.modeling", "sparseclip_d2.data", "sparseclip_d2.evaluation",
                     "sparseclip_d2.config"):
            try:
                __import__(what)
            except ImportError as e:
                assert what in str(e) and "scripts/setup.sh" in str(e), str(e)
            else:
                raise SystemExit(what + " imported without detectron2")
        try:
            sparseclip_d2.add_sparseclip_config
        except ImportError as e:
            assert "detectron2" in str(e)
        print("ok")
    """))
    assert out.strip() == "ok"


_LEAN_SCRIPT = """
import sys, time
t0 = time.perf_counter()
import torch
t_torch = time.perf_counter() - t0
t0 = time.perf_counter()
import sparseclip_d2.attention
t_attention = time.perf_counter() - t0
heavy = sorted({m.split('.')[0] for m in sys.modules} & {'detectron2', 'open_clip', 'timm', 'fvcore.nn'})
assert heavy == [], heavy
import detectron2.data, timm
from detectron2.data import DatasetCatalog, MetadataCatalog
from detectron2.modeling import META_ARCH_REGISTRY
before = (len(timm.list_models()), len(DatasetCatalog.list()), len(list(META_ARCH_REGISTRY)))
t0 = time.perf_counter()
import sparseclip_d2.clip
t_clip = time.perf_counter() - t0
after = (len(timm.list_models()), len(DatasetCatalog.list()), len(list(META_ARCH_REGISTRY)))
assert before == after, (before, after)
assert not [m for m in timm.list_models() if m.startswith('sparseclip')]
from detectron2.config import get_cfg
from sparseclip_d2 import add_sparseclip_config
add_sparseclip_config(get_cfg())
assert 'SparseCLIP' in META_ARCH_REGISTRY and 'sparseclip_demo' in DatasetCatalog.list()
print(f'import sparseclip_d2.attention: {t_attention:.2f} s after torch ({t_torch:.2f} s); import sparseclip_d2.clip (after detectron2 and timm): {t_clip:.2f} s')
"""


def test_with_detectron2_the_layers_import_lean_and_register_nothing():
    """With detectron2 installed: ``sparseclip_d2.attention`` loads torch only,
    ``sparseclip_d2.clip`` registers nothing in timm's or detectron2's registries, and
    ``add_sparseclip_config`` registers the detectron2 parts. Prints the import times
    (``pytest -s tests/project/test_layers.py -k lean``)."""
    out = _run(_LEAN_SCRIPT)
    print(out.strip())
    assert out.startswith("import sparseclip_d2.attention:")


# ---------------------------------------------------------------------------------- source graph
def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_DIR.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> Dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _imports(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """Every module (ours or third-party top-level) that ``name`` imports, anywhere in its body."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            for a in node.names:  # `from . import datasets` imports a submodule
                if f"{target}.{a.name}" in modules:
                    found.add(f"{target}.{a.name}")
    return found


def _own_graph() -> Dict[str, Set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in _imports(name, path, modules):
            if not target.startswith("sparseclip_d2"):
                continue
            # the parent packages are imported before any module anyway (require_detectron2)
            if name == target or name.startswith(target + "."):
                continue
            while target not in modules:
                target = target.rpartition(".")[0]
            deps.add(target)
        graph[name] = deps
    return graph


def _layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) == 1:
        return max(LAYERS.values()) + 1  # the package root registers everything
    if parts[1] not in LAYERS:
        raise AssertionError(f"{module}: assign its subpackage {parts[1]!r} a layer in LAYERS")
    return LAYERS[parts[1]]


def test_no_upward_imports():
    modules = _modules()
    bad: List[str] = []
    for name, deps in _own_graph().items():
        for dep in deps:
            if _layer(dep) > _layer(name):
                bad.append(f"{name} (layer {_layer(name)}) imports {dep} (layer {_layer(dep)})")
    for name, path in modules.items():
        forbidden = FORBIDDEN.get(_layer(name), ())
        for target in _imports(name, path, modules):
            if target.split(".")[0] in forbidden:
                bad.append(f"{name} (layer {_layer(name)}) imports {target}")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = _own_graph()
    state: Dict[str, int] = {}
    cycles: List[str] = []

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    assert not cycles, "\n".join(cycles)


def test_the_graph_reader_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself: a lazy relative import inside a function is an edge."""
    graph = _own_graph()
    assert "sparseclip_d2.attention.entmax" in graph["sparseclip_d2.attention.normalizers"]
    assert "sparseclip_d2.modeling.attention_record" in graph["sparseclip_d2.modeling.meta_arch"]
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from ..dense.windows import window_grid\n")
    got = _imports("sparseclip_d2.evaluation.m", src, _modules())
    assert "sparseclip_d2.dense.windows" in got


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
