"""Pictures and clips -> model inputs: the one room ``infer`` and ``serve`` share (numpy + Pillow)."""

from veo_edge.preprocess.image import Preprocess, sample_frames

__all__ = ["Preprocess", "sample_frames"]
