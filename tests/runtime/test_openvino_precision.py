"""Every OpenVINO compile states its precision, and runs at it, whatever this machine's CPU can do.

OpenVINO's CPU plugin picks bf16 by itself on CPUs with AVX512-BF16 or AMX (and so changes the numbers
with the machine) unless the compile says otherwise. These tests fail on any CPU when a compile forgets.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from veo_edge.builddir import BuildDir
from veo_edge.runtime.backends.openvino_compile import compile_config
from veo_edge.runtime.loaders import cpu_runner

REPO = Path(__file__).resolve().parents[2]


def test_the_runner_runs_at_the_precision_it_asked_for(nano_build: Path) -> None:
    runner = cpu_runner(BuildDir.open(nano_build), "openvino")
    with runner:
        assert runner.compiled_precision == "f32"
        assert runner._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name() == "f32"
        assert runner.describe()["precision"] == "f32"


def test_compile_config_states_the_precision() -> None:
    assert compile_config()["INFERENCE_PRECISION_HINT"] == "f32"
    assert compile_config("bf16", threads=2)["INFERENCE_NUM_THREADS"] == 2
    with pytest.raises(ValueError, match="unknown OpenVINO inference precision 'fp8'; choose one of"):
        compile_config("fp8")


def _compile_calls(path: Path) -> list[tuple[int, bool]]:
    """(line, states a config) for each ``compile_model(...)`` call in a Python file."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if name == "compile_model":
                has_config = len(node.args) >= 3 or any(k.arg == "config" for k in node.keywords)
                calls.append((node.lineno, has_config))
    return calls


def test_every_openvino_compile_in_the_repo_passes_a_config() -> None:
    files = [p for d in ("veo_edge", "tests", "bench", "plugins") for p in (REPO / d).rglob("*.py")]
    found, missing = 0, []
    for path in files:
        for line, has_config in _compile_calls(path):
            found += 1
            if not has_config:
                missing.append(f"{path.relative_to(REPO)}:{line}")
    assert found >= 2  # the runner and the surgery test at least: the scan itself works
    assert not missing, f"OpenVINO compiles without a stated precision (use compile_config): {missing}"
