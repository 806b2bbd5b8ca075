"""The manifest's JSON schema, one file per ``schema_version`` (``veo_edge/schemas/manifest.vN.json``),
checked with ``jsonschema-rs`` (Draft 2020-12); a violation becomes one line naming the field and what
was expected.

Every command that opens a build validates its manifest, in a process of its own. The pure-Python
``jsonschema`` cost 1.1 s of CPU to import wherever ``rfc3987-syntax`` is installed (it builds its IRI
grammars at import; cyclonedx-python-lib's ``validation`` extra, which the ``image`` extra pulls in,
installs it), against 0.03 s for jsonschema-rs: measured with ``python -c "import jsonschema"``.

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


def _type(types: Any) -> str:
    names = [types] if isinstance(types, str) else list(types)
    return " or ".join(f"a{'n' if str(v)[0] in 'aeiou' else ''} {v}" for v in names)


#: jsonschema-rs error kinds -> what was expected, from the kind's own fields
_EXPECTED = {
    "type": lambda k, path: _type(k["types"]),
    "constant": lambda k, path: json.dumps(k["expected_value"]),
    "enum": lambda k, path: "one of " + ", ".join(map(json.dumps, k["options"])),
    "minimum": lambda k, path: f"at least {k['limit']}",
    "maximum": lambda k, path: f"at most {k['limit']}",
    "exclusiveMinimum": lambda k, path: f"more than {k['limit']}",
    "minItems": lambda k, path: f"at least {k['limit']} item{'s' if k['limit'] != 1 else ''}",
    "minLength": lambda k, path: "a non-empty string",
    "pattern": lambda k, path: _pattern_meaning(path),
}


def describe(error: Any) -> str:
    """One clause for a ``jsonschema_rs.ValidationError``: which field, what it is, what was expected."""
    path = list(error.instance_path)
    where = field_name(path)
    kind = error.kind
    if kind.name == "required":
        parent = f"{where}." if path else ""
        return f"field '{parent}{kind.as_dict()['property']}' is missing"
    got = json.dumps(error.instance)
    if len(got) > 60:
        got = got[:57] + "..."
    expected = _EXPECTED.get(kind.name)
    want = expected(kind.as_dict(), path) if expected else error.message
    return f"field '{where}' is {got}, expected {want}"


def _pattern_meaning(path: list[Any]) -> str:
    if "sha256" in [str(p) for p in path]:
        return "64 lowercase hex digits (a sha256)"
    return "a relative path inside the build directory (no leading '/', no '..')"


@functools.cache
def _validator(version: int) -> Any:
    import jsonschema_rs

    return jsonschema_rs.Draft202012Validator(schema(version))


def _errors(manifest: Any, version: int) -> list[Any]:
    """Every violation, the shallowest first (as jsonschema's ``best_match`` would lead with it)."""
    return sorted(_validator(version).iter_errors(manifest), key=lambda e: len(list(e.instance_path)))


def validate(manifest: Any, where: Path) -> None:
    """Raise :class:`ManifestError` (a version this veo-edge cannot read: :class:`BuildDirError`) unless
    ``manifest`` follows the schema of its ``schema_version``."""
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
    errors = _errors(manifest, version)
    if errors:
        clauses = [describe(e) for e in errors]
        shown = "; ".join(clauses[:3]) + (f" (and {len(clauses) - 3} more)" if len(clauses) > 3 else "")
        err = ManifestError(
            f"{where} does not follow manifest schema v{version}: {shown}; "
            "rebuild it with `veo-edge build --force`"
        )
        err.details = {"manifest": str(where), "schema_version": version, "problems": clauses}
        raise err


def problems(manifest: Any, version: int = SCHEMA_VERSION) -> list[str]:
    """Every schema violation of ``manifest``, one clause each (for reports)."""
    return [describe(e) for e in _errors(manifest, version)]
