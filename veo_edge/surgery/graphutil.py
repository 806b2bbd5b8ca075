"""Small onnx-graphsurgeon helpers the matchers share: constants, shapes, layout walks and liveness.

Matching is by op types, attributes, constants and shapes only; node names appear in reports, never in
a decision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: ops that only move or regroup elements (the reshapes and transposes around attention)
LAYOUT_OPS = frozenset(
    {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Gather", "Split", "Slice", "Identity", "Flatten"}
)


class MatchFailure(Exception):
    """A region looked like an op but failed one check; ``check`` names it for the report."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"{check}: {detail}")
        self.check = check
        self.detail = detail


def producer(t: Any) -> Any | None:
    return t.inputs[0] if len(t.inputs) else None


def const_value(t: Any) -> np.ndarray | None:
    """The value of an initializer or a ``Constant`` node's output, else None."""
    import onnx_graphsurgeon as gs

    if isinstance(t, gs.Constant):
        return np.asarray(t.values)
    p = producer(t)
    if p is not None and p.op == "Constant" and "value" in p.attrs:
        v = p.attrs["value"]
        return np.asarray(v.values if isinstance(v, gs.Constant) else v)
    return None


def static_shape(t: Any) -> list[int | None] | None:
    """The tensor's inferred shape, with None for symbolic dims; None when the rank is unknown."""
    if t.shape is None:
        return None
    return [d if isinstance(d, int) and d >= 0 else None for d in t.shape]


def numel_is_one(t: Any) -> bool:
    v = const_value(t)
    if v is not None:
        return v.size == 1
    shape = static_shape(t)
    return shape is not None and all(d == 1 for d in shape)


def data_consumers(t: Any) -> list[Any]:
    """Consumers of ``t`` other than ``Shape`` (which reads only its shape)."""
    return [n for n in t.outputs if n.op != "Shape"]


def walk_back(t: Any, nodes: list[Any], factors: list[tuple[Any, bool]]) -> Any:
    """Follow ``t`` up through layout ops and scalar multiplies/divides to the tensor they start from.

    The visited nodes go to ``nodes``; each scalar factor to ``factors`` as (tensor, is_divisor)."""
    while True:
        n = producer(t)
        if n is None or not n.inputs:
            return t
        if n.op in LAYOUT_OPS:
            nodes.append(n)
            t = n.inputs[0]
        elif n.op in ("Mul", "Div") and len(n.inputs) == 2:
            a, b = n.inputs
            if numel_is_one(b) and not numel_is_one(a):
                factors.append((b, n.op == "Div"))
            elif n.op == "Mul" and numel_is_one(a) and not numel_is_one(b):
                factors.append((a, False))
                a = b
            else:
                return t
            nodes.append(n)
            t = a
        else:
            return t


def walk_forward(
    t: Any, nodes: list[Any], ops: frozenset[str] = frozenset({"Transpose", "Reshape", "Flatten"})
) -> Any:
    """Follow ``t`` down through a chain of single-consumer layout ops; returns the last tensor."""
    while True:
        consumers = data_consumers(t)
        if len(consumers) != 1 or consumers[0].op not in ops or consumers[0].inputs[0] is not t:
            return t
        nodes.append(consumers[0])
        t = consumers[0].outputs[0]


def live_node_ids(graph: Any, cut: dict[str, list[Any]]) -> set[int]:
    """Ids of the nodes still needed for the graph outputs once each tensor named in ``cut`` is computed
    from the listed tensors instead of its producer (the replacement under consideration)."""
    live: set[int] = set()
    seen: set[str] = set()
    stack = list(graph.outputs)
    while stack:
        t = stack.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        if t.name in cut:
            stack.extend(cut[t.name])
            continue
        n = producer(t)
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        stack.extend(i for i in n.inputs if i.name)
    return live


def check_contained(graph: Any, cut: dict[str, list[Any]], core: list[Any]) -> None:
    """Raise unless every ``core`` node becomes dead after the replacement: otherwise something outside
    the region still uses its intermediate results and fusing would compute them twice."""
    live = live_node_ids(graph, cut)
    used = [n for n in core if id(n) in live]
    if used:
        raise MatchFailure(
            "contained",
            f"an intermediate result of the region ({used[0].op} {used[0].name!r}) is used outside it",
        )
