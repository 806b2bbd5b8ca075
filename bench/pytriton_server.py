"""Triton (through PyTriton) serving a build's OpenVINO IR, for `bench/serve.py limit --pytriton` to compare
against (standalone: it runs in another venv).

    PYTHON -m pytriton_server BUILD_DIR --http-port P --grpc-port Q [--delay-us 2000]

Run it with a Python that has ``nvidia-pytriton`` and ``openvino`` (a separate virtual environment:
PyTriton pins its own tritonclient). The model is compiled as veo-edge compiles it (LATENCY, f32 stated)
and bound with Triton's dynamic batcher (max batch = the build's, ``--delay-us`` queue delay). PyTriton's
python-backend stub needs the running Python's LIBDIR on ``LD_LIBRARY_PATH``; this script re-executes
itself with it set. Prints ``pytriton ready`` once serving; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("build_dir")
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, default=0)
    ap.add_argument("--delay-us", type=int, default=2000)
    args = ap.parse_args()
    libdir = sysconfig.get_config_var("LIBDIR")
    if libdir and libdir not in os.environ.get("LD_LIBRARY_PATH", "").split(":"):
        env = {**os.environ, "LD_LIBRARY_PATH": f"{libdir}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    import numpy as np
    import openvino as ov
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

    build = Path(args.build_dir)
    manifest = json.loads((build / "manifest.json").read_text())
    xml = build / "openvino" / "model.xml"
    core = ov.Core()
    config = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}  # as compile_config states
    compiled = core.compile_model(core.read_model(str(xml)), "CPU", config)
    request = compiled.create_infer_request()
    output = compiled.outputs[0]

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        x = np.ascontiguousarray(inputs[manifest["inputs"][0]["name"]])
        return {manifest["outputs"][0]["name"]: np.array(request.infer({0: x})[output])}

    out_shape = tuple(int(d) for d in manifest["outputs"][0]["shape"][1:])
    triton_config = TritonConfig(
        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port or None
    )
    # loopback bench: no access token on statistics (perf_analyzer reads them), as a plain Triton has none
    with Triton(
        config=triton_config, security_config=TritonSecurityConfig(restricted_endpoints=[])
    ) as triton:
        triton.bind(
            model_name=manifest["model"]["name"],
            infer_func=infer,
            inputs=[
                Tensor(
                    name=manifest["inputs"][0]["name"], dtype=np.float32, shape=tuple(manifest["input_shape"])
                )
            ],
            outputs=[Tensor(name=manifest["outputs"][0]["name"], dtype=np.float32, shape=out_shape)],
            config=ModelConfig(
                max_batch_size=int(manifest["max_batch"]),
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.delay_us),
            ),
            strict=False,
        )
        print("pytriton ready", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
