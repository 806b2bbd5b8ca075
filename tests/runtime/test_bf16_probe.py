"""``veo-edge doctor`` says whether ``--cpu-precision bf16`` runs bf16 here, from the CPU flags, and
agrees with OpenVINO's own test on this machine."""

from __future__ import annotations

import json

import pytest

from veo_edge.cli.main import main
from veo_edge.runtime.backends.openvino_compile import native_bf16
from veo_edge.runtime.probes import BF16_FLAGS, CPUINFO_ENV, _cpu, probe_bf16

AVX512_NO_BF16 = (
    "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu sse4_2 avx fma avx2 avx512f avx512_vnni\n"
)


def test_the_bf16_probe_follows_the_cpu_flags() -> None:
    f32 = probe_bf16(AVX512_NO_BF16)
    assert (
        not f32.ok
        and f32.reason == "this CPU has none of avx512_bf16, amx_bf16: --cpu-precision bf16 runs f32 here"
    )
    for flag in BF16_FLAGS:
        native = probe_bf16(f"flags\t\t: fpu avx2 avx512f {flag}\n")
        assert (
            native.ok and native.data["flags"] == [flag] and native.detail.startswith(f"bf16 native ({flag})")
        )
    assert probe_bf16("Features\t: fp asimd\n").ok  # an Arm CPU: not judged by x86 flags


def test_the_probe_agrees_with_openvino_on_this_machine() -> None:
    flags, _ = _cpu()
    if "avx2" not in flags:
        pytest.skip("not an x86 CPU with AVX2: the probe does not judge it")
    assert probe_bf16().ok == native_bf16(), sorted(flags)


def test_doctor_shows_bf16(tmp_path, monkeypatch, capsys) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(AVX512_NO_BF16)
    monkeypatch.setenv(CPUINFO_ENV, str(cpuinfo))
    with pytest.raises(SystemExit) as done:
        main(["doctor", "--json"])
    assert done.value.code in (0, None)
    bf16 = json.loads(capsys.readouterr().out)["bf16"]
    assert bf16["ok"] is False and "runs f32 here" in bf16["reason"]
    with pytest.raises(SystemExit):
        main(["doctor"])
    assert "│ bf16" in capsys.readouterr().out  # its own row in the table
