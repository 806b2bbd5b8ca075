"""``bench/serve.py trace``: one client against ``veo-edge serve`` with per-request stamps on its event loop.

The server side (:func:`install`, run as ``__main__``: ``python bench/trace_server.py serve BUILD ...``
in place of ``python -m veo_edge.cli.main``, the tree chosen by ``PYTHONPATH``) stamps
``perf_counter_ns`` where the HTTP protocol sees a request begin, its body complete and its answer
written, around ``Batcher.run_alone`` and around OpenVINO's C++ ``infer``, and writes one row per
answered infer request to ``$VEO_EDGE_TRACE`` (``.npy``, int64) at exit: begin, body, answered,
run_alone in, infer in, infer out, run_alone out (0: not reached; run_alone 0 when the
request went through the batcher). Wraps our code and OpenVINO's; measures, changes no answer. The
client side (:func:`cmd_trace`) starts such servers, drives them and differences the stamps.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import tempfile
import time
from pathlib import Path

import clients
import harness as h
import numpy as np
import report

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


#: the stamps, differenced: (label, later stamp, earlier stamp)
TRACE_PARTS = (
    ("request head → body complete", "body", "begin"),
    ("run_alone → OpenVINO's infer starts", "infer_in", "alone_in"),
    ("OpenVINO's infer", "infer_out", "infer_in"),
    ("infer returns → run_alone returns", "alone_out", "infer_out"),
    ("run_alone returns → answer written", "answered", "alone_out"),
)


def cmd_trace(args) -> None:
    """One perf_analyzer client against a server that stamps each request's parts on its event loop
    (this module), over HTTP (``--transport http-shm``: system shared memory); with --old, that
    tree's server too, the two alternating round by round. Per round and tree: the medians, in µs, of the
    parts of the lone requests that ran on the loop (the first tenth left out), of body complete →
    answer written minus the infer, and of the client's turnaround (answer written → its next request)."""
    from veo_edge.builddir import BuildDir

    trees = {"new": args.new, **({"old": args.old} if args.old else {})}
    columns = {"round": ("round", "{}"), "tree": ("tree", "{}"), "p50_ms": ("perf_analyzer p50 ms", "{:.2f}")}
    columns |= {f"part{i}": (label + " µs", "{:.0f}") for i, (label, _, _) in enumerate(TRACE_PARTS)}
    columns |= {
        "rest_us": ("body → answer written − infer µs", "{:.0f}"),
        "client_us": ("client µs", "{:.0f}"),
    }
    table = report.Table("one client, traced", columns)
    shm = ("--shared-memory",) if args.transport == "http-shm" else ()
    entry = str(Path(__file__).resolve())
    with h.build_dir(args.build_dir, args.model) as build, tempfile.TemporaryDirectory() as tmp:
        name = BuildDir.open(build).model_name
        for r in range(args.rounds):
            for who in list(trees)[:: -1 if r % 2 else 1]:
                out = Path(tmp) / f"{who}-{r}.npy"
                env = {"VEO_EDGE_TRACE": str(out)}
                with h.server(build, *shm, tree=trees[who], env=env, entry=entry) as srv:
                    p50 = clients.perf_analyzer(
                        args.perf_analyzer, name, srv.http, args.transport, 1, args.seconds
                    )["p50"]
                t = np.load(out)
                lone = t[:, COLUMNS.index("alone_in")] > 0  # the requests that ran on the loop
                t = t[lone].astype(float) / 1e3  # µs
                t = t[len(t) // 10 :]
                col = {c: t[:, i] for i, c in enumerate(COLUMNS)}
                parts = {f"part{i}": np.median(col[a] - col[b]) for i, (_, a, b) in enumerate(TRACE_PARTS)}
                rest = (col["answered"] - col["body"]) - (col["infer_out"] - col["infer_in"])
                client = col["begin"][1:] - col["answered"][:-1]
                table.add(
                    round=r + 1,
                    tree=who,
                    p50_ms=p50,
                    rest_us=np.median(rest),
                    client_us=np.median(client),
                    **parts,
                )
                print(f"  round {r + 1} {who}: {len(t)} lone requests, p50 {p50:.2f} ms", flush=True)
    report.emit([table], args.json)


def add_command(sub: argparse._SubParsersAction) -> None:
    p = h.command(sub, "trace", cmd_trace, "one client against a server that stamps each request's parts")
    h.build_args(p, "vit-tiny")
    p.add_argument("--perf-analyzer", required=True, help="Triton's perf_analyzer binary")
    p.add_argument("--old", default=None, help="a tree to compare against, its server alternating with ours")
    p.add_argument("--new", default=str(report.TREE), help="the other tree (this one)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=5.0, help="per cell")
    p.add_argument("--transport", default="http-shm", choices=("http", "http-shm"))


if __name__ == "__main__":
    rows: list[list[int]] = []
    install(rows)
    out = os.environ["VEO_EDGE_TRACE"]
    atexit.register(lambda: np.save(out, np.array(rows, dtype=np.int64).reshape(-1, len(COLUMNS))))
    from veo_edge.cli.main import main

    sys.argv = ["veo-edge", *sys.argv[1:]]
    main()
