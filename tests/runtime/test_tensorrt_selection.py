"""select_engine, the flow of `veo-edge engine build --engine fastest`, with TensorRT stood in for: the
reference is real ONNX Runtime on the build's plain ONNX, the decision and its record are real; only the
engines (their outputs and their timings) are stand-ins."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from veo_edge.builddir import BuildDir
from veo_edge.engine.cache import ChoiceRecord, EngineKey
from veo_edge.errors import BackendError
from veo_edge.runtime.backends import tensorrt as trt_backend


def _key(variant):
    return EngineKey("NVIDIA A100", "8.0", "10.3.0", "ab" * 32 if variant == "plugins" else None,
                     ("11" if variant == "plugins" else "22") * 32, "fp32", 8, 8)  # fmt: skip


def _stand_ins(monkeypatch, ms, noise, fail_plugins=False):
    """Engines whose outputs are ONNX Runtime's plus ``noise[variant]`` and whose enqueue takes
    ``ms[variant][batch]`` milliseconds."""
    import onnxruntime as ort

    built = []

    def ensure_engine(build, config, variant, **kw):
        built.append(variant)
        if fail_plugins and variant == "plugins":
            raise BackendError("TensorRT could not parse model.plugins.onnx")
        return SimpleNamespace(key=_key(variant), variant=variant)

    class Runner:
        def __init__(self, build, config, cache=None, gpu=0):
            self.variant = config.engine
            self.sess = ort.InferenceSession(str(build.artifact("onnx")), providers=["CPUExecutionProvider"])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

        def output_metadata(self):
            return [SimpleNamespace(name="logits")]

        def infer(self, x):
            y = self.sess.run(None, {self.sess.get_inputs()[0].name: x})[0]
            return {"logits": y + noise[self.variant]}

        def time_once(self, batch):
            return ms[self.variant][batch]

    monkeypatch.setattr(trt_backend, "ensure_engine", ensure_engine)
    monkeypatch.setattr(trt_backend, "plugin_engine_possible", lambda build, mode: True)
    monkeypatch.setattr(trt_backend, "TensorRtRunner", Runner)
    return built


def test_fastest_keeps_the_faster_equivalent_engine_and_records_it(monkeypatch, nano_build, tmp_path):
    build = BuildDir.open(nano_build)
    built = _stand_ins(
        monkeypatch,
        ms={"plugins": {1: 0.4, 8: 1.0}, "plain": {1: 0.5, 8: 1.2}},
        noise={"plugins": 1e-6, "plain": 0.0},
    )
    config = trt_backend.default_config(build)
    decision, _ = trt_backend.select_engine(
        build, config, cache=tmp_path, warmup=1, reps=3, progress=lambda m: None
    )
    assert built == ["plugins", "plain"] and decision.chosen == "plugins"
    assert decision.measurements["plugins"].median_ms == {1: 0.4, 8: 1.0}
    assert decision.measurements["plugins"].max_abs_err == pytest.approx(
        1e-6, rel=0.1
    )  # float32 rounding of y + 1e-6
    record = ChoiceRecord.for_keys(tmp_path, build.model_name, _key("plain"), _key("plugins"))
    assert record.read(_key("plain"), _key("plugins")) == decision  # what the runner reads next time


def test_a_plugin_engine_that_is_off_is_not_kept_however_fast(monkeypatch, nano_build, tmp_path):
    build = BuildDir.open(nano_build)
    _stand_ins(
        monkeypatch,
        ms={"plugins": {1: 0.1, 8: 0.2}, "plain": {1: 0.5, 8: 1.2}},
        noise={"plugins": 0.05, "plain": 0.0},
    )
    config = dataclasses.replace(trt_backend.default_config(build))
    decision, _ = trt_backend.select_engine(
        build, config, cache=tmp_path, warmup=0, reps=1, progress=lambda m: None
    )
    assert decision.chosen == "plain" and "not equivalent" in decision.reason
    assert np.isfinite(decision.tolerance)


def test_a_plugin_engine_that_does_not_build_leaves_tensorrts_own(monkeypatch, nano_build, tmp_path, caplog):
    build = BuildDir.open(nano_build)
    _stand_ins(monkeypatch, ms={}, noise={}, fail_plugins=True)
    decision, blobs = trt_backend.select_engine(
        build, trt_backend.default_config(build), cache=tmp_path, progress=lambda m: None
    )
    assert decision.chosen == "plain" and set(blobs) == {"plain"}
    assert "the plugin engine could not be built (TensorRT could not parse" in decision.reason
    assert not list(tmp_path.glob("*.choice.json"))  # not recorded: the next build tries again
    with pytest.raises(BackendError, match="could not parse"):  # forced, the failure is the answer
        trt_backend.select_engine(
            build,
            trt_backend.default_config(build, engine="plugins"),
            cache=tmp_path,
            progress=lambda m: None,
        )
