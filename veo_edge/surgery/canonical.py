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

1. constant folding (:mod:`veo_edge.surgery.folding`: Polygraphy's ``fold_constants``, onnx-graphsurgeon
   with ONNX Runtime, with shape inference and partial folding of ``Shape`` reads between passes);
2. our own simplifications (:mod:`veo_edge.surgery.simplify`), on shapes inferred with data propagation at
   the build's static dims and two concrete batches (:mod:`veo_edge.surgery.shapes`), so that a dim which
   changes with the batch is known as such: no-op ``Cast``/``Identity``/``Dropout``/``Expand``/``Reshape``/
   ``Transpose``, arithmetic with a neutral constant, ``Where`` on a constant condition, the dynamo
   exporter's NaN guard after an unmasked softmax, and ``Shape`` reads of (N, static...) tensors
   rewritten to read the batch from the graph input;
3. dead-node cleanup, then folding again until nothing changes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from veo_edge.surgery.folding import (
    as_exported_shapes,
    explicit_shape_slices,
    export_like,
    fold,
    strip_value_info,
)
from veo_edge.surgery.shapes import ShapeAnalysis
from veo_edge.surgery.simplify import simplify

if TYPE_CHECKING:
    import onnx

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
            return Canonical(model, as_exported_shapes(model))
        removed: Counter = Counter()
        current = explicit_shape_slices(strip_value_info(model))
        typed = None
        for _ in range(MAX_ROUNDS):
            before = len(current.graph.node)
            current = fold(current)
            removed["constant folding"] += max(0, before - len(current.graph.node))
            # folding keeps tensor names, and the simplifications only remove tensors: one analysis,
            # on the graph folded once (smaller than the export), serves every round
            typed = typed or ShapeAnalysis(current, self.input_shape)
            graph = gs.import_onnx(current)
            typed.annotate(graph)
            changed = simplify(graph, typed, removed)
            graph.cleanup(remove_unused_graph_inputs=False).toposort()
            current = export_like(graph, model)
            if not changed:
                break
        return Canonical(current, typed.merged(), dict(removed))
