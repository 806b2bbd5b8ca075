"""Before anything starts on a device: the image's signed manifest must verify (``--verify-key``).

The manifest (the sha256 of every file baked into the image, signed at ``veo-edge build --target ...
--sign-key``) and its verification belong to :mod:`veo_edge.packaging`; this is the deploy's call into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from veo_edge.errors import DeployError


def verify_image(client: Any, ref: str, public_key: Path) -> dict[str, Any]:
    """Verify ``ref``'s signed manifest on ``client`` with ``public_key``; raise when it does not verify."""
    try:
        from veo_edge.packaging import verify as packaging_verify
    except ImportError as e:
        raise DeployError(
            f"--verify-key needs image verification (veo_edge.packaging), which this installation lacks: {e}"
        ) from e
    return packaging_verify.verify_image(client, ref, Path(public_key))
