"""Prove that an exported artifact computes what PyTorch computes.

Tolerances follow the FlashAttention habit: a candidate's error against a float64 reference must stay
within ``k * err_baseline + floor``, where the baseline is the error of PyTorch's own float32 (or
FP16-weight) computation against the same reference. No tolerance is picked until a test passes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from veo_edge.errors import ParityError

#: how many times the baseline error a backend may be off (op reordering, other GEMM kernels)
K_FP32 = 20.0
K_FP16 = 4.0
#: absolute floor, relative to the largest reference magnitude
FLOOR_REL = 1e-5


@dataclass(frozen=True)
class ParityStats:
    candidate: str
    batch: int
    max_abs: float
    max_rel: float  # max_abs / max |reference|
    min_cosine: float  # worst per-sample cosine similarity
    top1_agreement: float  # over samples whose reference top-2 margin exceeds the tolerance
    ambiguous: int  # samples left out of top-1 for a margin below the tolerance
    baseline: float
    tolerance: float
    passed: bool

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.candidate} batch {self.batch}: max abs {self.max_abs:.3g} (tolerance {self.tolerance:.3g}), "
            f"max rel {self.max_rel:.3g}, min cosine {self.min_cosine:.6f}, top-1 {self.top1_agreement:.0%}"
        )


def compare(
    candidate: str, got: np.ndarray, ref: np.ndarray, baseline: float, k: float = K_FP32
) -> ParityStats:
    got = np.asarray(got, dtype=np.float64).reshape(ref.shape[0], -1)
    ref = np.asarray(ref, dtype=np.float64).reshape(ref.shape[0], -1)
    scale = float(np.abs(ref).max()) or 1.0
    tol = k * baseline + FLOOR_REL * scale
    diff = np.abs(got - ref)
    max_abs = float(diff.max())
    denom = np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)
    cos = np.where(denom > 0, (got * ref).sum(axis=1) / np.where(denom > 0, denom, 1.0), 1.0)
    top2 = np.sort(ref, axis=1)[:, -2:] if ref.shape[1] > 1 else np.concatenate([ref, ref - np.inf], 1)
    clear = (top2[:, 1] - top2[:, 0]) > 2 * tol
    agree = got.argmax(axis=1) == ref.argmax(axis=1)
    top1 = float(agree[clear].mean()) if clear.any() else 1.0
    min_cos = float(cos.min())
    passed = bool(max_abs <= tol and top1 == 1.0 and min_cos >= 0.999)
    return ParityStats(
        candidate=candidate,
        batch=int(ref.shape[0]),
        max_abs=max_abs,
        max_rel=max_abs / scale,
        min_cosine=min_cos,
        top1_agreement=top1,
        ambiguous=int((~clear).sum()),
        baseline=float(baseline),
        tolerance=float(tol),
        passed=passed,
    )


def seeded_inputs(input_shape: tuple[int, ...], batch: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, *input_shape)).astype(np.float32)


@dataclass
class TorchReference:
    """PyTorch outputs in float64 (the reference) and float32 (the baseline) for the same inputs."""

    module: object  # nn.Module; typed loosely so that importing this file needs no torch

    def __post_init__(self) -> None:
        import copy

        import torch

        self._fp32 = self.module
        try:
            self._fp64 = copy.deepcopy(self.module).double()
        except Exception:  # a user module that cannot run in float64: fall back to a float32 reference
            self._fp64 = None
        self._fp16w = None
        self._torch = torch

    def __call__(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Returns (reference fp64 output, fp32 output)."""
        torch = self._torch
        with torch.no_grad():
            out32 = self._fp32(torch.from_numpy(x)).numpy()
            if self._fp64 is None:
                return out32.astype(np.float64), out32
            out64 = self._fp64(torch.from_numpy(x).double()).numpy()
        return out64, out32

    def fp16_weights(self, x: np.ndarray) -> np.ndarray:
        """Output of the model with weights rounded to FP16 and computed in float32: the baseline for an
        FP16-compressed artifact."""
        import copy

        torch = self._torch
        if self._fp16w is None:
            self._fp16w = copy.deepcopy(self._fp32).half().float()
        with torch.no_grad():
            return self._fp16w(torch.from_numpy(x)).numpy()


def check_all(
    runs: dict[str, Callable[[np.ndarray], np.ndarray]],
    reference: TorchReference,
    input_shape: tuple[int, ...],
    batches: tuple[int, ...],
    seed: int,
    fp16_candidates: frozenset[str] = frozenset(),
) -> list[ParityStats]:
    """Run every candidate on seeded inputs per batch size against the torch reference; raise
    :class:`ParityError` with the numbers when any fails."""
    stats = []
    for i, batch in enumerate(batches):
        x = seeded_inputs(input_shape, batch, seed + i)
        ref, out32 = reference(x)
        base32 = float(np.abs(out32 - ref).max())
        for name, run in runs.items():
            if name in fp16_candidates:
                base = float(np.abs(reference.fp16_weights(x) - ref).max())
                stats.append(compare(name, run(x), ref, base, K_FP16))
            else:
                stats.append(compare(name, run(x), ref, base32, K_FP32))
    failed = [s for s in stats if not s.passed]
    if failed:
        raise ParityError(
            "parity check failed, the exported model does not compute what PyTorch computes: "
            + "; ".join(s.summary() for s in failed)
            + ". If the model has ops whose export is lossy, re-export with --exporter dynamo or a newer opset"
        )
    return stats
