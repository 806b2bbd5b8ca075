"""The accuracy guard's two rules on real backends (OpenVINO and ONNX Runtime over the nano build),
without building: what passes, what is refused, and the numbers the refusal gives."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from veo_edge.builddir import BuildDir
from veo_edge.errors import AccuracyGuardError
from veo_edge.export.accuracy import MIN_MEAN_COSINE, label_free_guard, labelled_guard, outputs
from veo_edge.export.parity import seeded_inputs
from veo_edge.runtime.loaders import cpu_runner


@pytest.fixture(scope="module")
def runs(nano_build: Path):
    build = BuildDir.open(nano_build)
    ov, ort = cpu_runner(build, "openvino"), cpu_runner(build, "onnxruntime")
    with ov, ort:
        yield {
            "openvino": lambda x: next(iter(ov.infer(x).values())),
            "onnxruntime": lambda x: next(iter(ort.infer(x).values())),
        }


def test_label_free_passes_a_faithful_backend_and_refuses_a_noisy_one(runs) -> None:
    x = seeded_inputs((3, 32, 32), 64, 5)
    ok = label_free_guard(runs["openvino"], ("onnxruntime", runs["onnxruntime"]), "f32", x, 8, "seeded")
    assert ok.passed and ok.agreement["top1_agreement"] == 1.0 and ok.agreement["unambiguous"] > 0
    assert ok.agreement["min_cosine"] > 0.9999
    rng = np.random.default_rng(0)

    def noisy(batch: np.ndarray) -> np.ndarray:  # the real output, plus noise of its own size
        out = runs["onnxruntime"](batch)
        return out + rng.standard_normal(out.shape).astype(np.float32) * out.std()

    with pytest.raises(
        AccuracyGuardError,
        match=rf"int8 on noisy does not reproduce the f32 model: .*\(min {MIN_MEAN_COSINE}\)",
    ):
        label_free_guard(runs["openvino"], ("noisy", noisy), "int8", x, 8, "seeded")


def test_labelled_reports_every_backend_and_refuses_a_drop(runs) -> None:
    x = seeded_inputs((3, 32, 32), 40, 6)
    y = outputs(runs["onnxruntime"], x, 8).argmax(1)  # labels that f32 gets all right
    report = labelled_guard(runs, ("openvino", runs["openvino"]), "bf16", x, y, 8, 0.0, "seeded")
    assert report.accuracy == {"openvino": {"f32": 100.0, "bf16": 100.0}, "onnxruntime": {"f32": 100.0}}
    assert report.drop == 0.0 and report.passed

    def one_wrong(batch: np.ndarray) -> np.ndarray:  # the real output with the first sample's classes rolled
        out = runs["openvino"](batch).copy()
        if np.array_equal(batch, x[: len(batch)]):  # the first chunk
            out[0] = np.roll(out[0], 1)
        return out

    with pytest.raises(
        AccuracyGuardError,
        match=r"int8 loses 2.50 top-1 points on openvino \(100.00% at f32, 97.50% at int8, 40 labelled samples from seeded\); the most allowed is --max-accuracy-drop 0.2",
    ):
        labelled_guard(runs, ("openvino", one_wrong), "int8", x, y, 8, 0.2, "seeded")
