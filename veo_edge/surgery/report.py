"""The surgery report: per op how many regions looked like it, matched and were replaced, and for each
region left alone the check that failed. Stored as ``surgery_report.json`` in the build directory."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OPS = ("VeoPatchEmbedLayerNorm", "VeoAttention")
REPORT_NAME = "surgery_report.json"


@dataclass
class RegionReport:
    op: str
    anchor_op: str  # the node the region was found from (Softmax, Attention, Conv)
    anchor: str  # that node's name, for people to find it; never used for matching
    replaced: bool
    matched: bool  # the structure matched (it may still have failed a later check)
    check: str = ""  # the failed check, when not replaced
    detail: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    max_abs: float | None = None  # region vs the op's float64 reference on the seeded activations
    tolerance: float | None = None


@dataclass
class SurgeryReport:
    regions: list[RegionReport] = field(default_factory=list)
    reference_check: list[dict[str, Any]] = field(default_factory=list)
    seed: int = 0

    def counts(self) -> dict[str, dict[str, int]]:
        out = {}
        for op in OPS:
            rs = [r for r in self.regions if r.op == op]
            out[op] = {
                "candidates": len(rs),
                "matched": sum(r.matched for r in rs),
                "replaced": sum(r.replaced for r in rs),
            }
        return out

    @property
    def replaced(self) -> int:
        return sum(r.replaced for r in self.regions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "counts": self.counts(),
            "regions": [asdict(r) for r in self.regions],
            "reference_check": self.reference_check,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SurgeryReport:
        return cls(
            regions=[RegionReport(**r) for r in d.get("regions", [])],
            reference_check=list(d.get("reference_check", [])),
            seed=int(d.get("seed", 0)),
        )

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def read(cls, path: Path) -> SurgeryReport:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def summary(self) -> dict[str, Any]:
        """The short form kept in the manifest."""
        worst = max((c["max_abs"] for c in self.reference_check), default=None)
        return {"counts": self.counts(), "replaced": self.replaced, "reference_max_abs": worst}

    def lines(self) -> list[str]:
        """Human-readable lines: counts per op, then every region not replaced and why."""
        out = []
        for op, c in self.counts().items():
            out.append(
                f"{op}: {c['replaced']} replaced of {c['matched']} matched ({c['candidates']} candidate regions)"
            )
        for r in self.regions:
            if not r.replaced:
                out.append(f"  not replaced: {r.op} at {r.anchor_op} {r.anchor!r}: {r.check}: {r.detail}")
        for c in self.reference_check:
            out.append(
                f"reference check batch {c['batch']}: max abs {c['max_abs']:.3g} "
                f"(tolerance {c['tolerance']:.3g}), vs plain ONNX {c['max_abs_vs_plain']:.3g}"
            )
        if self.replaced == 0:
            out.append(
                "NOTHING MATCHED: no region was replaced by a plugin; TensorRT will build the plain ONNX"
            )
        return out
