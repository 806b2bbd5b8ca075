"""Dynamic batching and mid-run fallback of the in-process runtime (no HTTP).

    python bench/runtime_batching.py [--build-dir DIR] [--model vit-nano] [--requests 2000]
                                     [--clients 1,4,16] [--delays-ms 0,1,4]

For each (clients, max queue delay) it submits --requests single samples from that many threads through
``Runtime.submit`` on OpenVINO and prints throughput, latency percentiles, mean batch size and mean
queue wait. Then it injects a CUDA-OOM-like fault into ONNX Runtime after 20 batches (policy
onnxruntime -> openvino) and reports how long the batch that hit the fault took, including the switch.
"""

from __future__ import annotations

import argparse
import threading
import time

from _server import build_dir, percentiles, sample

import veo_edge


def run_load(rt: veo_edge.Runtime, x, clients: int, total: int) -> tuple[float, list[float]]:
    per_client = max(1, total // clients)
    latencies: list[list[float]] = [[] for _ in range(clients)]

    def client(i: int) -> None:
        for _ in range(per_client):
            t = time.perf_counter()
            rt.submit(x).result(timeout=60)
            latencies[i].append(time.perf_counter() - t)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, [v for lat in latencies for v in lat]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh build of --model")
    ap.add_argument("--model", default="vit-nano")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--delays-ms", default="0,1,4")
    args = ap.parse_args()
    with build_dir(args.build_dir, args.model) as path:
        x = sample(path, 1)[0]
        print(
            f"{'clients':>7} {'delay ms':>8} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'batch':>6} {'wait ms':>8}"
        )
        for clients in map(int, args.clients.split(",")):
            for delay in map(float, args.delays_ms.split(",")):
                with veo_edge.Runtime(
                    path, backend="openvino", max_queue_delay_ms=delay, max_queue=4096
                ) as rt:
                    rt.submit(x).result(timeout=60)  # warm-up
                    before = rt.stats()
                    seconds, lat = run_load(rt, x, clients, args.requests)
                    after = rt.stats()
                batches = after["batches"] - before["batches"]
                n = after["requests_success"] - before["requests_success"]
                wait = (after["queue_us_total"] - before["queue_us_total"]) / max(n, 1) / 1e3
                p = percentiles(lat)
                print(f"{clients:>7} {delay:>8g} {n / seconds:>8.0f} {p['p50'] / 1e3:>7.2f} {p['p99'] / 1e3:>7.2f} "
                      f"{n / max(batches, 1):>6.2f} {wait:>8.2f}")  # fmt: skip

        faults = {"onnxruntime": {"oom_after": 20}}
        with veo_edge.Runtime(path, policy=["onnxruntime", "openvino"], faults=faults) as rt:
            times = []
            for _ in range(40):
                t = time.perf_counter()
                rt.infer(x[None])
                times.append(time.perf_counter() - t)
            state = rt.state
        switch = times[20]
        steady = sorted(times[25:])[len(times[25:]) // 2]
        print(f"\nfallback onnxruntime -> openvino after an injected OOM: {state.fallback_count} switch, "
              f"the failing batch took {switch * 1e3:.1f} ms (re-run included) vs {steady * 1e3:.2f} ms steady on "
              f"{state.active_backend}")  # fmt: skip


if __name__ == "__main__":
    main()
