"""``bench/serve.py images``: JPEG pictures (BYTES, decoded and preprocessed by the server) against f32
tensors, on one server of a ``build --hf`` ViT (``bench/hf.py``'s checkpoint), driven by perf_analyzer.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import sys
import tempfile
from pathlib import Path

import clients
import harness as h
import hf
import report


def cmd_images(args) -> None:
    """One server of a `build --hf` ViT: perf_analyzer's random f32 tensors against a JPEG as BYTES."""
    from veo_edge.builddir import BuildDir
    from veo_edge.preprocess import Preprocess
    from veo_edge.preprocess.decode import decode_image

    build = hf.hf_build(hf.hf_checkpoint(args.work / "vit-hf"), args.work / "vit-hf-build")
    name, jpeg = "vit-hf", hf.photos_jpeg()[1]  # the flower: 427x640
    # perf_analyzer reads a BYTES file of a --input-data folder as lines of text: the JPEG goes as base64 in
    # its JSON form instead, one picture ([1]: the companion model declares BYTES [-1], max_batch_size 0)
    data = args.work / "input-data.json"
    data.write_text(json.dumps({"data": [{"input": {"b64": base64.b64encode(jpeg).decode(), "shape": [1]}}]}))
    prep = Preprocess.from_manifest(BuildDir.open(build).manifest["preprocess"])
    once = statistics.median(report.timed(lambda: prep(decode_image(jpeg))) for _ in range(200))
    print(
        f"decode + preprocess of one {len(jpeg) / 1e3:.0f} kB JPEG, one thread: {once:.2f} ms",
        file=sys.stderr,
    )
    levels, cells = [int(c) for c in args.concurrency.split(",")], {}
    parts = (
        "Client Send",
        "Network+Server Send/Recv",
        "Server Queue",
        "Server Compute Input",
        "Server Compute Infer",
        "Server Compute Output",
        "Client Recv",
    )
    with h.server(build) as srv:
        for _ in range(args.rounds):
            for k in levels:
                for kind, model, extra in (
                    ("f32", name, ()),
                    ("jpeg", name + "_image", ("--input-data", str(data))),
                ):
                    r = clients.perf_analyzer(
                        args.perf_analyzer,
                        model,
                        srv.port(args.transport),
                        args.transport,
                        k,
                        args.seconds,
                        extra,
                    )
                    total = sum(r.get(p, float("nan")) for p in parts)
                    r["share"] = (
                        r.get("Server Compute Input", float("nan")) / total if total else float("nan")
                    )
                    cells.setdefault((kind, k), []).append(r)
    table = report.Table(
        f"pictures against tensors ({args.transport})",
        {
            "input": ("input", "{}"),
            "clients": ("clients", "{}"),
            "rate": ("images/s", "{:.1f}"),
            "p50_ms": ("p50 ms", "{:.2f}"),
            "share": ("decode + preprocess share", "{:.0%}"),
        },
    )
    for (kind, k), rs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        table.add(
            input=kind,
            clients=k,
            rate=report.median(r["rate"] for r in rs),
            p50_ms=report.median(r["p50"] for r in rs),
            share=report.median(r["share"] for r in rs),
        )
    report.emit([table], args.json, decode_one_ms=once, jpeg_bytes=len(jpeg))


def add_command(sub: argparse._SubParsersAction) -> None:
    p = h.command(
        sub, "images", cmd_images, "JPEG pictures against f32 tensors (a `build --hf` ViT, perf_analyzer)"
    )
    p.add_argument("--perf-analyzer", required=True)
    p.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "veo-bench-hf", help="reused")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,4")
    p.add_argument("--transport", default="http", choices=("http", "grpc"))
    p.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")
