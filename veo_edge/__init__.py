"""veo-edge: Vision Transformers from PyTorch to a monitored inference service on NVIDIA GPUs,
with an OpenVINO CPU fallback.

Heavy dependencies (torch, onnx, onnxruntime, openvino, tensorrt) are imported lazily by the modules
that need them, so importing this package is cheap.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["Runtime", "__version__"]


def __getattr__(name: str):
    # lazy: `import veo_edge` stays cheap; the runtime (numpy, the backends' probes) loads on first use
    if name == "Runtime":
        from veo_edge.runtime.runtime import Runtime

        return Runtime
    raise AttributeError(f"module 'veo_edge' has no attribute {name!r}")
