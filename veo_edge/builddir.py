"""The build directory: every artifact a build made, indexed by ``manifest.json``.

A build is written into a staging directory beside its destination and renamed into place only when
every stage passed, so no half-written build ever sits under the output name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veo_edge.errors import BuildDirError, OutputExistsError

MANIFEST_NAME = "manifest.json"
SCHEMA_VERSION = 1


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def artifact_entry(root: Path, path: Path) -> dict[str, Any]:
    """``{"path", "sha256", "bytes"}`` of ``path``, with the path relative to ``root`` when inside it."""
    path = Path(path)
    try:
        rel = str(path.resolve().relative_to(Path(root).resolve()))
    except ValueError:
        rel = str(path)
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


def check_output(out: Path, force: bool) -> None:
    """Refuse an existing output directory unless ``force``."""
    if Path(out).exists() and not force:
        raise OutputExistsError(f"output directory {out} already exists; pass --force to overwrite it")


@contextlib.contextmanager
def staged_output(out: Path, force: bool) -> Iterator[Path]:
    """Yield an empty staging directory; on success it replaces ``out`` atomically, on failure it goes."""
    out = Path(out)
    check_output(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        out.rename(old)
    os.chmod(stage, 0o755)
    stage.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@dataclass
class BuildDir:
    """A finished build directory, opened read-only through its manifest."""

    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, path: str | Path) -> BuildDir:
        path = Path(path)
        mpath = path / MANIFEST_NAME
        if not path.is_dir():
            raise BuildDirError(f"build directory {path} does not exist; run `veo-edge build` first")
        if not mpath.is_file():
            raise BuildDirError(f"{path} has no {MANIFEST_NAME}; it is not a veo-edge build directory")
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError) as e:
            raise BuildDirError(f"{mpath} is unreadable or corrupt: {e}; rebuild with --force") from e
        if manifest.get("schema_version") != SCHEMA_VERSION:
            raise BuildDirError(
                f"{mpath} has schema version {manifest.get('schema_version')!r}, this veo-edge reads "
                f"{SCHEMA_VERSION}; rebuild it with this version"
            )
        return cls(path=path, manifest=manifest)

    @property
    def model_name(self) -> str:
        return self.manifest["model"]["name"]

    @property
    def max_batch(self) -> int:
        return int(self.manifest["max_batch"])

    def has(self, kind: str) -> bool:
        return kind in self.manifest.get("artifacts", {})

    def artifact(self, kind: str) -> Path:
        entry = self.manifest.get("artifacts", {}).get(kind)
        if entry is None:
            have = ", ".join(sorted(self.manifest.get("artifacts", {})))
            raise BuildDirError(f"build {self.path} has no {kind!r} artifact (it has: {have})")
        p = Path(entry["path"])
        p = p if p.is_absolute() else self.path / p
        if not p.is_file():
            raise BuildDirError(
                f"artifact {kind!r} of build {self.path} is missing: {p}; rebuild with --force"
            )
        return p

    def verify(self, kinds: list[str] | None = None) -> None:
        """Check size and sha256 of the artifacts (all, or ``kinds``) against the manifest."""
        for kind in kinds or sorted(self.manifest.get("artifacts", {})):
            p = self.artifact(kind)
            entry = self.manifest["artifacts"][kind]
            if p.stat().st_size != entry["bytes"] or sha256_file(p) != entry["sha256"]:
                raise BuildDirError(
                    f"artifact {kind!r} ({p}) does not match its manifest checksum; the build directory "
                    "was modified or corrupted: rebuild it with `veo-edge build --force`"
                )


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    path = Path(root) / MANIFEST_NAME
    path.write_text(
        json.dumps({"schema_version": SCHEMA_VERSION, **manifest}, indent=2, sort_keys=False) + "\n"
    )
    return path
