"""Before anything starts on a device: the image's signed manifest must verify (``--verify-key``).

The manifest (the sha256 of every file baked into the image, signed at ``veo-edge build --target ...
--sign-key``) and its verification belong to :mod:`veo_edge.packaging`; this is the deploy's call into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def verify_image(client: Any, ref: str, public_key: Path) -> dict[str, Any]:
    """Verify ``ref``'s files and signed manifest on ``client`` against ``public_key`` (a PEM public key
    or a ``sha256:`` fingerprint); raises :class:`~veo_edge.errors.ImageTrustError` when they do not."""
    from veo_edge.packaging.image import verify_image as verify_packaged

    return verify_packaged(ref, trusted_key=str(public_key), client=client)
