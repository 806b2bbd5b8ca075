"""ModelInfer's request read in place: the top level of a serialized ``ModelInferRequest`` walked by its
wire format, so that each tensor in ``raw_input_contents`` stays a memoryview of the bytes grpcio
received (protobuf's Python API has no zero-copy bytes field: it copies each tensor into its arena and
again on access, ~40 us of the event loop per 600 kB). Everything else is parsed by protobuf.
"""

from __future__ import annotations

from typing import Any

from tritonclient.grpc import service_pb2

#: the field number of ``ModelInferRequest.raw_input_contents``
_RAW_INPUT_CONTENTS = 7


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos, shift = pos + 1, shift + 7
        if not b & 0x80:
            return value, pos


def deserialize_infer_request(data: bytes) -> tuple[Any, list[memoryview]]:
    """A ``ModelInferRequest`` whose ``raw_input_contents`` stay where they arrived, as memoryviews of
    ``data`` (protobuf would copy each tensor twice: into its arena, then out again on access); the rest
    of the message (names, shapes, parameters: a few hundred bytes) is parsed by protobuf. Our own reading
    of the wire format's top level because protobuf's Python API has no zero-copy bytes field."""
    view, raw, rest, pos = memoryview(data), [], [], 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        wire = tag & 7
        if wire == 2:  # length-delimited
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise ValueError("a field runs past the end of the message")
            pos += length
            if tag >> 3 == _RAW_INPUT_CONTENTS:
                raw.append(view[pos - length : pos])
                continue
        elif wire == 0:
            pos = _varint(data, pos)[1]
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        rest.append(view[start:pos])
    return service_pb2.ModelInferRequest.FromString(b"".join(rest)), raw


def deserialize_or_refuse(data: bytes) -> tuple[Any, Any]:
    """:func:`deserialize_infer_request`, with a malformed message as (None, why): ModelInfer answers it
    INVALID_ARGUMENT rather than grpcio UNKNOWN with a logged traceback."""
    from google.protobuf.message import DecodeError

    try:
        return deserialize_infer_request(data)
    except (ValueError, DecodeError) as e:
        return None, f"the ModelInferRequest is malformed: {e}"
