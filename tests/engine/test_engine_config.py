"""TensorRT build decisions made without TensorRT: version dispatch, profile, memory arithmetic."""

import pytest

from veo_edge.engine.config import (
    POOL_FACTOR,
    EngineConfig,
    engine_gpu_bytes,
    estimate_unbuilt_gpu_bytes,
    io_bytes,
    pool_capacity,
    precision_plan,
    uses_device_memory_v2,
)
from veo_edge.errors import BackendUnavailableError, UsageError

MIB = 1 << 20


@pytest.mark.parametrize(
    ("version", "precision", "typed", "flag", "fp16_onnx"),
    [
        ("10.3.0", "fp16", False, True, False),  # Jetson Orin, JetPack 6.1: the FP16 builder flag
        ("10.13.2.6", "fp32", False, False, False),
        ("11.1.0", "fp16", True, False, True),  # flag removed: FP16 ONNX into a strongly typed network
        ("11.4.1", "fp32", True, False, False),
    ],
)
def test_fp16_the_way_each_tensorrt_wants_it(version, precision, typed, flag, fp16_onnx):
    plan = precision_plan(version, precision)
    assert (plan.strongly_typed, plan.fp16_flag, plan.fp16_onnx) == (typed, flag, fp16_onnx)


def test_unsupported_versions_and_precisions():
    with pytest.raises(
        BackendUnavailableError, match=r"TensorRT 8.6.1 is too old; veo-edge needs TensorRT >= 10.0"
    ):
        precision_plan("8.6.1", "fp16")
    with pytest.raises(BackendUnavailableError, match=r"cannot read the TensorRT version 'ten'"):
        precision_plan("ten", "fp16")
    with pytest.raises(UsageError, match=r"unknown TensorRT precision 'int8'; choose one of: fp32, fp16"):
        precision_plan("10.3.0", "int8")


def test_profile_covers_batch_one_to_max():
    assert EngineConfig(max_batch=8).profile((3, 224, 224)) == (
        (1, 3, 224, 224),
        (8, 3, 224, 224),
        (8, 3, 224, 224),
    )
    assert EngineConfig(max_batch=8, opt_batch=4).profile((3, 8, 112, 112))[1] == (4, 3, 8, 112, 112)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_batch": 0}, r"engine max batch must be an integer >= 1, got 0"),
        ({"max_batch": 4, "opt_batch": 5}, r"engine opt batch 5 is outside 1..4"),
        ({"max_batch": 4, "precision": "bf16"}, r"unknown TensorRT precision 'bf16'"),
        ({"max_batch": 4, "workspace_bytes": 1024}, r"workspace of 1024 bytes is too small"),
    ],
)
def test_config_validation(kw, match):
    with pytest.raises(UsageError, match=match):
        EngineConfig(**kw)


def test_memory_arithmetic():
    assert io_bytes((3, 32, 32), (10,), 8) == 8 * (3072 + 10) * 4
    assert POOL_FACTOR == 4.0  # the design: 4x the max-batch activation + I/O need
    assert pool_capacity(100 * MIB, 20 * MIB) == 480 * MIB  # 4 x (activations + I/O), whole MiB
    assert pool_capacity(100 * MIB, 0, factor=1.5) == 150 * MIB
    assert pool_capacity(1, 0) == MIB
    assert pool_capacity(10 * MIB, 0, weights=7 * MIB) == 47 * MIB  # the weights once, not 4x
    assert engine_gpu_bytes(50 * MIB, 100 * MIB, 0) == 450 * MIB
    assert estimate_unbuilt_gpu_bytes(40 * MIB, 0, "fp16") == 20 * MIB + 80 * MIB
    assert estimate_unbuilt_gpu_bytes(40 * MIB, 0, "fp32") == 40 * MIB + 160 * MIB


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"pool_factor": 0.5},
            r"memory pool factor must be a number in 1..64 .*got 0.5; the design's default is 4",
        ),
        ({"engine": "tensorrt"}, r"unknown engine choice 'tensorrt'; choose one of: fastest, plugins, plain"),
    ],
)
def test_pool_factor_and_engine_choice_are_validated(kw, match):
    with pytest.raises(UsageError, match=match):
        EngineConfig(max_batch=4, **kw)
    assert EngineConfig(max_batch=4).pool_factor == 4.0 and EngineConfig(max_batch=4).engine == "fastest"


@pytest.mark.parametrize(
    ("version", "v2"),
    [("10.0.1.6", False), ("10.1.0", True), ("10.3.0", True), ("11.0.0", True), ("11.1.0.7", True)],
)
def test_device_memory_api_follows_the_version(version, v2):
    # set_device_memory(ptr, size) / device_memory_size_v2 arrived in 10.1; 11.0 dropped device_memory_size
    assert uses_device_memory_v2(version) is v2
