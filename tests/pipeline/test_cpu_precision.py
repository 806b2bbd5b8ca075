"""``--cpu-precision f32|bf16|int8``: recorded in the manifest, honoured by the runtime, guarded by real
accuracy numbers (vit-digits on its real test split), refused with nothing left behind when bad."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import veo_edge
from veo_edge.builddir import BuildDir
from veo_edge.errors import AccuracyGuardError, UsageError
from veo_edge.export.accuracy import MAX_ACCURACY_DROP, top1_points
from veo_edge.export.canary import compare_canary
from veo_edge.export.source import BuiltinSource
from veo_edge.models import digits as digits_data
from veo_edge.pipeline.build import BuildOptions, run_build
from veo_edge.runtime.backends import openvino as ov_backend
from veo_edge.runtime.backends import openvino_compile
from veo_edge.serve.health import check_local, load_canary


def test_int8_build_records_what_it_did(digits_int8_build: Path) -> None:
    m = BuildDir.open(digits_int8_build).manifest
    cpu = m["cpu_precision"]
    assert cpu["requested"] == "int8"
    assert cpu["served"] == {"openvino": "int8", "onnxruntime": "f32"}
    assert cpu["calibration"]["samples"] == digits_data.CALIBRATION_SIZE
    assert "training split" in cpu["calibration"]["data"]
    guard = cpu["guard"]
    assert guard["kind"] == "labelled" and guard["passed"] and guard["samples"] == 540
    assert guard["thresholds"] == {"max_accuracy_drop": MAX_ACCURACY_DROP}
    assert set(guard["accuracy"]) == {"openvino", "onnxruntime"}
    assert set(guard["accuracy"]["openvino"]) == {"f32", "int8"}
    assert guard["drop"] <= MAX_ACCURACY_DROP
    # the FP32 IR stays beside the int8 one
    assert {"openvino_xml", "openvino_bin", "openvino_int8_xml", "openvino_int8_bin"} <= set(m["artifacts"])
    assert "FakeQuantize" in (digits_int8_build / m["artifacts"]["openvino_int8_xml"]["path"]).read_text()
    assert "FakeQuantize" not in (digits_int8_build / m["artifacts"]["openvino_xml"]["path"]).read_text()


def test_int8_weights_never_saturate_a_cpu_without_vnni(digits_int8_build: Path) -> None:
    """Checked on the IR, so on any CPU: every int8 weight of every quantized layer lies in 7 bits, where
    u8 x s8 pair sums fit int16 on CPUs without VNNI (with the full range this CPU-dependent saturation
    cost 0.37 top-1 points on an AVX2 machine and failed the guard; quantize.py)."""
    import openvino as ov

    from veo_edge.export.quantize import WEIGHT_RANGE

    m = BuildDir.open(digits_int8_build).manifest
    assert m["cpu_precision"]["quantization"]["overflow_fix"] == "enable"
    model = ov.Core().read_model(str(digits_int8_build / m["artifacts"]["openvino_int8_xml"]["path"]))
    weights = [
        op.get_data()
        for op in model.get_ordered_ops()
        if op.get_type_name() == "Constant" and op.get_element_type() == ov.Type.i8
    ]
    # patch embedding, 4 matrices in each of the 4 blocks, the head
    assert len(weights) == 18
    lo, hi = WEIGHT_RANGE
    assert [(int(w.min()), int(w.max())) for w in weights if w.min() < lo or w.max() > hi] == []
    assert max(int(np.abs(w).max()) for w in weights) > hi // 2  # the 7 bits are used, not a degenerate range


@pytest.mark.parametrize(("backend", "precision"), [("openvino", "int8"), ("onnxruntime", "f32")])
def test_the_runtime_serves_the_chosen_precision_with_the_recorded_accuracy(
    digits_int8_build: Path, backend: str, precision: str
) -> None:
    """The accuracy the manifest records is what the runtime gives on the real test split."""
    test = digits_data.test_split()
    with veo_edge.Runtime(digits_int8_build, backend=backend) as rt:
        assert rt.describe()["precision"] == precision
        logits = rt.infer(test.x)
    recorded = BuildDir.open(digits_int8_build).manifest["cpu_precision"]["guard"]["accuracy"][backend]
    assert top1_points(logits, test.y) == pytest.approx(recorded[precision], abs=1e-9)
    print(f"\nvit-digits {precision} on {backend}: top-1 {recorded[precision]:.2f}% on 540 test scans")


def test_canary_tolerance_follows_the_precision(digits_int8_build: Path) -> None:
    build = BuildDir.open(digits_int8_build)
    f32, int8 = load_canary(build, "f32"), load_canary(build)
    assert int8.atol > f32.atol and int8.min_cosine <= f32.min_cosine
    with veo_edge.Runtime(build, backend="openvino") as rt:
        out = rt.infer(int8.input)
    assert compare_canary(out, int8).ok
    assert not compare_canary(out, f32).ok  # int8 really is further off than the f32 rule allows
    assert check_local(str(digits_int8_build), backend="openvino")["healthy"]


def test_a_bad_quantization_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    """Calibrating on constant zeros ruins the int8 ranges: the guard refuses with both numbers."""
    zeros = tmp_path / "zeros.npy"
    np.save(zeros, np.zeros((64, 1, 32, 32), np.float32))
    out = tmp_path / "out"
    opts = BuildOptions(
        BuiltinSource("vit-digits"),
        out=out,
        quiet=True,
        plugins=False,
        cpu_precision="int8",
        calibration=zeros,
    )
    with pytest.raises(
        AccuracyGuardError,
        match=r"int8 loses .* top-1 points on openvino \(.*% at f32, .*% at int8, 540 labelled",
    ):
        run_build(opts)
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [zeros]  # no staging directory either


def test_int8_without_data_is_refused_before_any_work(tmp_path: Path) -> None:
    opts = BuildOptions(BuiltinSource("vit-nano"), out=tmp_path / "o", quiet=True, cpu_precision="int8")
    with pytest.raises(
        UsageError, match=r"--cpu-precision int8 needs calibration inputs for vit-nano: pass --calibration"
    ):
        run_build(opts)
    with pytest.raises(UsageError, match=r"--cpu-precision 'fp8' is unknown; choose one of: f32, bf16, int8"):
        BuildOptions(BuiltinSource("vit-nano"), cpu_precision="fp8")
    assert not (tmp_path / "o").exists()


def test_bf16_falls_back_to_f32_with_a_note_where_the_cpu_has_no_bf16(tmp_path: Path, monkeypatch) -> None:
    """The capability probe is simulated (a CPU without BF16); OpenVINO itself runs for real."""
    monkeypatch.setattr(openvino_compile, "native_bf16", lambda: False)
    out = tmp_path / "nano-bf16"
    result = run_build(
        BuildOptions(BuiltinSource("vit-nano"), out=out, quiet=True, plugins=False, cpu_precision="bf16")
    )
    cpu = result.manifest["cpu_precision"]
    assert cpu["requested"] == "bf16" and cpu["served"]["openvino"] == "f32"
    assert "no native BF16" in cpu["note"] and "guard" not in cpu
    with veo_edge.Runtime(out, backend="openvino") as rt:
        assert rt.describe()["precision"] == "f32"
    # a bf16 build served on a CPU without BF16: the runner falls back too, and says so
    runner = ov_backend.OpenVinoRunner(
        out / "openvino" / "model.xml", precision="bf16", has_native_bf16=lambda: False
    )
    with runner:
        assert runner.compiled_precision == "f32"
        assert "no native BF16" in runner.describe()["precision_note"]


def test_bf16_runs_bf16_where_the_cpu_has_it(tmp_path: Path) -> None:
    if not openvino_compile.native_bf16():
        pytest.skip("this CPU has no native BF16")
    out = tmp_path / "nano-bf16"
    result = run_build(
        BuildOptions(BuiltinSource("vit-nano"), out=out, quiet=True, plugins=False, cpu_precision="bf16")
    )
    cpu = result.manifest["cpu_precision"]
    assert cpu["served"]["openvino"] == "bf16" and cpu["inference_precision_hint"] == "bf16"
    assert cpu["guard"]["kind"] == "label-free" and cpu["guard"]["passed"]
    with veo_edge.Runtime(out, backend="openvino") as rt:
        assert rt.describe()["precision"] == "bf16"
        assert rt.describe()["inference_precision_hint"] == "bf16"
