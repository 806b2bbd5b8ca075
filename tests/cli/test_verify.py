"""A tampered or malformed build is refused, through the CLI as a user meets it: ``veo-edge verify`` and
every load (``infer``, ``healthcheck``, ``serve``, ``inspect``) say which file differs and both hashes,
with exit code 30; a manifest that breaks its schema says which field (exit 31)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from veo_edge.builddir import BuildDir, sha256_file, verify
from veo_edge.errors import ArtifactMismatchError, BuildDirError, ManifestError

TAMPERED, BAD_MANIFEST, NOT_A_BUILD = 30, 31, 7


def veo(*args, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}
    env.pop("VEO_EDGE_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "veo_edge.cli.main", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def flip_byte(path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate_half(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_an_intact_build_verifies(nano_build):
    r = veo("verify", nano_build)
    assert r.returncode == 0, r.stderr
    assert f"verified {nano_build}: 7 artifacts" in r.stdout and "every sha256 matches" in r.stdout
    report = json.loads(veo("verify", nano_build, "--json").stdout)
    manifest = BuildDir.open(nano_build).manifest
    assert report["ok"] is True and report["schema_version"] == 1
    assert {a["kind"]: a["sha256"] for a in report["artifacts"]} == {
        k: e["sha256"] for k, e in manifest["artifacts"].items()
    }
    assert report["bytes"] == sum(e["bytes"] for e in manifest["artifacts"].values())


# each artifact kind, tampered, and a command that loads it
LOADERS = {
    "onnx": ["infer", "{b}", "--backend", "onnxruntime"],
    "openvino_xml": ["infer", "{b}", "--backend", "openvino"],
    "openvino_bin": ["infer", "{b}"],  # the default policy falls to openvino on this CPU host
    "canary_input": ["healthcheck", "--build-dir", "{b}"],
    "canary_expected": ["healthcheck", "--build-dir", "{b}"],
    "surgery_report": ["inspect", "{b}"],
    "plugins_onnx": ["engine", "build", "{b}"],  # verified before TensorRT is even imported
}


@pytest.mark.parametrize("damage", [flip_byte, truncate_half], ids=["byte-flipped", "truncated"])
@pytest.mark.parametrize("kind", sorted(LOADERS))
def test_a_tampered_artifact_is_refused_by_verify_and_by_its_loader(kind, damage, nano_build, copy_build):
    build = copy_build(nano_build)
    entry = BuildDir.open(build).manifest["artifacts"][kind]
    target = build / entry["path"]
    damage(target)
    now = sha256_file(target)
    commands = [["verify", "{b}"], LOADERS[kind]]
    for command in commands:
        r = veo(*(a.format(b=build) for a in command))
        assert r.returncode == TAMPERED, (command, r.stderr)
        line = one_line(r)
        assert f"build {build} was modified after it was built: {entry['path']} has" in line
        assert f"sha256 {now}, the manifest records" in line, (command, line)
        assert entry["sha256"] in line.split("the manifest records")[1]
        assert "rebuild it with `veo-edge build --force`" in line
    if damage is truncate_half:
        assert f"the manifest records {entry['bytes']} bytes" in line


def test_serve_refuses_a_tampered_model_before_listening(nano_build, copy_build):
    build = copy_build(nano_build)
    flip_byte(build / "openvino" / "model.bin")
    r = veo("serve", build, "--port", "0", "--grpc-port", "0", "--metrics-port", "0", timeout=120)
    assert r.returncode == TAMPERED, r.stderr
    assert "openvino/model.bin has sha256" in one_line(r)


def test_int8_weights_are_verified_with_their_xml(digits_int8_build, copy_build):
    """The int8 IR's .bin is read with its .xml, as the f32 one's is: a changed int8 .bin was loaded by
    serve, recovery and healthcheck --build-dir, and only `verify` saw it."""
    build = copy_build(digits_int8_build)
    flip_byte(build / "openvino" / "model.int8.bin")
    r = veo("healthcheck", "--build-dir", build, "--timeout", "120", timeout=180)
    assert r.returncode == TAMPERED, r.stderr
    assert "openvino/model.int8.bin has sha256" in one_line(r)


def test_verify_json_reports_every_differing_artifact(nano_build, copy_build):
    build = copy_build(nano_build)
    flip_byte(build / "model.onnx")
    flip_byte(build / "openvino" / "model.bin")
    r = veo("verify", build, "--json")
    assert r.returncode == TAMPERED
    report = json.loads(r.stdout)
    assert report["ok"] is False and report["exit_code"] == TAMPERED
    assert sorted(a["kind"] for a in report["artifacts"] if not a["ok"]) == ["onnx", "openvino_bin"]
    assert "(also differ: openvino/model.bin)" in report["error"]


def edit_manifest(build, change) -> None:
    path = build / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


def test_a_manifest_whose_checksum_was_edited_is_refused(nano_build, copy_build):
    build = copy_build(nano_build)
    real = sha256_file(build / "model.onnx")
    edit_manifest(build, lambda m: m["artifacts"]["onnx"].update(sha256="0" * 64))
    for command in (["verify", build], ["infer", build, "--backend", "onnxruntime"]):
        r = veo(*command)
        assert r.returncode == TAMPERED, r.stderr
        assert f"model.onnx has sha256 {real}, the manifest records {'0' * 64}" in one_line(r)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda m: m.pop("inputs"), "field 'inputs' is missing"),
        (lambda m: m.update(max_batch="eight"), "field 'max_batch' is \"eight\", expected an integer"),
        (lambda m: m.update(max_batch=0), "field 'max_batch' is 0, expected at least 1"),
        (lambda m: m["inputs"][0].update(dtype="float31"), "field 'inputs[0].dtype' is \"float31\", expected one of"),
        (lambda m: m["inputs"][0]["shape"].append("x"), "field 'inputs[0].shape[4]' is \"x\", expected an integer"),
        (lambda m: m.pop("canary"), "field 'canary' is missing"),
        (lambda m: m["artifacts"].pop("canary_expected"), "field 'artifacts.canary_expected' is missing"),
        (lambda m: m["artifacts"]["onnx"].update(sha256="abc"), "field 'artifacts.onnx.sha256' is \"abc\", expected 64 lowercase hex"),
        (lambda m: m["artifacts"]["onnx"].update(path="../../etc/passwd"), "field 'artifacts.onnx.path' is \"../../etc/passwd\", expected a relative path inside"),
        (lambda m: m["model"].pop("name"), "field 'model.name' is missing"),
    ],
    ids=["no-inputs", "max-batch-string", "max-batch-0", "dtype", "shape", "no-canary", "no-canary-artifact",
         "bad-sha", "path-escape", "no-name"],
)  # fmt: skip
def test_a_manifest_that_breaks_the_schema_names_the_field(change, message, nano_build, copy_build):
    build = copy_build(nano_build)
    edit_manifest(build, change)
    for command in (["verify", build], ["infer", build], ["healthcheck", "--build-dir", build]):
        r = veo(*command)
        assert r.returncode == BAD_MANIFEST, (command, r.stderr)
        line = one_line(r)
        assert f"{build}/manifest.json does not follow manifest schema v1: {message}" in line
        assert "internal error" not in line


def test_a_manifest_with_many_problems_lists_them_in_json(nano_build, copy_build):
    build = copy_build(nano_build)
    edit_manifest(
        build, lambda m: (m.pop("inputs"), m.pop("outputs"), m.update(max_batch="8", input_shape=[]))
    )
    r = veo("verify", build, "--json")
    assert r.returncode == BAD_MANIFEST
    report = json.loads(r.stdout)
    assert len(report["problems"]) == 4 and "(and 1 more)" in report["error"]


def test_a_missing_golden_canary_is_a_clear_error_at_start(nano_build, copy_build):
    build = copy_build(nano_build)
    (build / "canary" / "expected.npy").unlink()
    canary_unusable = 22  # healthcheck's code for a golden canary it cannot use
    for command, code in (
        (["healthcheck", "--build-dir", build], canary_unusable),
        (["serve", build, "--port", "0", "--grpc-port", "0", "--metrics-port", "0"], canary_unusable),
        (["verify", build], NOT_A_BUILD),
    ):
        r = veo(*command)
        assert r.returncode == code, (command, r.stderr)
        assert (
            f"artifact 'canary_expected' of build {build} is missing: {build}/canary/expected.npy"
            in one_line(r)
        )


def test_not_a_build_directory(tmp_path):
    r = veo("verify", tmp_path / "nowhere")
    assert r.returncode == NOT_A_BUILD and "does not exist; run `veo-edge build` first" in one_line(r)
    (tmp_path / "f").write_text("x")
    r = veo("verify", tmp_path / "f")
    assert r.returncode == NOT_A_BUILD and "is a file, not a build directory" in one_line(r)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "manifest.json").write_text("[1, 2]")
    r = veo("verify", tmp_path / "m")
    assert r.returncode == BAD_MANIFEST and "holds a JSON list, expected an object" in one_line(r)


# -- the library entry points -----------------------------------------------------------------------


def test_verify_returns_a_report_and_raises_the_specific_error(nano_build, copy_build):
    report = verify(nano_build)
    assert report.ok and len(report.artifacts) == 7 and report.bytes > 0
    build = copy_build(nano_build)
    flip_byte(build / "canary" / "input.npy", offset=-1)
    with pytest.raises(
        ArtifactMismatchError, match=r"canary/input\.npy has sha256 [0-9a-f]{64}, the manifest"
    ):
        verify(build)
    edit_manifest(build, lambda m: m.update(max_batch=None))
    with pytest.raises(ManifestError, match=r"field 'max_batch' is null, expected an integer"):
        verify(build)
    assert issubclass(ManifestError, BuildDirError) and issubclass(ArtifactMismatchError, BuildDirError)


def test_each_artifact_is_hashed_once_per_load_and_again_when_it_changes(nano_build, copy_build):
    """Verified artifacts are remembered by inode, size and mtime: a change the stamp cannot see (a byte
    flipped with the mtime put back) is not hashed again by the same BuildDir, but by a new load."""
    build = copy_build(nano_build)
    b = BuildDir.open(build)
    onnx = b.artifact("onnx")
    st = onnx.stat()
    with open(onnx, "r+b") as f:  # in place: same inode
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(onnx, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert b.artifact("onnx") == onnx  # remembered: not hashed again
    with pytest.raises(ArtifactMismatchError, match=r"model\.onnx has sha256"):
        BuildDir.open(build).artifact("onnx")  # a new load hashes it
    os.utime(onnx)  # the same BuildDir sees a new mtime and hashes again
    with pytest.raises(ArtifactMismatchError):
        b.artifact("onnx")


def test_the_runtime_verifies_only_what_its_backends_load(nano_build, copy_build):
    from veo_edge.runtime.runtime import Runtime

    build = copy_build(nano_build)
    flip_byte(build / "openvino" / "model.bin")
    with pytest.raises(ArtifactMismatchError, match=r"openvino/model\.bin"):
        Runtime(build, backend="openvino").start()
    with pytest.raises(ArtifactMismatchError, match=r"openvino/model\.bin"):
        Runtime(build).start()  # openvino is a fallback candidate of the default policy
    with Runtime(build, backend="onnxruntime") as rt:  # loads model.onnx only
        assert rt.state.active_backend == "onnxruntime"


def _stderr_on_a_terminal(*args) -> tuple[int, str]:
    """Run ``veo-edge`` with stderr on a pseudo-terminal (as in a shell); its exit code and what it drew."""
    import pty

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "veo_edge.cli.main", *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace")


def test_verify_shows_a_progress_bar_on_a_terminal(nano_build):
    code, drawn = _stderr_on_a_terminal("verify", nano_build, "--progress")
    assert code == 0
    assert f"Verifying {nano_build}" in drawn and "MB" in drawn
    code, drawn = _stderr_on_a_terminal("verify", nano_build)  # 1.4 MiB: below the progress threshold
    assert code == 0 and "Verifying" not in drawn
