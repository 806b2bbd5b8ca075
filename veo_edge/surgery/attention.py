"""Find multi-head attention cores and replace each with one ``VeoAttention`` node.

An attention-like region is anchored at a ``Softmax`` (explicit or SDPA-decomposed attention from the
TorchScript and dynamo exporters) or at an ONNX ``Attention`` op (opset 23). From the anchor the matcher
walks to the score and context MatMuls (past any additive bias made of constants and shapes only, see
:mod:`veo_edge.surgery.bias`), then up through the head split (Reshape/Transpose with Gather,
Split+Squeeze or Slice+Squeeze, scale multiplies) to the projection(s), and down through the head merge.
The structure found must then compute exactly ``VeoAttention`` on the recorded activations of a seeded
run, within a tolerance derived from the op's own float32 rounding; only then is it replaced. A region
with a bias becomes a version-2 node with the bias as a constant input; one without stays version 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from veo_edge.surgery import bias as bias_terms
from veo_edge.surgery.graphutil import (
    MatchFailure,
    check_contained,
    const_value,
    data_consumers,
    numel_is_one,
    producer,
    static_shape,
    walk_back,
    walk_forward,
)

OP = "VeoAttention"


@dataclass
class AttentionMatch:
    anchor: Any
    sources: list[Any]  # [qkv] packed, or [q, k, v] projection outputs
    out: Any  # the merged-heads tensor the region ends in
    head_dim: int
    embed_dim: int
    base_scale: float  # 1.0 for a Softmax anchor; the Attention op's scale otherwise
    factors: list[tuple[Any, bool]]
    core: list[Any]
    q_in: Any = None  # the query operand (its last dim is the head dim; 3-D for an Attention op)
    q_heads: int = 0  # an Attention op's q_num_heads for 3-D inputs
    projections: list[tuple[Any, np.ndarray, np.ndarray]] = field(default_factory=list)  # separate q/k/v
    scale: float = 0.0
    layout: str = "NS"  # "NS": (N, S, ...) tensors; "SN": sequence-first (nn.MultiheadAttention)
    terms: list[bias_terms.BiasTerm] = field(default_factory=list)  # what is added to the scores
    scores_rank: int | None = None
    bias: np.ndarray | None = None  # (B, 1|H, S, S), set by verify() when there are terms

    @property
    def num_heads(self) -> int:
        return self.embed_dim // self.head_dim


def anchors(graph: Any) -> list[Any]:
    return [
        n
        for n in graph.nodes
        if n.op == "Softmax" or (n.op == "Attention" and (n.domain or "") in ("", "ai.onnx"))
    ]


def match(graph: Any, anchor: Any) -> AttentionMatch:
    """The structure of the region at ``anchor``; raises :class:`MatchFailure` naming the failed check."""
    factors: list[tuple[Any, bool]] = []
    core = [anchor]
    free = bias_terms.DataFree()
    if anchor.op == "Softmax":
        rank = len(anchor.inputs[0].shape or [])
        axis = int(anchor.attrs.get("axis", -1))
        if axis not in (-1, rank - 1):
            raise MatchFailure(
                "softmax_axis", f"softmax over axis {axis}, not the last axis of a rank-{rank} tensor"
            )
        nodes: list[Any] = []
        peeled, terms = bias_terms.peel(anchor.inputs[0], nodes, factors, free)
        scores_t = walk_back(peeled, nodes, factors)
        scores = producer(scores_t)
        if scores is None or scores.op != "MatMul":
            found = "a graph input" if scores is None else scores.op
            check = {"Add": "bias_layout", "Where": "masked_fill"}.get(found, "scores_matmul")
            raise MatchFailure(
                check,
                f"the softmax input comes from {found}, expected MatMul(Q, K^T) (times a scale, plus a bias)",
            )
        consumers = data_consumers(anchor.outputs[0])
        if (
            len(consumers) != 1
            or consumers[0].op != "MatMul"
            or consumers[0].inputs[0] is not anchor.outputs[0]
        ):
            raise MatchFailure(
                "context_matmul",
                f"the softmax feeds {[c.op for c in consumers]}, expected one MatMul(probs, V)",
            )
        ctx = consumers[0]
        core += [scores, ctx, *nodes]
        q_in, k_in, v_in, out_start = scores.inputs[0], scores.inputs[1], ctx.inputs[1], ctx.outputs[0]
        base_scale = 1.0
    else:
        extra = [t for t in anchor.inputs[4:] if t.name]
        if extra:
            raise MatchFailure("kv_cache", "the Attention op has past key/value or sequence-length inputs")
        terms = bias_terms.attention_op_mask(anchor, free)
        if int(anchor.attrs.get("is_causal", 0)) or float(anchor.attrs.get("softcap", 0.0)):
            raise MatchFailure("plain_softmax", "the Attention op is causal or soft-capped")
        if any(o.name and o.outputs for o in anchor.outputs[1:]):
            raise MatchFailure("single_output", "the Attention op's present key/value or qk outputs are used")
        q_in, k_in, v_in, out_start = anchor.inputs[0], anchor.inputs[1], anchor.inputs[2], anchor.outputs[0]
        base_scale = float(anchor.attrs["scale"]) if "scale" in anchor.attrs else 0.0
    q_shape = static_shape(q_in)
    paths: list[list[Any]] = [[], [], []]
    sources = [walk_back(t, p, factors) for t, p in zip((q_in, k_in, v_in), paths, strict=True)]
    core += [n for p in paths for n in p]
    out_nodes: list[Any] = []
    out = walk_forward(out_start, out_nodes)
    core += out_nodes
    out_shape = static_shape(out)
    if out_shape is None or len(out_shape) not in (2, 3):
        raise MatchFailure(
            "merged_heads",
            f"the region ends in a tensor of shape {out.shape}, expected (N, S, E) or (N*S, E)",
        )
    embed = out_shape[-1] or 0  # unknown dims are read from the seeded run in verify()
    q_heads = (
        int(anchor.attrs.get("q_num_heads", 0)) if anchor.op == "Attention" and len(q_shape or []) == 3 else 0
    )
    m = AttentionMatch(anchor, [], out, 0, embed, base_scale, factors, core, q_in=q_in, q_heads=q_heads)
    m.terms = terms
    m.scores_rank = len(anchor.inputs[0].shape or []) if anchor.op == "Softmax" else 4
    if sources[0] is sources[1] is sources[2]:
        shape = static_shape(sources[0])
        if shape is None or len(shape) != 3 or (embed and shape[-1] not in (3 * embed, None)):
            raise MatchFailure(
                "packed_qkv",
                f"Q, K and V come from a tensor of shape {sources[0].shape}, expected (N, S, 3*E)",
            )
        m.sources = [sources[0]]
    elif len({id(s) for s in sources}) == 3:
        m.sources = sources
        if not embed:
            raise MatchFailure("static_shapes", f"the merged heads' width is not static (shape {out.shape})")
        m.projections = [_projection(s, embed) for s in sources]
        if len({id(x) for x, _, _ in m.projections}) != 1:
            raise MatchFailure("separate_projections", "the Q, K and V projections read different inputs")
    else:
        raise MatchFailure("qkv_source", "two of Q, K and V share a source and the third does not")
    return m


def _projection(t: Any, embed: int) -> tuple[Any, np.ndarray, np.ndarray]:
    """(input, weight (E_in, E), bias (E,)) of ``t = input @ weight + bias`` with constant weights."""
    n = producer(t)
    bias = None
    if n is not None and n.op == "Add" and len(n.inputs) == 2:
        a, b = n.inputs
        if const_value(a) is not None and const_value(b) is None:
            a, b = b, a
        bias = const_value(b)
        n = producer(a)
    if n is None or n.op != "MatMul" or const_value(n.inputs[1]) is None:
        raise MatchFailure(
            "separate_projections",
            f"a Q/K/V source is produced by {n.op if n else 'nothing'}, expected x @ W (+ b)",
        )
    w = const_value(n.inputs[1])
    if w.ndim != 2 or w.shape[1] != embed:
        raise MatchFailure(
            "separate_projections", f"a Q/K/V projection weight has shape {w.shape}, expected (E_in, {embed})"
        )
    bias = np.zeros(embed, w.dtype) if bias is None else np.broadcast_to(bias, (embed,))
    return n.inputs[0], w, np.asarray(bias, dtype=w.dtype)


def wanted(m: AttentionMatch) -> list[Any]:
    """Tensors whose values the numeric check needs from the seeded run."""
    terms = [b.tensor for b in m.terms if const_value(b.tensor) is None]
    return [*m.sources, m.out, m.q_in, *terms] + [t for t, _ in m.factors if const_value(t) is None]


def verify(m: AttentionMatch, values: dict[str, np.ndarray], baseline: Any) -> tuple[float, float]:
    """Check the region against ``VeoAttention`` on the recorded values; sets scale, layout and bias.

    ``baseline(qkv, num_heads, head_dim, scale, bias)`` gives the op's float32 output (its function body
    in ONNX Runtime); the region's error against the float64 reference must stay within K times the
    baseline's."""
    from veo_edge.export.parity import FLOOR_REL, K_FP32
    from veo_edge.surgery import reference

    m.embed_dim = int(values[m.out.name].shape[-1])
    m.head_dim = m.embed_dim // m.q_heads if m.q_heads else int(values[m.q_in.name].shape[-1])
    if m.embed_dim % m.head_dim:
        raise MatchFailure(
            "head_dim", f"model dim {m.embed_dim} is not a multiple of the head dim {m.head_dim}"
        )
    scale = m.base_scale or 1.0 / math.sqrt(m.head_dim)
    multipliers = []
    for t, is_div in m.factors:
        v = const_value(t)
        v = values[t.name] if v is None else v
        f = float(np.asarray(v, dtype=np.float64).reshape(-1)[0])
        multipliers.append(1.0 / f if is_div else f)
        scale *= multipliers[-1]
    m.scale = scale
    if len(m.sources) == 1 and values[m.sources[0].name].shape[-1] != 3 * m.embed_dim:
        raise MatchFailure("packed_qkv", f"the packed projection is not (N, S, 3*{m.embed_dim})")
    qkv = (
        np.concatenate([values[s.name] for s in m.sources], axis=-1)
        if len(m.sources) == 3
        else values[m.sources[0].name]
    )
    got = values[m.out.name].astype(np.float64)
    if m.terms:
        if m.scores_rank != 4:
            raise MatchFailure(
                "bias_shape",
                f"the scores the bias is added to have rank {m.scores_rank}, expected (N, H, S, S)",
            )
        m.bias = bias_terms.materialize(
            m.terms,
            multipliers,
            values,
            batch=qkv.shape[0],
            num_heads=m.num_heads,
            seq=qkv.shape[1],
            dtype=np.float16 if m.out.dtype == np.float16 else np.float32,
        )
        if not np.any(m.bias):  # an all-zero mask the canonical passes could not see through
            m.bias = None
    errs = {}
    for layout in ("NS", "SN") if m.bias is None else ("NS",):
        # the op runs batch-first: a sequence-first region is transposed to (N, S, .) and back
        x = qkv if layout == "NS" else qkv.transpose(1, 0, 2)
        ref = reference.attention(x, m.bias, num_heads=m.num_heads, head_dim=m.head_dim, scale=scale)
        if ref.size != got.size:
            continue
        # the baseline and the reference are compared in the op's own (N, S, E) layout; the region's
        # output in the region's layout, (S, N, E) or flattened (S*N, E) for a sequence-first one
        out32 = baseline(x, m.num_heads, m.head_dim, scale, m.bias)
        base = float(np.abs(out32.astype(np.float64) - ref).max())
        in_layout = ref if layout == "NS" else ref.transpose(1, 0, 2)
        err = float(np.abs(in_layout.reshape(got.shape) - got).max())
        tol = K_FP32 * base + FLOOR_REL * (float(np.abs(ref).max()) or 1.0)
        errs[layout] = (err, tol)
        if err <= tol:
            m.layout = layout
            return err, tol
    err, tol = min(errs.values(), default=(float("nan"), float("nan")))
    with_bias = "" if m.bias is None else f", bias {tuple(m.bias.shape)}"
    raise MatchFailure(
        "numeric_equivalence",
        f"the region does not compute VeoAttention(num_heads={m.num_heads}, head_dim={m.head_dim}, "
        f"scale={scale:.6g}{with_bias}) on the seeded activations: max abs error {err:.3g} > tolerance "
        f"{tol:.3g}",
    )


def contained(graph: Any, m: AttentionMatch) -> None:
    inputs = [x for x, _, _ in m.projections[:1]] or m.sources
    check_contained(graph, {m.out.name: inputs}, m.core)


def replace(graph: Any, m: AttentionMatch, index: int) -> Any:
    """Rewire the region into one ``VeoAttention`` node (plus a packed projection for separate Q/K/V and
    transposes for sequence-first layouts); the old nodes go at the next cleanup."""
    import onnx_graphsurgeon as gs

    from veo_edge.surgery.spec import attention_spec

    name = f"veo_attention_{index}"
    dtype = m.out.dtype
    if m.projections:
        x = m.projections[0][0]
        w = np.concatenate([p[1] for p in m.projections], axis=1)
        b = np.concatenate([p[2] for p in m.projections])
        mm = gs.Variable(f"{name}/qkv_matmul", dtype=dtype)
        qkv = gs.Variable(f"{name}/qkv", dtype=dtype)
        graph.nodes.append(
            gs.Node(
                "MatMul", f"{name}/qkv_proj", inputs=[x, gs.Constant(f"{name}/qkv_weight", w)], outputs=[mm]
            )
        )
        graph.nodes.append(
            gs.Node(
                "Add", f"{name}/qkv_bias_add", inputs=[mm, gs.Constant(f"{name}/qkv_bias", b)], outputs=[qkv]
            )
        )
    else:
        qkv = m.sources[0]
    if m.layout == "SN":
        qkv_ns = gs.Variable(f"{name}/qkv_batch_first", dtype=dtype)
        graph.nodes.append(
            gs.Node("Transpose", f"{name}/to_batch_first", {"perm": [1, 0, 2]}, [qkv], [qkv_ns])
        )
        qkv = qkv_ns
    out_rank = len(m.out.shape)
    direct = m.layout == "NS" and out_rank == 3
    m.out.inputs.clear()
    y = m.out if direct else gs.Variable(f"{name}/out", dtype=dtype)
    inputs, version = [qkv], "1"
    if m.bias is not None:
        inputs.append(_shared_constant(graph, f"{name}/bias", m.bias))
        version = "2"
    node = attention_spec().make_node(
        inputs, [y], name=name, version=version, num_heads=m.num_heads, head_dim=m.head_dim, scale=m.scale
    )
    graph.nodes.append(node)
    if not direct:
        cur = y
        if m.layout == "SN":
            tr = m.out if out_rank == 3 else gs.Variable(f"{name}/out_seq_first", dtype=dtype)
            graph.nodes.append(gs.Node("Transpose", f"{name}/to_seq_first", {"perm": [1, 0, 2]}, [cur], [tr]))
            cur = tr
        if out_rank == 2:
            shape = gs.Constant(f"{name}/flat_shape", np.array([-1, m.embed_dim], dtype=np.int64))
            graph.nodes.append(gs.Node("Reshape", f"{name}/flatten", inputs=[cur, shape], outputs=[m.out]))
    return node


def _shared_constant(graph: Any, name: str, value: np.ndarray) -> Any:
    """A constant holding ``value``, the same object for every region whose bias is equal (BEiT's shared
    relative position bias stays one table)."""
    import onnx_graphsurgeon as gs

    key = (value.dtype.str, value.shape, value.tobytes())
    for t in graph.tensors().values():
        if isinstance(t, gs.Constant) and t.name.endswith("/bias") and t.name.startswith("veo_attention_"):
            v = np.asarray(t.values)
            if (v.dtype.str, v.shape, v.tobytes()) == key:
                return t
    return gs.Constant(name, value)


def describe(m: AttentionMatch) -> dict[str, Any]:
    return {
        "num_heads": m.num_heads,
        "head_dim": m.head_dim,
        "scale": m.scale,
        "qkv": "separate" if m.projections else "packed",
        "layout": m.layout,
        "bias": None if m.bias is None else list(m.bias.shape),
    }


__all__ = [
    "OP",
    "AttentionMatch",
    "anchors",
    "contained",
    "describe",
    "match",
    "numel_is_one",
    "replace",
    "verify",
    "wanted",
]
