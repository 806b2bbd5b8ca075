"""What a correct backend answers for a build: seeded inputs, the plain ONNX Runtime runner's answers one
sample at a time, and the build's own tolerance between two correct backends."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from veo_edge.builddir import BuildDir
from veo_edge.export.parity import seeded_inputs
from veo_edge.runtime.loaders import cpu_runner


def seeded(n: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return seeded_inputs(shape, n, seed)


def reference(build_dir: Path, x: np.ndarray) -> np.ndarray:
    """Unbatched answers from the plain ONNX Runtime runner, one sample at a time."""
    with cpu_runner(BuildDir.open(build_dir), "onnxruntime") as r:
        return np.concatenate([r.infer(x[i : i + 1])["logits"] for i in range(len(x))])


def tolerance(build_dir: Path) -> float:
    """The build's canary tolerance: what any two correct backends may differ by, per side."""
    return 2 * BuildDir.open(build_dir).manifest["canary"]["atol"]
