"""The fallback policy above the runners: which backends, in which order, and why each one was skipped.

Each candidate is probed before it is activated, cheaply and without side effects on the GPU: NVIDIA GPU
present and driver usable (NVML), library importable, execution provider / plugin library present, and
free GPU memory at least what the backend needs plus a margin, within the configured budget. A probe
that fails is a skip with its reason; so is an activation that fails. Backends never import each other;
this module is the only place that knows all of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from veo_edge.builddir import BuildDir
from veo_edge.errors import UsageError
from veo_edge.runtime.backends.base import Verdict

__all__ = ["BACKENDS", "DEFAULT_POLICY", "Verdict", "check_gpu_memory", "make_runner", "probe_candidate"]

BACKENDS = ("tensorrt", "onnxruntime-cuda", "onnxruntime", "openvino")
DEFAULT_POLICY = ("tensorrt", "onnxruntime-cuda", "openvino", "onnxruntime")
GPU_BACKENDS = frozenset({"tensorrt", "onnxruntime-cuda"})
#: what an explicitly chosen GPU backend falls back to, in order, where it cannot run (fallback on)
CPU_CHAIN = ("openvino", "onnxruntime")
#: free GPU memory kept beyond what a backend needs (other processes, CUDA context, fragmentation)
GPU_MEMORY_MARGIN = 256 << 20
#: ONNX Runtime CUDA EP: weights plus activations and cuDNN workspaces, as a multiple of the ONNX size
ORT_CUDA_MEMORY_FACTOR = 3.0

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_memory_size(value: int | str | None) -> int | None:
    """Bytes from ``1073741824``, ``"1G"``, ``"512MiB"``, ``"1.5GB"`` (binary units); ``None`` passes."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise UsageError(f"GPU memory budget must be > 0 bytes, got {value}")
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", str(value), re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise UsageError(
            f"GPU memory budget {value!r} is not a size; expected bytes or a number with a unit, e.g. 2G, 512MiB"
        )
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def resolve_policy(backend: str, policy: Sequence[str] | None, fallback: bool) -> tuple[list[str], list[str]]:
    """(eligible candidates in order, candidates listed but not eligible because fallback is off).

    A forced CPU backend is the only candidate; a forced GPU backend is the first, the CPU chain
    (:data:`CPU_CHAIN`) after it, so that a GPU host without its GPU still serves (each skip logged)."""
    for name in [backend, *(policy or [])]:
        if name != "auto" and name not in BACKENDS:
            raise UsageError(f"unknown backend {name!r}; choose one of: auto, {', '.join(BACKENDS)}")
    if backend != "auto":
        if policy is not None:
            raise UsageError(
                f"backend={backend!r} forces one backend, so a policy cannot be given too; "
                "use backend='auto' with the policy"
            )
        chain = list(CPU_CHAIN) if backend in GPU_BACKENDS else []
        return ([backend, *chain], []) if fallback else ([backend], chain)
    # a policy of "auto" alone is the default order (what --policy auto reads as)
    names = list(policy) if policy is not None and list(policy) != ["auto"] else list(DEFAULT_POLICY)
    if not names or "auto" in names or len(set(names)) != len(names):
        raise UsageError(
            f"policy {names} must be a non-empty list of distinct backends from: {', '.join(BACKENDS)}"
        )
    return (names, []) if fallback else (names[:1], names[1:])


def check_gpu_memory(
    name: str, need: int, free: int, budget: int | None, margin: int = GPU_MEMORY_MARGIN
) -> Verdict:
    """Whether ``need`` bytes fit: within ``budget`` (when set) and with ``margin`` to spare in ``free``."""
    mib = 1 << 20
    if budget is not None and need > budget:
        return Verdict(
            False,
            f"{name} needs about {need / mib:.0f} MiB of GPU memory, above the budget of {budget / mib:.0f} MiB; "
            "raise --gpu-memory-budget or build with a smaller --max-batch",
        )
    if need + margin > free:
        return Verdict(
            False,
            f"{name} needs about {need / mib:.0f} MiB of GPU memory plus a {margin / mib:.0f} MiB margin, "
            f"but only {free / mib:.0f} MiB is free; free GPU memory or build with a smaller --max-batch",
        )
    return Verdict(True, detail={"need": need, "free": free, "budget": budget})


def _gpu(index: int = 0) -> tuple[Verdict, int]:
    from veo_edge.runtime.probes import probe_gpu

    p = probe_gpu()
    if not p.ok:
        return Verdict(False, f"no usable NVIDIA GPU: {p.reason}"), 0
    devices = p.data["devices"]
    if not 0 <= index < len(devices):
        return Verdict(
            False, f"GPU {index} does not exist: this machine has {len(devices)} (0..{len(devices) - 1})"
        ), 0
    return Verdict(True), int(devices[index]["memory_free"])


def probe_candidate(
    name: str, build: BuildDir, gpu_memory_budget: int | None = None, gpu: int = 0
) -> Verdict:
    """Cheap checks that decide whether ``name`` is worth activating on this machine (each package probe
    first asks whether its import killed a child process: :mod:`veo_edge.runtime.imports`)."""
    if name == "openvino":
        from veo_edge.runtime.probes import probe_openvino

        p = probe_openvino()
        return Verdict(p.ok, p.reason)
    if name == "onnxruntime":
        from veo_edge.runtime.probes import probe_onnxruntime

        p = probe_onnxruntime()
        return Verdict(p.ok, p.reason)
    if name == "onnxruntime-cuda":
        dev, free = _gpu(gpu)
        if not dev.ok:
            return dev
        from veo_edge.runtime.probes import probe_onnxruntime

        p = probe_onnxruntime()
        if not p.ok:
            return Verdict(False, p.reason)
        if "CUDAExecutionProvider" not in p.data["providers"]:
            return Verdict(
                False,
                f"this onnxruntime build has no CUDAExecutionProvider (providers: {', '.join(p.data['providers'])}); "
                "install onnxruntime-gpu",
            )
        need = int(build.manifest["artifacts"]["onnx"]["bytes"] * ORT_CUDA_MEMORY_FACTOR)
        return check_gpu_memory(name, need, free, gpu_memory_budget)
    if name == "tensorrt":
        dev, free = _gpu(gpu)
        if not dev.ok:
            return dev
        from veo_edge.runtime.backends.tensorrt_probe import probe

        return probe(build, free, gpu_memory_budget, check_gpu_memory, gpu=gpu)
    raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")


def artifacts_of(name: str, build: BuildDir) -> list[str]:
    """The artifact kinds candidate ``name`` loads from ``build`` (verified when the runtime starts)."""
    if name == "openvino":
        return ["openvino_xml", "openvino_bin"]
    if name == "tensorrt" and build.has("plugins_onnx"):
        return ["plugins_onnx"]
    return ["onnx"]


def resolve_max_batch(max_batch: int | str | None, top: int) -> tuple[int, bool]:
    """(the runtime's max batch, whether its first backend measures it) for ``Runtime(max_batch=...)``:
    None is the build's ``top``, an int in 1..top itself, "auto" ``top`` until the backend measured."""
    if isinstance(max_batch, str) and max_batch == "auto":
        return top, True
    if max_batch is not None and (type(max_batch) is not int or not 1 <= max_batch <= top):
        raise UsageError(f"max_batch must be 'auto' or lie in 1..{top} (the build's), got {max_batch!r}")
    return max_batch or top, False


def make_runner(
    name: str,
    build: BuildDir,
    threads: int | None = None,
    performance_hint: str = "LATENCY",
    max_batch: int | None = None,
    measure_batching: bool = False,
    **options: Any,
):
    """The (inactive) runner for candidate ``name`` over ``build``'s artifacts; ``max_batch``: the largest
    batch it will be given (default: the build's), which lets the CPU runners compile less;
    ``measure_batching``: OpenVINO ADAPTIVE measures whether batching pays and runs batch 1 where not."""
    if name in ("openvino", "onnxruntime"):
        from veo_edge.runtime.loaders import cpu_runner

        return cpu_runner(build, name, threads, performance_hint, max_batch, measure_batching)
    if name == "onnxruntime-cuda":
        from veo_edge.runtime.backends.onnxruntime import OnnxRuntimeRunner

        return OnnxRuntimeRunner(
            build.artifact("onnx"),
            providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
            max_batch=build.max_batch,
            threads=threads,
        )
    if name == "tensorrt":
        from veo_edge.runtime.backends.tensorrt import TensorRtRunner

        return TensorRtRunner.for_build(build, **options)
    raise UsageError(f"unknown backend {name!r}; choose one of: {', '.join(BACKENDS)}")
