"""Hugging Face ``transformers`` checkpoints: a ``save_pretrained`` directory (or a hub id found in the
local cache) -> a module that returns what is served, its input shape, labels and preprocessing.

``transformers`` is optional (``pip install 'veo-edge[hf]'``) and imported only here, only when a
checkpoint is loaded. Supported families are listed in
:data:`~veo_edge.models.hf_families.FAMILIES`; the served output is the
classification logits (for DeiT with a distillation head, what ``DeiTForImageClassificationWithTeacher``
returns: the mean of both heads), or for a bare backbone its pooled output, else its last hidden state.
CLIP and SigLIP (:data:`VISION_TOWERS`) build their vision tower alone and serve its image embeddings.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from veo_edge.errors import ModelLoadError, UsageError
from veo_edge.models import hf_processors
from veo_edge.models.hf_families import (
    FAMILIES,
    RESAMPLES_POSITIONS,
    TOWER_SERVES,
    VISION_TOWERS,
    positions_at,
)
from veo_edge.preprocess.image import Preprocess

if TYPE_CHECKING:
    from torch import nn

PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")


@dataclass
class HfModel:
    """A loaded checkpoint, ready for export."""

    module: nn.Module
    name: str
    model_type: str
    kind: str  # image or video
    input_shape: tuple[int, ...]  # (C, H, W) or, for video, (T, C, H, W) as transformers takes it
    output: str  # "logits", "pooler_output" or "last_hidden_state"
    architecture: str
    labels: list[str] | None
    preprocess: Preprocess | None  # None: built with --no-preprocess
    path: Path
    notes: list[str] = field(default_factory=list)


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise UsageError(
            f"--hf needs Hugging Face transformers, which is not installed ({e}); pip install 'veo-edge[hf]'"
        ) from e
    return transformers


def resolve(path_or_id: str) -> Path:
    """A ``save_pretrained`` directory, or the local snapshot of a hub id (downloaded when the hub is
    reachable and ``HF_HUB_OFFLINE`` is not set)."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(
                f"--hf {path} is a directory without config.json; expected a directory written by "
                "model.save_pretrained(DIR) (with the processor's processor.save_pretrained(DIR))"
            )
        return path
    if path.exists():
        raise ModelLoadError(f"--hf {path} is a file; expected a save_pretrained directory or a hub id")
    if path_or_id.count("/") > 1 or path_or_id.startswith((".", "/", "~")):
        raise ModelLoadError(f"--hf {path_or_id}: no such directory")
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:
        raise UsageError(f"--hf {path_or_id} names a hub id, which needs huggingface_hub ({e})") from e
    try:
        return Path(snapshot_download(path_or_id, local_files_only=True))
    except Exception as cached_error:
        if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            raise ModelLoadError(
                f"--hf {path_or_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                f"download it where the hub is reachable (`hf download {path_or_id} --local-dir DIR`) and "
                "pass --hf DIR"
            ) from cached_error
    try:
        return Path(snapshot_download(path_or_id, etag_timeout=10))
    except Exception as e:
        raise ModelLoadError(
            f"--hf {path_or_id} is not in the local Hugging Face cache and could not be downloaded "
            f"({type(e).__name__}); on a machine with network run `hf download {path_or_id} --local-dir DIR`, "
            "copy DIR here and pass --hf DIR"
        ) from e


def _no_token_id_warnings(record: logging.LogRecord) -> bool:
    """Drop transformers' "Model config: bos_token_id must be ... within the vocabulary" warnings. Every full
    SigLIP checkpoint printed two (transformers 5.25 checks the default text config, a vocabulary of 32000
    with CLIP's token ids 49406/49407, before it reads the checkpoint's own), and a vision build uses no
    token id of any config."""
    return "_token_id must be" not in record.getMessage()


def load(path_or_id: str, attn_implementation: str | None = None, pictures: bool = True) -> HfModel:
    """Load the checkpoint, its labels and its preprocessing (none where ``pictures`` is False: the build
    then takes preprocessed tensors only); every refusal is one line."""
    path = resolve(path_or_id)
    tf = _transformers()
    quiet = logging.getLogger("transformers.configuration_utils")
    quiet.addFilter(_no_token_id_warnings)
    try:
        config = tf.AutoConfig.from_pretrained(path)
    except Exception as e:
        raise ModelLoadError(f"--hf {path}: cannot read config.json ({type(e).__name__}: {e})") from e
    finally:
        quiet.removeFilter(_no_token_id_warnings)
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ModelLoadError(
            f"--hf {path} is a {model_type!r} model, which veo-edge does not build; supported: "
            f"{', '.join(FAMILIES)}"
        )
    kind = FAMILIES[model_type]
    full = model_type in VISION_TOWERS and hasattr(config, "vision_config")  # CLIPModel, SiglipModel
    vision = config.vision_config if full else config  # what the picture size, channels, patches come from
    preprocess = load_preprocess(path, kind, vision) if pictures else None
    arch = (getattr(config, "architectures", None) or [""])[0]
    input_shape = _input_shape(vision, kind)
    notes = []
    hw = preprocess.output_hw if preprocess is not None else None
    if preprocess is not None and hw is None:
        raise ModelLoadError(
            f"--hf {path}: its {preprocess.processor or 'processor'} makes pictures whose size depends on "
            f"each picture ({preprocess.describe()}), but the build takes one size, "
            f"{input_shape[-2]}x{input_shape[-1]}; set do_center_crop and crop_size in the processor config, "
            "or build with --no-preprocess (the build then takes preprocessed tensors: infer --input x.npy)"
        )
    if preprocess is None:
        notes.append(
            "no preprocessing recorded (--no-preprocess): infer and serve take preprocessed tensors, not pictures"
        )
    if hw is not None and tuple(hw) != tuple(input_shape[-2:]):
        trained = f"{input_shape[-2]}x{input_shape[-1]}"
        patch = vision.patch_size if isinstance(vision.patch_size, int) else None
        if model_type not in RESAMPLES_POSITIONS or patch is None or hw[0] % patch or hw[1] % patch:
            raise ModelLoadError(
                f"--hf {path}: the processor makes {hw[0]}x{hw[1]} pictures but the model takes {trained}"
                + (
                    f" (its {patch}x{patch} patches must tile the picture)"
                    if model_type in RESAMPLES_POSITIONS
                    else ""
                )
                + "; fix size/crop_size in the processor config"
            )
        input_shape = (*input_shape[:-2], *hw)
        notes.append(
            f"{model_type} was pretrained at {trained}: its position table is resampled once to the "
            f"processor's {hw[0]}x{hw[1]} pictures ({hw[0] // patch}x{hw[1] // patch} patches), as transformers "
            "does on every call, and the build takes that size"
        )
    module, output, arch = _load_module(tf, path, config, kind, arch, attn_implementation, input_shape)
    labels = None
    if output == "logits":
        id2label = getattr(config, "id2label", None) or {}
        n = len(id2label)
        labels = [str(id2label.get(i, id2label.get(str(i), i))) for i in range(n)] if n else None
    serves = TOWER_SERVES.get((model_type.removesuffix("_vision_model"), output))
    if serves:
        notes.append(f"the build serves {serves}" + ("; the text tower is not built" if full else ""))
    elif output != "logits":
        notes.append(f"{arch or model_type} has no classification head: the build serves its {output}")
    # a hub snapshot's folder is named by its commit: name the build after the id instead
    local = Path(path_or_id).expanduser().is_dir()
    name = path.name if local else path_or_id.rstrip("/").rsplit("/", 1)[-1]
    name = name if name and not name.startswith(".") else model_type
    return HfModel(
        module=module,
        name=name,
        model_type=model_type,
        kind=kind,
        input_shape=input_shape,
        output=output,
        architecture=arch,
        labels=labels,
        preprocess=preprocess,
        path=path,
        notes=notes,
    )


def _input_shape(config: Any, kind: str) -> tuple[int, ...]:
    size = config.image_size
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    chans = int(getattr(config, "num_channels", 3))
    if kind == "video":
        return (int(config.num_frames), chans, int(h), int(w))
    return (chans, int(h), int(w))


def served_module(model: nn.Module, output: str) -> nn.Module:
    """``model`` wrapped to take ``pixel_values`` and return its ``output`` tensor alone."""
    import torch

    class Served(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
            return getattr(self.model(pixel_values=pixel_values), output)

    return Served()


def _load_module(
    tf: Any, path: Path, config: Any, kind: str, arch: str, attn: str | None, shape: tuple[int, ...]
) -> tuple[nn.Module, str, str]:
    import torch

    # float32 whatever the weights were saved in: transformers 5 loads a checkpoint in its saved dtype,
    # and an fp16 one exported an fp16 graph no input could reach, a bf16 one failed in the exporter
    kw: dict[str, Any] = {"dtype": torch.float32}
    if attn is not None:
        kw["attn_implementation"] = attn
    if arch.endswith("ForImageClassificationWithTeacher") or arch.endswith("ForImageClassification"):
        cls = getattr(tf, arch, None) or tf.AutoModelForImageClassification
        output = "logits"
    elif arch.endswith("ForVideoClassification"):
        cls = getattr(tf, arch, None) or tf.AutoModelForVideoClassification
        output = "logits"
    elif config.model_type in VISION_TOWERS:
        name = arch if arch.endswith("VisionModelWithProjection") else VISION_TOWERS[config.model_type]
        cls = getattr(tf, name)
        output = "image_embeds" if name.endswith("WithProjection") else ""
        if hasattr(config, "vision_config"):  # a full checkpoint: its projection's width is the model's
            kw["config"] = copy.deepcopy(config.vision_config)
            if hasattr(config, "projection_dim"):
                kw["config"].projection_dim = config.projection_dim
    else:
        cls = tf.AutoModel
        output = ""
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()  # its "Loading weights" bar drew above our own progress
    hf_logging.disable_progress_bar()
    tower = config.model_type in VISION_TOWERS and output != "logits"
    verbosity = hf_logging.get_verbosity()
    if tower:  # its report lists every weight of the text tower as unexpected: missing ones are refused below
        hf_logging.set_verbosity_error()
    try:
        model, info = cls.from_pretrained(path, output_loading_info=True, **kw)
        model.eval()
    except Exception as e:
        raise ModelLoadError(
            f"--hf {path}: cannot load the {arch or config.model_type} weights ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        ) from e
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    # a weight the checkpoint lacks is random (transformers initialises it and goes on): a head on a base
    # checkpoint, a deleted tensor. Only the mask token, which inference never uses, may be absent
    missing = sorted(k for k in info.get("missing_keys") or () if not k.endswith("mask_token"))
    if missing:
        raise ModelLoadError(
            f"--hf {path}: the checkpoint lacks {len(missing)} of {cls.__name__}'s weights "
            f"({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}); they would be random. A base "
            "checkpoint has no classification head: give the architecture it was saved as (config.json's "
            "'architectures'), or one trained with a head"
        )
    positions_at(model, (shape[-2], shape[-1]))
    if not output:
        output = _backbone_output(model, kind, shape)
    return served_module(model, output), output, type(model).__name__


def _backbone_output(model: nn.Module, kind: str, shape: tuple[int, ...]) -> str:
    import torch

    with torch.no_grad():
        out = model(pixel_values=torch.zeros((1, *shape)))
    return "pooler_output" if getattr(out, "pooler_output", None) is not None else "last_hidden_state"


def load_preprocess(path: Path, kind: str, config: Any | None = None) -> Preprocess:
    """The checkpoint's processor as :class:`Preprocess` (Hugging Face's PIL backend, defaults applied)."""
    found = [f for f in PROCESSOR_FILES if (path / f).is_file()]
    if not found:
        raise ModelLoadError(
            f"--hf {path} has no processor config ({' or '.join(PROCESSOR_FILES)}); save the checkpoint's "
            "image processor beside it: AutoImageProcessor.from_pretrained(ID).save_pretrained(DIR)"
        )
    try:
        tf = _transformers()
        proc = tf.AutoImageProcessor.from_pretrained(path, backend="pil")
        options = hf_processors.options_read(proc)
        processor = type(proc).__name__.removesuffix("Pil")
    except (OSError, ValueError, KeyError, TypeError, ImportError):  # a video processor only, say
        options = json.loads((path / found[0]).read_text())
        options = {k: v for k, v in options.items() if not k.startswith("_")}
        processor = options.get("image_processor_type") or options.get("video_processor_type") or ""
    hf_processors.check(path, processor, options)
    values = {k: options[k] for k in hf_processors.APPLIED if options.get(k) is not None}
    values = {k: _plain(v) for k, v in values.items()}
    if "size" in values:
        values["size"] = _size(values["size"])
    if values.get("crop_size") is not None:
        values["crop_size"] = _size(values["crop_size"])
    for k in ("image_mean", "image_std"):
        if k in values:
            v = values[k]
            values[k] = tuple(float(x) for x in (v if isinstance(v, list | tuple) else [v] * 3))
    values = hf_processors.rewrite(path, processor, values)
    chans = int(getattr(config, "num_channels", 3)) if config is not None else 3
    frames = int(config.num_frames) if kind == "video" and config is not None else None
    try:
        return Preprocess(
            **values,
            channel_order="RGB" if chans == 3 else "L",
            num_frames=frames,
            processor=processor,
        )
    except TypeError as e:
        raise ModelLoadError(f"--hf {path}: its processor config is not one veo-edge reads: {e}") from e
    except UsageError as e:  # a size veo-edge does not resize to (longest_edge, max_height, ...)
        raise ModelLoadError(
            f"--hf {path}: its {processor or 'processor'}'s {e}; {hf_processors.WHAT_TO_DO}"
        ) from e


def _plain(v: Any) -> Any:
    """A processor attribute as plain JSON data (SizeDict, enums and numpy scalars become dicts, ints)."""
    if hasattr(v, "items"):
        return {str(k): int(x) for k, x in v.items() if x is not None}
    if hasattr(v, "value") and isinstance(v.value, int):  # PILImageResampling
        return int(v.value)
    if isinstance(v, list | tuple):
        return [float(x) for x in v]
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    return v


def _size(size: Any) -> dict[str, int]:
    if isinstance(size, int):
        return {"height": size, "width": size}
    size = {k: int(v) for k, v in dict(size).items() if v is not None}
    if "shortest_edge" in size and "longest_edge" not in size:
        return {"shortest_edge": size["shortest_edge"]}
    return size
