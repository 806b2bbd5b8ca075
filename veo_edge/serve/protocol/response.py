"""The server's side of a response: the outputs asked for, as JSON or in Triton's binary tensor data
layout, and the classification extension's top-k classes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from veo_edge.serve.protocol.spec import InferRequest, ModelSpec, ShmRef, datatype_of


def classify(arr: np.ndarray, count: int, labels: list[str] | None) -> np.ndarray:
    """Triton's classification extension: per sample the top ``count`` classes, highest first, as
    ``"value:index"`` or ``"value:index:label"`` strings (an object array of bytes, shape [N, k])."""
    k = min(count, arr.shape[1])
    order = np.argsort(-arr, axis=1, kind="stable")[:, :k]
    out = np.empty((arr.shape[0], k), dtype=object)
    for n in range(arr.shape[0]):
        for j, idx in enumerate(order[n]):
            text = f"{float(arr[n, idx]):f}:{int(idx)}"
            if labels is not None and idx < len(labels):
                text += f":{labels[idx]}"
            out[n, j] = text.encode()
    return out


def bytes_tensor(arr: np.ndarray) -> bytes:
    """BYTES elements serialized as Triton does: each a 4-byte little-endian length, then its bytes."""
    return b"".join(len(v).to_bytes(4, "little") + v for v in arr.ravel())


def output_bytes(
    arr: np.ndarray, class_count: int, labels: list[str] | None
) -> tuple[str, list[int], bytes | memoryview]:
    """(datatype, shape, little-endian bytes) of one output as the binary layouts carry it (any transport)."""
    if class_count:
        top = classify(arr, class_count, labels)
        return "BYTES", list(top.shape), bytes_tensor(top)
    data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
    return datatype_of(arr.dtype), list(arr.shape), memoryview(data).cast("B")


def shm_params(ref: ShmRef, size: int) -> dict[str, Any]:
    """The parameters of an output answered in shared memory over gRPC."""
    params: dict[str, Any] = {"shared_memory_region": ref.region, "shared_memory_byte_size": size}
    if ref.offset:
        params["shared_memory_offset"] = ref.offset
    return params


def encode_infer_response(
    model: ModelSpec,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    labels: list[str] | None = None,
    write_shm: Callable[[ShmRef, bytes | memoryview], None] | None = None,
) -> tuple[list[bytes | memoryview], int | None]:
    """Body chunks of the response and the JSON header length (``None`` when the body is all JSON).

    Outputs requested in shared memory are handed to ``write_shm`` (see :mod:`veo_edge.serve.shm`) and
    answered with their name, datatype and shape, without data."""
    tensors = []
    binaries: list[bytes | memoryview] = []
    for want in request.outputs:
        arr = outputs[want.name]
        if want.shm is not None and write_shm is not None:
            datatype, shape, data = output_bytes(arr, want.class_count, labels)
            write_shm(want.shm, data)
            # name, datatype and shape only, as Triton answers it: Triton's C++ client (perf_analyzer
            # --shared-memory) reads an output's "parameters" as binary data and fails without
            # binary_data_size ("attempt to access non-existing object member 'binary_data_size'")
            tensors.append({"name": want.name, "datatype": datatype, "shape": shape})
            continue
        if want.class_count:
            top = classify(arr, want.class_count, labels)
            entry: dict[str, Any] = {"name": want.name, "datatype": "BYTES", "shape": list(top.shape)}
            if want.binary:
                data = bytes_tensor(top)
                entry["parameters"] = {"binary_data_size": len(data)}
                binaries.append(data)
            else:
                entry["data"] = [v.decode() for v in top.ravel()]
            tensors.append(entry)
            continue
        entry = {
            "name": want.name,
            "datatype": datatype_of(arr.dtype),
            "shape": list(arr.shape),
        }
        if want.binary:
            data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<"))
            entry["parameters"] = {"binary_data_size": data.nbytes}
            binaries.append(memoryview(data).cast("B"))
        else:
            entry["data"] = arr.ravel().tolist()
        tensors.append(entry)
    resp: dict[str, Any] = {"model_name": model.name, "model_version": model.version, "outputs": tensors}
    if request.id is not None:
        resp["id"] = request.id
    head = json.dumps(resp, separators=(",", ":")).encode()
    if not binaries:
        return [head], None
    return [head, *binaries], len(head)
