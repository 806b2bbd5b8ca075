"""`veo-edge build` and what its output costs at start-up, one subcommand per question:

    python bench/build.py stages          # stage timings of the build per built-in model (the manifest's)
    python bench/build.py verify-startup  # what verifying a build at load adds to `veo-edge serve` start-up

Every one prints markdown tables and writes them as JSON with ``--json PATH``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import harness as h
import report


def cmd_stages(args) -> None:
    """Each model built ``--repeat`` times: the median of each stage (seconds) and of the whole build."""
    from veo_edge.export.source import BuiltinSource
    from veo_edge.pipeline.build import BuildOptions, run_build

    table = report.Table(
        "build stages", {"model": ("model", "{}"), "stage": ("stage", "{}"), "s": ("median s", "{:.3f}")}
    )
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            per_stage: dict[str, list[float]] = {}
            for i in range(args.repeat):
                start = time.perf_counter()
                options = BuildOptions(
                    source=BuiltinSource(model), out=Path(tmp) / f"{model}-{i}", quiet=True
                )
                result = run_build(options)
                for stage, seconds in result.manifest["timings_s"].items():
                    per_stage.setdefault(stage, []).append(seconds)
                per_stage.setdefault("total", []).append(time.perf_counter() - start)
            for stage, values in per_stage.items():
                table.add(model=model, stage=stage, s=statistics.median(values))
    report.emit([table], args.json)


def _median_s(fn, repeats: int) -> float:
    return statistics.median(report.timed(fn) for _ in range(repeats)) / 1e3


def cmd_verify_startup(args) -> None:
    """1. ``veo_edge.builddir.verify``: every artifact hashed (page cache warm, as at a restart).
    2. What ``Runtime(...).start()`` hashes on the default policy (its candidates' artifacts, a fresh
       BuildDir), and the start itself with that verification and without it (a BuildDir already
       verified: a stat per artifact), interleaved.
    3. ``veo-edge serve`` from the process start until ``/v2/health/ready`` answers 200: the start-up a
       user waits for, and the share of it the verification takes."""
    from veo_edge.builddir import BuildDir, verify
    from veo_edge.runtime.policy import artifacts_of, resolve_policy
    from veo_edge.runtime.runtime import Runtime

    with h.build_dir(args.build_dir, args.model) as build:
        verified = verify(build)  # also warms the page cache
        verify_s = _median_s(lambda: verify(build), args.repeats)
        names, _ = resolve_policy("auto", None, True)
        kinds = sorted({k for n in names for k in artifacts_of(n, BuildDir.open(build))})
        start_bytes = sum(BuildDir.open(build).manifest["artifacts"][k]["bytes"] for k in kinds)
        kinds_s = _median_s(lambda: BuildDir.open(build).verify(kinds), args.repeats)

        def start(pre_verified: bool) -> float:
            b = BuildDir.open(build)
            if pre_verified:
                b.verify(kinds)
            rt = Runtime(b)
            elapsed = report.timed(rt.start) / 1e3
            rt.close()
            return elapsed

        starts: dict[str, list[float]] = {"with verification": [], "without (pre-verified)": []}
        for _ in range(args.repeats):  # interleaved, so that a busy machine weighs on both alike
            starts["with verification"].append(start(False))
            starts["without (pre-verified)"].append(start(True))
        serve_s = []
        for _ in range(args.serve_repeats):
            t = time.perf_counter()
            with h.server(build):
                serve_s.append(time.perf_counter() - t)
    serve = statistics.median(serve_s)
    table = report.Table(
        f"verifying {BuildDir.open(build).model_name} at start-up",
        {
            "what": ("", "{}"),
            "ms": ("ms", "{:.0f}"),
            "mib": ("MiB hashed", "{:.1f}"),
            "gbps": ("GB/s", "{:.2f}"),
            "share": ("of serve", "{:.1%}"),
        },
    )
    table.add(
        what="verify the whole build",
        ms=verify_s * 1e3,
        mib=verified.bytes / 2**20,
        gbps=verified.bytes / verify_s / 1e9,
    )
    table.add(
        what=f"added to the runtime's start ({', '.join(kinds)})",
        ms=kinds_s * 1e3,
        mib=start_bytes / 2**20,
        share=kinds_s / serve,
    )
    for label, values in starts.items():
        table.add(what=f"runtime start, {label}", ms=statistics.median(values) * 1e3)
    table.add(what="`veo-edge serve` to ready", ms=serve * 1e3)
    report.emit([table], args.json)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    p = h.command(sub, "stages", cmd_stages, "stage timings of `veo-edge build` per built-in model")
    p.add_argument("--models", default="vit-nano,vit-tiny,veo-video-tiny")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="also write the results here, as JSON")
    p = h.command(
        sub, "verify-startup", cmd_verify_startup, "what verifying a build adds to `veo-edge serve` start-up"
    )
    h.build_args(p, "vit-tiny")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--serve-repeats", type=int, default=3)
    args = ap.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
