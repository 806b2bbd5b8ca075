"""A build's model from a Hugging Face checkpoint (``veo-edge build --hf DIR_OR_ID``): the loading itself
is :mod:`veo_edge.models.huggingface`; this turns it into the :class:`LoadedModel` every build takes."""

from __future__ import annotations

from dataclasses import dataclass

from veo_edge.export.source import LoadedModel


@dataclass(frozen=True)
class HuggingFaceSource:
    """A ``save_pretrained`` directory or a hub id; ``attn_implementation`` as transformers takes it
    (``eager`` or ``sdpa``; default: the library's choice); ``pictures`` False builds without the checkpoint's
    preprocessing (``--no-preprocess``)."""

    path_or_id: str
    attn_implementation: str | None = None
    pictures: bool = True  # False: --no-preprocess, the build records no preprocessing

    def load(self) -> LoadedModel:
        from veo_edge.models import huggingface

        hf = huggingface.load(self.path_or_id, self.attn_implementation, self.pictures)
        return LoadedModel(
            name=hf.name,
            input_shape=hf.input_shape,
            module=hf.module,
            source=f"hf:{self.path_or_id}",
            config={
                "family": "huggingface",
                "model_type": hf.model_type,
                "architecture": hf.architecture,
                "kind": hf.kind,
                "output": hf.output,
                "layout": "TCHW" if hf.kind == "video" else "CHW",
            },
            labels=hf.labels,
            preprocess=hf.preprocess.to_manifest() if hf.preprocess is not None else None,
            notes=hf.notes,
        )
