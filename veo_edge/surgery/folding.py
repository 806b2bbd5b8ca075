"""Folding an ONNX model, the first and last pass of canonicalization (:mod:`veo_edge.surgery.canonical`):
Polygraphy's ``fold_constants`` on the dynamic-batch graph, onnx-graphsurgeon's folding on ONNX shapes
inferred with data propagation at a fully static input shape, and the small graph rewrites they need
(``Shape(x, start, end)`` as a ``Slice``, the exporter's value_info dropped, graphs exported like the
model they came from).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import onnx

FOLD_SIZE_LIMIT = 64 << 20  # bytes: larger folded constants are left as computations


def strip_value_info(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy without the exporter's intermediate shapes (often symbolic where they are static)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.value_info[:]
    return out


def explicit_shape_slices(model: onnx.ModelProto) -> onnx.ModelProto:
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
    return export_like(graph, model)


def as_exported_shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    out = {}
    for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]:
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            out[vi.name] = [int(d.dim_value) if d.HasField("dim_value") else None for d in tt.shape.dim]
    return out


def fold(model: onnx.ModelProto) -> onnx.ModelProto:
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


def fold_concrete(model: onnx.ModelProto, passes: int = 2) -> onnx.ModelProto:
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
        model = strip_value_info(export_like(graph, model))
        if len(model.graph.node) == before:
            break
    return model


def export_like(graph: Any, like: onnx.ModelProto) -> onnx.ModelProto:
    import onnx_graphsurgeon as gs

    out = gs.export_onnx(graph, do_type_check=False)
    out.ir_version = like.ir_version
    del out.opset_import[:]
    out.opset_import.extend(like.opset_import)
    out.producer_name, out.producer_version = like.producer_name, like.producer_version
    del out.graph.value_info[:]
    return out
