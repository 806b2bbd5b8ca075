"""The manifest's JSON schema, one file per ``schema_version`` (``veo_edge/schemas/manifest.vN.json``),
checked with :mod:`jsonschema`; a violation becomes one line naming the field and what was expected.

Only what the loaders rely on is constrained: sections and fields the schema does not name are allowed,
so a stage may add its own (``precision``, ``accuracy``, ...) without a new schema version.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path
from typing import Any

from veo_edge.errors import BuildDirError, ManifestError

#: the schema version this veo-edge writes, and the versions it reads
SCHEMA_VERSION = 1
#: the minor version within it (``schema_minor``; absent means 0). 1 adds ``labels`` and ``preprocess``,
#: both optional: a 1.0 manifest is a valid 1.1 one, and a 1.0 reader ignores the new fields
SCHEMA_MINOR = 1
READS = (1,)


@functools.cache
def schema(version: int = SCHEMA_VERSION) -> dict[str, Any]:
    """The JSON schema of manifest ``version``."""
    text = resources.files("veo_edge").joinpath(f"schemas/manifest.v{version}.json").read_text()
    return json.loads(text)


def field_name(path: Any) -> str:
    """``inputs[0].shape`` for the JSON path ``["inputs", 0, "shape"]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(the whole manifest)"


def describe(error: Any) -> str:
    """One clause for a :class:`jsonschema.ValidationError`: which field, what it is, what was expected."""
    where = field_name(error.absolute_path)
    if error.validator == "required":
        missing = next((p for p in error.validator_value if p not in error.instance), "?")
        parent = f"{where}." if error.absolute_path else ""
        return f"field '{parent}{missing}' is missing"
    got = json.dumps(error.instance)
    if len(got) > 60:
        got = got[:57] + "..."
    expected = {
        "type": lambda v: f"a{'n' if str(v)[0] in 'aeiou' else ''} {v}",
        "const": lambda v: json.dumps(v),
        "enum": lambda v: "one of " + ", ".join(map(json.dumps, v)),
        "minimum": lambda v: f"at least {v}",
        "maximum": lambda v: f"at most {v}",
        "minItems": lambda v: f"at least {v} item{'s' if v != 1 else ''}",
        "minLength": lambda v: "a non-empty string",
        "pattern": lambda v: _pattern_meaning(error),
    }.get(error.validator)
    want = expected(error.validator_value) if expected else error.message
    return f"field '{where}' is {got}, expected {want}"


def _pattern_meaning(error: Any) -> str:
    if "sha256" in [str(p) for p in error.absolute_path]:
        return "64 lowercase hex digits (a sha256)"
    return "a relative path inside the build directory (no leading '/', no '..')"


def validate(manifest: Any, where: Path) -> None:
    """Raise :class:`ManifestError` (a version this veo-edge cannot read: :class:`BuildDirError`) unless
    ``manifest`` follows the schema of its ``schema_version``."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    if not isinstance(manifest, dict):
        raise ManifestError(
            f"{where} holds a JSON {type(manifest).__name__}, expected an object; "
            "rebuild it with `veo-edge build --force`"
        )
    version = manifest.get("schema_version")
    if "schema_version" not in manifest:
        raise ManifestError(f"{where}: field 'schema_version' is missing; it is not a veo-edge manifest")
    if version not in READS:
        raise BuildDirError(
            f"{where} has schema version {version!r}, this veo-edge reads "
            f"{', '.join(map(str, READS))}; rebuild it with this version"
        )
    errors = list(Draft202012Validator(schema(version)).iter_errors(manifest))
    if errors:
        first = best_match(errors)
        clauses = [describe(first), *(describe(e) for e in errors if e is not first)]
        shown = "; ".join(clauses[:3]) + (f" (and {len(clauses) - 3} more)" if len(clauses) > 3 else "")
        err = ManifestError(
            f"{where} does not follow manifest schema v{version}: {shown}; "
            "rebuild it with `veo-edge build --force`"
        )
        err.details = {"manifest": str(where), "schema_version": version, "problems": clauses}
        raise err


def problems(manifest: Any, version: int = SCHEMA_VERSION) -> list[str]:
    """Every schema violation of ``manifest``, one clause each (for reports)."""
    from jsonschema import Draft202012Validator

    return [describe(e) for e in Draft202012Validator(schema(version)).iter_errors(manifest)]
