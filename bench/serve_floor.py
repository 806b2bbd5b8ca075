"""What any Python server on this machine pays per request at 1 client, with no HTTP and no veo-edge code.

    python bench/serve_floor.py [--build-dir DIR] [--model vit-tiny] [--requests 300]

Two floors under the 1-client target ("p50 within 1 ms of raw sync batch 1"):

- **handoff**: an asyncio (uvloop) task hands one infer to a worker thread (a condition variable, as the
  batcher does) and awaits the answer through ``asyncio.wrap_future``: the time from the hand-off to
  the infer's start, and from its end to the task running again. These are the machine's thread
  wake-ups (and the GIL changing hands); the infer itself is the build's OpenVINO IR, f32, LATENCY,
  batch 1, so the caches are as cold as serving leaves them. OpenVINO's own ``start_async`` with a
  callback is measured the same way, as the alternative to a thread of our own.
- **transfer**: a client ``sendall``s one request body (the build's input at batch 1, plus 400 bytes
  of head) over loopback to a bare uvloop protocol that only counts bytes and answers 4 KiB, and idles
  for the model's compute time between requests: the time from the first byte sent to the last one
  read by the server.

Bounded in requests, loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import statistics
import sys
import threading
import time
from concurrent.futures import Future

from _server import build_dir, sample
from serve_limit import served_ir, sync_request


def handoff(xml: str, x, requests: int, mode: str) -> tuple[float, float, float]:
    """Median (hand-off -> infer start, infer end -> task resumed, infer) in us."""
    import openvino as ov
    import uvloop

    request = sync_request(xml)  # the raw sync compile: f32 stated, LATENCY
    queue: collections.deque = collections.deque()
    cond = threading.Condition()
    rows: list[list[int]] = []

    def worker() -> None:
        while True:
            with cond:
                while not queue:
                    cond.wait()
                f, row = queue.popleft()
            if f is None:
                return
            row.append(time.perf_counter_ns())
            request.infer({0: x})
            row.append(time.perf_counter_ns())
            f.set_result(None)

    thread = threading.Thread(target=worker, daemon=True)
    if mode == "thread":
        thread.start()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(requests):
            row = [time.perf_counter_ns()]
            if mode == "thread":
                f: Future = Future()
                with cond:
                    queue.append((f, row))
                    cond.notify()
                await asyncio.wrap_future(f)
            else:
                fut = loop.create_future()

                def done(_userdata, fut=fut, row=row) -> None:
                    row.append(time.perf_counter_ns())
                    loop.call_soon_threadsafe(fut.set_result, None)

                request.set_callback(done, None)
                request.set_input_tensor(0, ov.Tensor(x))
                row.append(time.perf_counter_ns())
                request.start_async()
                await fut
            row.append(time.perf_counter_ns())
            rows.append(row)
            await asyncio.sleep(0.001)  # the client's part of a round trip

    uvloop.run(main())
    if mode == "thread":
        with cond:
            queue.append((None, None))
            cond.notify()
        thread.join(10)
    rows = rows[30:]  # each row: handed off, infer started, infer ended, task resumed

    def median_us(a: int, b: int) -> float:
        return statistics.median(r[b] - r[a] for r in rows) / 1e3

    return median_us(0, 1), median_us(2, 3), median_us(1, 2)


def transfer(nbytes: int, requests: int, idle_s: float) -> tuple[float, float]:
    """Median (first byte sent -> last byte read, reads per request) through a bare uvloop protocol."""
    import uvloop

    done: list[tuple[int, int]] = []

    class Counter(asyncio.Protocol):
        def connection_made(self, transport) -> None:
            self.transport, self.n, self.reads = transport, 0, 0

        def data_received(self, data: bytes) -> None:
            self.n += len(data)
            self.reads += 1
            if self.n >= nbytes:
                done.append((time.perf_counter_ns(), self.reads))
                self.n = self.reads = 0
                self.transport.write(b"\0" * 4096)

    ready: list = []

    async def serve() -> None:
        srv = await asyncio.get_running_loop().create_server(Counter, "127.0.0.1", 0)
        ready.append((srv, asyncio.get_running_loop()))
        await srv.serve_forever()

    threading.Thread(target=lambda: uvloop.run(serve()), daemon=True).start()
    while not ready:
        time.sleep(0.01)
    srv, loop = ready[0]
    payload = b"\1" * nbytes
    sent = []
    with socket.create_connection(srv.sockets[0].getsockname()[:2]) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(requests):
            sent.append(time.perf_counter_ns())
            s.sendall(payload)
            got = 0
            while got < 4096:
                got += len(s.recv(65536))
            time.sleep(idle_s)
    loop.call_soon_threadsafe(srv.close)
    pairs = list(zip(sent, done, strict=True))[30:]
    return (
        statistics.median((end - start) / 1e3 for start, (end, _) in pairs),
        statistics.median(reads for _, (_, reads) in pairs),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=None, help="default: a fresh build of --model")
    ap.add_argument("--model", default="vit-tiny")
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    from veo_edge.builddir import BuildDir

    with build_dir(args.build_dir, args.model) as build:
        _, xml = served_ir(BuildDir.open(build))
        x = sample(build, 1)
        print(
            f"{build.name}: input {x.nbytes} bytes at batch 1; medians over {args.requests - 30} requests, us"
        )
        for mode in ("thread", "openvino-async"):
            to, back, infer = handoff(str(xml), x, args.requests, mode)
            print(f"handoff ({mode}): to the infer {to:.0f}, back to the task {back:.0f} (infer {infer:.0f})")
        took, reads = transfer(x.nbytes + 400, args.requests, infer / 1e6)
        print(f"transfer: {took:.0f} from the first byte sent to the last one read ({reads:g} reads)")


if __name__ == "__main__":
    sys.exit(main())
