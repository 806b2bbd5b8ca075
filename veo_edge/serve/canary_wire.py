"""The golden canary on the wire: the body of ``/v2/models/{name}/canary`` as JSON or in its binary form
(what ``veo-edge serve`` answers, :meth:`~veo_edge.serve.app.InferenceService.canary_body`), and read
back (what ``veo-edge healthcheck --url`` takes, :func:`~veo_edge.serve.health.check_server`)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from veo_edge.export.canary import Canary
from veo_edge.serve.protocol.client import decode_infer_response

#: the media type the probe asks ``/v2/models/{name}/canary`` for: the tensors' bytes after a JSON header
#: (:func:`canary_to_binary`). As JSON text a 224x224 canary is ~3 MB whose parse took 0.1 s of each
#: probe's CPU here; the binary form is 0.6 MB and no parse. Without it the endpoint answers JSON.
BINARY = "application/octet-stream"


def canary_to_json(canary: Canary, about: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "input": {"shape": list(canary.input.shape), "data": canary.input.ravel().tolist()},
        "expected": {"shape": list(canary.expected.shape), "data": canary.expected.ravel().tolist()},
        "atol": canary.atol,
        "min_cosine": canary.min_cosine,
        **(about or {}),
    }


def encode_canary(
    canary: Canary, binary: bool = False, about: dict[str, Any] | None = None
) -> tuple[bytes, int | None]:
    """The body of ``/v2/models/{name}/canary``: JSON, or the binary form and the length of its header;
    ``about``: what the rule is for (the backend and the precision it serves), said beside it."""
    if binary:
        return canary_to_binary(canary, about)
    return json.dumps(canary_to_json(canary, about), separators=(",", ":")).encode(), None


def canary_to_binary(canary: Canary, about: dict[str, Any] | None = None) -> tuple[bytes, int]:
    """The canary's body in its binary form (and the length of its JSON header): the two tensors as raw
    little-endian float32 after a header laid out as an inference response of the binary tensor extension
    (``outputs`` ``input`` and ``expected``), the rule (and ``about``) in its ``parameters``."""
    tensors = {"input": canary.input, "expected": canary.expected}
    blobs = [np.ascontiguousarray(a, dtype="<f4").tobytes() for a in tensors.values()]
    outputs = [
        {"name": n, "datatype": "FP32", "shape": list(a.shape), "parameters": {"binary_data_size": len(b)}}
        for (n, a), b in zip(tensors.items(), blobs, strict=True)
    ]
    rule = {"atol": canary.atol, "min_cosine": canary.min_cosine, **(about or {})}
    head = json.dumps({"outputs": outputs, "parameters": rule}, separators=(",", ":")).encode()
    return head + b"".join(blobs), len(head)


def canary_from_binary(body: bytes, header_length: str) -> Canary:
    arrays = decode_infer_response(body, header_length)
    rule = json.loads(body[: int(header_length)])["parameters"]
    return Canary(arrays["input"], arrays["expected"], float(rule["atol"]), float(rule["min_cosine"]))


def canary_from_json(obj: dict[str, Any]) -> Canary:
    def arr(t: dict[str, Any]) -> np.ndarray:
        return np.asarray(t["data"], dtype=np.float32).reshape(t["shape"])

    return Canary(arr(obj["input"]), arr(obj["expected"]), float(obj["atol"]), float(obj["min_cosine"]))
