import sys
import textwrap

import pytest
import torch

from veo_edge.errors import ModelLoadError, UsageError
from veo_edge.export.source import BuiltinSource, ModuleSource, OnnxSource, parse_input_shape


@pytest.mark.parametrize(("text", "shape"), [("3,224,224", (3, 224, 224)), ("3x8x112x112", (3, 8, 112, 112))])
def test_parse_input_shape(text, shape):
    assert parse_input_shape(text) == shape


@pytest.mark.parametrize("text", ["", "3,a,4", "3,0,4", "-1,2"])
def test_parse_input_shape_rejects_garbage(text):
    with pytest.raises(UsageError, match="is not a list of positive integers"):
        parse_input_shape(text)


def test_builtin_source_rejects_unknown_names_at_construction():
    with pytest.raises(UsageError, match="unknown model 'nope'"):
        BuiltinSource("nope")


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A user package on sys.path with a ViT factory written independently of veo-edge."""
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    (tmp_path / "userpkg" / "nets.py").write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn

            class TinyNet(nn.Module):
                input_shape = (3, 16, 16)
                def __init__(self):
                    super().__init__()
                    self.conv = nn.Conv2d(3, 8, 4, stride=4)
                    self.fc = nn.Linear(8 * 16, 5)
                def forward(self, x):
                    return self.fc(self.conv(x).flatten(1))

            def make():
                torch.manual_seed(0)
                return TinyNet()

            def not_a_module():
                return 42
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("userpkg")]:
        del sys.modules[name]


def test_module_source_loads_a_factory_and_its_shape(user_pkg):
    loaded = ModuleSource("userpkg.nets:make").load()
    assert loaded.input_shape == (3, 16, 16)
    assert not loaded.module.training


def test_module_source_loads_a_checkpoint(user_pkg, tmp_path):
    net = ModuleSource("userpkg.nets:make").load().module
    state = {k: torch.full_like(v, 0.5) for k, v in net.state_dict().items()}
    ckpt = tmp_path / "ckpt.pt"
    torch.save(state, ckpt)
    loaded = ModuleSource("userpkg.nets:make", checkpoint=ckpt).load().module
    assert torch.all(loaded.fc.weight == 0.5)


def test_checkpoint_is_loaded_without_unpickling_code(user_pkg, tmp_path):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    ckpt = tmp_path / "evil.pt"
    torch.save({"x": Evil()}, ckpt)
    with pytest.raises(ModelLoadError, match=r"checkpoint .*evil.pt is unreadable or corrupt"):
        ModuleSource("userpkg.nets:make", checkpoint=ckpt).load()


def test_corrupt_checkpoint(user_pkg, tmp_path):
    ckpt = tmp_path / "bad.pt"
    ckpt.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(ModelLoadError, match=r"checkpoint .*bad.pt is unreadable or corrupt"):
        ModuleSource("userpkg.nets:make", checkpoint=ckpt).load()


def test_checkpoint_that_does_not_fit(user_pkg, tmp_path):
    ckpt = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(2)}, ckpt)
    with pytest.raises(ModelLoadError, match="does not fit the model"):
        ModuleSource("userpkg.nets:make", checkpoint=ckpt).load()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("userpkg.nets", "is not of the form pkg.mod:factory"),
        ("userpkg.missing:make", "cannot import 'userpkg.missing'"),
        ("userpkg.nets:nothing", "has no callable 'nothing'"),
        ("userpkg.nets:not_a_module", "returned a int, expected a torch.nn.Module"),
    ],
)
def test_module_source_errors(user_pkg, spec, message):
    with pytest.raises((UsageError, ModelLoadError), match=message):
        ModuleSource(spec).load()


def test_onnx_source_missing_and_corrupt(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        OnnxSource(tmp_path / "nope.onnx").load()
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(ModelLoadError, match="is unreadable or corrupt"):
        OnnxSource(bad).load()


def test_onnx_source_finds_its_external_data_and_names_a_missing_file(nano_build, tmp_path):
    import onnx

    src = tmp_path / "vit.onnx"
    model = onnx.load(str(nano_build / "model.onnx"))
    onnx.save_model(model, str(src), save_as_external_data=True, location="vit.onnx.data")
    loaded = OnnxSource(src).load()
    assert loaded.onnx_external_data == ((tmp_path / "vit.onnx.data").resolve(),)
    assert loaded.input_shape == (3, 32, 32)
    assert OnnxSource(nano_build / "model.onnx").load().onnx_external_data == ()
    (tmp_path / "vit.onnx.data").rename(tmp_path / "elsewhere.data")
    with pytest.raises(
        ModelLoadError,
        match=r"keeps tensor '.+' in the external data file 'vit.onnx.data', which is missing \(.+ does not "
        r"exist\); copy it beside vit.onnx under that name",
    ):
        OnnxSource(src).load()
