"""Encoded pictures against f32 tensors through `veo-edge serve`, driven by Triton's perf_analyzer.

    python bench/serve_images.py --perf-analyzer PATH/perf_analyzer [--work DIR] [--seconds 4]
                                 [--rounds 2] [--concurrency 1,4] [--transport http]

On one build (``bench/_hf.py``: a random-init Hugging Face ViT, 192 wide, 12 layers, 224², ViT's
processor; ``build --hf``, f32), one server, batch 1 per request:

- ``f32``: ``-m NAME``, perf_analyzer's random FP32 [1, 3, 224, 224] tensors (602 kB a request);
- ``jpeg``: ``-m NAME_image --input-data FILE.json``, scikit-learn's sample photograph (427x640, JPEG q90,
  ~60 kB) as the BYTES input, decoded and preprocessed by the server (resize to 224² bilinear, normalise).

Per cell: images/s, p50 (ms), and the share of the mean request latency spent decoding and preprocessing
(the server's ``compute_input``, perf_analyzer's "Server Compute Input", over its whole latency). Cells
interleave, ``--rounds`` times (median images/s, median p50). Also printed: one picture's decode +
preprocess on one thread in-process (median of 200). Loopback, bounded; read ``uptime`` first.
"""

from __future__ import annotations

import argparse
import base64
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _hf import hf_build, photos_jpeg, vit_checkpoint
from _server import server


def perf_analyzer(pa: str, args: list[str], seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "pa.csv"
        cmd = [pa, *args, "--measurement-interval", str(int(seconds * 1000)), "--max-trials", "3"]
        cmd += ["--stability-percentage", "1000", "-f", str(out)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10 + 60)
        if not out.is_file():
            tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
            raise RuntimeError(f"perf_analyzer failed ({done.returncode}): {' | '.join(tail)}")
        row = next(csv.DictReader(out.open()))
    parts = [
        "Client Send",
        "Network+Server Send/Recv",
        "Server Queue",
        "Server Compute Input",
        "Server Compute Infer",
        "Server Compute Output",
        "Client Recv",
    ]
    total = sum(float(row[p]) for p in parts)
    return {
        "ips": float(row["Inferences/Second"]),
        "p50_ms": float(row["p50 latency"]) / 1000,
        "decode_share": float(row["Server Compute Input"]) / total if total else float("nan"),
    }


def decode_once_ms(build: Path, jpeg: bytes, n: int = 200) -> float:
    from veo_edge.builddir import BuildDir
    from veo_edge.preprocess import Preprocess
    from veo_edge.preprocess.decode import decode_image

    prep = Preprocess.from_manifest(BuildDir.open(build).manifest["preprocess"])
    times = []
    for _ in range(n):
        t = time.perf_counter()
        prep(decode_image(jpeg))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--perf-analyzer", required=True)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "veo-bench-hf")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--transport", default="http", choices=["http", "grpc"])
    args = ap.parse_args()
    build = hf_build(vit_checkpoint(args.work / "vit-hf"), args.work / "vit-hf-build")
    name = "vit-hf"
    jpeg = photos_jpeg()[1]  # the flower: 427x640
    # perf_analyzer reads a BYTES file of a --input-data folder as lines of text: give the JPEG as base64
    # in its JSON form instead, one picture ([1]: the companion declares BYTES [-1], max_batch_size 0)
    data = args.work / "input-data.json"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text(json.dumps({"data": [{"input": {"b64": base64.b64encode(jpeg).decode(), "shape": [1]}}]}))
    print(
        f"decode + preprocess of one {len(jpeg) / 1e3:.0f} kB JPEG, one thread: {decode_once_ms(build, jpeg):.2f} ms"
    )
    levels = [int(c) for c in args.concurrency.split(",")]
    cells: dict[tuple[str, int], list[dict]] = {}
    with server(build, ports=True) as ports:
        port = ports[args.transport]
        for r in range(args.rounds):
            for k in levels:
                for kind in ("f32", "jpeg"):
                    common = [
                        "-u",
                        f"127.0.0.1:{port}",
                        "-i",
                        args.transport,
                        "--concurrency-range",
                        f"{k}:{k}",
                    ]
                    model = (
                        ["-m", name] if kind == "f32" else ["-m", name + "_image", "--input-data", str(data)]
                    )
                    res = perf_analyzer(args.perf_analyzer, model + common, args.seconds)
                    cells.setdefault((kind, k), []).append(res)
                    print(f"round {r + 1} {kind} c{k}: {res}", file=sys.stderr)
    print(
        f"\n| input | clients | images/s | p50 ms | decode+preprocess share |  ({args.transport}, {args.rounds} rounds)"
    )
    print("| --- | --- | --- | --- | --- |")
    for (kind, k), rs in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        ips = statistics.median(r["ips"] for r in rs)
        p50 = statistics.median(r["p50_ms"] for r in rs)
        share = statistics.median(r["decode_share"] for r in rs)
        print(f"| {kind} | {k} | {ips:.1f} | {p50:.2f} | {share:.0%} |")


if __name__ == "__main__":
    main()
