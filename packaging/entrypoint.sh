#!/bin/sh
# veo-edge container entrypoint (the image's ENTRYPOINT; see README "Container images").
#
#  1. Trust: every file baked under /opt/veo-edge is checked against the image manifest (sha256), the
#     manifest's DSSE/Ed25519 signature against the baked public key (and, when VEO_EDGE_TRUSTED_KEY
#     is set at run time, that key's fingerprint against it; deploy always sets it), the build directory
#     against its own manifest, and the cache volume for anything the image would not write there (a
#     .pth, a module, a library, an engine not built from this image's model: refused and reported).
#     Unsigned images start only with VEO_EDGE_ALLOW_UNSIGNED=1. Python runs isolated (-I: no user
#     site-packages, no PYTHON* variables, no current directory on sys.path; -B: no bytecode written),
#     and HOME is not the cache volume, so nothing writable is read as code, before the check or after.
#     Any mismatch: a one-line reason on stderr, a non-zero exit, nothing served.
#  2. GPU: when a GPU is visible, the TensorRT engine is built on first start and cached under
#     $VEO_EDGE_ENGINE_CACHE/<image manifest digest> (mount a volume on /cache to keep it across
#     restarts; each image keeps its own engines); later starts load it. No GPU (or a failed engine
#     build): the runtime falls back to OpenVINO on the CPU, and says so.
#  3. exec `veo-edge serve` on $VEO_EDGE_HOST:$VEO_EDGE_PORT; extra arguments go to serve. Several
#     replicas on one host (a Swarm service on the host network sets VEO_EDGE_REPLICA_SLOT={{.Task.Slot}})
#     listen on interleaved ports: slot s on the base ports + 2(s - 1) (HTTP 8000, gRPC 8001 for slot 1,
#     8002/8003 for slot 2, whatever the replica count); the healthcheck follows the same rule.
set -eu

root=/opt/veo-edge
build="$root/model"
cache_root="${VEO_EDGE_CACHE_ROOT:-/cache}"
py() { "$root/venv/bin/python" -I -B -u "$@"; }

slot="${VEO_EDGE_REPLICA_SLOT:-1}"
case "$slot" in
    '' | *[!0-9]* | 0)
        echo "veo-edge: REFUSING TO START: VEO_EDGE_REPLICA_SLOT=$slot is not a replica slot (1, 2, ...)" >&2
        exit 64
        ;;
esac
offset=$((2 * (slot - 1)))
port=$((${VEO_EDGE_PORT:-8000} + offset))
host="${VEO_EDGE_HOST:-0.0.0.0}"
backend="${VEO_EDGE_BACKEND:-auto}"
# KServe v2 gRPC (Triton's 8001) and a separate metrics port (-1: off; /metrics is on the HTTP port too)
grpc_port="${VEO_EDGE_GRPC_PORT:-8001}"
if [ "$grpc_port" -ge 0 ]; then
    grpc_port=$((grpc_port + offset))
fi
metrics_port="${VEO_EDGE_METRICS_PORT:--1}"
if [ "$metrics_port" -ge 0 ]; then
    metrics_port=$((metrics_port + offset))
fi

if ! py -m veo_edge verify "$root" --cache "$cache_root" || ! py -m veo_edge verify --quiet "$build"; then
    echo "veo-edge: REFUSING TO START: the image's baked files, its signature or its cache volume do not verify (reason above)" >&2
    exit 65
fi
# each image's engines in their own directory, named by its (now verified) manifest
manifest_sha=$(sha256sum "$root/trust/image-manifest.json" | cut -c1-16)
VEO_EDGE_ENGINE_CACHE="$cache_root/engines/$manifest_sha"
export VEO_EDGE_ENGINE_CACHE

refuse() {
    echo "veo-edge: REFUSING TO START: $*" >&2
    exit 64
}

# model load/unload (serve reads VEO_EDGE_MODEL_CONTROL_MODE=explicit and VEO_EDGE_CONTROL_TOKEN_FILE
# itself) only with a bearer token from a secret mounted at run time (deploy --control-token-file: a
# volume or a Swarm secret; Kubernetes: a Secret), never from a file baked into the image
token="${VEO_EDGE_CONTROL_TOKEN_FILE:-}"
if [ -n "$token" ]; then
    case "$(readlink -f "$token")" in
        "$root"/*) refuse "the control token $token is a file of the image; mount it from a secret" ;;
    esac
    [ -r "$token" ] || refuse "cannot read the control token $token"
fi

gpu_visible() {
    [ -e /dev/nvidia0 ] || [ -e /dev/nvhost-ctrl-gpu ] || [ -e /dev/nvgpu/igpu0/ctrl ]
}

if [ "${VEO_EDGE_TARGET:-cpu}" = "cpu" ]; then
    echo "veo-edge: cpu image: serving with OpenVINO on the CPU"
elif gpu_visible; then
    mkdir -p "$VEO_EDGE_ENGINE_CACHE"
    echo "veo-edge: GPU visible: building or loading the TensorRT engine (first start builds it; minutes)"
    if ! py -m veo_edge engine build "$build" --cache-dir "$VEO_EDGE_ENGINE_CACHE"; then
        echo "veo-edge: FALLBACK: the TensorRT engine could not be built; the runtime falls back (ONNX Runtime CUDA, then OpenVINO on the CPU)" >&2
    fi
else
    echo "veo-edge: FALLBACK: no GPU visible in this container (run it with the target's GPU options, e.g. --runtime nvidia or --gpus all); serving with OpenVINO on the CPU" >&2
fi

exec "$root/venv/bin/python" -I -B -u -m veo_edge serve "$build" --host "$host" --port "$port" --grpc-port "$grpc_port" \
    --metrics-port "$metrics_port" --backend "$backend" "$@"
