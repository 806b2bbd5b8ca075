"""TensorRT engine build configuration, without TensorRT: validation, version dispatch, profile shapes
and GPU memory arithmetic. The thin TensorRT layer (``runtime/backends/tensorrt.py``) only executes
what these functions decide, so the decisions are tested on machines without a GPU."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from veo_edge.errors import BackendUnavailableError, UsageError

PRECISIONS = ("fp32", "fp16")
MIN_TRT = Version("10.0")
#: TensorRT 11 removed the weak-typing precision flags: FP16 comes from an FP16 ONNX, strongly typed
STRONG_TYPING_ONLY = Version("11.0")
#: ``IExecutionContext.set_device_memory(ptr, size)`` and ``ICudaEngine.device_memory_size_v2`` appeared in
#: 10.1 (python/src/infer/pyCore.cpp, tags v10.0.1 vs v10.1.0); 11.0 removed 10.0's ``device_memory_size``
DEVICE_MEMORY_V2 = Version("10.1")
#: the design's reservation: the memory pool region is this many times the max-batch activation + I/O need
#: (a second execution context, TensorRT's own scratch through the pool allocator, fragmentation slack);
#: ``EngineConfig.pool_factor`` / ``--pool-factor`` changes it, the engine metadata and /metrics record it
POOL_FACTOR = 4.0
DEFAULT_WORKSPACE = 1 << 30


@dataclass(frozen=True)
class PrecisionPlan:
    """How to get ``precision`` out of a given TensorRT version."""

    precision: str
    #: the network is strongly typed: in 11.x always (its ``STRONGLY_TYPED`` creation flag is deprecated and
    #: ignored, NvInfer.h v11.1), so no creation flag is ever passed; 10.x builds weakly typed networks
    strongly_typed: bool
    fp16_flag: bool  # BuilderFlag.FP16 (10.x only)
    fp16_onnx: bool  # parse an FP16 ONNX made at build time (11.x)


def trt_version(text: str) -> Version:
    try:
        v = Version(text)
    except InvalidVersion as e:
        raise BackendUnavailableError(f"cannot read the TensorRT version {text!r}: {e}") from e
    if v < MIN_TRT:
        raise BackendUnavailableError(
            f"TensorRT {text} is too old; veo-edge needs TensorRT >= {MIN_TRT} (JetPack 6.1 ships 10.3)"
        )
    return v


def precision_plan(version: str, precision: str) -> PrecisionPlan:
    if precision not in PRECISIONS:
        raise UsageError(f"unknown TensorRT precision {precision!r}; choose one of: {', '.join(PRECISIONS)}")
    v = trt_version(version)
    fp16 = precision == "fp16"
    if v >= STRONG_TYPING_ONLY:
        return PrecisionPlan(precision, strongly_typed=True, fp16_flag=False, fp16_onnx=fp16)
    return PrecisionPlan(precision, strongly_typed=False, fp16_flag=fp16, fp16_onnx=False)


def uses_device_memory_v2(version: str) -> bool:
    """Whether this TensorRT sizes and hands over USER_MANAGED activation memory with the V2 API
    (``device_memory_size_v2`` / ``set_device_memory(ptr, size)``) rather than 10.0's
    ``device_memory_size`` / ``context.device_memory = ptr``."""
    return trt_version(version) >= DEVICE_MEMORY_V2


@dataclass(frozen=True)
class EngineConfig:
    """What an engine is built for: batch range of its optimization profile, precision, workspace."""

    max_batch: int
    opt_batch: int | None = None  # default: max_batch (the batcher fills batches under load)
    precision: str = "fp32"
    workspace_bytes: int = DEFAULT_WORKSPACE
    pool_factor: float = POOL_FACTOR  # memory pool = pool_factor x (activation + I/O need at max batch)
    engine: str = "fastest"  # which engine serves: "fastest" | "plugins" | "plain" (engine/selection.py)

    def __post_init__(self) -> None:
        if not isinstance(self.max_batch, int) or self.max_batch < 1:
            raise UsageError(f"engine max batch must be an integer >= 1, got {self.max_batch!r}")
        if self.opt_batch is not None and not 1 <= self.opt_batch <= self.max_batch:
            raise UsageError(
                f"engine opt batch {self.opt_batch} is outside 1..{self.max_batch} (the build's max batch)"
            )
        if self.precision not in PRECISIONS:
            raise UsageError(
                f"unknown TensorRT precision {self.precision!r}; choose one of: {', '.join(PRECISIONS)}"
            )
        if self.workspace_bytes < 1 << 20:
            raise UsageError(
                f"TensorRT workspace of {self.workspace_bytes} bytes is too small; give >= 1 MiB"
            )
        if not isinstance(self.pool_factor, (int, float)) or not 1.0 <= self.pool_factor <= 64.0:
            raise UsageError(
                f"memory pool factor must be a number in 1..64 (times the max-batch activation + I/O need), "
                f"got {self.pool_factor!r}; the design's default is {POOL_FACTOR:g}"
            )
        from veo_edge.engine.selection import check_mode

        check_mode(self.engine)

    def profile(
        self, sample_shape: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(min, opt, max) input shapes of the optimization profile: batch 1..max_batch."""
        opt = self.opt_batch or self.max_batch
        return (1, *sample_shape), (opt, *sample_shape), (self.max_batch, *sample_shape)


def io_bytes(
    sample_shape: tuple[int, ...], output_shape: tuple[int, ...], max_batch: int, itemsize: int = 4
) -> int:
    n_in = n_out = 1
    for d in sample_shape:
        n_in *= d
    for d in output_shape:
        n_out *= d
    return max_batch * (n_in + n_out) * itemsize


def pool_capacity(device_memory_size: int, io: int, factor: float = POOL_FACTOR, weights: int = 0) -> int:
    """Bytes of the memory pool region: ``factor`` x (the context's activation memory + its I/O at max
    batch), plus ``weights`` (the engine's, which TensorRT allocates through the pool allocator when it
    deserialises), rounded up to 1 MiB."""
    need = int((device_memory_size + io) * factor) + weights
    return -(-need // (1 << 20)) * (1 << 20)


def engine_gpu_bytes(engine_bytes: int, device_memory_size: int, io: int, factor: float = POOL_FACTOR) -> int:
    """GPU memory an engine needs to run: the pool, which holds its weights (about the serialised size)
    and the reservation for activations and I/O."""
    return pool_capacity(device_memory_size, io, factor, weights=engine_bytes)


def estimate_unbuilt_gpu_bytes(onnx_bytes: int, io: int, precision: str, factor: float = POOL_FACTOR) -> int:
    """Before any engine exists: weights from the ONNX size (halved for FP16) and activations guessed at
    the weights' size again; enough to turn away a GPU that is clearly too full."""
    weights = onnx_bytes // 2 if precision == "fp16" else onnx_bytes
    return pool_capacity(weights, io, factor, weights=weights)
