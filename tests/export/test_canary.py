"""The golden canary is a real sample where the build has data, so each precision's rule is tight: an int8
IR with one weight zeroed (re-hashed, so only the canary can notice) fails the healthcheck and is refused
as a standby, while the seeded-noise canary of earlier builds would have let it pass."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import veo_edge
from veo_edge.builddir import BuildDir, artifact_entry
from veo_edge.export.canary import Canary, compare_canary
from veo_edge.export.parity import seeded_inputs
from veo_edge.models import digits
from veo_edge.pipeline.build import CANARY_SEED
from veo_edge.runtime.loaders import cpu_runner
from veo_edge.serve.health import CanaryMismatchError, check_local


def zero_int8_weight(build: Path) -> None:
    """Zero the last (256, 64) int8 weight of the int8 IR (the last block's MLP), picked by element type
    and shape, and record the new file's sha256 in the manifest."""
    m = json.loads((build / "manifest.json").read_text())
    xml = build / m["artifacts"]["openvino_int8_xml"]["path"]
    weights = [
        layer.find("data")
        for layer in ET.parse(xml).getroot().iter("layer")
        if layer.get("type") == "Const"
        and layer.find("data").get("element_type") == "i8"
        and layer.find("data").get("shape") == "256, 64"
    ]
    data = weights[-1]
    offset, size = int(data.get("offset")), int(data.get("size"))
    path = build / m["artifacts"]["openvino_int8_bin"]["path"]
    blob = bytearray(path.read_bytes())
    assert any(blob[offset : offset + size])
    blob[offset : offset + size] = bytes(size)
    path.write_bytes(bytes(blob))
    m["artifacts"]["openvino_int8_bin"] = artifact_entry(build, path)
    (build / "manifest.json").write_text(json.dumps(m, indent=2))


def test_the_canary_is_a_test_split_sample_or_a_stated_seeded_one(digits_int8_build: Path, nano_build: Path):
    spec = BuildDir.open(digits_int8_build).manifest["canary"]
    assert spec["source"].startswith("vit-digits test split, sample 0 (scikit-learn load_digits")
    assert "seed" not in spec
    x = np.load(digits_int8_build / spec["input"])
    np.testing.assert_array_equal(x, digits.test_split().x[:1])
    # on a real sample int8 is close to f32, so its rule is tight (it was cosine >= 0.15 on seeded noise)
    assert spec["precisions"]["int8"]["min_cosine"] > 0.99
    seeded = BuildDir.open(nano_build).manifest["canary"]  # vit-nano has no data
    assert seeded["seed"] == CANARY_SEED and seeded["source"].startswith("seeded standard-normal input")
    np.testing.assert_array_equal(
        np.load(nano_build / seeded["input"]), seeded_inputs((3, 32, 32), 1, CANARY_SEED)
    )


@pytest.mark.slow
def test_a_broken_int8_ir_fails_the_healthcheck_and_is_refused_as_a_standby(
    digits_int8_build: Path, copy_build
):
    broken = copy_build(digits_int8_build)
    zero_int8_weight(broken)
    BuildDir.open(broken).verify()  # every checksum matches: only the canary can tell
    with pytest.raises(CanaryMismatchError, match=r"canary (cosine 0\.\d+ < 0\.99|max abs error)"):
        check_local(str(broken))  # auto on this CPU host: the int8 IR on openvino

    # the rule earlier builds derived on seeded noise (f32 tolerance + 4x what int8 measured there)
    x = seeded_inputs((1, 32, 32), 1, CANARY_SEED)
    f32_atol = BuildDir.open(digits_int8_build).manifest["canary"]["atol"]
    build = BuildDir.open(digits_int8_build)
    with cpu_runner(build, "onnxruntime") as f32_runner, cpu_runner(build, "openvino") as int8_runner:
        f32 = f32_runner.infer(x)["logits"]
        healthy = compare_canary(int8_runner.infer(x)["logits"], Canary(x, f32, f32_atol, 0.999))
    noise_rule = Canary(x, f32, f32_atol + 4 * healthy.max_abs, min(0.999, 1 - 4 * (1 - healthy.cosine)))
    with veo_edge.Runtime(broken, policy=["openvino", "onnxruntime"]) as rt:
        assert compare_canary(rt.infer(x), noise_rule).ok  # the old canary would have passed it
        # its standby, onnxruntime, computes f32 and was held to the f32 rule at its warm-up
        warm = rt.state.verified["onnxruntime"]
        assert warm["ok"] and warm["atol"] == f32_atol and warm["min_cosine"] == 0.999

    with veo_edge.Runtime(broken, policy=["onnxruntime", "openvino"]) as rt:
        (skip,) = rt.state.skipped
        assert skip["backend"] == "openvino"
        assert skip["reason"].startswith("warm-up canary failed: canary")
        assert rt.stats()["standby_backend"] is None
