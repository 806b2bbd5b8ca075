"""The HTTP layer's own cost per request: one server against another (e.g. before and after a change of
the HTTP implementation), on the same build and runtime, at 1 and 8 concurrent clients (loopback only).

    python bench/serve_http_layer.py [--build-dir DIR] [--checkout OLD_TREE] [--requests 2000]
                                     [--clients 1,8] [--json]

``--checkout DIR`` (repeatable) serves the ``veo_edge`` package found in DIR (``PYTHONPATH=DIR``); the
current tree is always measured too. Each client is a thread with one keep-alive ``http.client``
connection sending back to back: ``GET /v2/health/live`` (HTTP only: parse, route, respond) and a batch-1
binary-tensor ``POST .../infer`` (the same inference on both, so the difference is the HTTP layer).
Bounded: --requests per client and path, after a warm-up.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
from pathlib import Path

from _server import build_dir, percentiles, sample, server

from veo_edge.serve.protocol import encode_infer_request


def _clients(port: int, n_clients: int, n_requests: int, make_request) -> dict:
    lat: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n_clients)

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        go = make_request(conn)
        for _ in range(min(100, n_requests)):  # warm-up
            go()
        barrier.wait()
        mine = []
        for _ in range(n_requests):
            t = time.perf_counter()
            go()
            mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(n_clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    return {"requests_per_s": len(lat) / wall, **percentiles(lat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh vit-nano build")
    ap.add_argument("--checkout", action="append", default=[], help="another tree to serve (PYTHONPATH)")
    ap.add_argument("--requests", type=int, default=2000, help="per client and path")
    ap.add_argument("--clients", default="1,8")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from veo_edge.builddir import BuildDir

    trees = [("this tree", None)] + [(c, str(Path(c).resolve())) for c in args.checkout]
    results: dict = {}
    with build_dir(args.build_dir) as build:
        name = BuildDir.open(build).model_name
        x = sample(build, 1)
        body, hlen = encode_infer_request({"input": x})
        infer_headers = {"Inference-Header-Content-Length": str(hlen)}

        def live(conn):
            def go():
                conn.request("GET", "/v2/health/live")
                conn.getresponse().read()

            return go

        def infer(conn):
            def go():
                conn.request("POST", f"/v2/models/{name}/infer", body, infer_headers)
                r = conn.getresponse()
                r.read()
                assert r.status == 200, r.status

            return go

        for label, path in trees:
            env = {"PYTHONPATH": path} if path else None
            with server(build, "--max-queue-delay-ms", "0", env=env) as port:
                time.sleep(3)  # let start-up work (the JSON decoder process) finish before measuring
                for clients in (int(c) for c in args.clients.split(",")):
                    for what, fn in (("GET live", live), ("POST infer b1", infer)):
                        results[(label, what, clients)] = _clients(port, clients, args.requests, fn)
    if args.json:
        print(json.dumps([{"tree": k[0], "path": k[1], "clients": k[2], **v} for k, v in results.items()]))
        return
    print(f"{args.requests} requests per client and path; latency in microseconds")
    print(
        f"{'tree':<28} {'path':<14} {'clients':>7} {'req/s':>8} {'p50':>7} {'p90':>7} {'p99':>7} {'mean':>7}"
    )
    for (label, what, clients), r in results.items():
        print(
            f"{label[-28:]:<28} {what:<14} {clients:>7} {r['requests_per_s']:>8.0f} {r['p50']:>7.0f} "
            f"{r['p90']:>7.0f} {r['p99']:>7.0f} {r['mean']:>7.0f}"
        )


if __name__ == "__main__":
    main()
