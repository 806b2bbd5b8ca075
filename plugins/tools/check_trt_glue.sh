#!/usr/bin/env bash
# Syntax-check the TensorRT glue against real TensorRT headers without TensorRT installed:
#   plugins/tools/check_trt_glue.sh /path/to/TensorRT/include [more include dirs...]
# e.g. the include/ folder of an NVIDIA/TensorRT OSS checkout at tag v10.3.0 and at the TensorRT 11 tag.
# Needs g++ and the CUDA headers (cuda_runtime_api.h). Exit status non-zero on any error in the glue.
set -euo pipefail
if [[ $# -lt 1 || ! -f "$1/NvInferRuntime.h" ]]; then
  echo "usage: $0 TENSORRT_INCLUDE_DIR  (a folder holding NvInferRuntime.h; got '${1:-}')" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")/.." && pwd)
gen=$(mktemp -d)
trap 'rm -rf "$gen"' EXIT
for op in veoAttention veoPatchEmbedLayerNorm; do
  python3 "$here/tools/gen_spec_header.py" "$here/$op/spec.json" "$gen/${op}Spec.h"
done
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
for f in veoAttention/veoAttentionPlugin.cpp veoPatchEmbedLayerNorm/veoPatchEmbedLayerNormPlugin.cpp \
         common/pluginUtils.cpp common/pluginRegistration.cpp; do
  g++ -std=c++17 -fsyntax-only -Wall -Wno-deprecated-declarations -Wno-unused-parameter \
    $(printf -- '-I%s ' "$@") -I"$cuda_inc" -I"$here/common" -I"$here/veoAttention" \
    -I"$here/veoPatchEmbedLayerNorm" -I"$here/mempool" -I"$gen" "$here/$f"
  echo "ok: $f"
done
