"""``bench/serve.py floor``: the machine's own floors under one client's request, with no HTTP and no
veo-edge code: a loop → thread → loop hand-off around an infer, OpenVINO's workers spinning after one,
and a body the size of a request over loopback into a bare protocol. Loopback only, bounded in requests.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import socket
import statistics
import threading
import time
from concurrent.futures import Future

import harness as h
import raw_ov
import report


def handoff(xml: str, x, requests: int, mode: str) -> tuple[float, float, float]:
    """Median (hand-off -> infer start, infer end -> task resumed, infer) in us."""
    import openvino as ov
    import uvloop

    request = raw_ov.sync_request(xml)  # the raw sync compile: f32 stated, LATENCY
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


def worker_wait(xml: str, x, requests: int, gap_s: float = 0.003) -> tuple[float, float]:
    """Median process CPU (us) in the ``gap_s`` after a lone sync infer returns, this thread asleep, and
    the infer (us): what oneTBB's worker_wait (OpenVINO's workers spinning after their task, by design)
    takes of a core just when a server answers and reads the next request."""
    request = raw_ov.sync_request(xml)  # the raw sync compile: f32 stated, LATENCY
    cpu, infer = [], []
    for _ in range(requests):
        t0 = time.perf_counter_ns()
        request.infer({0: x})
        c0, t1 = time.process_time_ns(), time.perf_counter_ns()
        time.sleep(gap_s)
        cpu.append((time.process_time_ns() - c0) / 1e3)
        infer.append((t1 - t0) / 1e3)
    return statistics.median(cpu[30:]), statistics.median(infer[30:])


def cmd_floor(args) -> None:
    """The machine's floors under the 1-client target, with no HTTP and no veo-edge code: an asyncio
    (uvloop) task hands one infer (the build's IR, f32, LATENCY, batch 1) to a worker thread (a condition
    variable, as the batcher does) and awaits it through asyncio.wrap_future, or runs OpenVINO's own
    start_async with a callback: the time to the infer's start and back to the task. The process CPU in the
    3 ms after a lone infer returns, while the caller sleeps (oneTBB's worker_wait). And one request body
    sent over loopback into a bare uvloop protocol that only counts bytes, idling the model's compute time
    between requests: first byte sent to last byte read."""
    if args.requests <= 30:
        raise SystemExit(f"--requests must be above 30 (the first 30 are a warm-up), got {args.requests}")
    with h.build_dir(args.build_dir, args.model) as build:
        _, xml = raw_ov.served_ir(build)
        x = h.sample(build, 1)
        table = report.Table(
            f"{build.name}: the machine's floors, medians over {args.requests - 30} requests",
            {
                "floor": ("floor", "{}"),
                "there_us": ("to the infer / transfer µs", "{:.0f}"),
                "back_us": ("back to the task µs", "{:.0f}"),
                "infer_us": ("infer µs", "{:.0f}"),
                "cpu_us": ("process CPU after it µs", "{:.0f}"),
            },
        )
        for mode in ("thread", "openvino-async"):
            there, back, infer = handoff(xml, x, args.requests, mode)
            table.add(floor=f"hand-off ({mode})", there_us=there, back_us=back, infer_us=infer)
        spin, infer = worker_wait(xml, x, args.requests)
        table.add(
            floor="CPU in the 3 ms after a lone infer (OpenVINO's workers spinning)",
            cpu_us=spin,
            infer_us=infer,
        )
        took, reads = transfer(x.nbytes + 400, args.requests, infer / 1e6)
        table.add(floor=f"a {x.nbytes + 400} B body over loopback ({reads:g} reads)", there_us=took)
    report.emit([table], args.json)


def add_command(sub: argparse._SubParsersAction) -> None:
    p = h.command(
        sub, "floor", cmd_floor, "the machine's own cost of a thread hand-off and of a loopback body"
    )
    h.build_args(p, "vit-tiny")
    p.add_argument("--requests", type=int, default=300)
