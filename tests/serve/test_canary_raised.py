"""The ready body says the canary raised, on which backend and why, when the server's own canary failed
to answer rather than answered wrongly (it said ``"canary": null``, as if the canary had never run)."""

from __future__ import annotations

import json


def test_the_ready_body_says_the_canary_raised_and_why(serve, nano_build):
    faults = {"openvino": {"oom_after": 0, "error": "backend"}}  # every call raises, the canary's too
    env = {"VEO_EDGE_FAULTS": json.dumps(faults)}
    server = serve(nano_build, "--policy", "openvino", env=env, wait_ready=False)
    status, ready = server.get_json("/v2/health/ready")
    assert status == 503 and ready["active_backend"] == "openvino", ready
    canary = ready["canary"]
    assert canary is not None and canary["ok"] is False and canary["backend"] == "openvino", ready
    assert canary["raised"].startswith("openvino: injected fault on call"), canary
    assert "\n" not in canary["raised"] and "max_abs" not in canary
    assert "canary failed on openvino: openvino: injected fault" in ready["reason"], ready
