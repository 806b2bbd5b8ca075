"""The Open Inference Protocol (KServe v2) wire format: JSON tensors and Triton's binary tensor data
extension, as pure functions over bytes so that the parser can be fuzzed without a server.

A request body is either all JSON, or — when the ``Inference-Header-Content-Length`` header is given —
a JSON header of that many bytes followed by the raw little-endian tensor bytes of every input whose
``parameters.binary_data_size`` is set, in input order. Responses use the same layout for the outputs
asked for in binary (``parameters.binary_data`` per output, or ``binary_data_output`` for all).

``spec``: datatypes, model and request types, the error; ``request``: parsing a request (server);
``response``: encoding a response (server); ``client``: the other side of both.
"""

from veo_edge.serve.protocol.client import decode_infer_response, encode_infer_request
from veo_edge.serve.protocol.request import check_inputs, check_requested_outputs, parse_infer_request
from veo_edge.serve.protocol.response import bytes_tensor, classify, encode_infer_response
from veo_edge.serve.protocol.spec import (
    CONFIG_TYPES,
    DATATYPES,
    InferRequest,
    ModelSpec,
    ProtocolError,
    RequestedOutput,
    ShmInput,
    ShmRef,
    TensorSpec,
    datatype_of,
    load_labels,
    shm_input,
    shm_ref,
)

__all__ = [
    "CONFIG_TYPES",
    "DATATYPES",
    "InferRequest",
    "ModelSpec",
    "ProtocolError",
    "RequestedOutput",
    "ShmInput",
    "ShmRef",
    "TensorSpec",
    "bytes_tensor",
    "check_inputs",
    "check_requested_outputs",
    "classify",
    "datatype_of",
    "decode_infer_response",
    "encode_infer_request",
    "encode_infer_response",
    "load_labels",
    "parse_infer_request",
    "shm_input",
    "shm_ref",
]
