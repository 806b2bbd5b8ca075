"""Signing the image manifest: a DSSE envelope (the in-toto / Sigstore offline envelope) with Ed25519,
through securesystemslib (envelope, pre-authentication encoding, verification) and pyca/cryptography
(keys).

The key's fingerprint is ``sha256:`` + the hex sha256 of its DER SubjectPublicKeyInfo, the same number
``openssl pkey -pubin -in key.pub -outform DER | sha256sum`` prints; it is the envelope signature's
``keyid`` and the image's ``io.veo-edge.signing-key.fingerprint`` label. A key is made with
``openssl genpkey -algorithm ed25519 -out key.pem`` (public half: ``openssl pkey -in key.pem -pubout``).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from veo_edge.errors import ImageTrustError, PackagingError

PAYLOAD_TYPE = "application/vnd.veo-edge.image-manifest+json"


def _serialization():
    from cryptography.hazmat.primitives import serialization

    return serialization


def fingerprint(public_key: Any) -> str:
    ser = _serialization()
    der = public_key.public_bytes(ser.Encoding.DER, ser.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(der).hexdigest()


def public_pem(public_key: Any) -> bytes:
    ser = _serialization()
    return public_key.public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo)


def load_private_key(path: Path):
    """An Ed25519 private key from a PEM file (unencrypted, or encrypted with $VEO_EDGE_SIGN_KEY_PASSWORD)."""
    import os

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise PackagingError(
            f"--sign-key {path} cannot be read ({e}); pass an Ed25519 PEM private key"
        ) from e
    if b"-----BEGIN PUBLIC KEY-----" in data:
        raise PackagingError(
            f"--sign-key {path} is a public key; signing takes the private half (the key.pem it came from)"
        )
    password = os.environ.get("VEO_EDGE_SIGN_KEY_PASSWORD")
    try:
        key = _serialization().load_pem_private_key(data, password.encode() if password else None)
    except (ValueError, TypeError) as e:
        raise PackagingError(
            f"--sign-key {path} is not a readable PEM private key ({e}); make one with "
            "`openssl genpkey -algorithm ed25519 -out key.pem` (set VEO_EDGE_SIGN_KEY_PASSWORD if encrypted)"
        ) from e
    if not isinstance(key, Ed25519PrivateKey):
        raise PackagingError(
            f"--sign-key {path} is a {type(key).__name__.removeprefix('_')}, expected an Ed25519 key; "
            "make one with `openssl genpkey -algorithm ed25519 -out key.pem`"
        )
    return key


def load_public_key(data: bytes, source: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = _serialization().load_pem_public_key(data)
    except ValueError as e:
        raise ImageTrustError(f"{source} is not a PEM public key ({e})") from e
    if not isinstance(key, Ed25519PublicKey):
        raise ImageTrustError(f"{source} is a {type(key).__name__}, expected an Ed25519 public key")
    return key


def _sslib_key(public_key: Any):
    from securesystemslib.signer import SSlibKey

    return SSlibKey.from_crypto(public_key, keyid=fingerprint(public_key))


def sign(payload: bytes, private_key: Any, payload_type: str = PAYLOAD_TYPE) -> dict[str, Any]:
    """The DSSE envelope (as its JSON dict) of ``payload`` signed by ``private_key``."""
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import CryptoSigner

    signer = CryptoSigner(private_key, _sslib_key(private_key.public_key()))
    envelope = Envelope(payload=payload, payload_type=payload_type, signatures={})
    envelope.sign(signer)
    return envelope.to_dict()


def open_envelope(envelope_json: bytes, source: str, payload_type: str = PAYLOAD_TYPE):
    """The DSSE envelope in ``envelope_json`` (its payload NOT yet trusted: see :func:`verify_signed`)."""
    from securesystemslib.dsse import Envelope

    try:
        envelope = Envelope.from_dict(json.loads(envelope_json))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ImageTrustError(f"{source}: the signature envelope is not a DSSE envelope ({e})") from e
    if envelope.payload_type != payload_type:
        raise ImageTrustError(
            f"{source}: the envelope's payloadType is {envelope.payload_type!r}, expected {payload_type!r}"
        )
    return envelope


def verify_envelope(envelope_json: bytes, payload: bytes, public_key: Any, source: str) -> str:
    """Check that the envelope carries exactly ``payload`` with a valid signature by ``public_key``;
    returns the key's fingerprint. Any failure is an :class:`ImageTrustError` naming ``source``."""
    envelope = open_envelope(envelope_json, source)
    if envelope.payload != payload:
        raise ImageTrustError(
            f"{source}: the signed payload is not the image manifest (the manifest was changed after signing)"
        )
    return verify_signed(envelope, public_key, source)


def verify_signed(envelope: Any, public_key: Any, source: str) -> str:
    """Check the envelope's signature by ``public_key``; returns the key's fingerprint."""
    from securesystemslib.exceptions import VerificationError

    key = _sslib_key(public_key)
    try:
        envelope.verify([key], 1)
    except VerificationError as e:
        raise ImageTrustError(f"{source}: the signature does not verify with key {key.keyid} ({e})") from e
    return key.keyid
