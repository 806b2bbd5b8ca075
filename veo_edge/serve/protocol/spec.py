"""What the Open Inference Protocol (KServe v2) says about a model and a request: datatypes, tensor and
model specs, the parsed request, the error a client is answered with, and the checked reading of a JSON
body that the server's parser and the client's decoder share.
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
    known = _DATATYPE_CACHE.get(dtype)  # every response asks; numpy's dtype.name is Python code
    if known is not None:
        return known
    name = np.dtype(dtype).name
    if name not in _NUMPY_TO_DATATYPE:
        raise ProtocolError(f"numpy dtype {name} has no Open Inference Protocol datatype")
    _DATATYPE_CACHE[dtype] = _NUMPY_TO_DATATYPE[name]
    return _NUMPY_TO_DATATYPE[name]


_DATATYPE_CACHE: dict[str | np.dtype, str] = {}


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
    #: how a picture becomes the input (a :class:`~veo_edge.preprocess.Preprocess`), when the build records
    #: it: the model then also takes encoded pictures as BYTES (see :mod:`veo_edge.serve.images`)
    preprocess: Any = field(default=None, compare=False)
    #: the outputs that hold features (embeddings, pooled outputs), not class scores: no classification
    features: frozenset[str] = frozenset()

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any], name: str | None = None) -> ModelSpec:
        from veo_edge.builddir import served_output
        from veo_edge.preprocess import Preprocess

        prep = manifest.get("preprocess")
        outputs = tuple(TensorSpec.from_manifest(e) for e in manifest["outputs"])
        features = () if served_output(manifest) == "logits" else [o.name for o in outputs]
        return cls(
            name=name or manifest["model"]["name"],
            inputs=tuple(TensorSpec.from_manifest(e) for e in manifest["inputs"]),
            outputs=outputs,
            max_batch=int(manifest["max_batch"]),
            preprocess=Preprocess.from_manifest(prep) if prep else None,
            features=frozenset(features),
        )


@dataclass(frozen=True)
class ShmRef:
    """A tensor's bytes in a registered shared-memory region (Triton's shared-memory extension)."""

    region: str
    offset: int
    byte_size: int


@dataclass(frozen=True)
class ShmInput:
    """An input whose bytes lie in shared memory: where, and the array they make (resolved by
    :mod:`veo_edge.serve.shm`, so that parsing stays a pure function)."""

    ref: ShmRef
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool
    #: the classification extension: answer the top ``class_count`` classes as BYTES, not the tensor
    class_count: int = 0
    #: written into this shared-memory region instead of the response body
    shm: ShmRef | None = None


@dataclass
class InferRequest:
    """A parsed, checked request: one array per model input, all with the same batch size."""

    inputs: dict[str, np.ndarray]
    outputs: list[RequestedOutput]
    batch: int
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    #: inputs given in shared memory; their arrays join ``inputs`` once the regions are resolved
    shm_inputs: dict[str, ShmInput] = field(default_factory=dict)


def shm_ref(params: dict[str, Any], what: str) -> ShmRef | None:
    """The shared-memory parameters of one tensor (any transport), or ``None`` when it has none."""
    region = params.get("shared_memory_region")
    size = params.get("shared_memory_byte_size")
    if region is None and size is None:
        if params.get("shared_memory_offset") is not None:
            raise ProtocolError(f"{what} has shared_memory_offset without shared_memory_region")
        return None
    if region is None or size is None:
        raise ProtocolError(
            f"{what} needs both shared_memory_region and shared_memory_byte_size, got only "
            f"{'shared_memory_region' if size is None else 'shared_memory_byte_size'}"
        )
    expect(region, str, f"{what} shared_memory_region")
    expect(size, int, f"{what} shared_memory_byte_size")
    offset = expect(params.get("shared_memory_offset", 0), int, f"{what} shared_memory_offset")
    if size < 0 or offset < 0:
        raise ProtocolError(
            f"{what} has shared_memory_offset {offset} and shared_memory_byte_size {size}; both must be >= 0"
        )
    return ShmRef(region, offset, size)


def decode_json(raw: bytes | memoryview, what: str) -> Any:
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


def expect(obj: Any, kind: type | tuple[type, ...], what: str) -> Any:
    if not isinstance(obj, kind) or (kind is int and isinstance(obj, bool)):
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        got = type(obj).__name__
        raise ProtocolError(
            f"{what} must be a JSON {_JSON_NAMES.get(want, want)}, got {_JSON_NAMES.get(got, got)}"
        )
    return obj


_JSON_NAMES = {"dict": "object", "list": "array", "str": "string", "int": "integer", "NoneType": "null"}


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


def shm_input(name: str, datatype: str, shape: tuple[int, ...], ref: ShmRef) -> ShmInput:
    """A shared-memory input whose byte size fits its shape (any transport); 400 otherwise."""
    dtype = DATATYPES[datatype]
    need = math.prod(shape) * dtype.itemsize
    if ref.byte_size != need:
        raise ProtocolError(
            f"input {name!r} has shared_memory_byte_size {ref.byte_size}, its shape {list(shape)} of "
            f"{datatype} needs {need} bytes"
        )
    return ShmInput(ref, tuple(shape), dtype)
