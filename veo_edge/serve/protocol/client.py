"""The client's side: a request body for some inputs and the arrays of a response body (the healthcheck,
the benches and the tests speak to a server through these).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from veo_edge.serve.protocol.spec import DATATYPES, ProtocolError, datatype_of, decode_json, expect


def encode_infer_request(
    inputs: dict[str, np.ndarray], binary: bool = True, outputs: list[str] | None = None
) -> tuple[bytes, int | None]:
    """A request body (and its header length) for ``inputs``: what a client sends; used by the
    healthcheck and the tests."""
    items = []
    blobs = []
    for name, arr in inputs.items():
        item: dict[str, Any] = {"name": name, "datatype": datatype_of(arr.dtype), "shape": list(arr.shape)}
        if binary:
            data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
            item["parameters"] = {"binary_data_size": len(data)}
            blobs.append(data)
        else:
            item["data"] = arr.ravel().tolist()
        items.append(item)
    req: dict[str, Any] = {"inputs": items}
    if outputs is not None:
        req["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in outputs]
    elif binary:
        req["parameters"] = {"binary_data_output": True}
    head = json.dumps(req).encode()
    return (head + b"".join(blobs), len(head)) if binary else (head, None)


def decode_infer_response(body: bytes, header_length: int | str | None) -> dict[str, np.ndarray]:
    """The output arrays of a response body (client side: the healthcheck)."""
    n = len(body) if header_length is None else int(header_length)
    resp = expect(decode_json(body[:n], "the response"), dict, "the response")
    out: dict[str, np.ndarray] = {}
    offset = n
    for item in expect(resp.get("outputs"), list, "'outputs'"):
        dtype = DATATYPES.get(item.get("datatype"))
        if dtype is None:
            raise ProtocolError(
                f"output {item.get('name')!r} has unsupported datatype {item.get('datatype')!r}"
            )
        size = (item.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            arr = np.frombuffer(body[offset : offset + size], dtype=dtype)
            offset += size
        else:
            arr = np.asarray(item["data"], dtype=dtype)
        out[item["name"]] = arr.reshape(item["shape"])
    return out
