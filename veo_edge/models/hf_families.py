"""What each Hugging Face family is to a build: its kind, the tower a CLIP or SigLIP checkpoint builds and
what it serves, and the DINOv2 position tables made for the build's picture size
(:mod:`veo_edge.models.huggingface` loads the checkpoints with these)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from veo_edge.errors import ModelLoadError

if TYPE_CHECKING:
    from torch import nn

#: model_type -> "image" or "video" (the families built and tested here)
FAMILIES = {
    "vit": "image",
    "deit": "image",
    "beit": "image",
    "data2vec-vision": "image",
    "dinov2": "image",
    "dinov2_with_registers": "image",
    "vit_msn": "image",
    "swin": "image",
    "swinv2": "image",
    "videomae": "video",
    "timesformer": "video",
    "vivit": "video",
    "clip": "image",
    "clip_vision_model": "image",
    "siglip": "image",
    "siglip_vision_model": "image",
}
#: model_type -> the transformers class that loads its vision tower alone: a full CLIP or SigLIP checkpoint
#: (text and vision) builds its vision tower, the text tower neither loaded nor built; a standalone one whose
#: architectures name CLIPVisionModelWithProjection loads with that. A tower with a projection serves its
#: ``image_embeds``, else its ``pooler_output`` (:data:`TOWER_SERVES` says what each is)
VISION_TOWERS = {
    "clip": "CLIPVisionModelWithProjection",
    "clip_vision_model": "CLIPVisionModel",
    "siglip": "SiglipVisionModel",
    "siglip_vision_model": "SiglipVisionModel",
}
#: (family, served output) -> what a vision tower's build serves, for its note
TOWER_SERVES = {
    ("clip", "image_embeds"): (
        "the image embeddings of CLIP's vision tower (its pooled output projected, unnormalised: what "
        "CLIPModel.get_image_features returns)"
    ),
    ("clip", "pooler_output"): (
        "the pooled output of CLIP's vision tower (its layer-normed class token: the checkpoint has no projection)"
    ),
    ("siglip", "pooler_output"): (
        "the pooled output of SigLIP's vision tower (its attention-pooling head: what "
        "SiglipModel.get_image_features returns)"
    ),
}
#: the families whose embeddings resample their position table to the picture's size on every call. Their
#: Hub checkpoints record the size they were pretrained at (``image_size`` 518 for DINOv2) while their
#: processors crop to another (224): the build takes the processor's size
RESAMPLES_POSITIONS = {"dinov2", "dinov2_with_registers"}


def positions_at(model: nn.Module, hw: tuple[int, int]) -> None:
    """Give DINOv2's embeddings their position table at the build's picture size, computed once.

    transformers resamples the table on every call whose size differs from the table's and, whenever the
    model is traced, on every call (so that a traced graph takes any size): bicubic for DINOv2, antialiased
    bicubic for DINOv2 with registers, which the TorchScript ONNX exporter cannot translate
    (``aten::_upsample_bicubic2d_aa``). A build takes one size: the table is resampled here by
    transformers' own code, untraced (the identity at the size it was made for), and the embeddings use it
    as is at that size, so the exported graph carries no resampling."""
    import torch

    for m in model.modules():
        if type(m).__name__ not in ("Dinov2Embeddings", "Dinov2WithRegistersEmbeddings"):
            continue
        table = m.position_embeddings
        ph, pw = m.patch_embeddings.patch_size
        with torch.no_grad():
            probe = table.new_zeros(1, 1 + (hw[0] // ph) * (hw[1] // pw), table.shape[-1])
            resampled = m.interpolate_pos_encoding(probe, hw[0], hw[1])
        if resampled.shape != table.shape or not torch.equal(resampled, table):
            m.position_embeddings = torch.nn.Parameter(resampled.detach().clone(), requires_grad=False)

        def at_size(embeddings: Any, height: int, width: int, m: Any = m) -> Any:
            if (height, width) != hw:
                raise ModelLoadError(
                    f"this model was loaded for {hw[0]}x{hw[1]} pictures, not {height}x{width}"
                )
            return m.position_embeddings

        m.interpolate_pos_encoding = at_size
