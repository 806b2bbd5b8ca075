"""Where TensorRT is installed: a real build through veo-edge's own code path, on a small model.

`veo-edge build` of vit-nano into a temporary directory, then ``select_engine`` (plugin and plain engines
built, serialised into the cache, deserialised into the pool, compared and timed), batch 1..max through
the chosen runner, two execution contexts of the same build serving at once from two threads, and the
plugin engine's parity with the plain one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]


def run(model: str = "vit-nano", reps: int = 20) -> tuple[bool, list[str]]:
    from veo_edge.builddir import BuildDir
    from veo_edge.export.parity import seeded_inputs
    from veo_edge.runtime.backends.tensorrt import TensorRtRunner, default_config, select_engine

    lines: list[str] = [
        f"memory pool library: {os.environ.get('VEO_EDGE_MEMPOOL_LIB', 'the default lookup (build/plugins)')}",
        "plugin library: "
        + (
            os.environ.get("VEO_EDGE_PLUGIN_LIB")
            or "none built with these TensorRT headers: TensorRT's own engine only"
        ),
    ]
    ok = True
    with tempfile.TemporaryDirectory(prefix="veo-gpu-") as tmp:
        out = Path(tmp) / model
        subprocess.run(
            [sys.executable, "-m", "veo_edge", "build", "--model", model, "--out", str(out), "--quiet"],
            check=True,
            cwd=REPO,
        )
        build = BuildDir.open(out)
        config = default_config(build)
        decision, blobs = select_engine(build, config, force=True, reps=reps, progress=lines.append)
        lines.append(f"decision: {decision.chosen}: {decision.reason}")
        shape = tuple(build.manifest["input_shape"])
        outs = {}
        for variant in blobs:  # each deserialised from the cache into a fresh pool
            runner = TensorRtRunner(build, dataclasses.replace(config, engine=variant))
            with runner:
                name = runner.output_metadata()[0].name
                outs[variant] = {
                    b: runner.infer(seeded_inputs(shape, b, b))[name] for b in range(1, build.max_batch + 1)
                }
                lines.append(f"{variant}: batch 1..{build.max_batch} ran; pool {runner.pool_stats()}")
        if "plugins" in outs:
            worst = max(float(np.max(np.abs(outs["plugins"][b] - outs["plain"][b]))) for b in outs["plain"])
            tol = decision.tolerance or 0.0
            passed = worst <= 2 * tol
            ok &= passed
            lines.append(
                f"parity plugins vs plain over batch 1..max: max abs {worst:.3g} (allowed {2 * tol:.3g}) {'PASS' if passed else 'FAIL'}"
            )
        # two execution contexts of the same build at once, each with its own pool and stream
        x = seeded_inputs(shape, build.max_batch, 3)
        with TensorRtRunner(build, config) as a, TensorRtRunner(build, config) as b:
            name = a.output_metadata()[0].name
            want = a.infer(x)[name]
            with concurrent.futures.ThreadPoolExecutor(2) as ex:
                got = list(ex.map(lambda r: [r.infer(x)[name] for _ in range(20)], (a, b)))
            same = all(np.array_equal(g, want) for run_ in got for g in run_)
            ok &= same
            lines.append(
                f"two execution contexts, 2 threads x 20 batches: {'identical' if same else 'DIFFERENT'} outputs"
            )
    return ok, lines
