"""The accuracy guard of a reduced CPU precision (bf16, int8) against the FP32 model.

With labels: top-1 accuracy (in points, i.e. percent) of FP32 and of the reduced precision on every CPU
backend; the build is refused when the reduced precision loses more than ``max_drop`` points.
Without labels: the reduced precision against FP32 on held-out inputs: top-1 agreement on the samples
whose FP32 top-2 margin is clear (at least ``AMBIGUITY_MARGIN`` standard deviations of that sample's
logits) and the per-sample cosine similarity, each against a stated threshold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import numpy as np

from veo_edge.errors import AccuracyGuardError, InputError, UsageError

Run = Callable[[np.ndarray], np.ndarray]

#: the default of --max-accuracy-drop: our design target, in top-1 points
MAX_ACCURACY_DROP = 0.2
#: label-free thresholds (stated in the manifest): agreement on unambiguous samples, mean and worst cosine
MIN_TOP1_AGREEMENT = 0.99
MIN_MEAN_COSINE = 0.99
MIN_COSINE = 0.95
AMBIGUITY_MARGIN = 0.25


def check_guard_data(
    source: str, samples: int, y: np.ndarray | None, served: str, classes: int | None, guarded: bool = True
) -> None:
    """Refuse ``--val`` data the build cannot use, before its slow work: fewer than 2 samples where a
    reduced precision's guard will score them (``guarded``; at f32 one sample is the canary and, labelled,
    a top-1 of 0 or 100), labels for a model that serves features, labels outside ``0 .. classes - 1``
    (``classes`` None: unknown, only negative labels are refused)."""
    if guarded and samples < 2:
        raise InputError(
            f"--val {source} has {samples} sample; the accuracy guard needs at least 2 (one sample's top-1 is "
            "0 or 100 %), and hundreds to resolve --max-accuracy-drop"
        )
    if y is None:
        return
    if served != "logits":
        raise UsageError(
            f"--val {source} has labels, but the model has no classification head: it serves {served} "
            "(features), which have no classes to score; pass its inputs without labels (a .npy, or a .npz "
            "with x alone) for the label-free guard"
        )
    bad = (y < 0) | (y >= classes) if classes is not None else y < 0
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        expected = f"0 to {classes - 1} (the model's {classes} classes)" if classes is not None else ">= 0"
        raise InputError(
            f"--val {source} has {int(bad.sum())} labels outside the model's classes (label {int(y[first])} "
            f"at sample {first}; labels range {int(y.min())} to {int(y.max())}); expected class indices "
            f"{expected}"
        )


def outputs(run: Run, x: np.ndarray, batch: int) -> np.ndarray:
    return np.concatenate([np.asarray(run(x[i : i + batch]), np.float64) for i in range(0, len(x), batch)])


def top1_points(logits: np.ndarray, y: np.ndarray) -> float:
    return float((logits.reshape(len(y), -1).argmax(1) == y).mean() * 100.0)


@dataclass
class GuardReport:
    kind: str  # "labelled" or "label-free"
    precision: str
    data: str
    samples: int
    passed: bool
    thresholds: dict[str, float]
    accuracy: dict[str, dict[str, float]] = field(default_factory=dict)  # backend -> precision -> points
    drop: float | None = None
    agreement: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if self.kind == "labelled":
            acc = ", ".join(f"{b} {p} {v:.2f}%" for b, per in self.accuracy.items() for p, v in per.items())
            return (
                f"top-1 on {self.samples} labelled samples ({self.data}): {acc}; {self.precision} drop "
                f"{self.drop:+.2f} points (max {self.thresholds['max_accuracy_drop']})"
            )
        a = self.agreement
        return (
            f"{self.precision} vs f32 on {self.samples} held-out inputs ({self.data}): top-1 agreement "
            f"{a['top1_agreement']:.2%} on {int(a['unambiguous'])} unambiguous (min {self.thresholds['min_top1_agreement']:.0%}), "
            f"mean cosine {a['mean_cosine']:.5f} (min {self.thresholds['min_mean_cosine']}), worst "
            f"{a['min_cosine']:.5f} (min {self.thresholds['min_cosine']})"
        )


def labelled_guard(
    fp32: dict[str, Run],
    reduced: tuple[str, Run],
    precision: str,
    x: np.ndarray,
    y: np.ndarray,
    batch: int,
    max_drop: float,
    data: str,
) -> GuardReport:
    """Top-1 accuracy of each FP32 backend and of ``reduced`` = (backend, run) at ``precision``."""
    acc: dict[str, dict[str, float]] = {
        b: {"f32": top1_points(outputs(r, x, batch), y)} for b, r in fp32.items()
    }
    backend, run = reduced
    acc.setdefault(backend, {})[precision] = top1_points(outputs(run, x, batch), y)
    drop = round(acc[backend]["f32"] - acc[backend][precision], 6)
    report = GuardReport(
        "labelled", precision, data, len(y), drop <= max_drop, {"max_accuracy_drop": max_drop}, acc, drop
    )
    if not report.passed:
        raise AccuracyGuardError(
            f"{precision} loses {drop:.2f} top-1 points on {backend} ({acc[backend]['f32']:.2f}% at f32, "
            f"{acc[backend][precision]:.2f}% at {precision}, {len(y)} labelled samples from {data}); "
            f"the most allowed is --max-accuracy-drop {max_drop}. Calibrate on representative data "
            "(--calibration), choose another --cpu-precision, or raise --max-accuracy-drop"
        )
    return report


def label_free_guard(
    fp32: Run, reduced: tuple[str, Run], precision: str, x: np.ndarray, batch: int, data: str
) -> GuardReport:
    """``reduced`` against the FP32 model on held-out inputs, without labels."""
    ref = outputs(fp32, x, batch).reshape(len(x), -1)
    got = outputs(reduced[1], x, batch).reshape(len(x), -1)
    top2 = np.sort(ref, axis=1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) >= AMBIGUITY_MARGIN * ref.std(axis=1)
    agree = got.argmax(1) == ref.argmax(1)
    denom = np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1)
    cos = np.where(denom > 0, (got * ref).sum(1) / np.where(denom > 0, denom, 1.0), 0.0)
    stats = {
        "top1_agreement": float(agree[clear].mean()) if clear.any() else 1.0,
        "unambiguous": int(clear.sum()),
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
    }
    thresholds = {
        "min_top1_agreement": MIN_TOP1_AGREEMENT,
        "min_mean_cosine": MIN_MEAN_COSINE,
        "min_cosine": MIN_COSINE,
        "ambiguity_margin_std": AMBIGUITY_MARGIN,
    }
    passed = (
        stats["top1_agreement"] >= MIN_TOP1_AGREEMENT
        and stats["mean_cosine"] >= MIN_MEAN_COSINE
        and stats["min_cosine"] >= MIN_COSINE
    )
    report = GuardReport("label-free", precision, data, len(x), passed, thresholds, agreement=stats)
    if not passed:
        raise AccuracyGuardError(
            f"{precision} on {reduced[0]} does not reproduce the f32 model: {report.summary()}. Calibrate on "
            "representative data (--calibration), pass labelled data (--val), or choose another --cpu-precision"
        )
    return report
