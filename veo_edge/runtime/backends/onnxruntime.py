"""ONNX Runtime backend: the plain ONNX on the CPU execution provider (checks, parity) or a GPU one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from veo_edge.errors import BackendError, BackendUnavailableError, ModelLoadError
from veo_edge.runtime.backends.base import Runner, TensorMeta

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(uint8)": "uint8",
}


def _meta(arg: Any) -> TensorMeta:
    shape = tuple(d if isinstance(d, int) else None for d in arg.shape)
    return TensorMeta(arg.name, shape, _ORT_TYPES.get(arg.type, arg.type))


class OnnxRuntimeRunner(Runner):
    name = "onnxruntime"

    def __init__(
        self,
        model: str | Path | bytes,
        providers: tuple[str, ...] = ("CPUExecutionProvider",),
        max_batch: int | None = None,
        threads: int | None = None,
    ) -> None:
        super().__init__(max_batch)
        self.model = model
        self.providers = tuple(providers)
        self.threads = threads
        self._session: Any = None

    def _activate(self) -> None:
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise BackendUnavailableError(
                f"onnxruntime is not importable ({e}); pip install onnxruntime"
            ) from e
        available = ort.get_available_providers()
        missing = [p for p in self.providers if p not in available]
        if missing:
            raise BackendUnavailableError(
                f"ONNX Runtime providers {missing} are not available in this build "
                f"(available: {available}); install onnxruntime-gpu for CUDA/TensorRT"
            )
        opts = ort.SessionOptions()
        opts.log_severity_level = 3
        if self.threads:
            opts.intra_op_num_threads = self.threads
        src = self.model if isinstance(self.model, bytes) else str(self.model)
        try:
            self._session = ort.InferenceSession(src, sess_options=opts, providers=list(self.providers))
        except Exception as e:  # ORT raises its own untyped errors for corrupt models
            raise ModelLoadError(f"ONNX Runtime could not load {self._label()}: {e}") from e
        # ORT silently drops providers it cannot initialise (e.g. CUDA without the right libcudnn)
        active = self._session.get_providers()
        dropped = [p for p in self.providers if p not in active]
        if dropped:
            self._session = None
            raise BackendUnavailableError(
                f"ONNX Runtime silently dropped providers {dropped} (active: {active}); "
                "their libraries (CUDA, cuDNN, TensorRT) are missing or do not match this onnxruntime build"
            )
        self._inputs = [_meta(a) for a in self._session.get_inputs()]
        self._outputs = [_meta(a) for a in self._session.get_outputs()]

    def _label(self) -> str:
        return "the in-memory model" if isinstance(self.model, bytes) else str(self.model)

    def _deactivate(self) -> None:
        self._session = None

    def _infer(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            outs = self._session.run(None, feed)
        except Exception as e:
            raise BackendError(f"ONNX Runtime inference failed: {e}") from e
        return {m.name: o for m, o in zip(self.output_metadata(), outs, strict=True)}

    def describe(self) -> dict[str, Any]:
        import onnxruntime as ort

        active = self._session.get_providers() if self._session is not None else list(self.providers)
        return {"backend": self.name, "version": ort.__version__, "providers": active, "precision": "f32"}
