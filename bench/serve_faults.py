"""The transient-fault schedule through `veo-edge serve` (backend auto): errors (must be 0) and p99.

    python bench/serve_faults.py [--build-dir DIR] [--faults JSON] [--clients 4] [--seconds 20]

Starts the server twice on the same build, with ``VEO_EDGE_FAULTS`` set to --faults (default: every 7th
call of every backend fails with an out-of-memory, the schedule issue 28 measured 94-121 HTTP 500s per
~600-720 requests with) and without faults; each time --clients threads send batch-1 binary HTTP infer
requests back to back (one kept-alive connection each) for --seconds. Prints per run: requests, errors
(any answer but 200, or no answer), p50 and p99 in ms, and what the server's /metrics counted: faults by
backend and kind, retries by backend and outcome, switches, the active and standby backends.
"""

from __future__ import annotations

import argparse
import http.client
import json
import threading
import time
import urllib.request

from _server import build_dir, percentiles, sample, server

DEFAULT_FAULTS = '{"*": {"every_nth": 7}}'


def _drive(build, port: int, clients: int, seconds: float) -> dict:
    from veo_edge.builddir import BuildDir
    from veo_edge.serve.protocol import encode_infer_request

    bd = BuildDir.open(build)
    body, hlen = encode_infer_request({bd.manifest["inputs"][0]["name"]: sample(build, 1)})
    headers = {"Inference-Header-Content-Length": str(hlen), "Content-Type": "application/octet-stream"}
    path = f"/v2/models/{bd.model_name}/infer"
    lat: list[float] = []
    codes: dict[str, int] = {}
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        mine, seen = [], {}
        while time.perf_counter() < stop_at:
            t = time.perf_counter()
            try:
                conn.request("POST", path, body, headers)
                r = conn.getresponse()
                r.read()
                code = str(r.status)
            except (OSError, http.client.HTTPException) as e:
                code = type(e).__name__
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            seen[code] = seen.get(code, 0) + 1
            if code == "200":
                mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            lat.extend(mine)
            for k, v in seen.items():
                codes[k] = codes.get(k, 0) + v

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    p = percentiles(lat) if lat else {"p50": float("nan"), "p99": float("nan")}
    total = sum(codes.values())
    return {"requests": total, "errors": total - codes.get("200", 0), "codes": codes, **p}


def _metrics(port: int) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict = {"faults": {}, "retries": {}, "switches": 0, "active": None, "standby": None}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            b = s.labels.get("backend")
            if s.name == "veo_edge_backend_faults_total":
                out["faults"][f"{b} {s.labels['kind']}"] = int(s.value)
            elif s.name == "veo_edge_retries_total":
                out["retries"][f"{b} {s.labels['outcome']}"] = int(s.value)
            elif s.name == "veo_edge_fallback_switches_total":
                out["switches"] = int(s.value)
            elif s.name == "veo_edge_active_backend" and s.value == 1:
                out["active"] = b
            elif s.name == "veo_edge_standby_backend" and s.value == 1:
                out["standby"] = b
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", help="a build to serve (default: a fresh vit-nano build)")
    ap.add_argument("--faults", default=DEFAULT_FAULTS, help=f"VEO_EDGE_FAULTS (default {DEFAULT_FAULTS})")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    json.loads(args.faults)
    with build_dir(args.build_dir) as build:
        for label, env in (
            ("faults", {"VEO_EDGE_FAULTS": args.faults}),
            ("no faults", {"VEO_EDGE_FAULTS": ""}),
        ):
            with server(build, env=env) as port:
                r = _drive(build, port, args.clients, args.seconds)
                m = _metrics(port)
            print(
                f"{label:9s}  {r['requests']} requests, {r['errors']} errors {r['codes']}, "
                f"p50 {r['p50'] / 1e3:.2f} ms, p99 {r['p99'] / 1e3:.2f} ms; server counted faults "
                f"{m['faults'] or '-'}, retries {m['retries'] or '-'}, {m['switches']} switches, "
                f"active {m['active']}, standby {m['standby']}"
            )


if __name__ == "__main__":
    main()
