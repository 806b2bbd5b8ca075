"""The C++ spec header generated from each plugins/<op>/spec.json agrees with the JSON."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
GENERATOR = PLUGINS / "tools" / "gen_spec_header.py"
SPECS = sorted(PLUGINS.glob("*/spec.json"))


def _generate(spec: Path, out: Path) -> str:
    subprocess.run([sys.executable, str(GENERATOR), str(spec), str(out)], check=True)
    return out.read_text()


def _const(header: str, name: str) -> str:
    m = re.search(rf"constexpr \w+(?: const\*)? {name}(?:\[\])? = (.+);", header)
    assert m, f"{name} missing from the generated header"
    return m.group(1)


def test_both_specs_are_found() -> None:
    assert [s.parent.name for s in SPECS] == ["veoAttention", "veoPatchEmbedLayerNorm"]


@pytest.mark.parametrize("spec_path", SPECS, ids=lambda p: p.parent.name)
def test_header_matches_spec(spec_path: Path, tmp_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    header = _generate(spec_path, tmp_path / "spec.h")
    assert f"namespace veo::spec::{spec_path.parent.name}" in header
    assert _const(header, "kNAME") == f'"{spec["name"]}"'
    assert _const(header, "kVERSION") == f'"{spec["version"]}"'
    assert _const(header, "kNAMESPACE") == f'"{spec["namespace"]}"'
    assert int(_const(header, "kMIN_SM")) == spec["min_sm"]
    assert int(_const(header, "kNB_ATTRIBUTES")) == len(spec["attributes"])
    names = ", ".join(f'"{a["name"]}"' for a in spec["attributes"])
    assert _const(header, "kATTRIBUTE_NAMES") == f"{{{names}}}"
    for a in spec["attributes"]:
        key = "kATTR_" + a["name"].upper()
        assert _const(header, key) == f'"{a["name"]}"'
        assert _const(header, key + "_REQUIRED") == ("true" if a["required"] else "false")
        if "default" in a:
            value = _const(header, key + "_DEFAULT")
            if a["type"] == "float":
                assert float(value.rstrip("f")) == pytest.approx(a["default"], rel=1e-7, abs=0)
            else:
                assert int(value) == a["default"]
        else:
            assert f"{key}_DEFAULT" not in header
        for bound in ("min", "max"):
            if bound in a:
                assert int(_const(header, f"{key}_{bound.upper()}")) == a[bound]
    for kind, items in (("INPUT", spec["inputs"]), ("OUTPUT", spec["outputs"])):
        assert int(_const(header, f"kNB_{kind}S_MAX")) == len(items)
        assert int(_const(header, f"kNB_{kind}S_MIN")) == sum(not t.get("optional", False) for t in items)
        listed = ", ".join(f'"{t["name"]}"' for t in items)
        assert _const(header, f"k{kind}_NAMES") == f"{{{listed}}}"


def test_patch_embed_input_counts_follow_the_omitted_optionals_rule(tmp_path: Path) -> None:
    header = _generate(PLUGINS / "veoPatchEmbedLayerNorm" / "spec.json", tmp_path / "p.h")
    # 3 + (P>0) + has_pos_embed + 2*has_layernorm: from 3 (nothing optional) to 7 (everything).
    assert int(_const(header, "kNB_INPUTS_MIN")) == 3
    assert int(_const(header, "kNB_INPUTS_MAX")) == 7
    assert _const(header, "kINPUT_OPTIONAL") == "{false, false, false, true, true, true, true}"


def test_bad_spec_is_reported(tmp_path: Path) -> None:
    bad = tmp_path / "broken" / "spec.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"name": "X", "version": "1", "namespace": "veo", "inputs": [], "outputs": []}))
    r = subprocess.run(
        [sys.executable, str(GENERATOR), str(bad), str(tmp_path / "x.h")], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert re.search(r"spec lacks the 'attributes' field", r.stderr)
    assert not (tmp_path / "x.h").exists()
