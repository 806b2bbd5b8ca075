#!/usr/bin/env bash
# Check the TensorRT glue against real TensorRT headers without TensorRT installed:
#   plugins/tools/check_trt_glue.sh /path/to/TensorRT/include [more include dirs...]
# e.g. the include/ folder of an NVIDIA/TensorRT OSS checkout at tag v10.3.0 and at the TensorRT 11 tag.
# Syntax-checks every glue file, then builds and runs tools/trtGlueProbe.cpp: the VeoAttention glue (both
# creator versions, the bias input) driven as TensorRT's builder and runtime would, with stand-ins for the
# kernel library. Needs g++ and the CUDA headers (cuda_runtime_api.h). Exit status non-zero on any error.
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
inc=( $(printf -- '-I%s ' "$@") -I"$cuda_inc" -I"$here/common" -I"$here/veoAttention" -I"$gen" )
g++ -std=c++17 -Wall -Wno-deprecated-declarations -Wno-unused-parameter "${inc[@]}" \
  "$here/tools/trtGlueProbe.cpp" "$here/veoAttention/veoAttentionPlugin.cpp" \
  "$here/veoAttention/veoAttentionConfig.cpp" "$here/common/pluginUtils.cpp" "$here/common/pluginFields.cpp" \
  -o "$gen/trtGlueProbe"
"$gen/trtGlueProbe"
