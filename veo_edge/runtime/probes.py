"""What this machine can do, probed without side effects: each probe returns a :class:`Probe` that says
whether the capability is there and, when it is not, why. ``veo-edge doctor`` prints them; the runtime's
fallback policy uses the same probes to skip candidates with a reason."""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Probe:
    name: str
    ok: bool
    detail: str = ""  # what was found (versions, devices)
    reason: str | None = None  # why not, when ok is False
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


#: where the CPU's flags are read; ``$VEO_EDGE_CPUINFO`` names another file (a container without /proc,
#: a test that describes another CPU)
CPUINFO_ENV = "VEO_EDGE_CPUINFO"
#: the CPU flags with which OpenVINO runs int8 faster than f32 (VNNI dot products, AMX tiles)
INT8_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: what int8 measured without them (docs/benchmarks.md: `python bench/runtime.py precision`)
INT8_WITHOUT_VNNI = (
    "int8 ran at 0.70x the speed of f32 on a CPU without them (vit-digits, batch 1, an AVX2-only AMD EPYC; "
    "docs/benchmarks.md)"
)


def cpuinfo_text(source: str | Path | None = None) -> str:
    """The text of /proc/cpuinfo; ``source``: a :class:`~pathlib.Path` to read instead, or the text
    itself; ``None``: ``$VEO_EDGE_CPUINFO`` (a path) or /proc/cpuinfo. Empty when unreadable."""
    if isinstance(source, str):
        return source
    path = source or Path(os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo")
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _cpu(source: str | Path | None = None) -> tuple[set[str], str]:
    """(the CPU's flags, its model name) from :func:`cpuinfo_text`."""
    flags: set[str] = set()
    model = platform.processor() or platform.machine()
    for line in cpuinfo_text(source).splitlines():
        if line.startswith(("flags", "Features")) and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and model in ("", platform.machine()):
            model = line.split(":", 1)[1].strip()
    return flags, model


def _by_flags(
    name: str, wanted: tuple[str, ...], source: str | Path | None, found: str, unjudged: str, without: str
) -> Probe:
    """Probe ``name`` by the CPU flags: ok with ``found (the flags it has)`` when the CPU has one of
    ``wanted``; on an x86 CPU without them not ok, with ``without`` as the reason; ok and ``unjudged``
    elsewhere (other architectures are not judged by x86 flags)."""
    flags, _ = _cpu(source)
    have = [f for f in wanted if f in flags]
    if have:
        return Probe(name, True, found.format(flags=", ".join(have)), data={"flags": have})
    if "avx2" not in flags and "avx512f" not in flags:
        return Probe(name, True, f"not an x86 CPU with AVX2: {unjudged}", data={"flags": []})
    return Probe(
        name, False, reason=f"this CPU has none of {', '.join(wanted)}: {without}", data={"flags": []}
    )


def probe_int8(source: str | Path | None = None) -> Probe:
    """Whether this CPU runs OpenVINO int8 faster than f32: it has one of :data:`INT8_FLAGS`. On an x86
    CPU without them the reason says what int8 measured there; other architectures are not judged."""
    return _by_flags(
        "int8",
        INT8_FLAGS,
        source,
        "int8 accelerated ({flags})",
        "int8 speed not judged",
        f"{INT8_WITHOUT_VNNI}; build with --cpu-precision f32 for speed (bf16 needs avx512_bf16 or "
        "amx_bf16), or serve int8 on a CPU with VNNI or AMX",
    )


#: the CPU flags with which OpenVINO computes bf16 natively; without them ``--cpu-precision bf16`` runs f32
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
#: what bf16 measured with them (docs/benchmarks.md: `python bench/runtime.py precision`)
BF16_MEASURED = "vit-tiny ran 1.5-1.9x faster at bf16 than at f32 on such a CPU (docs/benchmarks.md)"


def probe_bf16(source: str | Path | None = None) -> Probe:
    """Whether ``--cpu-precision bf16`` runs bf16 here: the CPU has one of :data:`BF16_FLAGS` (OpenVINO's
    own test, :func:`veo_edge.runtime.backends.openvino_compile.native_bf16`, agrees on x86). Elsewhere on x86 it
    runs f32, and says so; other architectures are not judged."""
    return _by_flags(
        "bf16",
        BF16_FLAGS,
        source,
        f"bf16 native ({{flags}}): {BF16_MEASURED}",
        "bf16 not judged",
        "--cpu-precision bf16 runs f32 here",
    )


def probe_cpu(source: str | Path | None = None) -> Probe:
    flags, model = _cpu(source)
    wanted = [
        "sse4_2",
        "avx2",
        "fma",
        "avx512f",
        "avx512_bf16",
        "avx512_vnni",
        "avx_vnni",
        "amx_tile",
        "amx_int8",
        "amx_bf16",
        "asimd",
        "sve",
    ]
    have = [f for f in wanted if f in flags]
    return Probe(
        "cpu",
        True,
        f"{model}, {os.cpu_count()} cores, {' '.join(have) or 'no SIMD flags read'}",
        data={"model": model, "cores": os.cpu_count(), "arch": platform.machine(), "flags": have},
    )


def _nvidia_driver_present() -> bool:
    """Whether an NVIDIA kernel driver is loaded here (what a container gets from the NVIDIA runtime
    too), or Jetson's (its driver is in the kernel image, with /dev/nvhost-* devices)."""
    return any(os.path.exists(p) for p in ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/nvhost-ctrl"))


def probe_gpu() -> Probe:
    """NVIDIA GPUs through NVML (pynvml), with driver version and free memory per device."""
    try:
        import pynvml
    except ImportError:
        if not _nvidia_driver_present():  # a CPU host or a cpu image: nothing to install
            return Probe("gpu", False, reason="no NVIDIA driver on this machine (no /proc/driver/nvidia)")
        return Probe(
            "gpu", False, reason="pynvml is not installed (pip install nvidia-ml-py), so NVML cannot be read"
        )
    try:
        pynvml.nvmlInit()
    except Exception as e:
        return Probe(
            "gpu", False, reason=f"NVML did not initialise ({e}); no NVIDIA driver or GPU on this machine"
        )
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        devices = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            cc = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            devices.append(
                {
                    "index": i,
                    "name": name.decode() if isinstance(name, bytes) else name,
                    "compute_capability": f"{cc[0]}.{cc[1]}",
                    "memory_total": int(mem.total),
                    "memory_free": int(mem.free),
                }
            )
    finally:
        pynvml.nvmlShutdown()
    if not devices:
        return Probe("gpu", False, reason=f"NVIDIA driver {driver} found but no GPU", data={"driver": driver})
    names = ", ".join(f"{d['name']} (sm_{d['compute_capability'].replace('.', '')})" for d in devices)
    return Probe("gpu", True, f"{names}; driver {driver}", data={"driver": driver, "devices": devices})


def probe_tensorrt() -> Probe:
    if crashed := _import_crash("tensorrt"):
        return crashed
    try:
        import tensorrt as trt
    except ImportError as e:
        return Probe("tensorrt", False, reason=f"the tensorrt Python package is not importable ({e})")
    except Exception as e:  # present but broken (e.g. libnvinfer missing)
        return Probe("tensorrt", False, reason=f"tensorrt failed to import: {type(e).__name__}: {e}")
    return Probe("tensorrt", True, f"TensorRT {trt.__version__}", data={"version": trt.__version__})


def probe_onnxruntime() -> Probe:
    if crashed := _import_crash("onnxruntime"):
        return crashed
    try:
        import onnxruntime as ort
    except ImportError as e:
        return Probe("onnxruntime", False, reason=f"onnxruntime is not importable ({e})")
    from veo_edge.privacy import onnxruntime_telemetry_state

    providers = ort.get_available_providers()
    telemetry = onnxruntime_telemetry_state()
    return Probe(
        "onnxruntime",
        True,
        f"ONNX Runtime {ort.__version__}; providers: {', '.join(providers)}; {telemetry}",
        data={"version": ort.__version__, "providers": providers, "telemetry": telemetry},
    )


def probe_openvino() -> Probe:
    if crashed := _import_crash("openvino"):
        return crashed
    try:
        import openvino as ov
    except ImportError as e:
        return Probe("openvino", False, reason=f"openvino is not importable ({e})")
    from veo_edge.privacy import openvino_telemetry_state

    devices = ov.Core().available_devices
    version = _version("openvino") or ov.get_version()
    telemetry = openvino_telemetry_state()
    return Probe(
        "openvino",
        bool(devices),
        f"OpenVINO {version}; devices: {', '.join(devices) or 'none'}; {telemetry}",
        reason=None if devices else "OpenVINO sees no device",
        data={"version": version, "devices": devices, "telemetry": telemetry},
    )


def probe_docker(timeout: float = 2.0) -> Probe:
    """Docker engine reachable over its Unix socket (``DOCKER_HOST=unix://...`` or the default)."""
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return Probe(
            "docker", False, reason=f"DOCKER_HOST={host} is not a unix socket; only local engines are probed"
        )
    path = host[len("unix://") :]
    if not Path(path).exists():
        return Probe("docker", False, reason=f"no Docker engine socket at {path}; is dockerd running?")
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(path)
            s.sendall(b"GET /version HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
    except OSError as e:
        return Probe("docker", False, reason=f"Docker socket {path} did not answer: {e}")
    head, _, body = reply.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        return Probe("docker", False, reason=f"Docker engine at {path} answered {head[:60]!r}")
    import json

    try:
        version = json.loads(body).get("Version", "?")
    except ValueError:
        version = "?"
    return Probe(
        "docker", True, f"Docker engine {version} at {path}", data={"version": version, "socket": path}
    )


def _import_crash(name: str) -> Probe | None:
    """A failed probe where importing ``name``'s package killed a child process (the probe's own import
    would have killed this one: :mod:`veo_edge.runtime.imports`)."""
    from veo_edge.runtime.imports import import_crash

    reason = import_crash(name)
    return None if reason is None else Probe(name, False, reason=reason)


def probe_all() -> list[Probe]:
    """Every probe; the backends' packages are imported in child processes first (``doctor`` reports a
    package that crashes at import, and lives)."""
    from veo_edge.runtime.imports import start_import_checks

    start_import_checks(("tensorrt", "onnxruntime", "openvino"))
    return [
        probe_cpu(),
        probe_int8(),
        probe_bf16(),
        probe_gpu(),
        probe_tensorrt(),
        probe_onnxruntime(),
        probe_openvino(),
        probe_docker(),
    ]
