"""Many concurrent tritonclient clients against `veo-edge serve` on loopback: throughput and latency.

    python bench/serve_load.py [--build-dir DIR] [--clients 1,8,32] [--seconds 5] [--batch 1]

Each client is a thread with its own ``tritonclient.http`` client sending binary-tensor requests back to
back for --seconds (bounded), after a short warm-up. Prints, per client count, requests/s, samples/s,
p50/p99 latency, errors, and the server's mean executed batch size (from its statistics endpoint).
"""

from __future__ import annotations

import argparse
import threading
import time

from _server import build_dir, percentiles, sample, server


def _run(port: int, name: str, x, clients: int, seconds: float) -> dict:
    import tritonclient.http as tc

    lat: list[float] = []
    errors = [0]
    lock = threading.Lock()
    start_at = time.perf_counter() + 1.0  # warm-up second, not measured
    stop_at = start_at + seconds

    def worker() -> None:
        client = tc.InferenceServerClient(f"127.0.0.1:{port}", network_timeout=60)
        inp = tc.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        mine = []
        while (now := time.perf_counter()) < stop_at:
            try:
                client.infer(name, [inp])
            except Exception:  # overload 503s and the like are counted, not fatal
                if now >= start_at:
                    with lock:
                        errors[0] += 1
                continue
            if now >= start_at:
                mine.append(time.perf_counter() - now)
        client.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"requests": len(lat), "errors": errors[0], **percentiles(lat or [0.0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh vit-nano build")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    import tritonclient.http as tc

    from veo_edge.builddir import BuildDir

    with build_dir(args.build_dir) as build:
        name = BuildDir.open(build).model_name
        x = sample(build, args.batch)
        with server(build, "--max-queue", "4096", "--grpc-port", "-1", "--metrics-port", "-1") as port:
            print(f"{name}, batch {args.batch} per request, {args.seconds:g} s per row; latency in ms")
            print(
                f"{'clients':>7} {'req/s':>8} {'samples/s':>10} {'p50':>7} {'p99':>7} {'errors':>6} {'mean batch':>10}"
            )
            stats = tc.InferenceServerClient(f"127.0.0.1:{port}")
            for clients in (int(c) for c in args.clients.split(",")):
                before = stats.get_inference_statistics(name)["model_stats"][0]
                r = _run(port, name, x, clients, args.seconds)
                after = stats.get_inference_statistics(name)["model_stats"][0]
                execs = int(after["execution_count"]) - int(before["execution_count"])
                infs = int(after["inference_count"]) - int(before["inference_count"])
                rps = r["requests"] / args.seconds
                print(
                    f"{clients:>7} {rps:>8.0f} {rps * args.batch:>10.0f} {r['p50'] / 1e3:>7.2f} "
                    f"{r['p99'] / 1e3:>7.2f} {r['errors']:>6} {infs / max(execs, 1):>10.2f}"
                )


if __name__ == "__main__":
    main()
