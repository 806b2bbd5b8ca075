#!/bin/sh
# veo-edge container entrypoint (the image's ENTRYPOINT; see README "Container images").
#
#  1. Trust: every file baked under /opt/veo-edge is checked against the image manifest (sha256), the
#     manifest's DSSE/Ed25519 signature against the baked public key (and, when VEO_EDGE_TRUSTED_KEY
#     is set at run time, that key's fingerprint against it), and the build directory against its own
#     manifest. Any mismatch: a one-line reason on stderr, a non-zero exit, nothing served.
#  2. GPU: when a GPU is visible, the TensorRT engine is built on first start and cached under
#     $VEO_EDGE_ENGINE_CACHE (mount a volume there to keep it across restarts); later starts load it.
#     No GPU (or a failed engine build): the runtime falls back to OpenVINO on the CPU, and says so.
#  3. exec `veo-edge serve` on $VEO_EDGE_HOST:$VEO_EDGE_PORT; extra arguments go to serve.
set -eu

root=/opt/veo-edge
build="$root/model"
port="${VEO_EDGE_PORT:-8000}"
host="${VEO_EDGE_HOST:-0.0.0.0}"
backend="${VEO_EDGE_BACKEND:-auto}"
# KServe v2 gRPC (Triton's 8001) and a separate metrics port (-1: off; /metrics is on the HTTP port too)
grpc_port="${VEO_EDGE_GRPC_PORT:-8001}"
metrics_port="${VEO_EDGE_METRICS_PORT:--1}"

if ! veo-edge verify "$root" || ! veo-edge verify --quiet "$build"; then
    echo "veo-edge: REFUSING TO START: the image's baked files or signature do not verify (reason above)" >&2
    exit 65
fi

gpu_visible() {
    [ -e /dev/nvidia0 ] || [ -e /dev/nvhost-ctrl-gpu ] || [ -e /dev/nvgpu/igpu0/ctrl ]
}

if [ "${VEO_EDGE_TARGET:-cpu}" = "cpu" ]; then
    echo "veo-edge: cpu image: serving with OpenVINO on the CPU"
elif gpu_visible; then
    mkdir -p "${VEO_EDGE_ENGINE_CACHE:-/cache/engines}"
    echo "veo-edge: GPU visible: building or loading the TensorRT engine (first start builds it; minutes)"
    if ! veo-edge engine build "$build" --cache-dir "${VEO_EDGE_ENGINE_CACHE:-/cache/engines}"; then
        echo "veo-edge: FALLBACK: the TensorRT engine could not be built; the runtime falls back (ONNX Runtime CUDA, then OpenVINO on the CPU)" >&2
    fi
else
    echo "veo-edge: FALLBACK: no GPU visible in this container (run it with the target's GPU options, e.g. --runtime nvidia or --gpus all); serving with OpenVINO on the CPU" >&2
fi

exec veo-edge serve "$build" --host "$host" --port "$port" --grpc-port "$grpc_port" \
    --metrics-port "$metrics_port" --backend "$backend" "$@"
