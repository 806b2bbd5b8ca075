"""The additive bias of an attention region: what reaches the scores between ``Q·Kᵀ`` and the softmax.

Relative position biases (BEiT, Data2Vec-vision, Swin), Swin's shifted-window masks and SDPA's float
``attn_mask`` (the opset-23 ``Attention`` op's too) are added to the scaled scores. The exporters emit them
as a constant, a ``Gather`` from a constant table, a sum of those with a mask, and, where the mask follows
the batch of windows, an ``Expand``/``Reshape`` whose target shape is read with ``Shape``. What they have in
common, and what is checked here, is that the term depends on constants and tensor shapes only, never on
the input's values (:class:`DataFree`). Its value is then read from the seeded run and reduced to the
smallest table the op takes (:func:`materialize`): ``(B, 1|H, S, S)`` with attention batch ``n`` reading row
``n mod B``. Anything else that reaches the scores is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from veo_edge.surgery.graphutil import MatchFailure, const_value, numel_is_one, producer

#: ops that read only their input's shape
_SHAPE_READS = frozenset({"Shape", "Size"})
#: ops whose output is not a function of their inputs (never a bias the op may bake in)
_NONDETERMINISTIC = ("Random", "Bernoulli", "Multinomial")


@dataclass
class BiasTerm:
    tensor: Any  # the operand added to the scores
    factors: int  # how many of the region's scale factors (the first ones found) multiply it
    boolean: bool = False  # a boolean attn_mask (True keeps a key), as the ONNX Attention op takes


class DataFree:
    """Whether a tensor is computed from constants and tensor shapes only (memoized per graph)."""

    def __init__(self) -> None:
        self._memo: dict[int, bool] = {}

    def __call__(self, t: Any) -> bool:
        stack = [t]
        while stack:
            cur = stack[-1]
            if id(cur) in self._memo:
                stack.pop()
                continue
            known = self._leaf(cur)
            if known is not None:
                self._memo[id(cur)] = known
                stack.pop()
                continue
            inputs = [i for i in producer(cur).inputs if i.name]
            pending = [i for i in inputs if id(i) not in self._memo]
            if pending:
                stack.extend(pending)
                continue
            self._memo[id(cur)] = all(self._memo[id(i)] for i in inputs)
            stack.pop()
        return self._memo[id(t)]

    @staticmethod
    def _leaf(t: Any) -> bool | None:
        if const_value(t) is not None:
            return True
        n = producer(t)
        if n is None:
            return False  # a graph input
        if n.op in _SHAPE_READS:
            return True
        if n.op.startswith(_NONDETERMINISTIC) or any(
            a.__class__.__name__ == "Graph" for a in n.attrs.values()
        ):
            return False  # random values, or a subgraph (If/Loop/Scan) this walk does not enter
        return None


def peel(
    t: Any, nodes: list[Any], factors: list[tuple[Any, bool]], free: DataFree
) -> tuple[Any, list[BiasTerm]]:
    """Walk up from the softmax input through additive terms and scalar multiplies/divides; returns the
    tensor the scores come from and the terms added on the way. A term found after ``k`` factors is
    multiplied by those ``k`` (``softmax((QKᵀ + b)·s)`` adds ``b·s``)."""
    terms: list[BiasTerm] = []
    while True:
        n = producer(t)
        if n is None or len(n.inputs) != 2:
            return t, terms
        a, b = n.inputs
        if n.op == "Add":
            fa, fb = free(a), free(b)
            if fa == fb:
                if fa:
                    raise MatchFailure(
                        "scores_matmul", "the softmax reads a sum of constants, not Q·Kᵀ plus a bias"
                    )
                other = b if _reaches_matmul(a) else a  # name the operand that is not the scores
                raise MatchFailure(
                    "input_bias",
                    f"the term added to the scores before the softmax ({_origin(other)}) depends on the "
                    "input's values, not on constants and shapes only",
                )
            bias, t = (a, b) if fa else (b, a)
            terms.append(BiasTerm(bias, len(factors)))
            nodes.append(n)
        elif n.op in ("Mul", "Div") and numel_is_one(b) and not numel_is_one(a):
            factors.append((b, n.op == "Div"))
            nodes.append(n)
            t = a
        elif n.op == "Mul" and numel_is_one(a) and not numel_is_one(b):
            factors.append((a, False))
            nodes.append(n)
            t = b
        else:
            return t, terms


def _reaches_matmul(t: Any, depth: int = 8) -> bool:
    """Whether ``t`` comes from a MatMul within a few nodes (the scores side of an Add)."""
    for _ in range(depth):
        n = producer(t)
        if n is None or not n.inputs:
            return False
        if n.op == "MatMul":
            return True
        t = n.inputs[0]
    return False


def _origin(t: Any) -> str:
    n = producer(t)
    return "a graph input" if n is None else f"{n.op} {n.name!r}"


def attention_op_mask(anchor: Any, free: DataFree) -> list[BiasTerm]:
    """The ``attn_mask`` of an ONNX ``Attention`` op as a bias term (none when absent)."""
    mask = anchor.inputs[3] if len(anchor.inputs) > 3 and anchor.inputs[3].name else None
    if mask is None:
        return []
    if not free(mask):
        raise MatchFailure(
            "input_bias",
            f"the Attention op's attn_mask ({_origin(mask)}) depends on the input's values, not on "
            "constants and shapes only",
        )
    return [BiasTerm(mask, 0, boolean=mask.dtype == np.bool_ or str(mask.dtype) == "bool")]


def materialize(
    terms: list[BiasTerm],
    factor_values: list[float],
    values: dict[str, np.ndarray],
    *,
    batch: int,
    num_heads: int,
    seq: int,
    dtype: Any = np.float32,
) -> np.ndarray:
    """The bias the op takes, ``(B, 1|H, S, S)`` in ``dtype`` with values clamped to its finite range,
    from the terms' values on the seeded run (``batch`` attention batches of ``num_heads`` heads).

    ``factor_values[i]`` is the multiplier of the region's i-th scale factor (1/f for a divisor). ``B``
    is the shortest period of the bias over the attention batch: 1 when every batch adds the same, the
    number of windows of an image for Swin's masks; a bias that differs between the images of the batch
    is refused."""
    if not terms:
        raise ValueError("materialize needs at least one bias term")
    total: np.ndarray | None = None
    for term in terms:
        v = const_value(term.tensor)
        v = values[term.tensor.name] if v is None else v
        v = np.asarray(v)
        if term.boolean:
            v = np.where(v, 0.0, float(np.finfo(dtype).min))
        v = v.astype(np.float64) * float(np.prod(factor_values[: term.factors]))
        if v.ndim > 4:
            raise MatchFailure("bias_shape", f"an additive term has rank {v.ndim} ({v.shape}), expected <= 4")
        total = v if total is None else total + v
    total = total.reshape((1,) * (4 - total.ndim) + total.shape)
    b, hb, s1, s2 = total.shape
    if b not in (1, batch) or hb not in (1, num_heads) or s1 not in (1, seq) or s2 not in (1, seq):
        raise MatchFailure(
            "bias_shape",
            f"the bias has shape {total.shape}; expected it to broadcast as (1 or the attention batch "
            f"{batch}, 1 or {num_heads} heads, {seq}, {seq})",
        )
    total = np.broadcast_to(total, (b, hb, seq, seq))
    period = _period(total)
    if b > 1 and period == b:
        raise MatchFailure(
            "bias_shape",
            f"the bias differs for every one of the {b} attention batches of the seeded run (two images): it "
            "does not repeat per image, so it cannot be a constant table",
        )
    lowest = float(np.finfo(dtype).min)
    return np.ascontiguousarray(np.maximum(total[:period], lowest).astype(dtype))


def _period(x: np.ndarray) -> int:
    """The shortest p dividing len(x) with x[n] == x[n mod p] for every n."""
    n = x.shape[0]
    for p in range(1, n + 1):
        if n % p == 0 and all(np.array_equal(x[i], x[i % p]) for i in range(p, n)):
            return p
    return n
