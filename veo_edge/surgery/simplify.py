"""The simplifications of canonicalization (:mod:`veo_edge.surgery.canonical`), on an onnx-graphsurgeon
graph whose shapes a :class:`~veo_edge.surgery.shapes.ShapeAnalysis` knows: no-op
``Cast``/``Identity``/``Dropout``/``Expand``/``Reshape``/``Transpose``, ``Add``/``Sub`` of an all-zero and
``Mul``/``Div`` by an all-one tensor that does not broadcast the other operand, ``Where`` on an all-true
or all-false condition, the dynamo exporter's NaN guard after an unmasked softmax, and ``Shape`` reads
of (N, static...) tensors rewritten to read the batch from the graph input. Decisions are by op types,
attributes, constant values and shapes, never by node names.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import numpy as np

from veo_edge.surgery.shapes import ANALYSIS_BATCHES, ShapeAnalysis


def simplify(graph: Any, shapes: ShapeAnalysis, removed: Counter) -> bool:
    uniform = _Uniform()
    changed = False
    for node in list(graph.nodes):
        src = _noop_source(node, shapes, uniform)
        if src is not None and _bypass(graph, node, src):
            removed[f"no-op {node.op}"] += 1
            changed = True
        elif node.op == "Shape" and _static_shape_read(graph, node, shapes):
            removed["Shape read of a static tensor"] += 1
            changed = True
    return changed


def _noop_source(node: Any, shapes: ShapeAnalysis, uniform: _Uniform) -> Any | None:
    """The input ``node``'s first output equals, element for element and in shape, or None."""
    op, ins = node.op, node.inputs
    if not ins or not node.outputs or not ins[0].name:
        return None
    out = node.outputs[0]
    same = shapes.same_shape(ins[0].name, out.name)
    if op == "Identity":
        return ins[0]
    if op == "Dropout":
        training = ins[2] if len(ins) > 2 and ins[2].name else None
        if len(node.outputs) > 1 and node.outputs[1].outputs:
            return None
        if training is not None and bool(uniform.value(training)) is not False:
            return None
        return ins[0]
    if op == "Cast":
        to = int(node.attrs.get("to", 0))
        return ins[0] if to and shapes.dtype(ins[0].name) == to else None
    if op == "CastLike" and len(ins) == 2:
        d = shapes.dtype(ins[1].name)
        return ins[0] if d and shapes.dtype(ins[0].name) == d else None
    if op in ("Expand", "Reshape", "Tile") and same:
        return ins[0]
    if op == "Transpose" and list(node.attrs.get("perm", [])) == list(range(len(out.shape or []))):
        return ins[0] if same else None
    if op in ("Add", "Sub", "Mul", "Div") and len(ins) == 2:
        neutral = 0.0 if op in ("Add", "Sub") else 1.0
        order = ((0, 1), (1, 0)) if op in ("Add", "Mul") else ((0, 1),)
        for keep, drop in order:
            v = uniform.value(ins[drop])
            if (
                v is not None
                and float(v) == neutral
                and shapes.same_shape(ins[keep].name, out.name)
                and shapes.dtype(ins[keep].name) == shapes.dtype(out.name)
            ):
                return ins[keep]
        return None
    if op == "Where" and len(ins) == 3:
        if _nan_guard_of_plain_softmax(node, uniform):
            return ins[2]
        c = uniform.value(ins[0])
        if c is None:
            return None
        pick = ins[1] if bool(c) else ins[2]
        return pick if shapes.same_shape(pick.name, out.name) else None
    return None


def _nan_guard_of_plain_softmax(node: Any, uniform: _Uniform) -> bool:
    """``Where(IsNaN(p), 0, p)`` with ``p = Softmax(scale * (q @ k))``: the dynamo exporter's guard for
    rows that a mask made all ``-inf``. Without a mask no row is, and only a NaN already in the input
    would differ (to NaN from 0)."""
    cond, zero, p = node.inputs
    guard = cond.inputs[0] if cond.inputs else None
    if guard is None or guard.op != "IsNaN" or guard.inputs[0] is not p or uniform.value(zero) != 0:
        return False
    softmax = p.inputs[0] if p.inputs else None
    if softmax is None or softmax.op != "Softmax":
        return False
    t = softmax.inputs[0]
    while t.inputs and t.inputs[0].op in ("Mul", "Div", "Cast"):
        n = t.inputs[0]
        t = n.inputs[0] if n.op == "Cast" or uniform.value(n.inputs[1]) is not None else n.inputs[1]
    return bool(t.inputs) and t.inputs[0].op == "MatMul"


def _bypass(graph: Any, node: Any, src: Any) -> bool:
    """Make every reader of ``node``'s output read ``src`` instead; False where the output is a graph
    output (its name is part of the model's interface)."""
    out = node.outputs[0]
    if any(o is g for o in node.outputs for g in graph.outputs):
        return False
    _replace_tensor(out, src)
    node.outputs.clear()
    node.inputs.clear()
    return True


def _static_shape_read(graph: Any, node: Any, shapes: ShapeAnalysis) -> bool:
    """Rewrite ``Shape(t)`` of a (N, static...) or fully static tensor so it no longer reads ``t``: a
    constant, or the graph input's batch concatenated with the static dims."""
    import onnx_graphsurgeon as gs

    t = node.inputs[0]
    if t.__class__.__name__ == "Constant" or not node.outputs:
        return False
    concrete = shapes.concrete(t.name)
    if concrete is None or len({len(s) for s in concrete}) != 1:
        return False
    rank = len(concrete[0])
    start = int(node.attrs.get("start", 0))
    end = int(node.attrs.get("end", rank)) if "end" in node.attrs else rank
    start, end = (max(0, min(rank, i + rank if i < 0 else i)) for i in (start, end))
    picked = [list(s[start:end]) for s in concrete]
    varying = [i for i in range(len(picked[0])) if len({p[i] for p in picked}) > 1]
    out = node.outputs[0]
    name = out.name
    if not varying:
        const = gs.Constant(f"{name}/static", np.array(picked[0], dtype=np.int64))
        _replace_tensor(out, const)
        return True
    inp = next((i for i in graph.inputs if i.name == shapes.input), None)
    if inp is None or t is inp or varying != [0] or start != 0:
        return False
    batches = [p[0] for p in picked]
    if batches != list(ANALYSIS_BATCHES):
        return False  # a dim that is a multiple of the batch, not the batch itself
    full = gs.Variable(f"{name}/input_shape", dtype=np.int64, shape=[len(inp.shape or concrete[0])])
    graph.nodes.append(gs.Node("Shape", f"{name}/input_shape", inputs=[inp], outputs=[full]))
    batch = gs.Variable(f"{name}/batch", dtype=np.int64, shape=[1])
    first = [
        gs.Constant(f"{name}/{k}", np.array([v], dtype=np.int64)) for k, v in (("s", 0), ("e", 1), ("a", 0))
    ]
    graph.nodes.append(gs.Node("Slice", f"{name}/input_batch", inputs=[full, *first], outputs=[batch]))
    rest = gs.Constant(f"{name}/static_dims", np.array(picked[0][1:], dtype=np.int64))
    new = gs.Variable(f"{name}/canonical", dtype=np.int64, shape=[len(picked[0])])
    graph.nodes.append(gs.Node("Concat", f"{name}/concat", {"axis": 0}, [batch, rest], [new]))
    _replace_tensor(out, new)
    return True


def _replace_tensor(old: Any, new: Any) -> None:
    for consumer in list(old.outputs):
        for i, t in enumerate(consumer.inputs):
            if t is old:
                consumer.inputs[i] = new
    old.inputs.clear()


class _Uniform:
    """Tensors every element of which is one known value, even when their shape follows the batch:
    constants, ``ConstantOfShape``, and broadcasts, casts and elementwise arithmetic of them."""

    PASS = frozenset(
        {"Expand", "Tile", "Reshape", "Identity", "Unsqueeze", "Squeeze", "Transpose", "Flatten"}
    )
    BINARY: ClassVar[dict[str, Any]] = {
        "Add": np.add,
        "Sub": np.subtract,
        "Mul": np.multiply,
        "Div": np.divide,
        "And": np.logical_and,
        "Or": np.logical_or,
        "Equal": np.equal,
    }

    def __init__(self) -> None:
        self._memo: dict[str, Any] = {}

    def value(self, t: Any) -> Any | None:
        if not t.name:
            return None
        if t.name not in self._memo:
            self._memo[t.name] = None  # cycles cannot happen in a DAG, but guard re-entry anyway
            self._memo[t.name] = self._compute(t)
        return self._memo[t.name]

    def _compute(self, t: Any) -> Any | None:
        import onnx
        import onnx_graphsurgeon as gs

        if isinstance(t, gs.Constant):
            v = np.asarray(t.values)
            return v.reshape(-1)[0] if v.size and np.all(v == v.reshape(-1)[0]) else None
        if not t.inputs:
            return None
        n = t.inputs[0]
        if n.op == "Constant" and "value" in n.attrs:
            v = n.attrs["value"]
            v = np.asarray(v.values if isinstance(v, gs.Constant) else v)
            return v.reshape(-1)[0] if v.size and np.all(v == v.reshape(-1)[0]) else None
        if n.op == "ConstantOfShape":
            v = n.attrs.get("value")
            return np.float32(0) if v is None else np.asarray(v.values).reshape(-1)[0]
        if n.op in self.PASS and n.inputs:
            return self.value(n.inputs[0])
        if n.op == "Cast":
            v = self.value(n.inputs[0])
            to = onnx.helper.tensor_dtype_to_np_dtype(int(n.attrs["to"]))
            return None if v is None else np.asarray(v).astype(to)[()]
        if n.op == "Not":
            v = self.value(n.inputs[0])
            return None if v is None else np.logical_not(v)
        if n.op == "Neg":
            v = self.value(n.inputs[0])
            return None if v is None else -v
        if n.op in self.BINARY and len(n.inputs) == 2:
            a, b = (self.value(i) for i in n.inputs)
            if a is None or b is None:
                return None
            with np.errstate(all="ignore"):
                return self.BINARY[n.op](np.asarray(a), np.asarray(b))[()]
        if n.op == "Where" and len(n.inputs) == 3:
            c = self.value(n.inputs[0])
            if c is None:
                return None
            return self.value(n.inputs[1] if bool(c) else n.inputs[2])
        return None
