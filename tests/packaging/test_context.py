"""Build contexts without an engine: the orin and a100 contexts (their NVIDIA base images cannot be
pulled here, so they are checked as contexts: Dockerfile, build args, plugins, SELinux module, SBOM,
lock, file index), the errors a user meets before any engine is involved, and the CLI wiring."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from veo_edge.builddir import sha256_file
from veo_edge.errors import (
    EngineUnreachableError,
    OutputExistsError,
    PackagingError,
    UsageError,
    VeoEdgeError,
)
from veo_edge.packaging import selinux
from veo_edge.packaging.context import CONTEXT_MANIFEST, ContextOptions, assemble_context
from veo_edge.targets import TARGETS, get_target

REPO = Path(__file__).resolve().parents[2]
SELINUX_PP_MAGIC = 0xF97CFF8F  # a policy package starts with this (libsepol's SEPOL_MODULE_PACKAGE_MAGIC)


@pytest.fixture(scope="module")
def selinux_tools() -> None:
    if not (shutil.which("checkmodule") and shutil.which("semodule_package")) or not selinux.DEVEL.is_dir():
        pytest.skip(
            "the SELinux policy development files are not installed (apt-get install selinux-policy-dev)"
        )


def _veo(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    code = f"from veo_edge.cli.main import main; main({list(args)!r})"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize("name", ["orin", "a100"])
def test_gpu_contexts(name: str, nano_build: Path, tmp_path: Path, selinux_tools) -> None:
    t = get_target(name)
    ctx = assemble_context(
        ContextOptions(build_dir=nano_build, target=t, out=tmp_path / "ctx", download_wheels=False)
    )
    p = ctx.path
    assert (p / "Dockerfile").read_bytes() == (REPO / t.dockerfile).read_bytes()
    args = json.loads((p / "build-args.json").read_text())
    assert args["stage"] == t.stage and args["platform"] == t.platform
    ba = args["build_args"]
    assert ba["CUDA_ARCHS"] == {"orin": "87", "a100": "80"}[name]
    assert ba["BASE_IMAGE"].startswith("nvcr.io/nvidia/") and ba["BUILDER_IMAGE"].startswith(
        "nvcr.io/nvidia/"
    )
    assert ba["TENSORRT_VERSION"] == "10.3" and ba["CUDA_VERSION"] == "12.6"
    assert ba["JETPACK_VERSION"] == ("6.1" if name == "orin" else "none")
    assert ba["MODEL_NAME"] == "vit-nano"
    build_manifest = json.loads((nano_build / "manifest.json").read_text())
    assert ba["MODEL_SHA256"] == build_manifest["artifacts"]["onnx"]["sha256"]
    assert ctx.labels["io.veo-edge.model.sha256"] == ba["MODEL_SHA256"]
    # the builder stage compiles plugins/ from the context; the plugin sources are there, tests are not
    assert (p / "plugins" / "CMakeLists.txt").is_file() and not (p / "plugins" / "tests").exists()
    # the baked app: build directory, entrypoint, healthcheck, SELinux module, SBOM, lock
    app = p / "app"
    assert json.loads((app / "model" / "manifest.json").read_text()) == build_manifest
    assert (app / "bin" / "entrypoint.sh").stat().st_mode & 0o111
    assert (app / "healthcheck" / "healthcheck.sh").stat().st_mode & 0o111
    pp = (app / "selinux" / "veo_edge.pp").read_bytes()
    assert struct.unpack("<I", pp[:4])[0] == SELINUX_PP_MAGIC
    lock = (app / "requirements.lock").read_text()
    assert "veo-edge==" in lock and "--hash=sha256:" in lock and "torch" not in lock
    sbom = json.loads((app / "sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX" and sbom["metadata"]["component"]["name"] == "veo-edge"
    assert "veo-edge" in {c["name"] for c in sbom["components"]}
    assert (p / "sbom.cdx.json").read_bytes() == (app / "sbom.cdx.json").read_bytes()
    _check_sbom(sbom, build_manifest, ba["BASE_IMAGE"])
    assert ctx.labels["org.opencontainers.image.revision"] == ba["VCS_REF"] != ""
    # the file index next to the context covers every file in it
    index = json.loads((p / CONTEXT_MANIFEST).read_text())["files"]
    on_disk = {str(f.relative_to(p)) for f in p.rglob("*") if f.is_file() and f.name != CONTEXT_MANIFEST}
    assert set(index) == on_disk
    for rel in ("app/model/model.onnx", "Dockerfile", "app/selinux/veo_edge.pp"):
        assert index[rel]["sha256"] == sha256_file(p / rel)


def _check_sbom(sbom: dict, build_manifest: dict, base: str) -> None:
    """The model (hashed), each artifact (hashed), the base image, and veo-edge's wheel as a local build;
    valid CycloneDX by cyclonedx-python-lib's own schema check."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(sbom)) is None
    by_type = {c["type"]: c for c in sbom["components"]}
    model = by_type["machine-learning-model"]
    arts = build_manifest["artifacts"]
    assert model["name"] == "vit-nano" and model["hashes"][0]["content"] == arts["onnx"]["sha256"]
    data = {c["name"]: c["hashes"][0]["content"] for c in model["components"] if c["type"] == "data"}
    assert data == {a["path"]: a["sha256"] for a in arts.values()}
    assert by_type["container"]["name"] == base
    (own,) = [c for c in sbom["components"] if c["name"] == "veo-edge"]
    assert own["purl"].startswith(f"pkg:generic/veo-edge@{own['version']}?checksum=sha256:")
    assert own["hashes"][0]["content"] in own["purl"]
    assert "pypi.org" not in json.dumps(own)


def test_runtime_packages_carry_no_torch_or_exporter_and_cpu_no_gpu_packages() -> None:
    for t in TARGETS.values():
        assert not {"torch", "onnxscript", "onnx-graphsurgeon", "cmake"} & set(t.runtime_packages)
    cpu = get_target("cpu")
    assert {"openvino", "onnxruntime"} <= set(cpu.runtime_packages) and not cpu.has_gpu
    assert not {"onnx", "onnxruntime-gpu", "nvidia-ml-py"} & set(cpu.runtime_packages)
    assert "onnxruntime-gpu" in get_target("a100").runtime_packages
    assert get_target("orin").gpu_run_args == ("--runtime", "nvidia")
    assert get_target("a100").gpu_device_request


def test_unknown_target_names_the_choices() -> None:
    with pytest.raises(UsageError, match="unknown target 'h100'; choose one of: orin, a100, cpu"):
        get_target("h100")


def test_existing_context_needs_force_and_a_failed_assembly_leaves_nothing(
    nano_build: Path, copy_build, tmp_path: Path, selinux_tools
) -> None:
    out = tmp_path / "ctx"
    opts = ContextOptions(build_dir=nano_build, target=get_target("a100"), out=out, download_wheels=False)
    assemble_context(opts)
    with pytest.raises(OutputExistsError, match="pass --force"):
        assemble_context(opts)
    # a build that does not match its own manifest is never baked, and leaves no context behind
    bad = copy_build(nano_build)
    data = bytearray((bad / "model.onnx").read_bytes())
    data[-1] ^= 0xFF
    (bad / "model.onnx").write_bytes(bytes(data))
    with pytest.raises(VeoEdgeError, match=r"model\.onnx"):
        assemble_context(ContextOptions(build_dir=bad, target=get_target("cpu"), out=tmp_path / "bad"))
    assert not (tmp_path / "bad").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bad")]


def test_selinux_module_compiles_and_a_broken_policy_is_a_clear_error(
    tmp_path: Path, monkeypatch, selinux_tools
) -> None:
    pp = selinux.compile_module(tmp_path / "ok")
    assert struct.unpack("<I", pp.read_bytes()[:4])[0] == SELINUX_PP_MAGIC
    fake = tmp_path / "src"
    shutil.copytree(REPO / "packaging" / "selinux", fake / "packaging" / "selinux")
    te = fake / "packaging" / "selinux" / "veo_edge.te"
    te.write_text(te.read_text().replace("type veo_edge_model_t;", "type veo_edge_model_t"))
    monkeypatch.setattr(selinux, "source_root", lambda: fake)
    with pytest.raises(
        PackagingError, match=r"compiling the SELinux module .*veo_edge\.te failed .*syntax error"
    ):
        selinux.compile_module(tmp_path / "broken")


def test_no_engine_is_one_line_naming_docker_host(nano_build: Path, tmp_path: Path) -> None:
    from veo_edge.packaging.image import connect

    sock = f"unix://{tmp_path}/no-docker.sock"
    import os

    old = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = sock
    try:
        with pytest.raises(EngineUnreachableError, match=f"no Docker engine answers at DOCKER_HOST={sock}"):
            connect()
    finally:
        if old is None:
            os.environ.pop("DOCKER_HOST")
        else:
            os.environ["DOCKER_HOST"] = old
    r = _veo("image", "build", str(nano_build), "--target", "cpu", "--context-dir", str(tmp_path / "c"),
             env={"DOCKER_HOST": sock})  # fmt: skip
    assert r.returncode == EngineUnreachableError.exit_code, r.stderr
    assert "DOCKER_HOST" in r.stderr and "--context-only" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "c").exists()
    out = tmp_path / "never"  # build --target: the engine is asked before the export, not after it
    r = _veo("build", "--model", "vit-nano", "--target", "cpu", "--out", str(out), env={"DOCKER_HOST": sock})
    assert r.returncode == EngineUnreachableError.exit_code and "--context-only" in r.stderr, r.stderr
    assert not out.exists() and "Exporting" not in r.stderr


def test_build_image_flags_need_a_target_and_a_bad_target_fails_before_the_export() -> None:
    r = _veo("build", "--model", "vit-nano", "--image", "x:1")
    assert r.returncode == UsageError.exit_code and "--image need --target" in r.stderr
    r = _veo("build", "--model", "vit-nano", "--target", "tpu")
    assert r.returncode == UsageError.exit_code and "unknown target 'tpu'" in r.stderr


def test_runtime_pins_follow_this_machine_only_for_its_own_python() -> None:
    from importlib import metadata

    from veo_edge.packaging.wheelhouse import runtime_requirements

    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    same = [t for t in TARGETS.values() if t.python == here]
    other = [t for t in TARGETS.values() if t.python != here]
    for t in same:
        reqs = runtime_requirements(t)
        assert f"numpy=={metadata.version('numpy')}" in reqs
    for t in other:
        # e.g. numpy 2.3+ has no Python 3.10 wheels: the target's Python picks its own versions
        assert runtime_requirements(t) == list(t.runtime_packages)


def test_build_with_target_context_only_makes_the_build_and_its_context(
    tmp_path: Path, selinux_tools
) -> None:
    """`veo-edge build --target cpu --context-only`: the build directory, then the cpu context beside it
    (real wheel downloads for the image's platform and Python)."""
    out = tmp_path / "vit-nano"
    r = _veo("build", "--model", "vit-nano", "--out", str(out), "--target", "cpu", "--context-only", "--json",
             env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})  # fmt: skip
    assert r.returncode == 0, r.stderr
    made = json.loads(r.stdout)
    ctx = tmp_path / "vit-nano.image-cpu"
    assert made["image"]["context"] == str(ctx) and made["image"]["build_args"]["TARGET"] == "cpu"
    assert json.loads((ctx / "app" / "model" / "manifest.json").read_text())["model"]["name"] == "vit-nano"
    assert (ctx / "Dockerfile").read_bytes() == (REPO / "packaging" / "Dockerfile").read_bytes()
    assert not (ctx / "plugins").exists(), "the cpu image compiles nothing"
    wheels = {w.name.split("-")[0].lower() for w in (ctx / "wheels").glob("*.whl")}
    assert {"openvino", "onnxruntime", "numpy", "veo_edge", "securesystemslib", "cryptography"} <= wheels
    assert not {"torch", "onnx", "onnxruntime_gpu", "onnx_graphsurgeon", "setuptools", "pip"} & wheels
    # every wheel is pinned by its sha256 in the lock the image installs from
    lock = (ctx / "wheels" / "requirements.lock").read_text()
    for w in (ctx / "wheels").glob("*.whl"):
        assert f"--hash=sha256:{sha256_file(w)}" in lock


def test_a_bad_sign_key_or_build_directory_is_a_usage_error_before_any_work(
    nano_build: Path, tmp_path: Path
) -> None:
    from tests.support.images import ed25519_pem
    from veo_edge.packaging import signing

    no_engine = {"DOCKER_HOST": f"unix://{tmp_path}/none.sock"}  # refused before the engine is asked
    r = _veo(
        "image",
        "build",
        str(nano_build),
        "--target",
        "cpu",
        "--sign-key",
        str(tmp_path / "nope.pem"),
        env=no_engine,
    )
    assert r.returncode == UsageError.exit_code and "is not a file" in r.stderr
    pub = tmp_path / "k.pub.pem"
    pub.write_bytes(
        signing.public_pem(signing.load_private_key(ed25519_pem(tmp_path / "k.pem")).public_key())
    )
    r = _veo("image", "build", str(nano_build), "--target", "cpu", "--sign-key", str(pub), env=no_engine)
    assert r.returncode == UsageError.exit_code and f"--sign-key {pub} is a public key" in r.stderr, r.stderr
    r = _veo("image", "build", str(nano_build / "manifest.json"), "--target", "cpu", env=no_engine)
    assert r.returncode == UsageError.exit_code, r.stderr
    assert (
        f"manifest.json is a file, not a build directory; pass the directory that holds it, {nano_build}"
        in r.stderr
    )
    assert not list(tmp_path.glob("*.image-cpu")) and not list(nano_build.parent.glob("*.image-cpu"))


def test_a_finished_build_in_the_way_of_build_target_points_to_image_build(
    copy_build, nano_build: Path, tmp_path: Path
) -> None:
    """What an interrupted `build --target` leaves: the build directory, finished; a rerun says how to
    make its image rather than only --force (which rebuilds the model)."""
    out = copy_build(nano_build)
    r = _veo("build", "--model", "vit-nano", "--out", str(out), "--target", "cpu", "--context-only",
             env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})  # fmt: skip
    assert r.returncode == OutputExistsError.exit_code, r.stderr
    assert f"to make its image run `veo-edge image build {out} --target cpu`" in r.stderr, r.stderr


def test_a_full_disk_during_assembly_is_one_line_naming_the_way_out(nano_build: Path, tmp_path: Path) -> None:
    import os

    from veo_edge.errors import DiskFullError

    small = tmp_path / "small"
    small.mkdir()
    mount = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(small)], capture_output=True
    )
    if mount.returncode != 0 or os.geteuid() != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mount.stderr.decode().strip()}")
    try:
        opts = ContextOptions(
            build_dir=nano_build, target=get_target("cpu"), out=small / "ctx", download_wheels=False
        )
        with pytest.raises(DiskFullError, match=r"no space left on device writing the image context .*small/ctx: "
                           r"\d+ MB free there.*pass --context-dir DIR on another file system"):  # fmt: skip
            assemble_context(opts)
        assert not list(small.iterdir()), "the staging directory is removed"
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_engine_output_reaches_the_progress_without_ansi_escapes_and_names_its_steps() -> None:
    """What the classic builder streams (colours, cursor moves) is written to a log or pipe as text; each
    step's image and RUN container is recorded for the clean-up of the build's stage images."""
    from veo_edge.packaging.engineimages import BuildTrace
    from veo_edge.packaging.image import _stream

    chunks = [
        {"stream": "Step 1/2 : FROM base\n"},
        {"stream": " ---> 5a898b4fa56c\n"},
        {"stream": "Step 2/2 : RUN pip install x\n ---> Running in 1b2c352456e5\n"},
        {"stream": "\x1b[91mWARNING: \x1b[0mthe \x1b[1mbold\x1b[0m part\x1b[2K\r\n"},
        {"stream": " ---> c64452d41575\n"},
        {"aux": {"ID": "sha256:" + "c6" * 32}},
    ]
    said: list[str] = []
    trace = BuildTrace()
    assert _stream(iter(chunks), said.append, "test", trace) == "sha256:" + "c6" * 32
    assert "WARNING: the bold part" in said and not any("\x1b" in line for line in said)
    assert trace.made == ["5a898b4fa56c", "c64452d41575"] and trace.running == ["1b2c352456e5"]
