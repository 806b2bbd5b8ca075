#!/usr/bin/env python3
"""Write a C++ header of constants from a plugin spec (``plugins/<op>/spec.json``).

    gen_spec_header.py plugins/veoAttention/spec.json build/plugins/generated/veoAttentionSpec.h

CMake runs this at configure time; the plugin glue and the TensorRT-free config code use only these
constants for names, version, namespace, attribute names, defaults and bounds, and input/output counts, so
a spec change cannot silently diverge from the C++. Depends on the standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ATTR_TYPES = {"int": "int64_t", "float": "float", "ints": "int64_t"}


def _ident(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z]", "_", name).upper()


def _namespace(spec_path: Path) -> str:
    return spec_path.parent.name  # plugins/veoAttention/spec.json -> veoAttention


def _literal(value: object, ctype: str) -> str:
    if ctype == "float":
        return f"{float(value)!r}f"
    return str(int(value))


def render(spec: dict, spec_path: Path) -> str:
    ns = _namespace(spec_path)
    for key in ("name", "version", "namespace", "attributes", "inputs", "outputs"):
        if key not in spec:
            raise ValueError(f"{spec_path}: spec lacks the {key!r} field; every plugin spec needs it")
    out = [
        f"// Generated from {spec_path.parent.name}/spec.json by plugins/tools/gen_spec_header.py. Do not edit:",
        "// change the spec and re-run cmake.",
        "#pragma once",
        "",
        "#include <cstdint>",
        "",
        f"namespace veo::spec::{ns}",
        "{",
        f'constexpr char const* kNAME = "{spec["name"]}";',
        f'constexpr char const* kVERSION = "{spec["version"]}";',
        f'constexpr char const* kNAMESPACE = "{spec["namespace"]}";',
        f'constexpr char const* kDOMAIN = "{spec.get("domain", "")}";',
        f"constexpr int32_t kMIN_SM = {int(spec.get('min_sm', 0))};",
        "",
    ]
    attrs = spec["attributes"]
    out.append(f"constexpr int32_t kNB_ATTRIBUTES = {len(attrs)};")
    for a in attrs:
        if a["type"] not in ATTR_TYPES:
            raise ValueError(
                f"{spec_path}: attribute {a['name']!r} has type {a['type']!r}; expected one of "
                f"{sorted(ATTR_TYPES)}"
            )
        ctype = ATTR_TYPES[a["type"]]
        key = f"kATTR_{_ident(a['name'])}"
        out.append(f"// attribute {a['name']}: {a['type']}, {'required' if a['required'] else 'optional'}")
        out.append(f'constexpr char const* {key} = "{a["name"]}";')
        out.append(f"constexpr bool {key}_REQUIRED = {'true' if a['required'] else 'false'};")
        out.append(f"constexpr bool {key}_IS_LIST = {'true' if a['type'] == 'ints' else 'false'};")
        if "default" in a:
            out.append(f"constexpr {ctype} {key}_DEFAULT = {_literal(a['default'], ctype)};")
        for bound in ("min", "max"):
            if bound in a:
                out.append(f"constexpr {ctype} {key}_{bound.upper()} = {_literal(a[bound], ctype)};")
    names = ", ".join(f'"{a["name"]}"' for a in attrs)
    out.append(f"constexpr char const* kATTRIBUTE_NAMES[] = {{{names}}};")
    out.append("")
    for kind, items in (("INPUT", spec["inputs"]), ("OUTPUT", spec["outputs"])):
        required = sum(1 for t in items if not t.get("optional", False))
        out.append(f"constexpr int32_t kNB_{kind}S_MAX = {len(items)};")
        out.append(f"constexpr int32_t kNB_{kind}S_MIN = {required};")
        listed = ", ".join(f'"{t["name"]}"' for t in items)
        out.append(f"constexpr char const* k{kind}_NAMES[] = {{{listed}}};")
        flags = ", ".join("true" if t.get("optional", False) else "false" for t in items)
        out.append(f"constexpr bool k{kind}_OPTIONAL[] = {{{flags}}};")
    out += ["", *_versions(spec, spec_path), "", f"}} // namespace veo::spec::{ns}", ""]
    return "\n".join(out)


def _versions(spec: dict, spec_path: Path) -> list[str]:
    """Every version a creator is registered for, and the inputs each takes: an input exists from its
    ``since_version`` on (TensorRT keys creators by name and version; older graphs keep loading)."""
    versions = [str(v) for v in spec.get("versions", [spec["version"]])]
    if str(spec["version"]) not in versions:
        raise ValueError(f"{spec_path}: version {spec['version']!r} is not among versions {versions}")
    out = [
        "// every version a creator is registered for; kVERSION is the newest",
        f"constexpr int32_t kNB_VERSIONS = {len(versions)};",
        "constexpr char const* kVERSIONS[] = {" + ", ".join(f'"{v}"' for v in versions) + "};",
    ]
    for v in versions:
        if not v.isdigit():
            raise ValueError(f"{spec_path}: version {v!r} is not a whole number")
        have = [t for t in spec["inputs"] if int(t.get("since_version", 1)) <= int(v)]
        required = sum(1 for t in have if not t.get("optional", False))
        out.append(f"constexpr int32_t kNB_INPUTS_MAX_V{v} = {len(have)};")
        out.append(f"constexpr int32_t kNB_INPUTS_MIN_V{v} = {required};")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: gen_spec_header.py SPEC_JSON OUT_HEADER", file=sys.stderr)
        return 2
    spec_path, out_path = Path(argv[1]), Path(argv[2])
    try:
        spec = json.loads(spec_path.read_text())
        text = render(spec, spec_path)
    except (OSError, ValueError, KeyError) as e:
        print(f"cannot generate a header from {spec_path}: {e}", file=sys.stderr)
        return 1
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if not out_path.exists() or out_path.read_text() != text:  # keep the mtime when unchanged
        out_path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
