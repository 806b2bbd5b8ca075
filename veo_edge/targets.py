"""The image targets ``veo-edge build --target`` knows: pure data, nothing probed at import.

Each target names the Dockerfile that builds it, the platforms it can be built for, its default base
images (overridable with ``--base-image``), the Python and glibc that base is declared to carry (what the
wheelhouse is made for when the base image itself cannot be read; ``veo_edge.packaging.platforms`` reads
them from the image when an engine has it), its CUDA architectures, the versions its base carries (they
become OCI labels), the runtime Python packages the image installs on top of veo-edge (and those it may
go without), and the options ``docker run`` / a deploy needs to give the container the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from veo_edge.errors import UsageError


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    #: repository file the build context takes its Dockerfile from
    dockerfile: str
    #: the stage of that Dockerfile the image is (``docker build --target``)
    stage: str
    platform: str  # docker platform, e.g. linux/amd64
    base_image: str  # runtime stage
    builder_image: str | None  # stage that compiles plugins/ (None: no native code in the image)
    python: str  # the base image's python3, "3.11", as declared (read from the image where it can be)
    glibc: str = "2.36"  # the base image's glibc, as declared: the newest manylinux_2_N wheels it takes
    #: every platform the target can be built for (``--platform``); the first is ``platform``'s default
    platforms: tuple[str, ...] = ()
    cuda_archs: tuple[int, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)  # cuda, tensorrt, jetpack, l4t
    #: distributions installed besides veo-edge (versions pinned from this machine where it has them)
    runtime_packages: tuple[str, ...] = ()
    #: of those, the ones the image goes without (saying so) where no wheel can be had: the CPU path
    #: never needs them (onnxruntime-gpu for Jetson comes only from NVIDIA's Jetson index)
    optional_packages: tuple[str, ...] = ()
    #: an optional package left out -> the one installed in its place: onnxruntime-gpu's CPU provider is
    #: auto's CPU standby, so without it PyPI's CPU onnxruntime keeps the chain ending in ONNX Runtime
    optional_stand_ins: dict[str, str] = field(default_factory=dict)
    #: an index the GPU wheels come from where PyPI has none (NVIDIA's JetPack index on Orin)
    extra_index_url: str | None = None
    #: ``docker run`` options a deploy adds so the container sees the GPU
    gpu_run_args: tuple[str, ...] = ()
    #: the same as Docker SDK / compose terms: ``runtime`` name or a device request
    gpu_runtime: str | None = None
    gpu_device_request: bool = False

    @property
    def has_gpu(self) -> bool:
        return bool(self.cuda_archs)

    @property
    def arch(self) -> str:
        return self.platform.split("/", 1)[1]

    @property
    def supported_platforms(self) -> tuple[str, ...]:
        return self.platforms or (self.platform,)

    @property
    def wheel_platforms(self) -> tuple[str, ...]:
        """pip ``--platform`` tags for the wheelhouse, newest first. pip takes exact tags, so every
        ``manylinux_2_N`` the base's glibc runs is listed (with only ``manylinux2014_aarch64``, pip silently
        resolves OpenVINO 2023.1, whose last wheel carries that tag, instead of 2026's ``manylinux_2_35``);
        ``linux_<arch>`` where an extra index serves locally built wheels (NVIDIA's Jetson index)."""
        major, minor = (int(x) for x in self.glibc.split(".")[:2])
        if major != 2:
            raise UsageError(f"target {self.name}: glibc {self.glibc} is not a 2.x version")
        arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(self.arch, self.arch)
        tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 16, -1)]
        tags.append(f"manylinux2014_{arch}")  # = manylinux_2_17, the name older wheels use
        if arch == "x86_64":  # older x86-64 wheels: manylinux2010 (2_12) and manylinux1 (2_5)
            tags += [f"manylinux_2_{n}_{arch}" for n in range(16, 4, -1)]
            tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
        if self.extra_index_url:
            tags.append(f"linux_{arch}")
        return tuple(tags)


#: what every image runs: serve + healthcheck over OpenVINO, and the manifest/signature checks
_COMMON = (
    "numpy",
    "typer",
    "rich",
    "packaging",
    "prometheus-client",
    "jsonschema-rs",  # the build manifest is checked against its schema at every load
    # veo-edge serve: HTTP on uvicorn/httptools/uvloop, KServe v2 gRPC on grpcio with tritonclient's stubs
    "uvicorn",
    "httptools",
    "uvloop",
    "grpcio",
    "protobuf",
    "tritonclient",
    "securesystemslib",
    "cryptography",
)

TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target(
            name="orin",
            description="Jetson Orin, JetPack 6 (L4T r36.4), CUDA 12.6, TensorRT 10.3, sm_87, arm64",
            dockerfile="Dockerfile.jetson",
            stage="runtime",
            platform="linux/arm64",
            base_image="nvcr.io/nvidia/l4t-jetpack:r36.4.0",
            builder_image="nvcr.io/nvidia/l4t-jetpack:r36.4.0",
            python="3.10",
            glibc="2.35",  # Ubuntu 22.04
            cuda_archs=(87,),
            versions={"cuda": "12.6", "tensorrt": "10.3", "jetpack": "6.1", "l4t": "r36.4.0"},
            runtime_packages=(*_COMMON, "openvino", "onnx", "onnxruntime-gpu", "nvidia-ml-py"),
            optional_packages=("onnxruntime-gpu",),
            optional_stand_ins={"onnxruntime-gpu": "onnxruntime"},
            extra_index_url="https://pypi.jetson-ai-lab.dev/jp6/cu126",
            gpu_run_args=("--runtime", "nvidia"),
            gpu_runtime="nvidia",
        ),
        Target(
            name="a100",
            description="x86_64 A100 (sm_80), CUDA 12.6, TensorRT 10.3 (NGC TensorRT 24.08)",
            dockerfile="packaging/Dockerfile",
            stage="gpu",
            platform="linux/amd64",
            base_image="nvcr.io/nvidia/tensorrt:24.08-py3",
            builder_image="nvcr.io/nvidia/tensorrt:24.08-py3",
            python="3.10",
            glibc="2.35",  # Ubuntu 22.04
            cuda_archs=(80,),
            versions={"cuda": "12.6", "tensorrt": "10.3"},
            runtime_packages=(*_COMMON, "openvino", "onnx", "onnxruntime-gpu", "nvidia-ml-py"),
            optional_packages=("onnxruntime-gpu",),
            optional_stand_ins={"onnxruntime-gpu": "onnxruntime"},
            gpu_run_args=("--gpus", "all"),
            gpu_device_request=True,
        ),
        Target(
            name="cpu",
            description="CPU only (x86_64, or arm64 with --platform linux/arm64): OpenVINO, no CUDA at all",
            dockerfile="packaging/Dockerfile",
            stage="cpu",
            platform="linux/amd64",
            platforms=("linux/amd64", "linux/arm64"),
            base_image="python:3.11-slim-bookworm",
            builder_image=None,
            python="3.11",
            # ONNX Runtime's CPU provider on the same ONNX: auto's second CPU backend, the warm
            # standby a failed OpenVINO batch is re-run on (docs/serving.md, faults)
            runtime_packages=(*_COMMON, "openvino", "onnxruntime"),
        ),
    )
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise UsageError(f"unknown target {name!r}; choose one of: {', '.join(TARGETS)}") from None
