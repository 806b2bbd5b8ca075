"""The Open Inference Protocol (KServe v2) wire format: JSON tensors and Triton's binary tensor data
extension, as pure functions over bytes so that the parser can be fuzzed without a server.

A request body is either all JSON, or — when the ``Inference-Header-Content-Length`` header is given —
a JSON header of that many bytes followed by the raw little-endian tensor bytes of every input whose
``parameters.binary_data_size`` is set, in input order. Responses use the same layout for the outputs
asked for in binary (``parameters.binary_data`` per output, or ``binary_data_output`` for all).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from veo_edge.errors import InputError

#: Open Inference Protocol datatype -> numpy dtype (BYTES and BF16 have no fixed numpy equivalent here)
DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
_NUMPY_TO_DATATYPE = {dt.newbyteorder("=").name: name for name, dt in DATATYPES.items()}
#: Triton model-configuration type names
CONFIG_TYPES = {name: f"TYPE_{name}" for name in DATATYPES}


class ProtocolError(InputError):
    """A request that does not follow the protocol or does not fit the model; answered with ``status``."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def datatype_of(dtype: str | np.dtype) -> str:
    """Protocol datatype name of a numpy dtype (``float32`` -> ``FP32``)."""
    name = np.dtype(dtype).name
    if name not in _NUMPY_TO_DATATYPE:
        raise ProtocolError(f"numpy dtype {name} has no Open Inference Protocol datatype")
    return _NUMPY_TO_DATATYPE[name]


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output as the protocol describes it; ``-1`` marks the batch axis."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> TensorSpec:
        shape = tuple(-1 if d is None else int(d) for d in entry["shape"])
        return cls(entry["name"], datatype_of(entry["dtype"]), shape)

    def to_metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}

    def describe(self) -> str:
        return f"{self.name}: {self.datatype}[{', '.join('N' if d < 0 else str(d) for d in self.shape)}]"


@dataclass(frozen=True)
class ModelSpec:
    """What the server says about the one model it serves, and what the parser checks requests against."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch: int
    version: str = "1"

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], name: str | None = None) -> ModelSpec:
        return cls(
            name=name or manifest["model"]["name"],
            inputs=tuple(TensorSpec.from_manifest(e) for e in manifest["inputs"]),
            outputs=tuple(TensorSpec.from_manifest(e) for e in manifest["outputs"]),
            max_batch=int(manifest["max_batch"]),
        )


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool
    #: the classification extension: answer the top ``class_count`` classes as BYTES, not the tensor
    class_count: int = 0


@dataclass
class InferRequest:
    """A parsed, checked request: one array per model input, all with the same batch size."""

    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput]
    batch: int
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)


def _decode_json(raw: bytes | memoryview, what: str) -> Any:
    try:
        return json.loads(bytes(raw).decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ProtocolError(
            f"{what} is not UTF-8 ({e}); send JSON, with tensors in binary after an "
            "Inference-Header-Content-Length header"
        ) from e
    except RecursionError as e:
        raise ProtocolError(f"{what} is nested too deeply to parse") from e
    except ValueError as e:
        raise ProtocolError(f"{what} is not valid JSON: {e}") from e


def _expect(obj: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(obj, kind) or (kind is int and isinstance(obj, bool)):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        got = type(obj).__name__
        raise ProtocolError(
            f"{what} must be a JSON {_JSON_NAMES.get(want, want)}, got {_JSON_NAMES.get(got, got)}"
        )
    return obj


_JSON_NAMES = {"dict": "object", "list": "array", "str": "string", "int": "integer", "NoneType": "null"}


def _check_shape(spec: TensorSpec, shape: Any, max_batch: int) -> tuple[int, ...]:
    _expect(shape, list, f"input {spec.name!r} 'shape'")
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
    _expect(data, list, f"input {spec.name!r} 'data'")
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
    return _expect(params, dict, f"{what} 'parameters'")


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
    req = _expect(_decode_json(head, "the request's JSON header"), dict, "the request")

    request_id = req.get("id")
    if request_id is not None:
        _expect(request_id, str, "'id'")
    parameters = _params(req, "the request")
    inputs = _expect(req.get("inputs"), list, "'inputs'")
    specs = {s.name: s for s in model.inputs}
    arrays: dict[str, np.ndarray] = {}
    offset = 0
    for i, item in enumerate(inputs):
        item = _expect(item, dict, f"inputs[{i}]")
        name = _expect(item.get("name"), str, f"inputs[{i}] 'name'")
        spec = specs.get(name)
        if spec is None:
            raise ProtocolError(
                f"unknown input {name!r}; model {model.name!r} has inputs: "
                f"{'; '.join(s.describe() for s in model.inputs)}"
            )
        if name in arrays:
            raise ProtocolError(f"input {name!r} is given twice")
        datatype = _expect(item.get("datatype"), str, f"input {name!r} 'datatype'")
        if datatype != spec.datatype:
            raise ProtocolError(f"input {name!r} has datatype {datatype!r}, expected {spec.datatype}")
        shape = _check_shape(spec, item.get("shape"), model.max_batch)
        size = _params(item, f"input {name!r}").get("binary_data_size")
        if size is not None:
            if "data" in item:
                raise ProtocolError(f"input {name!r} has both 'data' and binary_data_size; send one")
            _expect(size, int, f"input {name!r} binary_data_size")
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
    missing = [s.name for s in model.inputs if s.name not in arrays]
    if missing:
        raise ProtocolError(
            f"missing input(s) {missing}; model {model.name!r} needs: "
            f"{'; '.join(s.describe() for s in model.inputs)}"
        )
    batches = {a.shape[0] for a in arrays.values()}
    if len(batches) != 1:
        raise ProtocolError(f"inputs disagree on the batch size: {sorted(batches)}")

    binary_default = parameters.get("binary_data_output", False) is True
    requested: list[RequestedOutput] = []
    outs = req.get("outputs")
    if outs is None:
        requested = [RequestedOutput(s.name, binary_default) for s in model.outputs]
    else:
        for i, item in enumerate(_expect(outs, list, "'outputs'")):
            item = _expect(item, dict, f"outputs[{i}]")
            name = _expect(item.get("name"), str, f"outputs[{i}] 'name'")
            params = _params(item, f"output {name!r}")
            binary = params.get("binary_data", binary_default)
            # the extension's parameter is "classification" (what tritonclient sends); class_count too
            count = params.get("classification", params.get("class_count", 0))
            _expect(count, int, f"output {name!r} classification (class_count)")
            requested.append(RequestedOutput(name, binary is True, count))
    check_requested_outputs(model, requested)
    return InferRequest(arrays, requested, batches.pop(), request_id, parameters)


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
        if want.class_count and len(spec.shape) != 2:
            raise ProtocolError(
                f"output {want.name!r} has shape {spec.describe()}; class_count needs a [N, classes] output"
            )


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


def _bytes_tensor(arr: np.ndarray) -> bytes:
    """BYTES elements serialized as Triton does: each a 4-byte little-endian length, then its bytes."""
    return b"".join(len(v).to_bytes(4, "little") + v for v in arr.ravel())


def load_labels(build: Any) -> list[str] | None:
    """Class labels of a build, when it has them: manifest ``labels`` (a list), or ``labels.txt``
    (one label per line, Triton's label file) in the build directory."""
    labels = build.manifest.get("labels")
    if isinstance(labels, list) and all(isinstance(x, str) for x in labels):
        return list(labels)
    path = build.path / "labels.txt"
    if path.is_file():
        return path.read_text(encoding="utf-8").splitlines()  # line i is class i
    return None


def encode_infer_response(
    model: ModelSpec,
    request: InferRequest,
    outputs: dict[str, np.ndarray],
    labels: list[str] | None = None,
) -> tuple[list[bytes | memoryview], int | None]:
    """Body chunks of the response and the JSON header length (``None`` when the body is all JSON)."""
    tensors = []
    binaries: list[bytes | memoryview] = []
    for want in request.outputs:
        arr = outputs[want.name]
        if want.class_count:
            top = classify(arr, want.class_count, labels)
            entry: dict[str, Any] = {"name": want.name, "datatype": "BYTES", "shape": list(top.shape)}
            if want.binary:
                data = _bytes_tensor(top)
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
    resp = _expect(_decode_json(body[:n], "the response"), dict, "the response")
    out: dict[str, np.ndarray] = {}
    offset = n
    for item in _expect(resp.get("outputs"), list, "'outputs'"):
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
