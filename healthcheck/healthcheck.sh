#!/bin/sh
# Docker HEALTHCHECK probe for a veo-edge server. Use it in exec form, so no shell or build ARG expands
# anything at image build time:
#
#   HEALTHCHECK --interval=30s --timeout=15s --start-period=60s --retries=3 \
#     CMD ["/opt/veo-edge/healthcheck/healthcheck.sh"]
#
# It reads its settings at run time from the container's environment:
#   VEO_EDGE_HEALTH_URL      server to check        (default http://127.0.0.1:$VEO_EDGE_PORT, port 8000;
#                            with VEO_EDGE_REPLICA_SLOT=N, the port + 2(N - 1), as the entrypoint listens)
#   VEO_EDGE_HEALTH_TIMEOUT  seconds for the check  (default 10; keep it below HEALTHCHECK --timeout)
#   VEO_EDGE_BUILD_DIR       golden canary source   (default: the server's own, via /v2/models/NAME/canary)
#   VEO_EDGE_MODEL_NAME      model to check         (default: the one the server serves)
#
# Docker knows only 0 (healthy) and 1 (unhealthy); 2 is reserved. veo-edge's distinct codes
# (20 down, 21 not ready, 22 canary mismatch, 23 timeout, 30 build modified) are printed, and the exit status is 1.
#
# In a veo-edge image it runs the probe entry (python -m veo_edge.serve.probe: the same check, options, line
# and exit codes as `veo-edge healthcheck --url`, without the command line's imports: ~0.4 s of CPU per
# probe instead of ~0.75 s) with the image's Python isolated (-I: nothing from the cache volume, the
# environment's PYTHON* variables or a user site-packages is imported); elsewhere, `veo-edge healthcheck`.
set -u

slot="${VEO_EDGE_REPLICA_SLOT:-1}"
case "$slot" in '' | *[!0-9]* | 0) slot=1 ;; esac
url="${VEO_EDGE_HEALTH_URL:-http://127.0.0.1:$((${VEO_EDGE_PORT:-8000} + 2 * (slot - 1)))}"
timeout="${VEO_EDGE_HEALTH_TIMEOUT:-10}"

veo() {
    if [ -x /opt/veo-edge/venv/bin/python ]; then
        /opt/veo-edge/venv/bin/python -I -B -m veo_edge.serve.probe "$@"
    else
        veo-edge healthcheck "$@"
    fi
}

if [ -n "${VEO_EDGE_MODEL_NAME:-}" ]; then
    out=$(veo --url "$url" --timeout "$timeout" --model-name "$VEO_EDGE_MODEL_NAME" 2>&1)
else
    out=$(veo --url "$url" --timeout "$timeout" 2>&1)
fi
code=$?
if [ "$code" -eq 0 ]; then
    echo "$out"
    exit 0
fi
echo "unhealthy (veo-edge healthcheck exit $code): $out"
exit 1
