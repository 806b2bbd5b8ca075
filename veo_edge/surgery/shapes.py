"""Shapes and element types of every tensor of a dynamic-batch model, found by folding it at its static
input dims and each of :data:`ANALYSIS_BATCHES` and inferring shapes on the result: a dim that differs
between the batches follows the batch. The simplifications of :mod:`veo_edge.surgery.simplify` decide
on these shapes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from veo_edge.surgery.folding import fold_concrete, strip_value_info

if TYPE_CHECKING:
    import onnx

#: the concrete batches shapes are inferred at; a dim that differs between them follows the batch
ANALYSIS_BATCHES = (2, 3)


class ShapeAnalysis:
    """Shapes and element types of every tensor at the static input dims and each of
    :data:`ANALYSIS_BATCHES`: the model is folded at that concrete input shape (so every shape computation
    becomes a constant) and ONNX shape inference with data propagation runs on the result. Folding keeps
    tensor names, so the shapes apply to the dynamic-batch graph too."""

    def __init__(self, model: onnx.ModelProto, input_shape: tuple[int, ...]) -> None:
        self.runs = [infer_at(model, (b, *input_shape)) for b in ANALYSIS_BATCHES]
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


def infer_at(model: onnx.ModelProto, shape: tuple[int, ...]) -> tuple[dict[str, list[int]], dict[str, int]]:
    import onnx

    m = onnx.ModelProto()
    m.CopyFrom(model)
    dims = m.graph.input[0].type.tensor_type.shape.dim
    del dims[:]
    for d in shape:
        dims.add().dim_value = int(d)
    m = fold_concrete(strip_value_info(m))
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
