"""``veo-edge engine build`` on a machine without TensorRT: one line that says what to do."""

import pytest

from tests.cli.test_cli import veo


def test_engine_build_without_tensorrt_is_one_clear_line(nano_build):
    from veo_edge.runtime.probes import probe_tensorrt

    if probe_tensorrt().ok:
        pytest.skip("TensorRT is importable here")
    r = veo("engine", "build", nano_build)
    assert r.returncode == 8, r.stderr
    assert "TensorRT is not importable" in r.stderr and "--backend openvino" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_engine_help_lists_build():
    r = veo("engine", "--help")
    assert r.returncode == 0 and "build" in r.stdout
