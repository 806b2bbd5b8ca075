"""Canonicalize an exported ViT before matching: the same computation with the exporters' noise removed.

    canon = Canonicalize(input_shape=(3, 224, 224))(onnx.load("model.onnx"))
    canon.model    # folded and simplified; the batch axis stays dynamic
    canon.shapes   # tensor name -> shape, None for the dims that follow the batch
    canon.removed  # what each pass took out, for the report

What people ship reaches the matcher through patterns that compute nothing: a float ``Cast`` on a float
tensor (``softmax(x, dtype=float32).to(dtype)``), ``Identity`` around de-duplicated initializers,
``Dropout`` at inference, an ``Expand`` to the shape a tensor already has, an attention mask that is
always zero (``Where(Expand(<all true>), 0, -3.4e38)`` added before the softmax), position tables
resized to the size they already have, and ``Shape`` reads of tensors whose shape is static. The passes:

1. constant folding (Polygraphy's ``fold_constants``: onnx-graphsurgeon with ONNX Runtime, with shape
   inference and partial folding of ``Shape`` reads between passes);
2. our own simplifications, on shapes inferred (with data propagation) at the build's static dims and two
   concrete batches, so that a dim which changes with the batch is known as such: no-op
   ``Cast``/``Identity``/``Dropout``/``Expand``/``Reshape``/``Transpose``, ``Add``/``Sub`` of an all-zero and
   ``Mul``/``Div`` by an all-one tensor that does not broadcast the other operand, ``Where`` on an
   all-true or all-false condition, the dynamo exporter's NaN guard after an unmasked softmax, and ``Shape`` reads of (N, static...) tensors rewritten to read the
   batch from the graph input;
3. dead-node cleanup, then folding again until nothing changes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    import onnx

#: the concrete batches shapes are inferred at; a dim that differs between them follows the batch
ANALYSIS_BATCHES = (2, 3)
FOLD_SIZE_LIMIT = 64 << 20  # bytes: larger folded constants are left as computations
MAX_ROUNDS = 3


@dataclass
class Canonical:
    model: onnx.ModelProto
    shapes: dict[str, list[int | None]]  # None for a dim that follows the batch
    removed: dict[str, int] = field(default_factory=dict)  # pass -> nodes it took out

    def node_count(self) -> int:
        return len(self.model.graph.node)


@dataclass(frozen=True)
class Canonicalize:
    """Canonicalize a model with one input of ``input_shape`` (without its dynamic batch axis)."""

    input_shape: tuple[int, ...]
    enabled: bool = True  # False: the model as exported, with the shapes ONNX infers for it

    def __call__(self, model: onnx.ModelProto) -> Canonical:
        import onnx_graphsurgeon as gs

        if not self.enabled:
            return Canonical(model, _as_exported_shapes(model))
        removed: Counter = Counter()
        current = _explicit_shape_slices(_strip_value_info(model))
        typed = None
        for _ in range(MAX_ROUNDS):
            before = len(current.graph.node)
            current = _fold(current)
            removed["constant folding"] += max(0, before - len(current.graph.node))
            # folding keeps tensor names, and the simplifications only remove tensors: one analysis,
            # on the graph folded once (smaller than the export), serves every round
            typed = typed or _ShapeAnalysis(current, self.input_shape)
            graph = gs.import_onnx(current)
            typed.annotate(graph)
            changed = _simplify(graph, typed, removed)
            graph.cleanup(remove_unused_graph_inputs=False).toposort()
            current = _export(graph, model)
            if not changed:
                break
        return Canonical(current, typed.merged(), dict(removed))


def _strip_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without the exporter's intermediate shapes (often symbolic where they are static)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    return out


def _explicit_shape_slices(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Shape(x, start, end)`` (opset 15) as ``Slice(Shape(x), start, end)``: onnx-graphsurgeon's shape
    folding (0.6) ignores the two attributes and would fold the whole shape in their place."""
    import onnx_graphsurgeon as gs

    graph = gs.import_onnx(model)
    changed = False
    for node in list(graph.nodes):
        if node.op != "Shape" or not ({"start", "end"} & set(node.attrs)):
            continue
        start = int(node.attrs.pop("start", 0))
        end = node.attrs.pop("end", None)
        out = node.outputs[0]
        full = gs.Variable(f"{out.name}/full", dtype=np.int64)
        node.outputs = [full]
        limit = np.iinfo(np.int64).max if end is None else int(end)
        consts = [
            gs.Constant(f"{out.name}/{k}", np.array([v], dtype=np.int64))
            for k, v in (("start", start), ("end", limit), ("axes", 0))
        ]
        graph.nodes.append(gs.Node("Slice", f"{node.name}/slice", inputs=[full, *consts], outputs=[out]))
        changed = True
    if not changed:
        return model
    graph.toposort()
    return _export(graph, model)


def _as_exported_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    out = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            out[vi.name] = [int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim]
    return out


def _fold(model: onnx.ModelProto) -> onnx.ModelProto:
    import onnxruntime as ort
    from polygraphy.backend.onnx import fold_constants
    from polygraphy.logger import G_LOGGER

    ort.set_default_logger_severity(3)  # the folding sessions' optimizer notes are not for users

    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):  # a subgraph it cannot fold is left as it is
        return fold_constants(
            model,
            num_passes=None,
            do_shape_inference=True,
            fold_shapes=True,
            partitioning=None,  # "basic" retries failing subgraphs piecewise: 5x slower on vit-tiny
            error_ok=True,
            size_threshold=FOLD_SIZE_LIMIT,
            allow_onnxruntime_shape_inference=False,
        )


def _fold_concrete(model: onnx.ModelProto, passes: int = 2) -> onnx.ModelProto:
    """Fold a model whose input shape is fully static, so every shape computation becomes a constant:
    onnx-graphsurgeon's folding on ONNX shapes inferred with data propagation (Polygraphy's loader,
    which infers without it, leaves some of these chains unfolded)."""
    import onnx
    import onnx_graphsurgeon as gs
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    for _ in range(passes):
        try:
            model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except onnx.shape_inference.InferenceError:
            model = onnx.shape_inference.infer_shapes(model)
        graph = gs.import_onnx(model)
        before = len(graph.nodes)
        graph.fold_constants(fold_shapes=True, error_ok=True, size_threshold=FOLD_SIZE_LIMIT)
        graph.cleanup(remove_unused_graph_inputs=False).toposort()
        model = _strip_value_info(_export(graph, model))
        if len(model.graph.node) == before:
            break
    return model


def _export(graph: Any, like: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_graphsurgeon as gs

    out = gs.export_onnx(graph, do_type_check=False)
    out.ir_version = like.ir_version
    del out.opset_import[:]
    out.opset_import.extend(like.opset_import)
    out.producer_name, out.producer_version = like.producer_name, like.producer_version
    del out.graph.value_info[:]
    return out


class _ShapeAnalysis:
    """Shapes and element types of every tensor at the static input dims and each of
    :data:`ANALYSIS_BATCHES`: the model is folded at that concrete input shape (so every shape computation
    becomes a constant) and ONNX shape inference with data propagation runs on the result. Folding keeps
    tensor names, so the shapes apply to the dynamic-batch graph too."""

    def __init__(self, model: onnx.ModelProto, input_shape: tuple[int, ...]) -> None:
        self.runs = [_infer(model, (b, *input_shape)) for b in ANALYSIS_BATCHES]
        self.input = model.graph.input[0].name

    def concrete(self, name: str) -> list[list[int]] | None:
        """The tensor's shape at each analysis batch; None where any is unknown."""
        shapes = [r[0].get(name) for r in self.runs]
        return None if any(s is None for s in shapes) else shapes

    def same_shape(self, a: str, b: str) -> bool:
        sa, sb = self.concrete(a), self.concrete(b)
        return sa is not None and sa == sb

    def dtype(self, name: str) -> int | None:
        return self.runs[0][1].get(name)

    def merged(self) -> dict[str, list[int | None]]:
        out = {}
        for name in self.runs[0][0]:
            shapes = self.concrete(name)
            if shapes is not None and len({len(s) for s in shapes}) == 1:
                out[name] = [
                    d if len(set(ds)) == 1 else None for d, *ds in zip(shapes[0], *shapes, strict=True)
                ]
        return out

    def annotate(self, graph: Any) -> None:
        """Set each variable's shape (``"batch"`` for the dims that follow it) and dtype on ``graph``."""
        import onnx

        merged = self.merged()
        for t in graph.tensors().values():
            if t.__class__.__name__ != "Variable" or not t.name:
                continue
            if t.name in merged:
                t.shape = ["batch" if d is None else d for d in merged[t.name]]
            dt = self.dtype(t.name)
            if dt:
                t.dtype = onnx.helper.tensor_dtype_to_np_dtype(dt)


def _infer(model: onnx.ModelProto, shape: tuple[int, ...]) -> tuple[dict[str, list[int]], dict[str, int]]:
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    dims = m.graph.input[0].type.tensor_type.shape.dim
    del dims[:]
    for d in shape:
        dims.add().dim_value = int(d)
    m = _fold_concrete(_strip_value_info(m))
    try:
        m = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except onnx.shape_inference.InferenceError:
        m = onnx.shape_inference.infer_shapes(m, data_prop=False)
    shapes, types = {}, {}
    for vi in [*m.graph.input, *m.graph.value_info, *m.graph.output]:
        tt = vi.type.tensor_type
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[vi.name] = [int(d.dim_value) for d in tt.shape.dim]
    for init in m.graph.initializer:
        shapes[init.name] = list(init.dims)
        types[init.name] = init.data_type
    return shapes, types


# --- the simplifications ------------------------------------------------------------------------------


def _simplify(graph: Any, shapes: _ShapeAnalysis, removed: Counter) -> bool:
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


def _noop_source(node: Any, shapes: _ShapeAnalysis, uniform: _Uniform) -> Any | None:
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


def _static_shape_read(graph: Any, node: Any, shapes: _ShapeAnalysis) -> bool:
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
