"""Per-sample throughput of one batch size on OpenVINO's THROUGHPUT streams: the dynamic-batch compile the
server runs batches on, against a compile with the batch axis fixed at that size, and against the
batch-1 static compile ADAPTIVE's streams use (cells alternated, order reversed every other round).

    python bench/static_batch.py --build-dir vit-tiny --batch 2 --seconds 3 --rounds 8

Prints samples/s per cell and the static/dynamic ratio per round. docs/benchmarks.md ("Why ADAPTIVE
compiles static shapes") has a run.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from raw_ov import served_ir


def _compiled(xml: str, batch: int | None):
    """The IR compiled as the server's streams compile it (f32, THROUGHPUT); ``batch`` fixes the batch
    axis (None: dynamic)."""
    import openvino as ov

    from veo_edge.runtime.backends.openvino_compile import compile_config

    core = ov.Core()
    model = core.read_model(xml)
    if batch is not None:
        shape = model.inputs[0].get_partial_shape()
        shape[0] = batch
        model.reshape({model.inputs[0].get_any_name(): shape})
    return core.compile_model(model, "CPU", compile_config("f32", hint="THROUGHPUT"))


def _cell(compiled, x: np.ndarray, seconds: float, requests: int) -> float:
    """Samples/s with ``requests`` infer requests kept full for ``seconds`` (after 0.5 s of the same)."""
    import openvino as ov

    queue = ov.AsyncInferQueue(compiled, requests)
    done = [0]
    queue.set_callback(lambda _request, _data: done.__setitem__(0, done[0] + len(x)))
    for phase in (0.5, seconds):
        queue.wait_all()
        done[0] = 0
        start = time.perf_counter()
        while time.perf_counter() - start < phase:
            queue.start_async({0: x})
        queue.wait_all()
    return done[0] / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--requests", type=int, default=4, help="kept full (the server: 2 per stream)")
    args = ap.parse_args()
    _, xml = served_ir(args.build_dir)
    cells = {
        f"dynamic b{args.batch}": (_compiled(xml, None), args.batch),
        f"static b{args.batch}": (_compiled(xml, args.batch), args.batch),
        "static b1": (_compiled(xml, 1), 1),
    }
    streams = {name: int(c.get_property("NUM_STREAMS")) for name, (c, _) in cells.items()}
    print(f"f32, THROUGHPUT, streams {streams}, {args.requests} requests kept full")
    sample = [d.get_length() for d in list(cells["static b1"][0].inputs[0].get_partial_shape())[1:]]
    x = np.random.default_rng(0).standard_normal([args.batch, *sample]).astype(np.float32)
    got: dict[str, list[float]] = {name: [] for name in cells}
    for r in range(args.rounds):
        order = list(cells) if r % 2 == 0 else list(cells)[::-1]
        for name in order:
            compiled, b = cells[name]
            got[name].append(_cell(compiled, x[:b], args.seconds, args.requests))
    for name, values in got.items():
        print(f"{name:<12} " + " ".join(f"{v:6.1f}" for v in values) + f"   median {np.median(values):.1f}")
    ratio = np.array(got[f"static b{args.batch}"]) / np.array(got[f"dynamic b{args.batch}"])
    print(f"static/dynamic at b{args.batch}: " + " ".join(f"{v:.3f}" for v in ratio))
    print(f"median {np.median(ratio):.3f}, {int((ratio > 1).sum())} of {len(ratio)} rounds above 1")


if __name__ == "__main__":
    main()
