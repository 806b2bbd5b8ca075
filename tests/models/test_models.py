import pytest
import torch

from veo_edge.errors import UsageError
from veo_edge.models import DEFAULT_MODEL, ViTConfig, create_model, get_config, list_models


def test_registry_lists_the_variants_and_default():
    names = list_models()
    assert {"vit-nano", "vit-tiny", "veo-video-tiny"} <= set(names)
    assert DEFAULT_MODEL == "vit-digits"


def test_unknown_model_names_the_valid_ones():
    with pytest.raises(UsageError, match=r"unknown model 'vit-tny'; choose one of: .*vit-nano.*vit-tiny"):
        get_config("vit-tny")


def test_vit_tiny_is_the_deit_tiny_shape():
    cfg = get_config("vit-tiny")
    assert (cfg.embed_dim, cfg.depth, cfg.num_heads, cfg.img_size, cfg.patch_size) == (192, 12, 3, 224, 16)
    assert cfg.input_shape == (3, 224, 224)
    assert cfg.num_patches == 196


def test_video_tiny_uses_2x16x16_tubelets_over_8_frames():
    cfg = get_config("veo-video-tiny")
    assert cfg.num_frames == 8 and cfg.tubelet_size == 2 and cfg.patch_size == 16
    assert cfg.input_shape == (3, 8, 112, 112)
    built = create_model("veo-video-tiny")
    proj = built.module.patch_embed.proj
    assert isinstance(proj, torch.nn.Conv3d)
    assert proj.kernel_size == proj.stride == (2, 16, 16)
    assert built.module.pos_embed.shape == (1, cfg.num_patches, 192)  # no cls token, one pos per tubelet


def test_init_is_deterministic_from_the_seed():
    a = create_model("vit-nano", seed=3).module.state_dict()
    b = create_model("vit-nano", seed=3).module.state_dict()
    c = create_model("vit-nano", seed=4).module.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.qkv.weight"], c["blocks.0.attn.qkv.weight"])


def test_init_leaves_the_global_rng_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    create_model("vit-nano", seed=9)
    assert torch.equal(torch.rand(3), expected)


def test_state_dict_keys_follow_timm():
    keys = set(create_model("vit-nano").module.state_dict())
    for key in ["cls_token", "pos_embed", "patch_embed.proj.weight", "blocks.0.norm1.weight",
                "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
                "blocks.1.mlp.fc1.weight", "blocks.1.mlp.fc2.bias", "norm.weight", "head.weight"]:  # fmt: skip
        assert key in keys, key


@pytest.mark.parametrize("name", ["vit-nano", "veo-video-nano"])
@pytest.mark.parametrize("batch", [1, 3])
def test_forward_shapes(name, batch):
    built = create_model(name)
    with torch.no_grad():
        y = built.module(torch.randn(batch, *built.config.input_shape))
    assert y.shape == (batch, built.config.num_classes)
    assert torch.isfinite(y).all()


def test_fused_and_explicit_attention_agree():
    fused = create_model("vit-nano").module
    cfg = get_config("vit-nano")
    from dataclasses import replace

    from veo_edge.models.vit import VisionTransformer

    explicit = VisionTransformer(replace(cfg, fused_attn=False)).eval()
    explicit.load_state_dict(fused.state_dict())
    x = torch.randn(2, *cfg.input_shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(fused(x), explicit(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"embed_dim": 100, "num_heads": 3}, "embed_dim 100 is not divisible by num_heads 3"),
        ({"img_size": 30, "patch_size": 16}, "img_size 30 is not divisible by patch_size 16"),
        ({"num_frames": 5, "tubelet_size": 2}, "num_frames 5 is not divisible by tubelet_size 2"),
    ],
)
def test_config_rejects_inconsistent_shapes(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ViTConfig(**kwargs)
