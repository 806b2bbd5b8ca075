"""The fallback policy's plain logic: names, order, memory sizes and the GPU memory check."""

from __future__ import annotations

from pathlib import Path

import pytest

from veo_edge.builddir import BuildDir
from veo_edge.errors import UsageError
from veo_edge.runtime.policy import (
    DEFAULT_POLICY,
    check_gpu_memory,
    parse_memory_size,
    probe_candidate,
    resolve_policy,
)

MIB = 1 << 20


@pytest.mark.parametrize(
    ("text", "want"),
    [("1G", 1 << 30), ("512MiB", 512 * MIB), ("1.5GB", 3 << 29), ("4096", 4096), (2048, 2048), (None, None)],
)
def test_memory_sizes(text: object, want: int | None) -> None:
    assert parse_memory_size(text) == want  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["lots", "-1G", "0", "1P"])
def test_bad_memory_sizes(bad: str) -> None:
    with pytest.raises(UsageError, match=r"is not a size; expected bytes or a number with a unit, e.g. 2G"):
        parse_memory_size(bad)


def test_policy_order_forcing_and_no_fallback() -> None:
    assert DEFAULT_POLICY == ("tensorrt", "onnxruntime-cuda", "openvino", "onnxruntime")
    assert resolve_policy("auto", None, True) == (list(DEFAULT_POLICY), [])
    assert resolve_policy("auto", None, False) == (
        ["tensorrt"],
        ["onnxruntime-cuda", "openvino", "onnxruntime"],
    )
    assert resolve_policy("onnxruntime", None, True) == (["onnxruntime"], [])
    # a forced GPU backend has the CPU chain behind it, disabled without fallback; a forced CPU one stands alone
    assert resolve_policy("tensorrt", None, True) == (["tensorrt", "openvino", "onnxruntime"], [])
    assert resolve_policy("onnxruntime-cuda", None, False) == (
        ["onnxruntime-cuda"],
        ["openvino", "onnxruntime"],
    )
    assert resolve_policy("openvino", None, False) == (["openvino"], [])
    assert resolve_policy("auto", ["onnxruntime", "openvino"], True) == (["onnxruntime", "openvino"], [])
    assert resolve_policy("auto", ["auto"], True) == (list(DEFAULT_POLICY), [])  # --policy auto
    with pytest.raises(
        UsageError, match=r"unknown backend 'cuda'; choose one of: auto, tensorrt, onnxruntime-cuda"
    ):
        resolve_policy("cuda", None, True)
    with pytest.raises(UsageError, match=r"forces one backend, so a policy cannot be given too"):
        resolve_policy("openvino", ["openvino"], True)
    with pytest.raises(UsageError, match=r"must be a non-empty list of distinct backends"):
        resolve_policy("auto", ["openvino", "openvino"], True)
    with pytest.raises(UsageError, match=r"must be a non-empty list of distinct backends"):
        resolve_policy("auto", ["auto", "openvino"], True)  # auto is the whole order or nothing


def test_gpu_memory_check_names_budget_and_free_memory() -> None:
    assert check_gpu_memory("tensorrt", 100 * MIB, 1024 * MIB, None).ok
    over = check_gpu_memory("tensorrt", 600 * MIB, 8192 * MIB, 512 * MIB)
    assert not over.ok and "needs about 600 MiB of GPU memory, above the budget of 512 MiB" in over.reason
    tight = check_gpu_memory("tensorrt", 600 * MIB, 700 * MIB, None, margin=256 * MIB)
    assert not tight.ok and "plus a 256 MiB margin, but only 700 MiB is free" in tight.reason


def test_cpu_machine_skips_gpu_candidates_with_the_nvml_reason(nano_build: Path, cpu_only: None) -> None:
    build = BuildDir.open(nano_build)
    for name in ("tensorrt", "onnxruntime-cuda"):
        v = probe_candidate(name, build)
        assert not v.ok and v.reason.startswith("no usable NVIDIA GPU: ")
    assert probe_candidate("openvino", build).ok and probe_candidate("onnxruntime", build).ok
