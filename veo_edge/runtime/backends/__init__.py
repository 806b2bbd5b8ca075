"""Runtime backends, one module each; none imports another. Re-exports only."""

from veo_edge.runtime.backends.base import Runner, TensorMeta, check_feed

__all__ = ["Runner", "TensorMeta", "check_feed"]
