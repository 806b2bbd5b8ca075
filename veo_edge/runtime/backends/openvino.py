"""OpenVINO backend: the CPU fallback, running the IR from the build directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import BackendError, BackendUnavailableError, ModelLoadError
from veo_edge.runtime.backends.base import Runner, TensorMeta


def _meta(port: Any) -> TensorMeta:
    shape = tuple(None if d.is_dynamic else d.get_length() for d in port.get_partial_shape())
    return TensorMeta(port.get_any_name(), shape, np.dtype(port.get_element_type().to_dtype()).name)


class OpenVinoRunner(Runner):
    name = "openvino"

    def __init__(
        self,
        model: str | Path,
        device: str = "CPU",
        max_batch: int | None = None,
        threads: int | None = None,
    ) -> None:
        super().__init__(max_batch)
        self.model = Path(model)
        self.device = device
        self.threads = threads
        self._compiled: Any = None
        self._requests: dict[int, Any] = {}

    def _activate(self) -> None:
        try:
            import openvino as ov
        except ImportError as e:
            raise BackendUnavailableError(f"openvino is not importable ({e}); pip install openvino") from e
        core = ov.Core()
        if self.device not in core.available_devices:
            raise BackendUnavailableError(
                f"OpenVINO device {self.device!r} is not available (available: {core.available_devices})"
            )
        try:
            model = core.read_model(str(self.model))
        except Exception as e:
            raise ModelLoadError(f"OpenVINO could not read {self.model}: {e}") from e
        # f32 execution: on CPUs with AMX/AVX512-BF16 OpenVINO would otherwise pick bf16 and lose accuracy
        config: dict[str, Any] = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = self.threads
        self._compiled = core.compile_model(model, self.device, config)
        self._inputs = [_meta(p) for p in self._compiled.inputs]
        self._outputs = [_meta(p) for p in self._compiled.outputs]

    def _deactivate(self) -> None:
        self._requests.clear()
        self._compiled = None

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # one infer request per batch size: its tensors are reused, so steady state allocates nothing new
        batch = next(iter(feed.values())).shape[0]
        request = self._requests.get(batch)
        if request is None:
            request = self._requests[batch] = self._compiled.create_infer_request()
        try:
            result = request.infer(feed)
        except Exception as e:
            raise BackendError(f"OpenVINO inference failed: {e}") from e
        return {
            m.name: np.array(result[port])
            for m, port in zip(self._outputs, self._compiled.outputs, strict=True)
        }

    def describe(self) -> dict[str, Any]:
        import openvino as ov

        return {"backend": self.name, "version": ov.get_version(), "device": self.device}
