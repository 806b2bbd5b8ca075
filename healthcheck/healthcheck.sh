#!/bin/sh
# Docker HEALTHCHECK probe for a veo-edge server. Use it in exec form, so no shell or build ARG expands
# anything at image build time:
#
#   HEALTHCHECK --interval=30s --timeout=15s --start-period=60s --retries=3 \
#     CMD ["/opt/veo-edge/healthcheck/healthcheck.sh"]
#
# It reads its settings at run time from the container's environment:
#   VEO_EDGE_HEALTH_URL      server to check        (default http://127.0.0.1:$VEO_EDGE_PORT, port 8000)
#   VEO_EDGE_HEALTH_TIMEOUT  seconds for the check  (default 10; keep it below HEALTHCHECK --timeout)
#   VEO_EDGE_BUILD_DIR       golden canary source   (default: the server's own, via /v2/models/NAME/canary)
#   VEO_EDGE_MODEL_NAME      model to check         (default: the one the server serves)
#
# Docker knows only 0 (healthy) and 1 (unhealthy); 2 is reserved. veo-edge's distinct codes
# (20 down, 21 not ready, 22 canary mismatch, 23 timeout, 30 build modified) are printed, and the exit status is 1.
set -u

url="${VEO_EDGE_HEALTH_URL:-http://127.0.0.1:${VEO_EDGE_PORT:-8000}}"
timeout="${VEO_EDGE_HEALTH_TIMEOUT:-10}"

if [ -n "${VEO_EDGE_MODEL_NAME:-}" ]; then
    out=$(veo-edge healthcheck --url "$url" --timeout "$timeout" --model-name "$VEO_EDGE_MODEL_NAME" 2>&1)
else
    out=$(veo-edge healthcheck --url "$url" --timeout "$timeout" 2>&1)
fi
code=$?
if [ "$code" -eq 0 ]; then
    echo "$out"
    exit 0
fi
echo "unhealthy (veo-edge healthcheck exit $code): $out"
exit 1
