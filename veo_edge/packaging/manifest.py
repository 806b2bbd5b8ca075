"""The image manifest: the sha256 and size of every file baked under ``/opt/veo-edge`` (the virtual
environment, the build directory, the entrypoint, the healthcheck, the SELinux module, the SBOM, the
plugin libraries) and the target of every symlink, optionally signed (:mod:`.signing`).

It is made from the built image itself (its ``/opt/veo-edge`` read back through the engine), so files
compiled inside the image (the plugin libraries) are covered too, and added to the image in a last layer
under ``trust/`` with its signature and the public key. The same check runs in two places:
``scan_dir`` inside a container (the entrypoint, before anything is served) and ``scan_tar`` from
outside (``veo-edge verify IMAGE``, over the engine's archive of the image).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from veo_edge.errors import ImageTrustError
from veo_edge.packaging import signing
from veo_edge.packaging.streams import buffered

SCHEMA = "veo-edge/image-manifest/v1"
IMAGE_ROOT = "/opt/veo-edge"
TRUST_DIR = "trust"
MANIFEST_FILE = f"{TRUST_DIR}/image-manifest.json"
SIGNATURE_FILE = f"{TRUST_DIR}/image-manifest.dsse.json"
PUBKEY_FILE = f"{TRUST_DIR}/signing-key.pub.pem"
TRUST_FILES = (MANIFEST_FILE, SIGNATURE_FILE, PUBKEY_FILE)
#: the run-time pin of the signing key: a fingerprint (sha256:...) or a PEM public key file
TRUSTED_KEY_ENV = "VEO_EDGE_TRUSTED_KEY"
#: the run-time opt-out (deploy --allow-unsigned sets it): unsigned images start, loudly
ALLOW_UNSIGNED_ENV = "VEO_EDGE_ALLOW_UNSIGNED"


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the image root, '/'-separated
    sha256: str | None  # files
    bytes: int
    target: str | None = None  # symlinks


def _sha256_stream(f: IO[bytes]) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    while block := f.read(1 << 20):
        h.update(block)
        n += len(block)
    return h.hexdigest(), n


def _in_trust(rel: str) -> bool:
    return rel == TRUST_DIR or rel.startswith(TRUST_DIR + "/")


def scan_dir(root: Path) -> tuple[dict[str, Entry], dict[str, bytes]]:
    """Every file and symlink under ``root`` (trust files apart, returned by content)."""
    root = Path(root)
    entries: dict[str, Entry] = {}
    trust: dict[str, bytes] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames) + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root).replace(os.sep, "/")
            st = os.lstat(full)
            if _in_trust(rel):
                if stat.S_ISREG(st.st_mode):
                    trust[rel] = Path(full).read_bytes()
                else:
                    trust[rel] = b""
            elif stat.S_ISLNK(st.st_mode):
                entries[rel] = Entry(rel, None, 0, os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as f:
                    digest, n = _sha256_stream(f)
                entries[rel] = Entry(rel, digest, n)
            else:
                entries[rel] = Entry(rel, None, 0, f"<{stat.filemode(st.st_mode)}>")
    return entries, trust


def scan_tar(chunks: Iterator[bytes], top: str) -> tuple[dict[str, Entry], dict[str, bytes]]:
    """The same from a tar stream of the root (Docker's ``get_archive``: members start with ``top/``)."""
    entries: dict[str, Entry] = {}
    trust: dict[str, bytes] = {}
    with tarfile.open(fileobj=buffered(chunks), mode="r|") as tar:
        for m in tar:
            rel = m.name[len(top) :].lstrip("/") if m.name.startswith(top) else m.name
            if not rel or m.isdir():
                continue
            if _in_trust(rel):
                f = tar.extractfile(m) if m.isfile() else None
                trust[rel] = f.read() if f is not None else b""
                if m.islnk():  # the bytes of the member it names, as the disk would show them
                    trust[rel] = trust.get(m.linkname[len(top) :].lstrip("/"), b"")
            elif m.issym():
                entries[rel] = Entry(rel, None, 0, m.linkname)
            elif m.isfile():
                digest, n = _sha256_stream(tar.extractfile(m))
                entries[rel] = Entry(rel, digest, n)
            elif m.islnk():
                # a hard link is a regular file on disk (scan_dir hashes it as one): the same bytes as
                # the member it names; a link to something this archive did not carry cannot be hashed,
                # so it is recorded as such and fails the check instead of vanishing
                target = m.linkname[len(top) :].lstrip("/") if m.linkname.startswith(top) else None
                if target is not None and target in entries and entries[target].sha256 is not None:
                    entries[rel] = Entry(rel, entries[target].sha256, entries[target].bytes)
                elif target is not None and target in trust:
                    entries[rel] = Entry(rel, hashlib.sha256(trust[target]).hexdigest(), len(trust[target]))
                else:
                    entries[rel] = Entry(rel, None, 0, f"<hard link to {m.linkname}>")
            else:
                entries[rel] = Entry(rel, None, 0, f"<{m.type!r}>")
    return entries, trust


def make_manifest(entries: dict[str, Entry], info: dict[str, Any]) -> bytes:
    """The manifest's bytes (deterministic: sorted keys, one file per line)."""
    files = {e.path: {"sha256": e.sha256, "bytes": e.bytes} for e in entries.values() if e.sha256}
    links = {e.path: e.target for e in entries.values() if e.sha256 is None}
    body = {"schema": SCHEMA, "root": IMAGE_ROOT, **info, "files": files, "symlinks": links}
    return (json.dumps(body, sort_keys=True, indent=0) + "\n").encode()


def trusted_fingerprint(trusted: str | None, env: bool = True) -> str | None:
    """``trusted`` (else, with ``env``, $VEO_EDGE_TRUSTED_KEY) as a fingerprint: given as one, or a PEM
    public key file."""
    if trusted is None and env:
        trusted = os.environ.get(TRUSTED_KEY_ENV) or None
    if trusted is None or trusted.startswith("sha256:"):
        return trusted
    path = Path(trusted)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise ImageTrustError(
            f"trusted key {trusted!r} is neither a sha256:... fingerprint nor a readable PEM file ({e})"
        ) from e
    return signing.fingerprint(signing.load_public_key(data, str(path)))


def check(
    entries: dict[str, Entry],
    trust: dict[str, bytes],
    source: str,
    trusted_key: str | None = None,
    allow_unsigned: bool = False,
) -> dict[str, Any]:
    """Verify ``entries`` against the manifest in ``trust`` and its signature; returns a report, raises
    :class:`ImageTrustError` (one line: what differs, how many, what to do) on any mismatch. An unsigned
    manifest is refused unless ``allow_unsigned``; ``trusted_key`` (a fingerprint or PEM file, else
    $VEO_EDGE_TRUSTED_KEY) must be its signer when given."""
    raw = trust.get(MANIFEST_FILE)
    if raw is None:
        raise ImageTrustError(
            f"{source} has no {MANIFEST_FILE}; it was not built by `veo-edge build --target`, or it was stripped"
        )
    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise ImageTrustError(f"{source}: {MANIFEST_FILE} is not JSON ({e})") from e
    if manifest.get("schema") != SCHEMA:
        raise ImageTrustError(f"{source}: manifest schema is {manifest.get('schema')!r}, expected {SCHEMA!r}")
    extra_trust = sorted(set(trust) - set(TRUST_FILES))
    if extra_trust:
        raise ImageTrustError(f"{source}: unexpected files in {TRUST_DIR}/: {', '.join(extra_trust)}")

    # the signature first: a forged manifest must not get as far as being believed
    signer = manifest.get("signing_key")
    pinned = trusted_fingerprint(trusted_key)
    if signer is None:
        if pinned is not None:
            raise ImageTrustError(
                f"{source} is unsigned, but key {pinned} is required ({TRUSTED_KEY_ENV} or --key); "
                "rebuild it with --sign-key"
            )
        if not allow_unsigned:
            raise ImageTrustError(
                f"{source} is unsigned; build it with `veo-edge build --target ...` (it signs with "
                f"--sign-key or your local key), or accept it knowingly with {ALLOW_UNSIGNED_ENV}=1 "
                "(--allow-unsigned)"
            )
    else:
        if SIGNATURE_FILE not in trust or PUBKEY_FILE not in trust:
            raise ImageTrustError(
                f"{source}: the manifest names signing key {signer} but the image has no signature "
                f"({SIGNATURE_FILE}) or no public key ({PUBKEY_FILE})"
            )
        key = signing.load_public_key(trust[PUBKEY_FILE], f"{source}:{PUBKEY_FILE}")
        got = signing.fingerprint(key)
        if got != signer:
            raise ImageTrustError(f"{source}: the baked public key is {got}, the manifest names {signer}")
        if pinned is not None and pinned != signer:
            raise ImageTrustError(f"{source} is signed by {signer}, not by the trusted key {pinned}")
        signing.verify_envelope(trust[SIGNATURE_FILE], raw, key, source)

    problems: list[str] = []
    files, links = manifest.get("files", {}), manifest.get("symlinks", {})
    for path, want in files.items():
        got_e = entries.get(path)
        if got_e is None or got_e.sha256 is None:
            problems.append(f"{path} is missing")
        elif (got_e.sha256, got_e.bytes) != (want["sha256"], want["bytes"]):
            problems.append(
                f"{path} has sha256 {got_e.sha256} ({got_e.bytes} bytes), the manifest records "
                f"{want['sha256']} ({want['bytes']} bytes)"
            )
    for path, target in links.items():
        got_e = entries.get(path)
        if got_e is None or got_e.target != target:
            problems.append(f"symlink {path} -> {target} is missing or points elsewhere")
    for path in sorted(set(entries) - set(files) - set(links)):
        problems.append(f"{path} is not in the manifest (added after the build)")
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ImageTrustError(
            f"{source}: baked files do not match the image manifest: {problems[0]}{more}; the image was "
            "modified after it was built: rebuild it with `veo-edge build --target ...`"
        )
    return {
        "source": source,
        "ok": True,
        "files": len(files),
        "symlinks": len(links),
        "bytes": sum(f["bytes"] for f in files.values()),
        "signed_by": signer,
        "pinned_key": pinned,
        "target": manifest.get("target"),
        "model": manifest.get("model"),
        "veo_edge_version": manifest.get("veo_edge_version"),
    }


def verify_root(
    root: Path = Path(IMAGE_ROOT),
    trusted_key: str | None = None,
    cache: Path | None = None,
    allow_unsigned: bool = False,
) -> dict[str, Any]:
    """The entrypoint's check: the image root on disk against its manifest and signature, and, with
    ``cache``, the cache volume against what the image writes there (:mod:`.cachecheck`). Unsigned
    images pass only with ``allow_unsigned`` or $VEO_EDGE_ALLOW_UNSIGNED=1."""
    allow = allow_unsigned or os.environ.get(ALLOW_UNSIGNED_ENV, "") == "1"
    entries, trust = scan_dir(Path(root))
    report = check(entries, trust, str(root), trusted_key, allow_unsigned=allow)
    if cache is not None:
        report["cache"] = check_cache(cache_items=None, cache_dir=Path(cache), trust=trust, source=str(cache))
    return report


def check_cache(
    cache_items: list | None, trust: dict[str, bytes], source: str, cache_dir: Path | None = None
) -> dict[str, Any]:
    """Refuse a cache volume holding what the image would not write there (see :mod:`.cachecheck`)."""
    from veo_edge.packaging import cachecheck

    raw = trust[MANIFEST_FILE]
    items = cache_items if cache_items is not None else cachecheck.scan_dir(Path(cache_dir or "."))
    digest = hashlib.sha256(raw).hexdigest()
    found = cachecheck.problems(items, json.loads(raw), digest)
    if found:
        more = f" (and {len(found) - 1} more: {'; '.join(found[1:4])})" if len(found) > 1 else ""
        raise ImageTrustError(
            f"{source}: the cache volume holds files the image did not write: {found[0]}{more}; nothing "
            "was run. Inspect the volume, then remove those files (or the volume) and start again"
        )
    return {"ok": True, "entries": len(items), "engine_dir": cachecheck.key_dir(digest)}
