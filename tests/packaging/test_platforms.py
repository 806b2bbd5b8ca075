"""Images for another platform, the quick part (the full run under QEMU is tools/arm64-check.sh): the wheel
tags pip is given, the base image's Python and glibc, what an ARM image serves, the contexts of both
platforms, and the aarch64 runtime resolved on the real package index (metadata only, no wheel download)."""

from __future__ import annotations

import json
import shutil
import socket
import sys
from importlib import metadata
from pathlib import Path

import pytest

from veo_edge.errors import PackagingError, UsageError
from veo_edge.packaging import platforms, resolve
from veo_edge.packaging.context import ContextOptions, assemble_context
from veo_edge.packaging.wheelhouse import runtime_requirements
from veo_edge.targets import get_target

HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"
BOOKWORM = platforms.BaseFacts(HERE, "2.36", "test")  # a Debian bookworm base with this machine's Python


@pytest.fixture(scope="module")
def pypi() -> None:
    try:
        socket.getaddrinfo("pypi.org", 443)
    except OSError as e:
        pytest.skip(f"the package index is not reachable here ({e})")


def test_every_manylinux_tag_up_to_the_base_glibc_is_listed() -> None:
    t = platforms.for_platform(get_target("cpu"), "linux/arm64", platforms.BaseFacts("3.11", "2.36", "x"))
    tags = t.wheel_platforms
    assert tags[0] == "manylinux_2_36_aarch64" and "manylinux_2_35_aarch64" in tags  # OpenVINO 2026's
    assert [f"manylinux_2_{n}_aarch64" for n in range(36, 16, -1)] == list(tags[:-1])
    assert tags[-1] == "manylinux2014_aarch64" and not any("x86_64" in x for x in tags)
    orin = get_target("orin")  # L4T r36 is Ubuntu 22.04: glibc 2.35; NVIDIA's index serves linux_aarch64
    assert orin.wheel_platforms[0] == "manylinux_2_35_aarch64" and orin.wheel_platforms[-1] == "linux_aarch64"
    a100 = get_target("a100").wheel_platforms
    assert a100[0] == "manylinux_2_35_x86_64" and "manylinux2010_x86_64" in a100


def test_a_platform_the_target_is_not_built_for_is_refused() -> None:
    with pytest.raises(
        UsageError, match=r"target orin is not built for linux/amd64; it is built for linux/arm64"
    ):
        platforms.for_platform(get_target("orin"), "linux/amd64")
    with pytest.raises(UsageError, match=r"target a100 is not built for linux/arm64"):
        platforms.for_platform(get_target("a100"), "linux/arm64")
    t = platforms.for_platform(get_target("orin"), None, platforms.BaseFacts("3.11", "2.36", "x"))
    assert (t.platform, t.python, t.glibc) == ("linux/arm64", "3.11", "2.36")


def test_python_and_glibc_are_read_from_the_probe_output() -> None:
    facts = platforms.parse_probe("3.10\nglibc 2.35\n", "nvcr.io/nvidia/l4t-jetpack:r36.4.0")
    assert (facts.python, facts.glibc) == ("3.10", "2.35")
    with pytest.raises(PackagingError, match=r"could not read Python and glibc from base image x"):
        platforms.parse_probe("sh: python3: not found", "x")
    said: list[str] = []
    facts = platforms.base_facts(get_target("orin"), "any", "linux/arm64", None, said.append)
    assert facts.python == "3.10" and said == [
        "base: Python 3.10, glibc 2.35, declared for target orin (--context-only asks no Docker engine to read "
        "the base image)"
    ]


def test_arm_images_serve_f32() -> None:
    served = lambda p: {"cpu_precision": {"served": {"openvino": p}}}  # noqa: E731
    assert platforms.check_servable(served("f32"), "linux/arm64") is None
    assert platforms.check_servable(served("int8"), "linux/amd64") is None
    assert "serves its f32 IR" in platforms.check_servable(served("bf16"), "linux/arm64")
    with pytest.raises(UsageError, match=r"serves an int8 OpenVINO IR .* rebuild with --cpu-precision f32"):
        platforms.check_servable(served("int8"), "linux/arm64")


@pytest.mark.slow
def test_the_cpu_context_for_arm64(nano_build: Path, tmp_path: Path) -> None:
    """Platform and the base's Python reach build-args.json; every build arg is an ARG of the Dockerfile
    (the a100 and orin contexts, amd64 and arm64, are assembled in test_context.py)."""
    if not (shutil.which("checkmodule") and shutil.which("semodule_package")):
        pytest.skip("checkmodule/semodule_package not installed (apt-get install checkpolicy semodule-utils)")
    cpu = platforms.for_platform(get_target("cpu"), "linux/arm64", BOOKWORM)
    ctx = assemble_context(
        ContextOptions(build_dir=nano_build, target=cpu, out=tmp_path / "ctx", download_wheels=False)
    )
    made = json.loads((ctx.path / "build-args.json").read_text())
    assert (made["platform"], made["python"], made["glibc"]) == ("linux/arm64", HERE, "2.36")
    dockerfile = (ctx.path / "Dockerfile").read_text()
    for arg in made["build_args"]:
        assert f"ARG {arg}" in dockerfile
    assert "PLUGINS" not in made["build_args"] and ctx.labels["io.veo-edge.serving"] == "openvino (CPU)"


@pytest.mark.parametrize("target", ["orin", "a100"])
def test_gpu_images_can_leave_the_plugin_libraries_out(target: str) -> None:
    """PLUGINS=no: nothing compiled, no library paths in the environment, and the labels say the image
    serves on the CPU only; every switch is an ARG of the target's Dockerfile."""
    from veo_edge.packaging.context import build_args, labels

    t = get_target(target)
    model = {"name": "vit-nano", "sha256": "0" * 64, "precision": "fp32"}
    args = build_args(t, model, None, None, plugin_libs=False)
    assert (args["PLUGINS"], args["PLUGIN_LIB"], args["MEMPOOL_LIB"]) == ("no", "", "")
    # the builder stage builds nothing: it is the base image, so no CUDA/TensorRT builder is pulled
    assert args.get("BUILDER_IMAGE", args["BASE_IMAGE"]) == args["BASE_IMAGE"]
    assert (
        build_args(t, model, "my/base:1", None, plugin_libs=False).get("BUILDER_IMAGE", "my/base:1")
        == "my/base:1"
    )
    assert labels(args)["io.veo-edge.serving"].startswith("openvino (CPU) only")
    assert build_args(t, model, None, None)["PLUGINS"] == "yes"
    dockerfile = (Path(__file__).resolve().parents[2] / t.dockerfile).read_text()
    for arg in args:
        assert f"ARG {arg}" in dockerfile, f"{t.dockerfile} has no ARG {arg}"
    assert '[ "$PLUGINS" != yes ] ||' in dockerfile


@pytest.mark.slow
def test_the_aarch64_runtime_resolves_to_wheels_of_that_platform(pypi) -> None:
    """Every runtime package of the cpu image has an aarch64 (or pure-Python) wheel for the base's Python,
    and OpenVINO is this machine's (2026's aarch64 wheel is manylinux_2_35: found only because every
    manylinux_2_N tag is listed)."""
    t = platforms.for_platform(get_target("cpu"), "linux/arm64", BOOKWORM)
    wheels = resolve.resolve(t, runtime_requirements(t))
    assert {w.name for w in wheels} >= {"openvino", "numpy", "grpcio", "uvloop", "cryptography"}
    for w in wheels:
        assert w.filename.endswith(("-any.whl", "_aarch64.whl")), w.filename
    ov = next(w for w in wheels if w.name == "openvino")
    assert (
        ov.version == metadata.version("openvino").split("-")[0] and "manylinux_2_35_aarch64" in ov.filename
    )


def test_too_old_tags_resolve_an_old_openvino_and_the_build_stops(pypi) -> None:
    """With only manylinux2014 (glibc 2.17) pip silently takes OpenVINO 2023.1: refused, naming why."""
    old = platforms.for_platform(get_target("cpu"), "linux/arm64", platforms.BaseFacts(HERE, "2.17", "x"))
    wheels = resolve.resolve(old, ["openvino"])
    assert next(w for w in wheels if w.name == "openvino").version.startswith("2023.")
    with pytest.raises(PackagingError, match=r"openvino resolved to 2023\.\S+ for linux/arm64.*glibc"):
        resolve.check_versions(old, wheels, print)


def test_a_package_without_an_aarch64_wheel_stops_the_build_naming_it(pypi) -> None:
    t = platforms.for_platform(get_target("cpu"), "linux/arm64", BOOKWORM)
    with pytest.raises(PackagingError, match=r"^intel-openmp has no wheel for linux/arm64, Python"):
        resolve.resolve_runtime(t, ["numpy", "intel-openmp"], print)  # x86-64 only; not optional


def test_onnxruntime_gpu_for_jetson_is_left_out_and_the_cpu_one_stands_in(pypi) -> None:
    """Jetson's comes from NVIDIA's Jetson index alone (PyPI's aarch64 wheel is for ARM servers), which is
    not reachable here: the orin image installs without it (the CPU path does not need it) and gets PyPI's
    CPU onnxruntime in its place, auto's CPU standby (it had no second CPU backend before); the note
    (which heads the lock) says both."""
    orin = platforms.for_platform(get_target("orin"), None, BOOKWORM)
    said: list[str] = []
    wheels, notes = resolve.resolve_runtime(orin, ["numpy", "onnxruntime-gpu"], said.append)
    names = [w.name for w in wheels]
    assert names[0] == "numpy" and "onnxruntime" in names and "onnxruntime-gpu" not in names
    ort = next(w for w in wheels if w.name == "onnxruntime")
    assert ort.version == metadata.version("onnxruntime") and ort.filename.endswith("_aarch64.whl")
    assert len(notes) == 1 and notes[0].startswith("onnxruntime-gpu left out: ")
    assert (
        f"onnxruntime {ort.version} (the CPU provider, auto's CPU standby) is installed in its place"
        in notes[0]
    )
    assert "the CPU path does not need it" in notes[0] and said == [f"wheelhouse: {notes[0]}"]


def test_the_cli_refuses_a_platform_before_the_export() -> None:
    import os
    import subprocess

    code = "from veo_edge.cli.main import main; main(['build', '--model', 'vit-nano', '--target', 'a100', '--platform', 'linux/arm64'])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ))
    assert r.returncode == UsageError.exit_code and "target a100 is not built for linux/arm64" in r.stderr
