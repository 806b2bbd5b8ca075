"""Container images: the build context (:mod:`.context`), its wheelhouse, SBOM and SELinux module, the
image itself through the Docker SDK (:mod:`.image`), and the signed manifest of every baked file
(:mod:`.manifest`, :mod:`.signing`) that the entrypoint and ``veo-edge verify`` check."""

from veo_edge.packaging.context import Context, ContextOptions, assemble_context
from veo_edge.packaging.manifest import verify_root

__all__ = ["Context", "ContextOptions", "assemble_context", "verify_root"]
