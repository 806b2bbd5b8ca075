"""The request parser and response encoder, as pure functions: the happy paths, every rejection with its
message pinned, and a property-based fuzz that only ever sees ProtocolError (never a crash)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from veo_edge.errors import InputError
from veo_edge.serve.protocol import (
    ModelSpec,
    ProtocolError,
    decode_infer_response,
    encode_infer_request,
    encode_infer_response,
    parse_infer_request,
)

MANIFEST = {
    "model": {"name": "vit-nano"},
    "inputs": [{"name": "input", "shape": [-1, 3, 4, 5], "dtype": "float32"}],
    "outputs": [{"name": "logits", "shape": [-1, 10], "dtype": "float32"}],
    "max_batch": 8,
}
MODEL = ModelSpec.from_manifest(MANIFEST)


def _x(batch: int = 2) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((batch, 3, 4, 5)).astype(np.float32)


def _json_req(**overrides) -> bytes:
    item = {"name": "input", "datatype": "FP32", "shape": [1, 3, 4, 5], "data": [0.5] * 60}
    item.update(overrides)
    return json.dumps({"inputs": [item]}).encode()


def test_spec_from_manifest():
    assert MODEL.inputs[0].to_metadata() == {"name": "input", "datatype": "FP32", "shape": [-1, 3, 4, 5]}
    assert MODEL.max_batch == 8 and MODEL.name == "vit-nano"


@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("binary", [True, False])
def test_roundtrip(batch, binary):
    x = _x(batch)
    body, hlen = encode_infer_request({"input": x}, binary=binary)
    req = parse_infer_request(body, hlen, MODEL)
    assert req.batch == batch
    np.testing.assert_array_equal(req.inputs["input"], x)
    assert [o.binary for o in req.outputs] == [binary]
    y = np.arange(batch * 10, dtype=np.float32).reshape(batch, 10)
    chunks, rhlen = encode_infer_response(MODEL, req, {"logits": y})
    out = decode_infer_response(b"".join(bytes(c) for c in chunks), rhlen)
    np.testing.assert_array_equal(out["logits"], y)


def test_nested_json_data_and_request_id():
    x = _x(1)
    body = json.dumps(
        {
            "id": "r1",
            "inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 4, 5], "data": x.tolist()}],
        }
    ).encode()
    req = parse_infer_request(body, None, MODEL)
    np.testing.assert_array_equal(req.inputs["input"], x)
    assert req.id == "r1"
    chunks, _ = encode_infer_response(MODEL, req, {"logits": np.zeros((1, 10), np.float32)})
    assert json.loads(chunks[0])["id"] == "r1"


def test_binary_output_per_output_overrides_default():
    body = json.dumps(
        {
            "inputs": json.loads(_json_req())["inputs"],
            "outputs": [{"name": "logits", "parameters": {"binary_data": True}}],
        }
    ).encode()
    assert parse_infer_request(body, None, MODEL).outputs[0].binary


BAD = [
    (b"{not json", None, "not valid JSON"),
    (b"\xff\xfe", None, "not UTF-8"),
    (b"[]", None, "the request must be a JSON object, got array"),
    (b"{}", None, "'inputs' must be a JSON array, got null"),
    (b'{"inputs": [1]}', None, r"inputs\[0\] must be a JSON object"),
    (_json_req(name="pixels"), None, "unknown input 'pixels'; model 'vit-nano' has inputs: input: FP32"),
    (_json_req(datatype="FP16"), None, "has datatype 'FP16', expected FP32"),
    (_json_req(datatype=7), None, "'datatype' must be a JSON string, got integer"),
    (_json_req(shape=[1, 3, 4]), None, r"has shape \[1, 3, 4\], expected input: FP32\[N, 3, 4, 5\]"),
    (_json_req(shape=[1, 3, 4, 6]), None, "expected input: FP32"),
    (_json_req(shape=[0, 3, 4, 5], data=[]), None, "has batch 0, expected 1..8"),
    (_json_req(shape=[9, 3, 4, 5]), None, "has batch 9, expected 1..8"),
    (_json_req(shape=[1, 3, 4, -5]), None, "must hold non-negative integers"),
    (_json_req(shape="1,3,4,5"), None, "'shape' must be a JSON array"),
    (_json_req(data=[0.5] * 59), None, "'data' has 59 elements, its shape"),
    (_json_req(data=["a"] * 60), None, "must hold numbers for datatype FP32"),
    (_json_req(data=[[1.0], [1.0, 2.0]]), None, "not a regular array"),
    (_json_req(data=[True] * 60), None, "holds booleans"),
    (_json_req(data=None), None, "'data' must be a JSON array, got null"),
    (_json_req(data=[1e300] * 60), None, "does not fit FP32"),
    (json.dumps({"inputs": json.loads(_json_req())["inputs"] * 2}).encode(), None, "given twice"),
    (
        json.dumps({"inputs": json.loads(_json_req())["inputs"], "outputs": [{"name": "probs"}]}).encode(),
        None,
        "unknown output 'probs'",
    ),
    (
        json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 4, 5]}]}).encode(),
        None,
        "neither 'data' nor parameters.binary_data_size",
    ),
    (json.dumps({"inputs": [], "id": 5}).encode(), None, "'id' must be a JSON string"),
    (
        json.dumps(
            {"inputs": json.loads(_json_req())["inputs"], "outputs": [{"name": "logits"}, {"name": "logits"}]}
        ).encode(),
        None,
        "output 'logits' is requested twice",
    ),
    (
        json.dumps(
            {
                "inputs": json.loads(_json_req())["inputs"],
                "outputs": [{"name": "logits", "parameters": {"classification": "3"}}],
            }
        ).encode(),
        None,
        r"classification \(class_count\) must be a JSON integer",
    ),
    (json.dumps({"inputs": []}).encode(), None, r"missing input\(s\) \['input'\]"),
    (b"[" * 100_000, None, "nested too deeply|not valid JSON"),
    (_json_req(), "ten", "Inference-Header-Content-Length 'ten' is not an integer"),
    (_json_req(), 10**6, "Inference-Header-Content-Length is 1000000, but the body has"),
    (_json_req(), 0, "Inference-Header-Content-Length is 0"),
]


@pytest.mark.parametrize(("body", "hlen", "match"), BAD, ids=[m[:40] for _, _, m in BAD])
def test_rejects(body, hlen, match):
    with pytest.raises(ProtocolError, match=match) as info:
        parse_infer_request(body, hlen, MODEL)
    assert info.value.status == 400
    assert isinstance(info.value, InputError)


def _binary(extra: bytes = b"", size: int | None = None, cut: int = 0) -> tuple[bytes, int]:
    body, hlen = encode_infer_request({"input": _x(1)})
    if size is not None:
        head = json.loads(body[:hlen])
        head["inputs"][0]["parameters"]["binary_data_size"] = size
        new = json.dumps(head).encode()
        body, hlen = new + body[hlen:], len(new)
    return (body[: len(body) - cut] if cut else body) + extra, hlen


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (
            {"cut": 1},
            r"binary data is truncated: input 'input' needs bytes 0..240 after the JSON header, the body has 239",
        ),
        ({"extra": b"xx"}, "the body has 2 bytes after the binary data"),
        ({"size": 100}, "binary_data_size 100, its shape .* needs 240 bytes"),
        ({"size": "240"}, "binary_data_size must be a JSON integer, got string"),
    ],
)
def test_rejects_binary(args, match):
    body, hlen = _binary(**args)
    with pytest.raises(ProtocolError, match=match):
        parse_infer_request(body, hlen, MODEL)


# -- fuzz: whatever the bytes, the parser answers a ProtocolError or a checked request -----------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=30,
)
_keys = st.sampled_from(["name", "datatype", "shape", "data", "parameters", "binary_data_size", "inputs"])


@st.composite
def _mutated_requests(draw):
    """A valid request with some fields replaced by arbitrary JSON, some bytes cut or appended."""
    batch = draw(st.integers(1, 3))
    binary = draw(st.booleans())
    body, hlen = encode_infer_request({"input": _x(batch)}, binary=binary)
    head = json.loads(body[:hlen] if hlen else body)
    item = head["inputs"][0]
    targets = [head, item, item.get("parameters", item)]
    for _ in range(draw(st.integers(0, 3))):
        target = draw(st.sampled_from(targets))
        target[draw(_keys)] = draw(_json_values)
    new = json.dumps(head).encode()
    tail = body[hlen:] if hlen else b""
    tail = tail[: draw(st.integers(0, len(tail)))] + draw(st.binary(max_size=8))
    header = draw(st.sampled_from([len(new), None, len(new) + draw(st.integers(-5, 5)), "x"]))
    return new + tail, header


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_requests())
def test_fuzz_structured(case):
    body, hlen = case
    try:
        req = parse_infer_request(body, hlen, MODEL)
    except ProtocolError as e:
        assert e.status == 400 and str(e)
        return
    x = req.inputs["input"]
    assert x.dtype == np.float32 and x.shape[1:] == (3, 4, 5) and 1 <= x.shape[0] <= 8


@settings(max_examples=300, derandomize=True, deadline=None)
@given(st.binary(max_size=300), st.one_of(st.none(), st.integers(-3, 400)))
def test_fuzz_bytes(body, hlen):
    with pytest.raises(ProtocolError):
        parse_infer_request(body, hlen, MODEL)


@pytest.mark.parametrize("binary", [True, False])
def test_classification_response(binary):
    body = json.dumps(
        {
            "inputs": json.loads(_json_req())["inputs"],
            "outputs": [{"name": "logits", "parameters": {"classification": 3, "binary_data": binary}}],
        }
    ).encode()
    req = parse_infer_request(body, None, MODEL)
    assert req.outputs[0].class_count == 3
    y = np.array([[0.5, 2.0, -1.0, 2.0, 0.25, 0, 0, 0, 0, 0]], np.float32)
    labels = [f"c{i}" for i in range(10)]
    chunks, hlen = encode_infer_response(MODEL, req, {"logits": y}, labels)
    raw = b"".join(bytes(c) for c in chunks)
    head = json.loads(raw[:hlen] if hlen else raw)
    out = head["outputs"][0]
    assert out["datatype"] == "BYTES" and out["shape"] == [1, 3]
    if binary:
        tail, values = raw[hlen:], []
        while tail:
            n = int.from_bytes(tail[:4], "little")
            values.append(tail[4 : 4 + n].decode())
            tail = tail[4 + n :]
    else:
        values = out["data"]
    # highest first; ties keep the lower index first (a stable sort)
    assert values == ["2.000000:1:c1", "2.000000:3:c3", "0.500000:0:c0"]


@pytest.mark.parametrize("request_id", [None, "a", "b"])
def test_a_binary_response_head_names_each_output_with_its_shape_size_and_the_id(request_id):
    x = _x(3)
    body, hlen = encode_infer_request({"input": x})
    req = parse_infer_request(body, hlen, MODEL)
    req.id = request_id
    y = np.arange(30, dtype=np.float32).reshape(3, 10)
    chunks, rhlen = encode_infer_response(MODEL, req, {"logits": y})
    head = json.loads(bytes(chunks[0]))
    assert rhlen == len(chunks[0])
    want = {
        "model_name": "vit-nano",
        "model_version": "1",
        "outputs": [
            {"name": "logits", "datatype": "FP32", "shape": [3, 10], "parameters": {"binary_data_size": 120}}
        ],
    }
    if request_id is not None:
        want["id"] = request_id
    assert head == want
    np.testing.assert_array_equal(
        np.frombuffer(b"".join(bytes(c) for c in chunks[1:]), np.float32), y.ravel()
    )
    big_endian = y.astype(">f4")  # sent little-endian whatever the array's byte order
    chunks, rhlen = encode_infer_response(MODEL, req, {"logits": big_endian})
    assert json.loads(bytes(chunks[0]))["outputs"][0]["datatype"] == "FP32"
    np.testing.assert_array_equal(np.frombuffer(bytes(chunks[1]), "<f4"), y.ravel())


def test_the_installed_uvicorn_has_every_hook_the_http_limits_build_on() -> None:
    """GuardedProtocol subclasses uvicorn's private HttpToolsProtocol: the installed one has each hook,
    and one without a hook is refused in one line that names it and the uvicorn that was tested."""
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    from veo_edge.errors import VeoEdgeError
    from veo_edge.serve.transport import check_protocol_base

    check_protocol_base(HttpToolsProtocol, uvicorn.__version__)

    class Renamed(HttpToolsProtocol):  # as a later uvicorn that renamed one private method would be
        _unset_keepalive_if_required = None

    with pytest.raises(
        VeoEdgeError, match=r"uvicorn 0\.54\.1's .* no _unset_keepalive_if_required.*uvicorn>=0\.30,<0\.56"
    ):
        check_protocol_base(Renamed, "0.54.1")
    with pytest.raises(VeoEdgeError, match=r"uvicorn 0\.56\.0 is outside the range .* tested with"):
        check_protocol_base(HttpToolsProtocol, "0.56.0")


def test_pyproject_pins_the_tested_uvicorn_range() -> None:
    """The one range the private-API subclass was tested on is what pip may install."""
    from pathlib import Path

    from veo_edge.serve.transport import UVICORN_TESTED

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    deps = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"][
        "dependencies"
    ]
    assert f"uvicorn{','.join(UVICORN_TESTED)}" in deps
