"""Which Hugging Face image processors a build reproduces, and the settings that turn one into
:class:`~veo_edge.preprocess.image.Preprocess`.

A processor is reproduced only where :class:`Preprocess` computes what the processor computes: its class
is one of :data:`REPRODUCED` (each is held against transformers' own processor on real photographs in
``tests/preprocess/``), and every option its class reads is one veo-edge applies (:data:`APPLIED`) or
is at a value that changes nothing (:data:`INERT`). Anything else is refused at build time in one line
that names the processor and the option, instead of pictures being preprocessed otherwise than
transformers does. ConvNeXt's ``crop_pct`` and LeViT's enlarged shortest edge are rewritten as the
resize and centre crop they amount to.
"""

from __future__ import annotations

import inspect
from typing import Any

from veo_edge.errors import ModelLoadError

#: processor classes (transformers' names, without the ``Pil`` suffix) whose steps Preprocess reproduces
REPRODUCED = (
    "ViTImageProcessor",
    "DeiTImageProcessor",
    "BitImageProcessor",
    "BeitImageProcessor",
    "CLIPImageProcessor",
    "SiglipImageProcessor",
    "ConvNextImageProcessor",
    "LevitImageProcessor",
    "VideoMAEImageProcessor",
    "VideoMAEVideoProcessor",
    "VivitImageProcessor",
)
#: the processor fields copied into :class:`~veo_edge.preprocess.image.Preprocess`
FIELDS = (
    "size",
    "resample",
    "do_resize",
    "do_center_crop",
    "crop_size",
    "do_rescale",
    "rescale_factor",
    "offset",
    "do_normalize",
    "image_mean",
    "image_std",
)
#: the options Preprocess applies (ConvNeXt's crop_pct is rewritten, see :func:`rewrite`)
APPLIED = {*FIELDS, "crop_pct"}
#: options that change nothing for a picture, whatever their value: the output's container, where it is
#: computed, how a size was written down (already read into ``size``), segmentation maps, and the RGB
#: conversion (veo-edge always converts to the model's channels, as the processor does for RGB pictures)
INERT = {
    "return_tensors",
    "device",
    "disable_grouping",
    "image_seq_length",
    "input_data_format",
    "default_to_square",
    "do_reduce_labels",
    "do_convert_rgb",
    "return_metadata",
    "video_metadata",
    "model_input_names",
    "processor_class",
    "image_processor_type",
    "video_processor_type",
    "feature_extractor_type",
}
#: options that change nothing at these values (None always does)
NEUTRAL = {
    "do_pad": (False,),
    "data_format": ("channels_first", "ChannelDimension.FIRST"),
    "do_sample_frames": (False,),
}
#: options that matter only when another option turns them on
DEPENDS = {"pad_size": "do_pad", "num_frames": "do_sample_frames", "fps": "do_sample_frames"}

WHAT_TO_DO = (
    "build with --no-preprocess (the build then takes preprocessed tensors: infer --input x.npy), or save "
    f"one of the processors veo-edge reproduces beside the checkpoint ({', '.join(REPRODUCED)}) if it "
    "computes the same"
)


def options_read(proc: Any) -> dict[str, Any]:
    """The options ``proc``'s class reads, with their values."""
    names = getattr(proc, "_valid_kwargs_names", None)
    if names is None:  # an image processor of the older kind (ViViT's): its __init__ names them
        names = [p for p in inspect.signature(type(proc).__init__).parameters if p not in ("self", "kwargs")]
    return {n: _plain_value(getattr(proc, n, None)) for n in names}


def _plain_value(v: Any) -> Any:
    if hasattr(v, "value") and not isinstance(v, bool | int | float | str):  # an enum (ChannelDimension)
        return v.value
    return v


def check(path: Any, processor: str, options: dict[str, Any]) -> None:
    """Refuse a processor whose preprocessing veo-edge does not reproduce, naming what is not."""
    if processor not in REPRODUCED:
        raise ModelLoadError(
            f"--hf {path}: its image processor {processor or '(unnamed)'} preprocesses pictures in a way "
            f"veo-edge does not reproduce; {WHAT_TO_DO}"
        )
    for name, value in sorted(options.items()):
        if value is None or name in APPLIED or name in INERT:
            continue
        if name in DEPENDS and not options.get(DEPENDS[name]):
            continue
        if name in NEUTRAL and _plain_value(value) in NEUTRAL[name]:
            continue
        raise ModelLoadError(
            f"--hf {path}: its {processor} sets {name}={value!r}, which veo-edge does not reproduce; {WHAT_TO_DO}"
        )


def rewrite(path: Any, processor: str, values: dict[str, Any]) -> dict[str, Any]:
    """ConvNeXt's and LeViT's resizes as the plain resize and centre crop they amount to."""
    values = dict(values)
    crop_pct = values.pop("crop_pct", None)
    size = values.get("size") or {}
    if not values.get("do_resize", True) or "shortest_edge" not in size:
        return values
    edge = size["shortest_edge"]
    if processor == "ConvNextImageProcessor":
        if edge >= 384:  # ConvNeXt warps to a square at 384 and above
            values["size"] = {"height": edge, "width": edge}
            return values
        if values.get("do_center_crop"):
            raise ModelLoadError(
                f"--hf {path}: its ConvNextImageProcessor crops twice (crop_pct {crop_pct}, then "
                f"do_center_crop to {values.get('crop_size')}), which veo-edge does not reproduce; {WHAT_TO_DO}"
            )
        if not crop_pct:
            raise ModelLoadError(
                f"--hf {path}: its ConvNextImageProcessor resizes to {edge} < 384 without crop_pct; set "
                "crop_pct (224/256 is ConvNeXt's) in preprocessor_config.json"
            )
        # the shortest edge to edge / crop_pct, then a centre crop of edge x edge
        values["size"] = {"shortest_edge": int(edge / crop_pct)}
        values["do_center_crop"] = True
        values["crop_size"] = {"height": edge, "width": edge}
    elif processor == "LevitImageProcessor":
        values["size"] = {"shortest_edge": int((256 / 224) * edge)}
    return values
