"""The CPU alpha-entmax kernel's build: content-addressed, announced, no OpenMP runtime,
threaded rows identical to one thread."""
import logging
import platform
import shutil
import sys

import pytest
import torch

from sparseclip_d2.attention import _entmax_cpu


def _kernel_must_build() -> bool:
    return (sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")
            and shutil.which("c++") is not None)


def test_kernel_name_is_a_hash_of_source_flags_and_toolchain(tmp_path, monkeypatch):
    monkeypatch.setenv(_entmax_cpu.DIR_ENV_VAR, str(tmp_path / "kernels"))
    text = _entmax_cpu._SOURCE.read_bytes()
    a, b = tmp_path / "a.cpp", tmp_path / "b.cpp"
    a.write_bytes(text)
    b.write_bytes(text)
    name_a, flags, dir_a = _entmax_cpu.kernel_spec(a)
    # The same inputs in another checkout give the same (shareable) build ...
    assert _entmax_cpu.kernel_spec(b)[0] == name_a
    assert dir_a == tmp_path / "kernels" / name_a
    # ... any change of the source, the flags or the compiler gives another one.
    b.write_bytes(text + b"\n// edited\n")
    assert _entmax_cpu.kernel_spec(b)[0] != name_a
    assert _entmax_cpu.kernel_spec(a, cflags=flags + ["-DX"])[0] != name_a
    monkeypatch.setenv("CXX", "some-other-c++")
    assert _entmax_cpu.kernel_spec(a)[0] != name_a
    # No OpenMP runtime: only the simd pragmas.
    assert "-fopenmp-simd" in flags and "-fopenmp" not in flags


def test_cold_build_is_announced_before_it_starts(tmp_path, monkeypatch, caplog):
    """A build that has to compile logs where and how long before the compiler runs
    (here a source that fails at once, so the test does not wait for a real build)."""
    monkeypatch.setenv(_entmax_cpu.DIR_ENV_VAR, str(tmp_path / "kernels"))
    broken = tmp_path / "broken.cpp"
    broken.write_text("#error deliberately broken kernel source\n")
    name, _, build_dir = _entmax_cpu.kernel_spec(broken)
    assert not _entmax_cpu.kernel_is_built(broken)
    with caplog.at_level(logging.INFO, logger=_entmax_cpu.__name__):
        with pytest.raises(Exception, match="(?i)error"):
            _entmax_cpu.build_kernel(broken)
    messages = [r.getMessage() for r in caplog.records if r.name == _entmax_cpu.__name__]
    assert messages and "compiling the CPU kernel" in messages[0]
    assert name in messages[0] and str(build_dir) in messages[0]
    assert "about 1 min" in messages[0]


def test_loaded_kernel_is_this_checkouts_build():
    module = (_entmax_cpu.load_kernel(raise_errors=True) if _kernel_must_build()
              else _entmax_cpu.load_kernel())
    if module is None:
        pytest.skip("the CPU kernel cannot be built on this platform")
    name, _, build_dir = _entmax_cpu.kernel_spec()
    assert module.__name__ == name
    assert str(module.__file__).startswith(str(build_dir))
    assert _entmax_cpu.kernel_is_built()


@pytest.mark.parametrize("r", [5.0, 2.0, 1.0 / 0.3])  # alpha 1.2, 1.5 and a real exponent
def test_threaded_rows_equal_one_thread(r):
    """Rows split over several threads give bit-identical results to one thread."""
    module = (_entmax_cpu.load_kernel(raise_errors=True) if _kernel_must_build()
              else _entmax_cpu.load_kernel())
    if module is None:
        pytest.skip("the CPU kernel cannot be built on this platform")
    x = torch.randn(3001, 197, generator=torch.Generator().manual_seed(0)) * 3
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one, code1 = module.entmax_rows(x, r)
        torch.set_num_threads(4)
        many, code4 = module.entmax_rows(x, r)
    finally:
        torch.set_num_threads(before)
    assert code1 == code4 == 0
    assert torch.equal(one, many)
    torch.testing.assert_close(one.sum(-1), torch.ones(3001), atol=1e-5, rtol=0)


def test_many_consecutive_threaded_calls():
    """Back-to-back jobs of the kernel's thread pool (late workers must never mix two jobs)."""
    module = (_entmax_cpu.load_kernel(raise_errors=True) if _kernel_must_build()
              else _entmax_cpu.load_kernel())
    if module is None:
        pytest.skip("the CPU kernel cannot be built on this platform")
    g = torch.Generator().manual_seed(1)
    inputs = [torch.randn(int(n), 64, generator=g) * 3
              for n in torch.randint(600, 3000, (60,), generator=g)]
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        expected = [module.entmax_rows(x, 5.0)[0] for x in inputs]
        torch.set_num_threads(3)
        for _ in range(3):
            for x, e in zip(inputs, expected):
                assert torch.equal(module.entmax_rows(x, 5.0)[0], e)
    finally:
        torch.set_num_threads(before)


def test_two_checkouts_write_one_build_file_without_their_paths(tmp_path, monkeypatch):
    """Two checkouts (same kernel source, other folders) share one build directory, and the
    build.ninja torch writes there names the copy inside it, never a checkout's path, so a
    load from the other checkout finds the same build.ninja and ninja has nothing to redo
   . A source that fails at once keeps the test fast: build.ninja is
    written before the compiler runs."""
    monkeypatch.setenv(_entmax_cpu.DIR_ENV_VAR, str(tmp_path / "kernels"))
    text = "#error deliberately broken kernel source\n"
    checkouts = [tmp_path / "clone_a" / "csrc", tmp_path / "clone_b" / "csrc"]
    ninja_files = []
    for folder in checkouts:
        folder.mkdir(parents=True)
        (folder / "kernel.cpp").write_text(text)
        # (the second call fails too: in this process torch's JIT versioner already knows
        # the placed source and looks straight for the .so the first build did not make)
        with pytest.raises(Exception):
            _entmax_cpu.build_kernel(folder / "kernel.cpp")
        name, _, build_dir = _entmax_cpu.kernel_spec(folder / "kernel.cpp")
        ninja_files.append((build_dir, (build_dir / "build.ninja").read_text()))
    (dir_a, ninja_a), (dir_b, ninja_b) = ninja_files
    assert dir_a == dir_b and ninja_a == ninja_b
    assert "clone_a" not in ninja_a and "clone_b" not in ninja_a
    assert f"compile {dir_a / 'kernel.cpp'}" in ninja_a
    assert (dir_a / "kernel.cpp").read_text() == text


def test_placed_source_is_never_rewritten(tmp_path):
    build_dir = tmp_path / "build"
    build_dir.mkdir()
    src = tmp_path / "k.cpp"
    src.write_text("int x;\n")
    placed = _entmax_cpu._place_source(src, build_dir)
    before = placed.stat().st_mtime_ns
    assert _entmax_cpu._place_source(src, build_dir) == placed and placed.stat().st_mtime_ns == before
    src.write_text("int y;\n")  # a copy that differs from its source is refused, not rebuilt
    with pytest.raises(RuntimeError, match="differs from"):
        _entmax_cpu._place_source(src, build_dir)
    assert not [p for p in build_dir.iterdir() if p.name.endswith(".tmp")]


def test_build_directory_depends_on_the_torch_and_python_folders(monkeypatch, tmp_path):
    """build.ninja holds torch's and Python's include folders: another venv with the same
    torch version gets its own build directory instead of rewriting this one's."""
    monkeypatch.setenv(_entmax_cpu.DIR_ENV_VAR, str(tmp_path))
    name = _entmax_cpu.kernel_spec()[0]
    import sysconfig

    paths = dict(sysconfig.get_paths(), include="/elsewhere/include/python3")
    monkeypatch.setattr(sysconfig, "get_paths", lambda *a, **k: paths)
    assert _entmax_cpu.kernel_spec()[0] != name
