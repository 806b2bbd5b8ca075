"""The image signature: a DSSE envelope over an in-toto Statement whose subject is the image ID.

The image ID is the sha256 of the image's config, which holds the Entrypoint, Cmd, Env, User,
WorkingDir, Healthcheck, the labels and the diff_id of every layer (the base image's included): signing
it signs everything that runs, as cosign signs a manifest digest. A signature cannot live inside the
image it signs, so it is kept beside it, in the two places cosign uses:

- a **signature image** tagged ``<repo>:sha256-<hex of the id>.sig`` on the same engine (and registry,
  when the image goes through one): ``FROM scratch`` with the envelope as its one file
  (``/signature.dsse.json``) and in its label ``io.veo-edge.signature``, so the engine answers with it
  without running anything;
- a **detached file**, ``image-signature.dsse.json`` in the build context, for ``--signature FILE``.

The Statement's predicate carries the signer's public key (PEM), the sha256 of the in-image file
manifest (``trust/image-manifest.json``, for the in-container check) and what was built. A verifier
takes the key from the envelope only to compare its fingerprint with the pinned one; the payload is
believed only after the signature verifies with that key, and then only for the image ID it names.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from veo_edge.errors import ImageTrustError
from veo_edge.packaging import signing

PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://veo-edge.dev/image-signature/v1"
SIGNATURE_FILE = "image-signature.dsse.json"
LABEL_SIGNATURE = "io.veo-edge.signature"
LABEL_SUBJECT = "io.veo-edge.signature.subject"


def _hex(image_id: str) -> str:
    return image_id.split(":", 1)[1] if image_id.startswith("sha256:") else image_id


def signature_tag(repo: str, image_id: str) -> str:
    """cosign's convention: ``<repo>:sha256-<hex>.sig``."""
    return f"{repo}:sha256-{_hex(image_id)}.sig"


def repo_of(ref: str) -> str:
    """``registry:5000/a/b:tag`` -> ``registry:5000/a/b`` (a digest or tag removed)."""
    from docker.utils import parse_repository_tag

    return parse_repository_tag(ref.split("@", 1)[0])[0]


def sign_image(
    image_id: str, repo: str, manifest_raw: bytes, info: dict[str, Any], private_key: Any
) -> bytes:
    """The envelope (JSON bytes) signing ``image_id`` with ``private_key``."""
    public = private_key.public_key()
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": repo, "digest": {"sha256": _hex(image_id)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "image_id": image_id,
            "manifest_sha256": hashlib.sha256(manifest_raw).hexdigest(),
            "signing_key": signing.fingerprint(public),
            "public_key": signing.public_pem(public).decode(),
            **{k: info[k] for k in ("target", "model", "veo_edge_version") if k in info},
        },
    }
    payload = json.dumps(statement, sort_keys=True).encode()
    return (json.dumps(signing.sign(payload, private_key, PAYLOAD_TYPE), indent=1) + "\n").encode()


@dataclass(frozen=True)
class Verified:
    image_id: str
    signed_by: str
    manifest_sha256: str | None
    predicate: dict[str, Any]


def verify(envelope_json: bytes, image_id: str, pinned: str | None, source: str) -> Verified:
    """Check that ``envelope_json`` is a signature of ``image_id`` by the key ``pinned`` (a fingerprint;
    None: any key that verifies, which only proves the envelope is self-consistent)."""
    envelope = signing.open_envelope(envelope_json, source, PAYLOAD_TYPE)
    try:
        claimed = json.loads(envelope.payload)
        pem = claimed["predicate"]["public_key"].encode()
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ImageTrustError(f"{source}: the signed statement names no public key ({e})") from e
    key = signing.load_public_key(pem, f"{source}: the signer's key")
    signer = signing.fingerprint(key)
    if pinned is not None and signer != pinned:
        raise ImageTrustError(
            f"{source} is signed by {signer}, not by the trusted key {pinned}; deploy only images your key "
            "signed (--key/--verify-key/$VEO_EDGE_TRUSTED_KEY), or rebuild it with that key"
        )
    signing.verify_signed(envelope, key, source)
    statement = claimed  # trusted from here on: the signature verified with the pinned key
    if statement.get("_type") != STATEMENT_TYPE or statement.get("predicateType") != PREDICATE_TYPE:
        raise ImageTrustError(f"{source}: the signed statement is not a veo-edge image signature")
    digests = [(s.get("digest") or {}).get("sha256") for s in statement.get("subject") or []]
    if _hex(image_id) not in digests:
        signed = ", ".join(f"sha256:{d}" for d in digests if d) or "nothing"
        raise ImageTrustError(
            f"{source}: the signature is for image {signed}, not for this image's ID {image_id}: the image "
            "was changed after it was signed (its entrypoint, environment, user, labels or a layer); "
            "rebuild it with `veo-edge build --target ...`"
        )
    predicate = statement["predicate"]
    return Verified(image_id, signer, predicate.get("manifest_sha256"), predicate)


def store_signature_image(client: Any, repo: str, image_id: str, envelope_json: bytes) -> str:
    """Build the signature image ``<repo>:sha256-<hex>.sig`` on ``client``; returns its tag."""
    from veo_edge.errors import ImageBuildError

    tag = signature_tag(repo, image_id)
    with tempfile.TemporaryDirectory(prefix="veo-sig-") as tmp:
        (Path(tmp) / SIGNATURE_FILE).write_bytes(envelope_json)
        (Path(tmp) / SIGNATURE_FILE).chmod(0o644)
        (Path(tmp) / "Dockerfile").write_text(f"FROM scratch\nCOPY {SIGNATURE_FILE} /\n")
        labels = {LABEL_SIGNATURE: envelope_json.decode(), LABEL_SUBJECT: image_id}
        for chunk in client.api.build(path=tmp, tag=tag, labels=labels, rm=True, decode=True):
            if "error" in chunk:
                raise ImageBuildError(f"building the signature image {tag} failed: {chunk['error'].strip()}")
    return tag


def _repos(client: Any, ref: str, image: Any) -> list[str]:
    repos = [] if ref.startswith("sha256:") else [repo_of(ref)]
    for t in image.tags or []:
        if repo_of(t) not in repos:
            repos.append(repo_of(t))
    for d in image.attrs.get("RepoDigests") or []:
        if repo_of(d) not in repos:
            repos.append(repo_of(d))
    return repos


def find_signatures(client: Any, ref: str, image: Any) -> list[tuple[bytes, str]]:
    """Every envelope for ``image``'s ID on ``client`` and where it was found: the signature image of each
    repository the image is known by, then any other signature image whose subject label names the ID
    (one left under a repository the image is no longer tagged in). Empty when there is none."""
    from docker.errors import ImageNotFound

    found: list[tuple[bytes, str]] = []
    seen: set[str] = set()
    for repo in _repos(client, ref, image):
        tag = signature_tag(repo, image.id)
        try:
            sig = client.images.get(tag)
        except ImageNotFound:
            continue
        text = (sig.labels or {}).get(LABEL_SIGNATURE)
        if text and tag not in seen:
            seen.add(tag)
            found.append((text.encode(), f"signature image {tag}"))
    for sig in client.images.list(filters={"label": f"{LABEL_SUBJECT}={image.id}"}):
        text = (sig.labels or {}).get(LABEL_SIGNATURE)
        tags = [t for t in sig.tags or [] if t not in seen]
        if text and tags and not seen.intersection(sig.tags or []):
            seen.update(tags)
            found.append((text.encode(), f"signature image {tags[0]}"))
    return found


def claimed_signer(envelope_json: bytes) -> str:
    """The fingerprint of the key an envelope says signed it (NOT verified: for naming it in an error)."""
    try:
        claimed = json.loads(signing.open_envelope(envelope_json, "signature", PAYLOAD_TYPE).payload)
        pem = claimed["predicate"]["public_key"].encode()
        return signing.fingerprint(signing.load_public_key(pem, "the claimed key"))
    except (ValueError, KeyError, TypeError, AttributeError, ImageTrustError):
        return "an unreadable key"


def other_signatures(client: Any, ref: str, image: Any) -> list[str]:
    """Signature images on ``client`` of the same repositories, for other image IDs (a changed image)."""
    out = []
    for repo in _repos(client, ref, image):
        for other in client.images.list(name=repo):
            out += [t for t in other.tags if t.endswith(".sig") and t != signature_tag(repo, image.id)]
    return sorted(out)
