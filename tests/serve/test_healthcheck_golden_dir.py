"""A golden build directory that is missing or no build directory is named by where it came from, as a
wrong one is (tests/serve/test_healthcheck_source.py): ``VEO_EDGE_BUILD_DIR=DIR`` when the environment gave
it (the image's probe, ``healthcheck --url`` without the flag), ``--build-dir DIR`` when the flag did.
Before, both said only 'build directory DIR does not exist; run `veo-edge build` first'."""

from __future__ import annotations

from pathlib import Path

from tests.serve.test_healthcheck_source import COMMANDS, _run
from veo_edge.errors import BuildDirError


def test_a_golden_dir_that_is_no_build_is_named_by_where_it_came_from(nano_server, tmp_path: Path):
    url = f"http://{nano_server.url}"
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    cases = {
        tmp_path / "nope": "does not exist",
        tmp_path / "file": "is a file, not a build directory",
        tmp_path / "empty": "has no manifest.json (it is not a veo-edge build directory)",
    }
    for golden, what in cases.items():
        for module in COMMANDS:
            r = _run(module, "--url", url, env={"VEO_EDGE_BUILD_DIR": str(golden)})
            assert r.returncode == BuildDirError.exit_code, r.stderr
            assert f"VEO_EDGE_BUILD_DIR={golden} {what}; " in r.stderr, r.stderr
            assert "unset VEO_EDGE_BUILD_DIR to use the server's canary" in r.stderr, r.stderr
            assert "--build-dir" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        # given as the flag, the flag is named (the environment's is not used then)
        args = ("--url", url, "--build-dir", str(golden))
        r = _run(COMMANDS[1], *args, env={"VEO_EDGE_BUILD_DIR": str(tmp_path)})
        assert r.returncode == BuildDirError.exit_code, r.stderr
        assert f"--build-dir {golden} {what}; " in r.stderr and "leave --build-dir out" in r.stderr
        assert "VEO_EDGE_BUILD_DIR" not in r.stderr, r.stderr
