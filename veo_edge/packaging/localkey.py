"""The local image-signing key: made once per user, so that the default path signs.

``veo-edge build --target`` without ``--sign-key`` signs with ``$XDG_CONFIG_HOME/veo-edge/signing-key.pem``
(``~/.config/veo-edge/`` when XDG_CONFIG_HOME is unset), creating it on first use as ``ssh-keygen`` makes
a host key: an Ed25519 PEM private key readable by its owner only, its public half beside it
(``signing-key.pub.pem``), and the fingerprint printed. ``veo-edge verify IMAGE`` and ``veo-edge deploy``
on the same machine pin that key when no other is given (``--key``/``--verify-key``,
``$VEO_EDGE_TRUSTED_KEY``). Other machines pin it by its fingerprint or by the public file.
"""

from __future__ import annotations

import os
from pathlib import Path

from veo_edge.errors import PackagingError
from veo_edge.packaging import signing

PRIVATE_NAME = "signing-key.pem"
PUBLIC_NAME = "signing-key.pub.pem"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "veo-edge"


def private_path() -> Path:
    return config_dir() / PRIVATE_NAME


def public_path() -> Path:
    return config_dir() / PUBLIC_NAME


def fingerprint() -> str | None:
    """The local key's fingerprint, or None when this user has no local key yet."""
    pub = public_path()
    if not pub.is_file():
        return None
    return signing.fingerprint(signing.load_public_key(pub.read_bytes(), str(pub)))


def ensure() -> tuple[Path, str, bool]:
    """The local private key's path and fingerprint, creating the pair on first use (``created``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    priv, pub = private_path(), public_path()
    if priv.is_file():
        key = signing.load_private_key(priv)
        if not pub.is_file():
            pub.write_bytes(signing.public_pem(key.public_key()))
        return priv, signing.fingerprint(key.public_key()), False
    try:
        priv.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # O_EXCL: two first builds at once must not both write (the loser reads the winner's key)
        fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return ensure()
    except OSError as e:
        raise PackagingError(
            f"cannot create the local signing key in {priv.parent} ({e}); pass --sign-key KEY.pem "
            "or set XDG_CONFIG_HOME to a writable directory"
        ) from e
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub.write_bytes(signing.public_pem(key.public_key()))
    return priv, signing.fingerprint(key.public_key()), True
