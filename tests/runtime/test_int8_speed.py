"""int8 on a CPU without VNNI or AMX runs slower than f32: the probe says so with the measured reason,
from the CPU flags of /proc/cpuinfo or of a file or text given instead; serving int8 there warns, and
``veo-edge doctor`` shows it."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

import veo_edge
from veo_edge.cli.main import main
from veo_edge.runtime.probes import CPUINFO_ENV, INT8_FLAGS, probe_int8

AVX2_ONLY = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu sse4_2 avx fma avx2 avx512f\n"


def test_the_int8_probe_follows_the_cpu_flags(tmp_path: Path) -> None:
    slow = probe_int8(AVX2_ONLY)
    assert not slow.ok
    assert slow.reason.startswith("this CPU has none of avx512_vnni, avx_vnni, amx_int8: int8 ran at 0.70x")
    for flag in INT8_FLAGS:
        fast = probe_int8(f"flags\t\t: fpu avx2 {flag}\n")
        assert fast.ok and fast.data["flags"] == [flag]
    path = tmp_path / "cpuinfo"
    path.write_text(AVX2_ONLY)
    assert probe_int8(path) == slow  # a path is read, a string is the text itself
    assert probe_int8("Features\t: fp asimd\n").ok  # an Arm CPU: not judged by x86 flags


def test_serving_int8_warns_on_a_cpu_without_vnni_and_doctor_shows_it(
    digits_int8_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    handler = Collect(logging.WARNING)
    logger = logging.getLogger("veo_edge.runtime")
    logger.addHandler(handler)
    cpuinfo = tmp_path / "cpuinfo"
    try:
        for text, warned in ((AVX2_ONLY, True), ("flags\t\t: avx2 avx512f avx512_vnni\n", False)):
            cpuinfo.write_text(text)
            monkeypatch.setenv(CPUINFO_ENV, str(cpuinfo))
            messages.clear()
            with veo_edge.Runtime(digits_int8_build, backend="openvino") as rt:
                assert rt.describe()["precision"] == "int8"
            slow = [m for m in messages if "serves int8 on openvino, but this CPU has none of" in m]
            assert bool(slow) is warned, messages
    finally:
        logger.removeHandler(handler)

    cpuinfo.write_text(AVX2_ONLY)
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--json"])
    assert done.value.code in (0, None)
    report = json.loads(capsys.readouterr().out)
    assert report["int8"]["ok"] is False and "0.70x" in report["int8"]["reason"]
