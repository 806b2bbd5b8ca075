"""The server's side of a request: parse and check an infer request body (JSON tensors, or a JSON header
followed by Triton's binary tensor data) against the model, as a pure function over bytes so that the
parser can be fuzzed without a server.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from veo_edge.serve.protocol.spec import (
    DATATYPES,
    InferRequest,
    ModelSpec,
    ProtocolError,
    RequestedOutput,
    ShmInput,
    TensorSpec,
    decode_json,
    expect,
    shm_input,
    shm_ref,
)


def _check_shape(spec: TensorSpec, shape: Any, max_batch: int) -> tuple[int, ...]:
    expect(shape, list, f"input {spec.name!r} 'shape'")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise ProtocolError(f"input {spec.name!r} 'shape' must hold non-negative integers, got {shape}")
    fits = len(shape) == len(spec.shape) and all(
        w < 0 or w == g for w, g in zip(spec.shape, shape, strict=False)
    )
    if not fits:
        raise ProtocolError(
            f"input {spec.name!r} has shape {shape}, expected {spec.describe()} (N is the batch axis, "
            f"1..{max_batch})"
        )
    if not 1 <= shape[0] <= max_batch:
        raise ProtocolError(
            f"input {spec.name!r} has batch {shape[0]}, expected 1..{max_batch} (the model's max batch "
            "size); split the request"
        )
    return tuple(shape)


def _json_tensor(spec: TensorSpec, data: Any, shape: tuple[int, ...]) -> np.ndarray:
    dtype = DATATYPES[spec.datatype]
    expect(data, list, f"input {spec.name!r} 'data'")
    try:
        arr = np.asarray(data)
    except (ValueError, RecursionError) as e:  # ragged nesting
        raise ProtocolError(f"input {spec.name!r} 'data' is not a regular array: {e}") from e
    if arr.size and arr.dtype.kind not in ("b", "i", "u", "f"):
        raise ProtocolError(
            f"input {spec.name!r} 'data' must hold numbers for datatype {spec.datatype}, got {arr.dtype.kind!r} "
            "elements (strings or objects)"
        )
    if arr.dtype.kind == "b" and spec.datatype != "BOOL":
        raise ProtocolError(f"input {spec.name!r} 'data' holds booleans, expected {spec.datatype} numbers")
    if arr.dtype.kind == "f" and not np.isfinite(arr).all():  # Python's parser takes NaN, Infinity, 1e999
        raise ProtocolError(
            f"input {spec.name!r} 'data' holds NaN or infinite numbers, which JSON does not have (and the "
            "answer could not be JSON); send finite numbers, or the tensor as binary data"
        )
    if arr.size != math.prod(shape):
        raise ProtocolError(
            f"input {spec.name!r} 'data' has {arr.size} elements, its shape {list(shape)} needs "
            f"{math.prod(shape)}"
        )
    try:
        with np.errstate(over="raise", invalid="ignore"):
            return arr.astype(dtype, casting="unsafe").reshape(shape)
    except (OverflowError, FloatingPointError) as e:
        raise ProtocolError(f"input {spec.name!r} 'data' does not fit {spec.datatype}: {e}") from e


def _params(obj: dict[str, Any], what: str) -> dict[str, Any]:
    params = obj.get("parameters", {})
    if params is None:
        return {}
    return expect(params, dict, f"{what} 'parameters'")


def parse_infer_request(
    body: bytes | memoryview, header_length: int | str | None, model: ModelSpec
) -> InferRequest:
    """Parse and check an infer request body against ``model``; raises :class:`ProtocolError` (a 4xx).

    ``header_length`` is the value of the ``Inference-Header-Content-Length`` header (``None`` when
    absent: the whole body is JSON)."""
    body = memoryview(body)
    if header_length is None:
        head, tail = body, body[:0]
    else:
        try:
            n = int(header_length)
        except (TypeError, ValueError) as e:
            raise ProtocolError(f"Inference-Header-Content-Length {header_length!r} is not an integer") from e
        if not 0 < n <= len(body):
            raise ProtocolError(
                f"Inference-Header-Content-Length is {n}, but the body has {len(body)} bytes; it must be "
                "the length of the JSON header that starts the body"
            )
        head, tail = body[:n], body[n:]
    req = expect(decode_json(head, "the request's JSON header"), dict, "the request")

    request_id = req.get("id")
    if request_id is not None:
        expect(request_id, str, "'id'")
    parameters = _params(req, "the request")
    inputs = expect(req.get("inputs"), list, "'inputs'")
    specs = {s.name: s for s in model.inputs}
    arrays: dict[str, np.ndarray] = {}
    in_shm: dict[str, ShmInput] = {}
    offset = 0
    for i, item in enumerate(inputs):
        item = expect(item, dict, f"inputs[{i}]")
        name = expect(item.get("name"), str, f"inputs[{i}] 'name'")
        spec = specs.get(name)
        if spec is None:
            raise ProtocolError(
                f"unknown input {name!r}; model {model.name!r} has inputs: "
                f"{'; '.join(s.describe() for s in model.inputs)}"
            )
        if name in arrays or name in in_shm:
            raise ProtocolError(f"input {name!r} is given twice")
        datatype = expect(item.get("datatype"), str, f"input {name!r} 'datatype'")
        if "BYTES" in (datatype, spec.datatype):  # encoded pictures: serve/images.py
            from veo_edge.serve.images import parse_http_pictures

            arrays[name], offset = parse_http_pictures(item, spec, model, tail, offset)
            continue
        if datatype != spec.datatype:
            raise ProtocolError(f"input {name!r} has datatype {datatype!r}, expected {spec.datatype}")
        shape = _check_shape(spec, item.get("shape"), model.max_batch)
        params = _params(item, f"input {name!r}")
        size = params.get("binary_data_size")
        ref = shm_ref(params, f"input {name!r}")
        if ref is not None:
            if "data" in item or size is not None:
                raise ProtocolError(f"input {name!r} is in shared memory and has 'data' too; send one")
            in_shm[name] = shm_input(name, datatype, shape, ref)
        elif size is not None:
            if "data" in item:
                raise ProtocolError(f"input {name!r} has both 'data' and binary_data_size; send one")
            expect(size, int, f"input {name!r} binary_data_size")
            need = math.prod(shape) * DATATYPES[datatype].itemsize
            if size != need:
                raise ProtocolError(
                    f"input {name!r} has binary_data_size {size}, its shape {list(shape)} of {datatype} "
                    f"needs {need} bytes"
                )
            if offset + size > len(tail):
                raise ProtocolError(
                    f"binary data is truncated: input {name!r} needs bytes {offset}..{offset + size} after "
                    f"the JSON header, the body has {len(tail)}"
                )
            arrays[name] = np.frombuffer(tail[offset : offset + size], dtype=DATATYPES[datatype]).reshape(
                shape
            )
            offset += size
        else:
            if "data" not in item:
                raise ProtocolError(f"input {name!r} has neither 'data' nor parameters.binary_data_size")
            arrays[name] = _json_tensor(spec, item["data"], shape)
    if offset != len(tail):
        raise ProtocolError(
            f"the body has {len(tail) - offset} bytes after the binary data of the inputs; "
            "binary_data_size or Inference-Header-Content-Length is wrong"
        )
    batch = check_inputs(model, arrays, in_shm)

    binary_default = parameters.get("binary_data_output", False) is True
    requested: list[RequestedOutput] = []
    outs = req.get("outputs")
    if outs is None:
        requested = [RequestedOutput(s.name, binary_default) for s in model.outputs]
    else:
        for i, item in enumerate(expect(outs, list, "'outputs'")):
            item = expect(item, dict, f"outputs[{i}]")
            name = expect(item.get("name"), str, f"outputs[{i}] 'name'")
            params = _params(item, f"output {name!r}")
            binary = params.get("binary_data", binary_default)
            # the extension's parameter is "classification" (what tritonclient sends); class_count too
            count = params.get("classification", params.get("class_count", 0))
            expect(count, int, f"output {name!r} classification (class_count)")
            requested.append(
                RequestedOutput(name, binary is True, count, shm_ref(params, f"output {name!r}"))
            )
    check_requested_outputs(model, requested)
    return InferRequest(arrays, requested, batch, request_id, parameters, in_shm)


def check_requested_outputs(model: ModelSpec, requested: list[RequestedOutput]) -> None:
    """Each requested output exists, is asked for once, and has a usable ``class_count`` (any transport)."""
    specs = {s.name: s for s in model.outputs}
    seen: set[str] = set()
    for want in requested:
        spec = specs.get(want.name)
        if spec is None:
            raise ProtocolError(
                f"unknown output {want.name!r}; model {model.name!r} has outputs: {sorted(specs)}"
            )
        if want.name in seen:
            raise ProtocolError(f"output {want.name!r} is requested twice; name each output once")
        seen.add(want.name)
        if want.class_count < 0:
            raise ProtocolError(
                f"output {want.name!r} has classification (class_count) {want.class_count}; expected >= 0"
            )
        if want.class_count and want.name in model.features:
            raise ProtocolError(
                f"output {want.name!r} of model {model.name!r} holds features, not class scores: "
                "classification (class_count) has no classes to rank there; ask for the tensor itself"
            )
        if want.class_count and len(spec.shape) != 2:
            raise ProtocolError(
                f"output {want.name!r} has shape {spec.describe()}; class_count needs a [N, classes] output"
            )


def check_inputs(model: ModelSpec, arrays: dict[str, np.ndarray], in_shm: dict[str, Any]) -> int:
    """Every input of the model given (in the body or in shared memory), all with one batch size: it."""
    missing = [s.name for s in model.inputs if s.name not in arrays and s.name not in in_shm]
    if missing:
        raise ProtocolError(
            f"missing input(s) {missing}; model {model.name!r} needs: "
            f"{'; '.join(s.describe() for s in model.inputs)}"
        )
    batches = {a.shape[0] for a in arrays.values()} | {x.shape[0] for x in in_shm.values()}
    if len(batches) != 1:
        raise ProtocolError(f"inputs disagree on the batch size: {sorted(batches)}")
    return batches.pop()
