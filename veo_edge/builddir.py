"""The build directory: every artifact a build made, indexed by ``manifest.json``.

Opening a build validates its manifest against the versioned schema (:mod:`veo_edge.manifest_schema`).
Every artifact a loader takes (:meth:`BuildDir.artifact`) is first checked against the sha256 and size
the manifest records, once per :class:`BuildDir` (again only when the file changed on disk), so a
tampered or corrupted build is refused at load with one line naming the file and both hashes
(:class:`~veo_edge.errors.ArtifactMismatchError`). :func:`verify` checks all of them on demand
(``veo-edge verify DIR``). How a build is written (staging, locking) is in :mod:`veo_edge.staging`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from veo_edge.errors import ArtifactMismatchError, BuildDirError
from veo_edge.manifest_schema import SCHEMA_MINOR, SCHEMA_VERSION, validate

MANIFEST_NAME = "manifest.json"
#: artifacts a loader reads together with the one it names (OpenVINO reads the .bin beside the .xml)
COMPANIONS = {"openvino_xml": ("openvino_bin",), "openvino_int8_xml": ("openvino_int8_bin",)}
#: verification shows a progress bar (on a terminal) from this many bytes on
PROGRESS_MIN_BYTES = 256 << 20
_CHUNK = 4 << 20
#: most files hashed at once
HASH_THREADS = 4

Advance = Callable[[int], None]

__all__ = ["MANIFEST_NAME", "SCHEMA_VERSION", "BuildDir", "VerifyReport", "verify"]


def sha256_file(path: Path, advance: Advance | None = None) -> str:
    """The sha256 of ``path``, read in 4 MiB chunks; ``advance(n)`` after each chunk."""
    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            if advance is not None:
                advance(n)
    return h.hexdigest()


def artifact_entry(root: Path, path: Path) -> dict[str, Any]:
    """``{"path", "sha256", "bytes"}`` of ``path``, with the path relative to ``root`` when inside it."""
    path = Path(path)
    try:
        rel = str(path.resolve().relative_to(Path(root).resolve()))
    except ValueError:
        rel = str(path)
    return {"path": rel, "sha256": sha256_file(path), "bytes": path.stat().st_size}


@dataclass(frozen=True)
class ArtifactCheck:
    """One artifact against its manifest entry."""

    kind: str
    path: str  # relative to the build directory, as the manifest records it
    bytes: int
    sha256: str
    expected_bytes: int
    expected_sha256: str

    @property
    def ok(self) -> bool:
        return self.bytes == self.expected_bytes and self.sha256 == self.expected_sha256

    def mismatch(self) -> str:
        """``model.onnx has sha256 X, the manifest records Y`` (sizes too when they differ)."""
        if self.bytes != self.expected_bytes:
            return (
                f"{self.path} has {self.bytes} bytes and sha256 {self.sha256}, the manifest records "
                f"{self.expected_bytes} bytes and sha256 {self.expected_sha256}"
            )
        return f"{self.path} has sha256 {self.sha256}, the manifest records {self.expected_sha256}"


@dataclass(frozen=True)
class VerifyReport:
    """What :func:`verify` checked: each artifact, the bytes hashed and the time it took."""

    path: str
    schema_version: int
    artifacts: list[ArtifactCheck]
    bytes: int
    seconds: float

    @property
    def ok(self) -> bool:
        return all(a.ok for a in self.artifacts)

    @property
    def mismatched(self) -> list[ArtifactCheck]:
        return [a for a in self.artifacts if not a.ok]

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "schema_version": self.schema_version,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 4),
            "artifacts": [{**asdict(a), "ok": a.ok} for a in self.artifacts],
        }

    def error(self) -> ArtifactMismatchError:
        bad = self.mismatched
        more = f" (also differ: {', '.join(a.path for a in bad[1:])})" if len(bad) > 1 else ""
        err = ArtifactMismatchError(
            f"build {self.path} was modified after it was built: {bad[0].mismatch()}{more}; "
            "rebuild it with `veo-edge build --force`"
        )
        err.details = self.to_dict()
        return err


@dataclass
class BuildDir:
    """A finished build directory, opened read-only through its schema-checked manifest."""

    path: Path
    manifest: dict[str, Any] = field(default_factory=dict)
    #: kind -> (inode, size, mtime_ns) of the file when it last matched the manifest
    _verified: dict[str, tuple[int, int, int]] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def open(cls, path: str | Path) -> BuildDir:
        path = Path(path)
        mpath = path / MANIFEST_NAME
        if not path.is_dir():
            what = "is a file, not a build directory" if path.exists() else "does not exist"
            raise BuildDirError(f"build directory {path} {what}; run `veo-edge build` first")
        if not mpath.is_file():
            raise BuildDirError(f"{path} has no {MANIFEST_NAME}; it is not a veo-edge build directory")
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError) as e:
            raise BuildDirError(f"{mpath} is unreadable or corrupt: {e}; rebuild with --force") from e
        validate(manifest, mpath)
        return cls(path=path, manifest=manifest)

    @property
    def model_name(self) -> str:
        return self.manifest["model"]["name"]

    @property
    def max_batch(self) -> int:
        return int(self.manifest["max_batch"])

    @property
    def served_output(self) -> str:
        return served_output(self.manifest)

    def has(self, kind: str) -> bool:
        return kind in self.manifest.get("artifacts", {})

    def _entry(self, kind: str) -> dict[str, Any]:
        entry = self.manifest.get("artifacts", {}).get(kind)
        if entry is None:
            have = ", ".join(sorted(self.manifest.get("artifacts", {})))
            raise BuildDirError(f"build {self.path} has no {kind!r} artifact (it has: {have})")
        return entry

    def _file(self, kind: str) -> Path:
        p = self.path / self._entry(kind)["path"]
        if not p.is_file():
            what = "is not a file" if p.exists() else "is missing"
            raise BuildDirError(
                f"artifact {kind!r} of build {self.path} {what}: {p}; rebuild with `veo-edge build --force`"
            )
        return p

    def file_problems(self) -> list[str]:
        """Each artifact whose file is missing or not the size the manifest records, as a sentence (a stat
        each: :meth:`verify` hashes them)."""
        problems = []
        for kind, entry in sorted(self.manifest.get("artifacts", {}).items()):
            p = self.path / entry["path"]
            if not p.is_file():
                problems.append(f"artifact {kind} ({entry['path']}) is missing")
            elif p.stat().st_size != int(entry["bytes"]):
                problems.append(
                    f"artifact {kind} ({entry['path']}) has {p.stat().st_size} bytes, the manifest records "
                    f"{entry['bytes']}"
                )
        return problems

    def artifact(self, kind: str) -> Path:
        """The path of artifact ``kind``, verified against the manifest (hashed the first time only)."""
        p = self._file(kind)
        kinds = [kind, *(k for k in COMPANIONS.get(kind, ()) if self.has(k))]
        if any(self._stamp(k) != self._verified.get(k) for k in kinds):
            self.verify(kinds)
        return p

    def _stamp(self, kind: str) -> tuple[int, int, int]:
        st = os.stat(self._file(kind))
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def verify(self, kinds: Iterable[str] | None = None, progress: bool | None = None) -> VerifyReport:
        """Hash the artifacts (all, or ``kinds`` and their companions) and compare each with the manifest;
        :class:`ArtifactMismatchError` naming every one that differs.

        ``progress``: a progress bar on stderr; ``None`` shows one on a terminal for builds of
        :data:`PROGRESS_MIN_BYTES` or more."""
        wanted = list(kinds) if kinds is not None else sorted(self.manifest.get("artifacts", {}))
        for k in list(wanted):
            wanted += [c for c in COMPANIONS.get(k, ()) if self.has(c) and c not in wanted]
        files = {k: self._file(k) for k in wanted}
        total = sum(p.stat().st_size for p in files.values())
        if progress is None:
            progress = total >= PROGRESS_MIN_BYTES and sys.stderr.isatty()
        start = time.perf_counter()
        with _progress(progress, total, f"Verifying {self.path}") as advance:

            def check(kind: str) -> tuple[ArtifactCheck, tuple[int, int, int]]:
                stamp = self._stamp(kind)
                entry = self.manifest["artifacts"][kind]
                digest = sha256_file(files[kind], advance)
                return ArtifactCheck(
                    kind, entry["path"], stamp[1], digest, int(entry["bytes"]), entry["sha256"]
                ), stamp

            # hashlib releases the GIL while it hashes: the files are hashed side by side
            workers = max(1, min(len(files), HASH_THREADS, os.cpu_count() or 1))
            with ThreadPoolExecutor(workers, thread_name_prefix="veo-edge-verify") as pool:
                results = list(pool.map(check, files))
        checks = []
        for c, stamp in results:
            checks.append(c)
            if c.ok:
                self._verified[c.kind] = stamp
            else:
                self._verified.pop(c.kind, None)
        report = VerifyReport(
            str(self.path), int(self.manifest["schema_version"]), checks, total, time.perf_counter() - start
        )
        if not report.ok:
            raise report.error()
        return report


def verify(path: str | Path, progress: bool | None = None) -> VerifyReport:
    """Open the build directory ``path`` (its manifest checked against the schema) and verify every
    artifact against the manifest: the report, or :class:`ArtifactMismatchError` /
    :class:`~veo_edge.errors.ManifestError` / :class:`BuildDirError`."""
    return BuildDir.open(path).verify(progress=progress)


class _progress:
    """A rich progress bar over ``total`` bytes on stderr (transient), or nothing."""

    def __init__(self, show: bool, total: int, description: str) -> None:
        self.show, self.total, self.description = show, total, description
        self._bar: Any = None

    def __enter__(self) -> Advance | None:
        if not self.show:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._bar.start()
        task = self._bar.add_task(self.description, total=self.total)
        return lambda n: self._bar.advance(task, n)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()


def served_output(manifest: dict[str, Any]) -> str:
    """What the model's output holds: ``logits`` (class scores), or the features a Hugging Face backbone,
    CLIP or SigLIP serves (``pooler_output``, ``image_embeds``, ...), as the build recorded it."""
    return ((manifest.get("model") or {}).get("config") or {}).get("output") or "logits"


def write_manifest(root: Path, manifest: dict[str, Any]) -> Path:
    """Write ``manifest.json`` (with the schema version) into ``root``, checked against the schema first:
    a build never writes a manifest it could not open again."""
    path = Path(root) / MANIFEST_NAME
    full = {"schema_version": SCHEMA_VERSION, "schema_minor": SCHEMA_MINOR, **manifest}
    validate(full, path)
    path.write_text(json.dumps(full, indent=2, sort_keys=False) + "\n")
    return path
