"""Per-request overhead of the HTTP server over an in-process runtime call (loopback only).

    python bench/serve_overhead.py [--build-dir DIR] [--requests 500] [--batch 1]

Runs the same sample sequentially (one request at a time, no batching window) through
``Runtime.submit`` in-process, then through ``veo-edge serve`` with tritonclient (binary tensors) and with
a bare ``http.client`` keep-alive connection. Prints latency percentiles in microseconds and the
overhead (HTTP minus in-process) at each percentile. Bounded: --requests per path.
"""

from __future__ import annotations

import argparse
import http.client
import time

from _server import build_dir, percentiles, sample, server

from veo_edge.serve.protocol import encode_infer_request


def _time(fn, n: int) -> list[float]:
    for _ in range(min(50, n)):  # warm-up
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh vit-nano build")
    ap.add_argument("--requests", type=int, default=500)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    import numpy as np
    import tritonclient.http as tc

    from veo_edge.builddir import BuildDir
    from veo_edge.runtime.runtime import Runtime

    with build_dir(args.build_dir) as build:
        x = sample(build, args.batch)
        rows = {}
        with Runtime(build, max_queue_delay_ms=0.0) as rt:
            rows["in-process Runtime.submit"] = percentiles(
                _time(lambda: np.stack([f.result() for f in [rt.submit(s) for s in x]]), args.requests)
            )
        name = BuildDir.open(build).model_name
        with server(build, "--max-queue-delay-ms", "0", "--grpc-port", "-1", "--metrics-port", "-1") as port:
            client = tc.InferenceServerClient(f"127.0.0.1:{port}")
            inp = tc.InferInput("input", list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            rows["HTTP tritonclient (binary)"] = percentiles(
                _time(lambda: client.infer(name, [inp]), args.requests)
            )
            body, hlen = encode_infer_request({"input": x})
            conn = http.client.HTTPConnection("127.0.0.1", port)

            def raw():
                conn.request(
                    "POST", f"/v2/models/{name}/infer", body, {"Inference-Header-Content-Length": str(hlen)}
                )
                conn.getresponse().read()

            rows["HTTP http.client (binary)"] = percentiles(_time(raw, args.requests))
        base = rows["in-process Runtime.submit"]
        print(f"batch {args.batch}, {args.requests} sequential requests per path; microseconds")
        print(f"{'path':<30} {'p50':>8} {'p90':>8} {'p99':>8} {'mean':>8}   overhead p50 / p99")
        for path, r in rows.items():
            over = "" if r is base else f"   {r['p50'] - base['p50']:>7.0f} / {r['p99'] - base['p99']:>7.0f}"
            print(f"{path:<30} {r['p50']:>8.0f} {r['p90']:>8.0f} {r['p99']:>8.0f} {r['mean']:>8.0f}{over}")


if __name__ == "__main__":
    main()
