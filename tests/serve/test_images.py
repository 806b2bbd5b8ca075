"""Encoded pictures over KServe v2 (``veo_edge/serve/images.py``): a real ``veo-edge serve`` of the
trained Hugging Face digits checkpoint's build (with the vit-nano build beside it, which has no
preprocessing) answers JPEG/PNG/WebP/BMP files sent as BYTES over HTTP and gRPC with ``tritonclient``,
with the digits' label names; the ``<name>_image`` companion is listed for metadata-driven tools; bad
pictures get a 400 and the server keeps serving."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from tests.support.hf import digit_pictures, hf_digits_build

pytest.importorskip("transformers", reason="transformers is not installed (hf extra)")
httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")
from tritonclient.utils import InferenceServerException  # noqa: E402

from veo_edge.errors import InputError  # noqa: E402
from veo_edge.serve.health import check_server  # noqa: E402
from veo_edge.serve.images import split_elements  # noqa: E402

MODEL = "hf-vit-digits"


@pytest.fixture(scope="session")
def hf_digits(tmp_path_factory) -> Path:
    return hf_digits_build(tmp_path_factory)


@pytest.fixture(scope="module")
def server(hf_digits: Path, nano_build: Path, serve_module):
    return serve_module([hf_digits, nano_build])


def _labels(result, name="logits") -> list[str]:
    """The top label name of each sample of a classification answer (``value:index:label``)."""
    return [row[0].decode().split(":", 2)[2] for row in result.as_numpy(name)]


def _expected(y: np.ndarray) -> list[str]:
    return [f"digit {d}" for d in y]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP"])
def test_pictures_of_any_size_over_http_answer_the_digits_label_names(server, fmt) -> None:
    pictures, y = digit_pictures(6, fmt, size=40)  # 40x40: the processor brings them to 32x32
    client = httpclient.InferenceServerClient(server.url)
    batch = np.array(pictures, dtype=object).reshape(6, 1)  # [N, 1], as Triton's image clients send
    inp = httpclient.InferInput("input", [6, 1], "BYTES")
    inp.set_data_from_numpy(batch, binary_data=True)
    got = client.infer(MODEL, [inp], outputs=[httpclient.InferRequestedOutput("logits", class_count=3)])
    assert _labels(got) == _expected(y)
    client.close()


@pytest.mark.slow
def test_logits_from_pictures_equal_logits_from_the_preprocessed_tensor_over_grpc(server, hf_digits) -> None:
    from PIL import Image

    from veo_edge.builddir import BuildDir
    from veo_edge.preprocess import Preprocess
    from veo_edge.preprocess.decode import decode_image

    pictures, y = digit_pictures(4, "PNG")
    prep = Preprocess.from_manifest(BuildDir.open(hf_digits).manifest["preprocess"])
    x = prep.batch([decode_image(p) for p in pictures])
    assert isinstance(decode_image(pictures[0]), Image.Image)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("input", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    want = client.infer(MODEL, [tensor]).as_numpy("logits")
    encoded = grpcclient.InferInput("input", [4], "BYTES")
    encoded.set_data_from_numpy(np.array(pictures, dtype=object))
    got = client.infer(MODEL, [encoded]).as_numpy("logits")
    np.testing.assert_array_equal(got, want)  # the same f32 input, the same compiled model
    labelled = client.infer(
        MODEL + "_image", [encoded], outputs=[grpcclient.InferRequestedOutput("logits", class_count=1)]
    )
    assert _labels(labelled) == _expected(y)
    client.close()


@pytest.mark.slow
def test_the_image_companion_is_listed_with_one_bytes_input(server) -> None:
    client = httpclient.InferenceServerClient(server.url)
    index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
    assert index == {MODEL: "READY", MODEL + "_image": "READY", "vit-nano": "READY"}  # nano: no preprocessing
    meta = client.get_model_metadata(MODEL + "_image")
    assert meta["inputs"] == [{"name": "input", "datatype": "BYTES", "shape": [-1, 1]}]
    assert meta["outputs"] == client.get_model_metadata(MODEL)["outputs"]
    config, base = client.get_model_config(MODEL + "_image"), client.get_model_config(MODEL)
    # batched as the model behind it: one picture per sample (dims [1], or [N] alone: reshape [])
    assert config["max_batch_size"] == base["max_batch_size"] == 8
    assert config["dynamic_batching"] == base["dynamic_batching"]
    assert config["input"] == [
        {
            "name": "input",
            "data_type": "TYPE_STRING",
            "format": "FORMAT_NONE",
            "dims": [1],
            "reshape": {"shape": []},
        }
    ]
    assert config["output"] == base["output"] and config["output"][0]["dims"] == [10]
    assert client.is_model_ready(MODEL + "_image")
    pictures, y = digit_pictures(3, "JPEG")
    inp = httpclient.InferInput("input", [3], "BYTES")
    inp.set_data_from_numpy(np.array(pictures, dtype=object))
    got = client.infer(
        MODEL + "_image", [inp], outputs=[httpclient.InferRequestedOutput("logits", class_count=1)]
    )
    assert _labels(got) == _expected(y)
    stats = client.get_inference_statistics(MODEL + "_image")["model_stats"][0]
    assert stats["name"] == MODEL + "_image" and stats["inference_stats"]["compute_input"]["ns"] > 0
    client.close()
    # the healthcheck behind the pictures' server: its models' golden canaries, in their binary form
    for name in (MODEL, "vit-nano"):
        assert check_server(f"http://{server.url}", model_name=name, timeout=30)["model"] == name
    # the companion takes pictures and the canary is a tensor: it runs on the model behind it, said so
    # (it answered 400, "exit 22 canary mismatch", on a healthy server)
    report = check_server(f"http://{server.url}", model_name=MODEL + "_image", timeout=30)
    assert (report["asked"], report["model"]) == (MODEL + "_image", MODEL)
    assert report["note"] == f"'{MODEL}_image' takes encoded pictures: the canary ran on '{MODEL}'"


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_companion_takes_what_its_config_says_and_refuses_one_more(server, protocol) -> None:
    """What a Triton client reads (max_batch_size, dims) is what the server takes: a full batch of
    [max_batch_size, *dims] pictures answers, one picture more is refused with the limit named."""
    lib = httpclient if protocol == "http" else grpcclient
    client = lib.InferenceServerClient(server.url if protocol == "http" else server.grpc_url)
    config = client.get_model_config(MODEL + "_image")
    config = config if protocol == "http" else json.loads(_grpc_json(config.config))
    top, dims = int(config["max_batch_size"]), [int(d) for d in config["input"][0]["dims"]]
    pictures, y = digit_pictures(top + 1, "PNG")
    full = lib.InferInput("input", [top, *dims], "BYTES")
    full.set_data_from_numpy(np.array(pictures[:top], dtype=object).reshape(top, *dims))
    got = client.infer(MODEL + "_image", [full], outputs=[lib.InferRequestedOutput("logits", class_count=1)])
    assert _labels(got) == _expected(y[:top])
    over = lib.InferInput("input", [top + 1, *dims], "BYTES")
    over.set_data_from_numpy(np.array(pictures, dtype=object).reshape(top + 1, *dims))
    with pytest.raises(InferenceServerException, match=rf"has {top + 1} pictures, expected 1\.\.{top}"):
        client.infer(MODEL + "_image", [over])
    client.close()


def _grpc_json(message) -> str:
    from google.protobuf.json_format import MessageToJson

    return MessageToJson(message, preserving_proto_field_name=True)


def test_a_curl_request_json_base64_and_one_raw_file(server) -> None:
    """What docs/serving.md shows: one file sent raw after the JSON header, and base64 in JSON."""
    pictures, y = digit_pictures(2, "PNG")
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [1],
                    "datatype": "BYTES",
                    "parameters": {"binary_data_size": len(pictures[0])},
                }
            ],
            "outputs": [{"name": "logits", "parameters": {"classification": 1}}],
        }
    ).encode()
    status, _, body = server.request(
        "POST",
        f"/v2/models/{MODEL}/infer",
        head + pictures[0],
        {"Inference-Header-Content-Length": str(len(head))},
    )
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"][0].endswith(f":digit {y[0]}")
    request = {
        "inputs": [
            {
                "name": "input",
                "shape": [2],
                "datatype": "BYTES",
                "data": [base64.b64encode(p).decode() for p in pictures],
            }
        ],
        "outputs": [{"name": "logits", "parameters": {"classification": 1}}],
    }
    status, _, body = server.request("POST", f"/v2/models/{MODEL}_image/infer", json.dumps(request).encode())
    assert status == 200, body
    assert [v.split(":", 2)[2] for v in json.loads(body)["outputs"][0]["data"]] == _expected(y)


def _bomb_png(side: int) -> bytes:
    """A valid grey PNG of side x side zeros: a few hundred kB that would decode to side² bytes."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    z = zlib.compressobj(9)
    body = b"".join(z.compress(bytes(side + 1)) for _ in range(side)) + z.flush()
    head = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", body) + chunk(b"IEND", b"")


def _http_error(client, model: str, pictures: list[bytes]) -> str:
    inp = httpclient.InferInput("input", [len(pictures)], "BYTES")
    inp.set_data_from_numpy(np.array(pictures, dtype=object))
    with pytest.raises(InferenceServerException) as info:
        client.infer(model, [inp])
    assert info.value.status() == "400"
    return info.value.message()


@pytest.mark.slow
def test_bad_pictures_are_400s_and_the_server_keeps_serving(server) -> None:
    good, y = digit_pictures(1, "JPEG")
    client = httpclient.InferenceServerClient(server.url)
    msg = _http_error(client, MODEL, [good[0], b"this is not a picture"])
    assert "input 'input' picture 1 is not a picture Pillow can read (21 bytes starting 0x7468" in msg
    big = digit_pictures(1, "JPEG", size=64)[0][0]
    msg = _http_error(client, MODEL, [big[: len(big) * 3 // 4]])  # the header whole, the scan cut
    assert "picture 0 is truncated or corrupt" in msg
    msg = _http_error(client, MODEL + "_image", [_bomb_png(8000)])
    assert "8000x8000 = 64,000,000 pixels, over the limit of 40,000,000" in msg
    msg = _http_error(client, "vit-nano", [good[0]])
    assert "has datatype 'BYTES', expected FP32: model 'vit-nano' was built without preprocessing" in msg
    assert "so it takes only input: FP32[N, 3, 32, 32], not encoded pictures" in msg
    with pytest.raises(InferenceServerException, match="unknown model 'vit-nano_image'") as e:
        client.get_model_metadata("vit-nano_image")
    assert f"and '{MODEL}_image' (encoded pictures)" in str(e.value)  # the companions are named too
    body = json.dumps({"inputs": [{"name": "input", "datatype": "BYTES", "shape": [1], "data": [7]}]})
    status, _, answer = server.request("POST", f"/v2/models/{MODEL}/infer", body.encode())
    assert status == 400 and "'data' must hold base64 strings (one per picture), got int" in answer.decode()
    # still serving, and the refusals were counted as invalid requests
    inp = httpclient.InferInput("input", [1], "BYTES")
    inp.set_data_from_numpy(np.array(good, dtype=object))
    got = client.infer(MODEL, [inp], outputs=[httpclient.InferRequestedOutput("logits", class_count=1)])
    assert _labels(got) == _expected(y)
    status, _, metrics = server.request("GET", "/metrics")
    assert status == 200 and b'reason="INVALID"' in metrics
    client.close()


def test_the_bytes_serialization_is_checked() -> None:
    two = b"".join(len(p).to_bytes(4, "little") + p for p in (b"ab", b"cde"))
    assert split_elements(two, 2, "x") == [b"ab", b"cde"]
    assert split_elements(b"\xff\xd8\xff raw jpeg", 1, "x") == [b"\xff\xd8\xff raw jpeg"]  # no prefix
    with pytest.raises(InputError, match="element 1 says 3 bytes, only 2 follow"):
        split_elements(two[:-1], 2, "x")
    with pytest.raises(InputError, match="2 elements for a shape of 3"):
        split_elements(two, 3, "x")


def test_a_companion_is_not_a_second_model_to_a_soak(hf_digits: Path, serve) -> None:
    """A soak over gRPC against a server of one model with preprocessing picks that model by itself: its
    NAME_image companion is listed in the repository index, but is not another model to choose from."""
    from veo_edge.soak.servers import GrpcTarget

    server = serve(hf_digits)
    target = GrpcTarget(f"grpc://{server.grpc_url}")
    shape, dtype = target.open()
    assert target.model_name == "hf-vit-digits" and dtype == np.float32 and len(shape) == 3
