"""``veo-edge serve`` with per-request stamps on the event loop, for ``bench/serve.py trace``.

Run in place of ``python -m veo_edge.cli.main`` (``python bench/trace_server.py serve BUILD ...``, the tree
chosen by ``PYTHONPATH``). It stamps ``perf_counter_ns`` where the HTTP protocol sees a request begin, its
body complete and its answer written, around ``Batcher.run_alone`` and around OpenVINO's C++ ``infer``,
and writes one row per answered infer request to ``$VEO_EDGE_TRACE`` (``.npy``, int64) at exit: begin,
body, answered, run_alone in, infer in, infer out, run_alone out (0: not reached; run_alone 0 when the
request went through the batcher). Wraps our code and OpenVINO's; measures, changes no answer.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

import numpy as np

COLUMNS = ("begin", "body", "answered", "alone_in", "infer_in", "infer_out", "alone_out")


def install(rows: list[list[int]]) -> None:
    from openvino._pyopenvino import InferRequest

    from veo_edge.runtime.batching import Batcher
    from veo_edge.serve import transport

    now, stamps = time.perf_counter_ns, {}
    make_protocol, run_alone, infer = transport.make_protocol, Batcher.run_alone, InferRequest.infer

    def traced_protocol(limits, on_reject):
        class Traced(make_protocol(limits, on_reject)):
            def on_message_begin(self):
                stamps.clear()
                stamps["begin"] = now()
                super().on_message_begin()

            def on_message_complete(self):
                stamps["body"] = now()
                super().on_message_complete()

            def on_response_complete(self):
                if "infer_in" in stamps:
                    rows.append([now() if k == "answered" else stamps.get(k, 0) for k in COLUMNS])
                super().on_response_complete()

        return Traced

    def traced_alone(self, *a, **k):
        start = now()
        done = run_alone(self, *a, **k)
        if done is not None:
            stamps["alone_in"], stamps["alone_out"] = start, now()
        return done

    def traced_infer(self, *a, **k):
        stamps["infer_in"] = now()
        try:
            return infer(self, *a, **k)
        finally:
            stamps["infer_out"] = now()

    transport.make_protocol = traced_protocol
    Batcher.run_alone = traced_alone
    InferRequest.infer = traced_infer


if __name__ == "__main__":
    rows: list[list[int]] = []
    install(rows)
    out = os.environ["VEO_EDGE_TRACE"]
    atexit.register(lambda: np.save(out, np.array(rows, dtype=np.int64).reshape(-1, len(COLUMNS))))
    from veo_edge.cli.main import main

    sys.argv = ["veo-edge", *sys.argv[1:]]
    main()
