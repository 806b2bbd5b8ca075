"""Find the patch embedding and replace it with one ``VeoPatchEmbedLayerNorm`` node.

An embedding-like region is anchored at a ``Conv``. It matches when the conv is a patchify (kernel =
stride, no padding, 2-D or 3-D), its output is flattened to tokens (N, L, E), optionally gets constant
prefix tokens concatenated in front and a constant position table added (before or after the prefix),
and, when the resulting residual stream feeds a LayerNormalization over the last axis with constant
weights, that LayerNorm becomes the node's second output. Like attention, the region must then compute
the op on the activations of a seeded run before it is replaced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from veo_edge.surgery.functions import PatchEmbedLayout
from veo_edge.surgery.graphutil import (
    MatchFailure,
    check_contained,
    const_value,
    data_consumers,
    producer,
    static_shape,
    walk_forward,
)

OP = "VeoPatchEmbedLayerNorm"


@dataclass
class PatchEmbedMatch:
    conv: Any
    x: Any
    weight: np.ndarray
    bias: np.ndarray
    prefix: np.ndarray | None  # (1, P, E)
    pos: np.ndarray | None  # (1, L or P+L, E)
    pos_covers: str
    tokens: Any  # the residual stream tensor
    ln: Any | None  # the LayerNormalization node
    ln_weight: np.ndarray | None
    ln_bias: np.ndarray | None
    epsilon: float
    core: list[Any]

    @property
    def patch_size(self) -> list[int]:
        return [int(d) for d in self.weight.shape[2:]]

    @property
    def layout(self) -> PatchEmbedLayout:
        return PatchEmbedLayout(
            num_prefix_tokens=0 if self.prefix is None else int(self.prefix.shape[1]),
            has_pos_embed=self.pos is not None,
            pos_covers=self.pos_covers,
            has_layernorm=self.ln is not None,
        )

    def attrs(self) -> dict[str, Any]:
        lay = self.layout
        return {
            "patch_size": self.patch_size,
            "in_channels": int(self.weight.shape[1]),
            "embed_dim": int(self.weight.shape[0]),
            "num_prefix_tokens": lay.num_prefix_tokens,
            "has_pos_embed": int(lay.has_pos_embed),
            "has_layernorm": int(lay.has_layernorm),
            "epsilon": self.epsilon,
        }


def anchors(graph: Any) -> list[Any]:
    return [n for n in graph.nodes if n.op == "Conv"]


def _prefix_const(t: Any) -> np.ndarray | None:
    """The constant a prefix-token input is broadcast from (through Expand/Tile/Identity/Cast)."""
    while True:
        v = const_value(t)
        if v is not None:
            return v
        n = producer(t)
        if n is None or n.op not in ("Expand", "Tile", "Identity", "Cast"):
            return None
        t = n.inputs[0]


def _prefix_tokens(t: Any, e: int) -> np.ndarray | None:
    """The (1, P, E) tokens a concatenated prefix input holds: its constant, broadcast to the input's
    token count (a class token stored as an (E,) or (1, E) vector and expanded to (N, 1, E))."""
    v = _prefix_const(t)
    shape = static_shape(t)
    if v is None or shape is None or len(shape) != 3 or shape[1] is None or v.ndim > 3:
        return v
    try:
        return np.broadcast_to(v, (1, shape[1], e)) if v.size in (e, shape[1] * e) else v
    except ValueError:
        return v


def match(graph: Any, conv: Any) -> PatchEmbedMatch:
    w = const_value(conv.inputs[1]) if len(conv.inputs) > 1 else None
    if w is None or w.ndim not in (4, 5):
        raise MatchFailure("patchify_conv", "the conv weight is not a constant 2-D or 3-D kernel")
    k = list(w.shape[2:])
    a = conv.attrs
    if list(a.get("kernel_shape", k)) != k or list(a.get("strides", [1] * len(k))) != k:
        raise MatchFailure(
            "patchify_conv", f"kernel {k} != stride {list(a.get('strides', []))}: not a patchify conv"
        )
    if any(a.get("pads", [0] * 2 * len(k))) or any(d != 1 for d in a.get("dilations", [1] * len(k))):
        raise MatchFailure("patchify_conv", "the conv has padding or dilation")
    if int(a.get("group", 1)) != 1 or a.get("auto_pad", "NOTSET") not in (
        "NOTSET",
        b"NOTSET",
        "VALID",
        b"VALID",
    ):
        raise MatchFailure("patchify_conv", "the conv is grouped or auto-padded")
    e = int(w.shape[0])
    bias = (
        const_value(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2].name else np.zeros(e, w.dtype)
    )
    if bias is None:
        raise MatchFailure("patchify_conv", "the conv bias is not a constant")
    conv_shape = static_shape(conv.outputs[0])
    if conv_shape is None or any(d is None for d in conv_shape[1:]):
        raise MatchFailure(
            "static_shapes", f"the patch grid is not static (conv output {conv.outputs[0].shape})"
        )
    num_patches = int(np.prod(conv_shape[2:]))
    core: list[Any] = [conv]
    t = walk_forward(conv.outputs[0], core)
    shape = static_shape(t)
    if shape is None or len(shape) != 3 or shape[1] not in (num_patches, None) or shape[2] not in (e, None):
        raise MatchFailure(
            "tokens_layout",
            f"the conv output is not flattened to tokens (N, {num_patches}, {e}); got {t.shape}",
        )
    prefix = pos = None
    pos_covers = ""
    while True:
        consumers = data_consumers(t)
        if len(consumers) != 1:
            break
        n = consumers[0]
        if n.op == "Add" and pos is None and len(n.inputs) == 2:
            other = n.inputs[1] if n.inputs[0] is t else n.inputs[0]
            v = const_value(other)
            tokens = num_patches + (0 if prefix is None else prefix.shape[1])
            if v is None or v.shape[-2:] != (tokens, e) or v.ndim > 3 or (v.ndim == 3 and v.shape[0] != 1):
                break
            pos, pos_covers = v.reshape(1, tokens, e), ("patches" if prefix is None else "all")
        elif (
            n.op == "Concat"
            and prefix is None
            and pos_covers != "all"
            and int(n.attrs.get("axis", 0)) in (1, -2)
        ):
            if n.inputs[-1] is not t:
                raise MatchFailure(
                    "prefix_tokens", "tokens are concatenated after the patch tokens, not before"
                )
            parts = [_prefix_tokens(i, e) for i in n.inputs[:-1]]
            if any(p is None or p.ndim != 3 or p.shape[0] != 1 or p.shape[2] != e for p in parts):
                raise MatchFailure(
                    "prefix_tokens", "a token concatenated before the patches is not a constant (1, p, E)"
                )
            prefix = np.concatenate(parts, axis=1)
            if prefix.shape[1] > 2:
                raise MatchFailure(
                    "prefix_tokens", f"{prefix.shape[1]} prefix tokens; the op supports 0, 1 or 2"
                )
        else:
            break
        core.append(n)
        t = n.outputs[0]
    ln = None
    ln_w = ln_b = None
    eps = 1e-6
    for c in t.outputs:
        if (
            c.op != "LayerNormalization"
            or c.inputs[0] is not t
            or int(c.attrs.get("axis", -1)) not in (-1, 2)
        ):
            continue
        ln_w = const_value(c.inputs[1])
        ln_b = const_value(c.inputs[2]) if len(c.inputs) > 2 and c.inputs[2].name else np.zeros(e, np.float32)
        if ln_w is not None and ln_b is not None and ln_w.shape == (e,) and ln_b.shape == (e,):
            ln, eps = c, float(c.attrs.get("epsilon", 1e-5))
            break
    return PatchEmbedMatch(
        conv, conv.inputs[0], w, bias, prefix, pos, pos_covers, t, ln, ln_w, ln_b, eps, core
    )


def wanted(m: PatchEmbedMatch) -> list[Any]:
    return [m.x, m.tokens] + ([m.ln.outputs[0]] if m.ln is not None else [])


def verify(m: PatchEmbedMatch, values: dict[str, np.ndarray], baseline: Any) -> tuple[float, float]:
    """``baseline(m, x)`` gives the op's float32 outputs (its function body in ONNX Runtime)."""
    from veo_edge.export.parity import FLOOR_REL, K_FP32
    from veo_edge.surgery import reference

    x = values[m.x.name]
    refs = reference.patch_embed_layernorm(
        x,
        m.weight,
        m.bias,
        m.prefix,
        m.pos,
        m.ln_weight,
        m.ln_bias,
        patch_size=m.patch_size,
        epsilon=m.epsilon,
    )
    gots = [values[m.tokens.name]] + ([values[m.ln.outputs[0].name]] if m.ln is not None else [])
    bases = baseline(m, x)
    worst = (0.0, 0.0)
    for ref, got, base in zip(refs, gots, bases, strict=False):
        err = float(np.abs(got.astype(np.float64) - ref).max())
        tol = K_FP32 * float(np.abs(base.astype(np.float64) - ref).max()) + FLOOR_REL * (
            float(np.abs(ref).max()) or 1.0
        )
        if err > tol:
            raise MatchFailure(
                "numeric_equivalence",
                f"the region does not compute VeoPatchEmbedLayerNorm on the seeded input: max abs error "
                f"{err:.3g} > tolerance {tol:.3g}",
            )
        worst = max(worst, (err, tol))
    return worst


def contained(graph: Any, m: PatchEmbedMatch) -> None:
    cut = {m.tokens.name: [m.x]}
    if m.ln is not None:
        cut[m.ln.outputs[0].name] = [m.x]
    check_contained(graph, cut, m.core + ([m.ln] if m.ln is not None else []))


def replace(graph: Any, m: PatchEmbedMatch, index: int) -> Any:
    import onnx_graphsurgeon as gs

    from veo_edge.surgery.spec import patch_embed_spec

    name = f"veo_patch_embed_{index}"
    dt = m.weight.dtype
    inputs = [m.x, gs.Constant(f"{name}/weight", m.weight), gs.Constant(f"{name}/bias", m.bias.astype(dt))]
    if m.prefix is not None:
        inputs.append(gs.Constant(f"{name}/prefix_tokens", m.prefix.astype(dt)))
    if m.pos is not None:
        inputs.append(gs.Constant(f"{name}/pos_embed", m.pos.astype(dt)))
    outputs = [m.tokens]
    if m.ln is not None:
        inputs += [
            gs.Constant(f"{name}/ln_weight", m.ln_weight.astype(dt)),
            gs.Constant(f"{name}/ln_bias", m.ln_bias.astype(dt)),
        ]
        outputs.append(m.ln.outputs[0])
    for t in outputs:
        t.inputs.clear()
    node = patch_embed_spec().make_node(inputs, outputs, name=name, **m.attrs())
    graph.nodes.append(node)
    return node


def describe(m: PatchEmbedMatch) -> dict[str, Any]:
    return {**m.attrs(), "pos_covers": m.pos_covers or None}
