"""plugins/tests/gpu/run_gpu_checks.py, the one script a GPU machine runs, as far as a CPU can run it:
it parses and imports, says what it would skip and why, and its pool storm runs on the host backend."""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys

import pytest

from veo_edge import nativelib

GPU_DIR = nativelib.REPO_ROOT / "plugins" / "tests" / "gpu"
SCRIPT = GPU_DIR / "run_gpu_checks.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300)


@pytest.fixture
def gpu_modules(monkeypatch):
    monkeypatch.syspath_prepend(str(GPU_DIR))
    return importlib.import_module("checks_pool"), importlib.import_module("checks_tensorrt")


def test_every_section_is_planned_with_a_reason_when_it_cannot_run(cpu_only):
    r = _run("--list")
    assert r.returncode == 0, r.stderr
    lines = dict(line.split(None, 1) for line in r.stdout.splitlines())
    assert set(lines) == {
        "kernels",
        "sanitizer",
        "pool",
        "tensorrt",
        "cudashm",
    }  # nothing runs: nothing to build
    assert all(v.startswith("skipped: ") for v in lines.values())
    r = _run("--sections", "kernels")  # asked for, cannot run: exit 2, not a silent pass
    assert r.returncode == 2 and "== kernels: SKIPPED" in r.stdout


def test_one_build_is_planned_for_whatever_runs_without_its_library():
    r = _run("--list", "--sections", "pool", "--pool-backend", "host")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["build", "runs:", "build/plugins-gpu", "(cmake,", "ctest)"]


def test_the_build_is_what_the_runtime_loads(monkeypatch, pool_lib, tmp_path):
    """After export, the runtime's own lookups (pool and plugin library, also in a `veo-edge` the script
    starts) find the script's build, not another build/plugins; a plugin library it did not build is no
    longer named."""
    monkeypatch.syspath_prepend(str(GPU_DIR))
    checks_build = importlib.import_module("checks_build")
    from veo_edge.engine import plugin_library
    from veo_edge.runtime import mempool

    plugins = tmp_path / "libveo_edge_plugins.so"
    plugins.write_bytes(b"\x7fELF stand-in")
    built = checks_build.Built(tmp_path, pool_lib, None, plugins, None, True, "100% tests passed")
    monkeypatch.setenv("VEO_EDGE_PLUGIN_LIB", "/elsewhere/libveo_edge_plugins.so")
    monkeypatch.setenv("VEO_EDGE_MEMPOOL_LIB", "/elsewhere/libveo_mempool.so")
    checks_build.export(built)
    assert mempool.find_library(search_dirs=[]) == pool_lib
    assert plugin_library.find_plugin_library(search_dirs=[]).path == plugins
    checks_build.export(checks_build.Built(tmp_path, pool_lib, None, None, "TensorRT NOT found", True, ""))
    assert plugin_library.find_plugin_library(search_dirs=[]) is None


def test_unknown_sections_are_refused():
    r = _run("--sections", "kernels,benchmarks")
    assert r.returncode == 2 and "unknown section(s) benchmarks" in r.stderr


def test_the_pool_storm_runs_on_the_host_backend(pool_lib):
    r = _run("--sections", "pool", "--pool-backend", "host", "--mempool-lib", str(pool_lib))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "pool storm (host, 2 streams, 4000 ops): corrupted 0" in r.stdout and "invariants ok PASS" in r.stdout
    )
    assert "== build" not in r.stdout  # the library was given: nothing to build


def test_the_storm_catches_a_pool_that_hands_out_live_memory(gpu_modules):
    import ctypes
    import dataclasses

    from veo_edge.runtime.mempool import PoolStats

    checks_pool, _ = gpu_modules
    arena = ctypes.create_string_buffer(2 << 20)
    zero = PoolStats(**{f.name: 0 for f in dataclasses.fields(PoolStats)})

    class Overlapping:  # a broken pool: every slice at the same address
        def alloc_async(self, n, stream):
            return ctypes.addressof(arena)

        def free_async(self, ptr, stream):
            pass

        def stats(self):
            return zero

        def check(self):
            return ""

    result = checks_pool.storm(Overlapping(), checks_pool.HostOps(), iterations=600)
    assert result["corrupted"] > 0


def test_the_tensorrt_section_imports_without_tensorrt(gpu_modules):
    _, checks_tensorrt = gpu_modules
    assert callable(checks_tensorrt.run)


def test_the_kernels_section_imports_without_a_gpu(monkeypatch):
    monkeypatch.syspath_prepend(str(GPU_DIR))
    checks_kernels = importlib.import_module("checks_kernels")
    assert callable(checks_kernels.run) and callable(checks_kernels.run_sanitizer)
    assert len(list(checks_kernels.attention_cases(quick=True, tiny=True))) == 2


def test_cudashm_without_a_build_or_the_means_to_make_one_is_planned_out(monkeypatch, tmp_path):
    """As on the lent H200 (CUDA, no OpenVINO): without --model-dir the section is skipped with the way
    out, not started and crashed in its `veo-edge build`; with one, that reason is gone."""
    import torch

    monkeypatch.syspath_prepend(str(GPU_DIR))
    run_gpu_checks = importlib.import_module("run_gpu_checks")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the planner's view of a GPU host
    monkeypatch.setitem(sys.modules, "openvino", None)  # not importable, as there
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "openvino" else real_find_spec(n, *a)
    )
    ((_, why),) = run_gpu_checks.plan(["cudashm"], "cuda")
    assert why is not None and "pass --model-dir with a build made elsewhere" in why
    ((_, why),) = run_gpu_checks.plan(["cudashm"], "cuda", tmp_path)
    assert why is None or "--model-dir" not in why  # then only the client packages can be missing
