"""The CycloneDX SBOM of the image's Python environment, made by cyclonedx-bom (``cyclonedx-py``) from
the wheelhouse's ``requirements.lock``: the image installs exactly that list (``--no-index --no-deps
--require-hashes``), so each component's version and wheel sha256 are those of the installed one.

:func:`complete` then adds what cyclonedx-py cannot see: the model (a ``machine-learning-model``
component with the sha256 of every artifact the build directory's manifest records, each a ``data``
component), the base image (a ``container`` component, with its image ID where an engine holds it), and
gives veo-edge's own wheel, built here and never fetched from PyPI, a ``pkg:generic`` purl with its
sha256 instead of cyclonedx-py's ``pkg:pypi`` and PyPI URL (a scanner would otherwise look up whatever
PyPI's veo-edge is). The result is checked against the CycloneDX schema by cyclonedx-python-lib where its
``json-validation`` extra is installed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from veo_edge.errors import PackagingError

SBOM_NAME = "sbom.cdx.json"


def make_sbom(lock: Path, pyproject: Path, out: Path) -> Path:
    try:
        import cyclonedx_py  # noqa: F401
    except ImportError as e:
        raise PackagingError(
            "cyclonedx-bom is not installed; image builds need it for the SBOM: pip install 'veo-edge[image]'"
        ) from e
    cmd = [
        sys.executable,
        "-m",
        "cyclonedx_py",
        "requirements",
        "--pyproject",
        str(pyproject),
        "--mc-type",
        "application",
        "--output-reproducible",
        "--of",
        "JSON",
        "-o",
        str(out),
        str(lock),
    ]
    env = {**os.environ, "SOURCE_DATE_EPOCH": os.environ.get("SOURCE_DATE_EPOCH", "0")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise PackagingError(
            f"cyclonedx-py failed on {lock} (exit {proc.returncode}): {proc.stderr.strip()[-400:]}"
        )
    return out


def _sha256(hexdigest: str) -> list[dict[str, str]]:
    return [{"alg": "SHA-256", "content": hexdigest}]


def _own_wheel(component: dict[str, Any], wheels: Path) -> None:
    """veo-edge's wheel as what it is: a local build, by its file name and sha256."""
    from veo_edge.builddir import sha256_file

    found = sorted(wheels.glob(f"veo_edge-{component['version']}-*.whl"))
    if not found:
        return
    digest = sha256_file(found[0])
    component["purl"] = (
        f"pkg:generic/veo-edge@{component['version']}?checksum=sha256:{digest}&file_name={found[0].name}"
    )
    component["hashes"] = _sha256(digest)
    refs = [r for r in component.get("externalReferences", []) if "pypi.org" not in r.get("url", "")]
    component.pop("externalReferences", None)
    if refs:
        component["externalReferences"] = refs
    component.setdefault("properties", []).append(
        {"name": "veo-edge:origin", "value": f"built from this source tree into wheels/{found[0].name}"}
    )


def complete(
    path: Path, wheels: Path, build_dir: Path, model: dict[str, Any], base_image: str, base_id: str | None
) -> Path:
    """Add the model, its artifacts and the base image to the SBOM at ``path``, fix veo-edge's own wheel,
    and check the result against the CycloneDX schema (see the module docstring)."""
    from veo_edge.builddir import MANIFEST_NAME

    bom = json.loads(Path(path).read_text())
    components = bom.setdefault("components", [])
    for c in components:
        if c.get("name") == "veo-edge":
            _own_wheel(c, Path(wheels))
    artifacts = json.loads((Path(build_dir) / MANIFEST_NAME).read_text()).get("artifacts", {})
    data = [
        {"type": "data", "bom-ref": f"model-artifact:{a['path']}", "name": a["path"], "hashes": _sha256(a["sha256"]),
         "description": f"{kind} artifact of the build, baked at /opt/veo-edge/model/{a['path']}"}
        for kind, a in sorted(artifacts.items())
        if isinstance(a, dict) and a.get("path") and a.get("sha256")
    ]  # fmt: skip
    ml = {
        "type": "machine-learning-model",
        "bom-ref": f"model:{model['name']}",
        "name": model["name"],
        "description": f"the served model ({model.get('precision', 'fp32')}, max batch {model.get('max_batch')}); "
        "its hash is the ONNX export's",
        "components": data,
    }
    if model.get("sha256"):
        ml["hashes"] = _sha256(model["sha256"])
    base = {"type": "container", "bom-ref": f"base-image:{base_image}", "name": base_image,
            "description": "the runtime base image the image is built FROM"}  # fmt: skip
    if base_id:
        base["hashes"] = _sha256(base_id.split(":", 1)[-1])
        base["properties"] = [{"name": "veo-edge:image-id", "value": base_id}]
    components[:0] = [ml, base]
    text = json.dumps(bom, indent=2, sort_keys=False) + "\n"
    _validate(text, bom.get("specVersion", "1.6"))
    Path(path).write_text(text)
    return Path(path)


def _validate(text: str, spec: str) -> None:
    """The CycloneDX schema check; skipped where cyclonedx-python-lib's optional ``json-validation``
    dependencies (jsonschema) are not installed (the dev install has them)."""
    from cyclonedx.exception import MissingOptionalDependencyException
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    try:
        error = JsonStrictValidator(SchemaVersion.from_version(spec)).validate_str(text)
    except MissingOptionalDependencyException:
        return
    if error is not None:
        raise PackagingError(f"the SBOM is not valid CycloneDX {spec}: {str(error)[:400]}")
