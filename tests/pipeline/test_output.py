"""Where a build is written, through ``veo-edge build`` as a user runs it: ``--force`` replaces only a
veo-edge build, ``--out`` naming a file is refused, two builds of one output never both write it (real
processes), a SIGKILLed build's staging directory is reclaimed, and a full disk (a real tmpfs) or a bad
path is one line naming the path, with nothing left behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from veo_edge.builddir import BuildDir

OUTPUT_EXISTS, OUTPUT_PATH, DISK_FULL, LOCKED, MODEL_LOAD = 5, 32, 33, 34, 3


def veo(*args, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(_cmd(*args), capture_output=True, text=True, env=_env(env), timeout=600, **kw)


def veo_bg(*args, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        _cmd(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(env)
    )


def _cmd(*args) -> list[str]:
    return [sys.executable, "-m", "veo_edge.cli.main", *map(str, args)]


def _env(extra: dict | None) -> dict:
    env = {**os.environ, "COLUMNS": "400", **(extra or {})}
    env.pop("VEO_EDGE_DEBUG", None)
    return env


def one_line(r: subprocess.CompletedProcess | tuple) -> str:
    stderr = r.stderr if hasattr(r, "stderr") else r[1]
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the build exited ({proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


def lock_owner(out: Path) -> int | None:
    try:
        return json.loads((out.parent / f".{out.name}.lock").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


NANO = ("build", "--model", "vit-nano", "--quiet")


# -- --force and --out ------------------------------------------------------------------------------


def test_force_never_deletes_a_directory_that_is_not_a_build(tmp_path):
    mine = tmp_path / "my-photos"
    mine.mkdir()
    (mine / "holiday.jpg").write_bytes(b"precious")
    for extra in ((), ("--force",)):
        r = veo(*NANO, "--out", mine, *extra)
        assert r.returncode == OUTPUT_EXISTS, r.stderr
        line = one_line(r)
        assert f"--out {mine} exists and is not a veo-edge build directory" in line
        assert "--force replaces only build directories" in line
    assert (mine / "holiday.jpg").read_bytes() == b"precious"
    assert hidden(tmp_path) == []


def test_out_naming_a_file_is_refused_and_the_file_kept(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("keep me")
    for extra in ((), ("--force",)):
        r = veo(*NANO, "--out", f, *extra)
        assert r.returncode == OUTPUT_PATH, r.stderr
        assert f"--out {f} is a file, not a directory" in one_line(r)
    assert f.read_text() == "keep me"
    assert hidden(tmp_path) == []  # no .notes.txt.old-PID copy


def test_a_parent_that_is_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    r = veo(*NANO, "--out", tmp_path / "file" / "sub" / "out")
    assert r.returncode == OUTPUT_PATH, r.stderr
    assert f"{tmp_path / 'file'} is a file, not a directory" in one_line(r)


@pytest.mark.parametrize("flag", ["--onnx", "--checkpoint"])
def test_a_model_path_naming_a_directory_says_so(flag, nano_build, tmp_path):
    # checked before the import
    extra = ("--module", "no_such_module:make", "--input-shape", "3,32,32") if flag == "--checkpoint" else ()
    r = veo("build", "-q", *extra, flag, nano_build, "--out", tmp_path / "o")
    assert r.returncode == MODEL_LOAD, r.stderr
    line = one_line(r)
    assert (
        f"{flag} {nano_build} is a directory, expected {'an ONNX file' if flag == '--onnx' else 'a checkpoint'}"
        in line
    )
    if flag == "--onnx":
        assert f"did you mean --onnx {nano_build / 'model.onnx'}?" in line
    assert not (tmp_path / "o").exists()


def test_an_unwritable_parent_is_named(tmp_path):
    """Permissions bind only a non-root user: the build runs as nobody (skipped where it cannot)."""
    if os.getuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv (util-linux) to run the build as another user")
    parent = tmp_path / "locked"
    parent.mkdir(mode=0o755)
    home = tmp_path / "home"
    home.mkdir()
    os.chown(home, 65534, 65534)
    for p in (tmp_path, *tmp_path.parents):  # let nobody reach it (pytest's basetemp is 0700)
        if p.stat().st_mode & 0o005 != 0o005:
            os.chmod(p, p.stat().st_mode | 0o005)
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    r = subprocess.run(
        [*nobody, *_cmd(*NANO, "--out", parent / "out")],
        capture_output=True,
        text=True,
        env=_env({"HOME": str(home)}),
        timeout=600,
    )
    if r.returncode != OUTPUT_PATH and "veo_edge" not in r.stderr and "error:" not in r.stderr:
        pytest.skip(f"nobody cannot run this checkout's interpreter: {r.stderr.strip()[:200]}")
    assert r.returncode == OUTPUT_PATH, r.stderr
    line = one_line(r)
    assert f"permission denied writing {parent}" in line and "as uid 65534" in line
    assert list(parent.iterdir()) == []


# -- small real filesystems ----------------------------------------------------------------------


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs("1m", "ro")``: a fresh tmpfs mounted for the test (skipped where mounting is not allowed)."""
    mounts: list[Path] = []

    def mount(*options: str) -> Path:
        where = tmp_path / f"fs{len(mounts)}"
        where.mkdir()
        r = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(where)],
            capture_output=True,
            text=True,
        )
        if r.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN): {r.stderr.strip()}")
        mounts.append(where)
        return where

    yield mount
    for where in mounts:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_read_only_parent_is_named(tmpfs):
    fs = tmpfs("size=1m", "ro")
    r = veo(*NANO, "--out", fs / "out")
    assert r.returncode == OUTPUT_PATH, r.stderr
    assert f"{fs} is on a read-only filesystem" in one_line(r)


def test_too_little_space_is_refused_before_the_build_with_what_it_needs(tmpfs):
    fs = tmpfs("size=512k")
    r = veo(*NANO, "--out", fs / "out")
    assert r.returncode == DISK_FULL, r.stderr
    line = one_line(r)
    assert f"not enough space for the build in {fs}: 0.5 MiB free, the build needs about" in line
    assert "free space there or choose an --out on another filesystem" in line
    assert list(fs.iterdir()) == []


@pytest.mark.parametrize("inodes", [6, 9])  # 6: OpenVINO cannot open model.xml; 9: the canary files
def test_a_disk_that_fills_up_during_the_build_leaves_nothing(inodes, tmpfs):
    """Enough bytes but too few inodes: the build hits ENOSPC part-way, in Python or in a native library."""
    fs = tmpfs("size=64m", f"nr_inodes={inodes}")
    r = veo(*NANO, "--out", fs / "out")
    assert r.returncode == DISK_FULL, r.stderr
    line = one_line(r)
    assert f"the filesystem of {fs} ran out of inodes during the build" in line
    assert f"nothing was written to {fs / 'out'}" in line
    assert list(fs.iterdir()) == []


def test_a_build_that_fits_a_small_filesystem_succeeds(tmpfs, nano_build):
    need = sum(e["bytes"] for e in BuildDir.open(nano_build).manifest["artifacts"].values())
    fs = tmpfs(f"size={need * 2 // 1024 + 256}k")
    r = veo(*NANO, "--out", fs / "out")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in fs.iterdir()) == ["out"]


# -- concurrent builds and killed builds --------------------------------------------------------------


def test_a_second_build_of_the_same_output_fails_while_the_first_runs_or_with_wait_queues_behind_it(tmp_path):
    """One first build holds the output's lock for three others (one build fewer than two tests would
    make): without --wait a build fails at once and names the holder; with --wait, one replaces the first's
    output after it (--force) and one then finds the output made (no --force)."""
    out = tmp_path / "shared"
    first = veo_bg(*NANO, "--out", out, "--max-batch", "2", "--json")  # --json: what it wrote, on stdout
    wait_for(lambda: lock_owner(out) == first.pid, first, "the first build took the lock")
    refused = veo("build", "--model", "veo-video-nano", "--quiet", "--out", out, "--force")
    assert refused.returncode == LOCKED, refused.stderr
    line = one_line(refused)
    assert f"another veo-edge build (pid {first.pid} on " in line and f"is writing {out}" in line
    assert "pass --wait to queue behind it" in line
    assert lock_owner(out) == first.pid, "the refused build left the first build's lock alone"
    second = veo_bg(*NANO, "--out", out, "--max-batch", "4", "--force", "--wait")
    no_force = veo_bg(*NANO, "--out", out, "--wait")  # waits too, then finds the output made
    first_out, first_err = first.communicate(timeout=600)
    assert first.returncode == 0, first_err
    made = json.loads(first_out)  # the first wrote its own build, untouched by the refused one
    assert made["path"] == str(out) and made["model"]["name"] == "vit-nano" and made["max_batch"] == 2
    _, second_err = second.communicate(timeout=600)
    assert second.returncode == 0, second_err
    assert f"waiting for another veo-edge build (pid {first.pid} on " in second_err
    assert BuildDir.open(out).model_name == "vit-nano"
    assert BuildDir.open(out).max_batch == 4  # the second ran after the first, and replaced it
    _, no_force_err = no_force.communicate(timeout=600)
    assert no_force.returncode == OUTPUT_EXISTS, no_force_err
    assert (
        no_force_err.strip().splitlines()[-1]
        == f"error: output directory {out} already exists; pass --force to overwrite it"
    )
    assert hidden(tmp_path) == []  # no staging directory, no lock file


def test_a_killed_build_leaves_debris_that_the_next_build_reclaims(tmp_path):
    out = tmp_path / "b"
    victim = veo_bg(*NANO, "--out", out)

    def staged_onnx() -> bool:
        return any(
            p.name.startswith(".b.building-") and (p / "model.onnx").is_file() for p in tmp_path.iterdir()
        )

    wait_for(staged_onnx, victim, "the build staged model.onnx")
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=60)
    debris = [n for n in hidden(tmp_path) if n.startswith(".b.building-")]
    assert len(debris) == 1 and not out.exists()
    r = veo("build", "--model", "vit-nano", "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"removed {debris[0]} (" in r.stderr and "left by a build of b that was killed" in r.stderr
    assert hidden(tmp_path) == []
    BuildDir.open(out).verify()


def test_a_build_stopped_by_sigterm_cleans_up_as_ctrl_c_does(tmp_path):
    """SIGTERM (a container stop, a CI timeout) mid-build: no staging directory, no lock, no output, one
    line saying so; it used to leave a 45 MB staging directory and the lock for the next build to reclaim."""
    out = tmp_path / "b"
    victim = veo_bg(*NANO, "--out", out)
    wait_for(
        lambda: any(
            p.name.startswith(".b.building-") and (p / "model.onnx").is_file() for p in tmp_path.iterdir()
        ),
        victim,
        "the build staged model.onnx",
    )
    os.kill(victim.pid, signal.SIGTERM)
    _, err = victim.communicate(timeout=60)
    assert victim.returncode == 130, err
    assert err.strip().splitlines()[-1] == "interrupted by SIGTERM"
    assert hidden(tmp_path) == [] and not out.exists()


# -- one line when no backend can run -----------------------------------------------------------------


def test_no_backend_is_one_line_with_the_reasons_in_json_and_debug(nano_build):
    faults = json.dumps({"openvino": {"fail_at_start": True}, "onnxruntime": {"fail_at_start": True}})
    env = {"VEO_EDGE_FAULTS": faults}
    r = veo("infer", nano_build, env=env)
    assert r.returncode == 8, r.stderr
    line = one_line(r)
    tried = ["tensorrt", "onnxruntime-cuda", "openvino", "onnxruntime"]
    assert line.startswith(f"error: no backend can run build {nano_build} (tried {', '.join(tried)})")
    assert "--json or --debug shows each backend's full reason" in line
    r = veo("infer", nano_build, "--json", env=env)
    report = json.loads(r.stdout)
    assert report["exit_code"] == 8 and report["tried"] == tried
    assert [s["backend"] for s in report["skipped"]] == tried
    assert all(s["reason"] for s in report["skipped"])
    r = veo("--debug", "infer", nano_build, env=env)
    assert '"skipped"' in r.stderr and "Traceback" in r.stderr
