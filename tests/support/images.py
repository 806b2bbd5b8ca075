"""The real veo-edge cpu image of vit-nano, built once per test session on the tests' Docker engine and
signed (used by the image tests and the deploy tests)."""

from __future__ import annotations

from pathlib import Path

TAG = "veo-edge/vit-nano:test-cpu"


def ed25519_pem(path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path
