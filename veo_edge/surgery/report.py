"""The surgery report: per op how many regions looked like it, matched and were replaced, and for each
region left alone the check that failed. Stored as ``surgery_report.json`` in the build directory."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

OPS = ("VeoPatchEmbedLayerNorm", "VeoAttention")
REPORT_NAME = "surgery_report.json"
FAMILY = {"VeoPatchEmbedLayerNorm": "patch embedding", "VeoAttention": "attention"}

#: per failed check: why the region was left alone, and what a user can do about it
ADVICE = {
    "input_bias": (
        "a term added to the scores before the softmax depends on the input (a runtime attention mask, a "
        "bias computed from the tokens); VeoAttention v2 takes a constant bias only (a relative position "
        "bias, a window mask), TensorRT runs these layers unfused"
    ),
    "bias_shape": (
        "the constant bias does not broadcast as (1 or the windows of an image, 1 or H, S, S) over the "
        "attention batch"
    ),
    "bias_layout": "a reshape or transpose sits between the additive bias and the softmax",
    "masked_fill": "the scores are masked with Where (masked_fill) rather than an additive bias",
    "kv_cache": "the Attention op has past key/value inputs (decoder-style attention)",
    "scores_matmul": (
        "the softmax does not read Q·Kᵀ, scaled by one number at most (a classifier or pooling softmax; or "
        "attention that scales its scores per head, as Swin V2's cosine attention does)"
    ),
    "context_matmul": (
        "the softmax output is used by more than the context MatMul (attention weights returned or "
        "post-processed); export without output_attentions / need_weights"
    ),
    "softmax_axis": "the softmax is not over the last axis",
    "static_shapes": (
        "shapes stay unknown even at the build's static input shape; export with a fixed --input-shape"
    ),
    "contained": (
        "an intermediate result is read outside the region (attention weights, or the token grid read by "
        "another layer); the region would be computed twice"
    ),
    "numeric_equivalence": (
        "the structure looks like the op but computes something else on the seeded run (a variant the "
        "op does not cover)"
    ),
    "whole_graph": (
        "replacing it made the whole graph differ from the reference; dropped so the rest could be fused"
    ),
    "patchify_conv": "not a patchify convolution (kernel = stride, no padding): a stem or hybrid conv",
    "tokens_layout": "the conv output is not flattened to (N, tokens, E) right after the conv",
    "prefix_tokens": "the prefix tokens are not constants before the patch tokens (or more than 2)",
    "separate_projections": "Q, K and V do not come from constant-weight projections of one input",
    "packed_qkv": "the packed projection is not (N, S, 3·E)",
    "qkv_source": "Q, K and V come from mismatched sources (cross-attention?)",
    "merged_heads": "the heads are not merged back to (N, S, E)",
    "one_layout": "a second patch embedding with another layout: the op is made for one layout per model",
    "plain_softmax": "causal or soft-capped attention; not supported by VeoAttention",
    "single_output": "the Attention op's extra outputs are used",
    "no_layernorm": "no LayerNorm after the embedding (post-norm model): fused without it",
}


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
    canonical: dict[str, Any] = field(default_factory=dict)  # node counts and what each pass removed

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
            "canonical": self.canonical,
            "families": self.families(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SurgeryReport:
        return cls(
            regions=[RegionReport(**r) for r in d.get("regions", [])],
            reference_check=list(d.get("reference_check", [])),
            seed=int(d.get("seed", 0)),
            canonical=dict(d.get("canonical", {})),
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
        families = {
            name: {"fused": f["fused"], "left_alone": {g["check"]: g["count"] for g in f["left_alone"]}}
            for name, f in self.families().items()
        }
        return {
            "counts": self.counts(),
            "replaced": self.replaced,
            "reference_max_abs": worst,
            "families": families,
        }

    def families(self) -> dict[str, dict[str, Any]]:
        """Per op family: how many regions were fused, and the ones left alone grouped by reason."""
        out = {}
        for op in OPS:
            rs = [r for r in self.regions if r.op == op]
            left: dict[str, int] = {}
            for r in rs:
                if not r.replaced:
                    left[r.check] = left.get(r.check, 0) + 1
            out[FAMILY[op]] = {
                "op": op,
                "fused": sum(r.replaced for r in rs),
                "candidates": len(rs),
                "left_alone": [
                    {"check": c, "count": n, "why": ADVICE.get(c, c)} for c, n in sorted(left.items())
                ],
            }
        return out

    def lines(self) -> list[str]:
        """Human-readable lines: per family what was fused and what was not (and what to do), then every
        region not replaced with its check, then the whole-graph check."""
        out = []
        for op, c in self.counts().items():
            out.append(
                f"{op}: {c['replaced']} replaced of {c['matched']} matched ({c['candidates']} candidate regions)"
            )
        for family, f in self.families().items():
            for group in f["left_alone"]:
                out.append(f"  {family} left alone ({group['count']}×): {group['check']}: {group['why']}")
        for r in self.regions:
            if not r.replaced:
                out.append(f"  not replaced: {r.op} at {r.anchor_op} {r.anchor!r}: {r.check}: {r.detail}")
        if self.canonical.get("nodes_before"):
            removed = ", ".join(f"{k} {v}" for k, v in sorted(self.canonical.get("removed", {}).items()) if v)
            out.append(
                f"canonical graph: {self.canonical['nodes_before']} -> {self.canonical['nodes_after']} nodes"
                + (f" ({removed})" if removed else "")
            )
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
