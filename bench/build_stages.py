"""Stage timings of `veo-edge build` per built-in model (the numbers the manifest records).

    python bench/build_stages.py [--models vit-nano,vit-tiny,veo-video-tiny] [--repeat 2]

Prints one row per model and stage: the median over the repeats, in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from veo_edge.export.source import BuiltinSource
from veo_edge.pipeline.build import BuildOptions, run_build


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="vit-nano,vit-tiny,veo-video-tiny")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(f"{'model':<16} {'stage':<10} {'median s':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            per_stage: dict[str, list[float]] = {}
            totals = []
            for i in range(args.repeat):
                start = time.perf_counter()
                result = run_build(
                    BuildOptions(source=BuiltinSource(model), out=Path(tmp) / f"{model}-{i}", quiet=True)
                )
                totals.append(time.perf_counter() - start)
                for stage, seconds in result.manifest["timings_s"].items():
                    per_stage.setdefault(stage, []).append(seconds)
            for stage, values in per_stage.items():
                print(f"{model:<16} {stage:<10} {statistics.median(values):>9.3f}")
            print(f"{model:<16} {'total':<10} {statistics.median(totals):>9.3f}")


if __name__ == "__main__":
    main()
