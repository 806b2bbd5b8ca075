"""The real veo-edge cpu image of vit-nano, built once per test session on the tests' Docker engine and
signed (used by the image tests and the deploy tests)."""

from __future__ import annotations

from pathlib import Path

TAG = "veo-edge/vit-nano:test-cpu"


def ed25519_pem(path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    key = ed25519.Ed25519PrivateKey.generate()
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return path


def infer_canary(port: int, build: Path):
    """A tritonclient inference of the build's golden canary against a server on 127.0.0.1:port."""
    import numpy as np
    import tritonclient.http as httpclient

    from veo_edge.builddir import BuildDir
    from veo_edge.export.canary import compare_canary
    from veo_edge.serve.health import load_canary

    canary = load_canary(BuildDir.open(build))
    client = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
    meta = client.get_model_metadata("vit-nano")
    inp = httpclient.InferInput(meta["inputs"][0]["name"], list(canary.input.shape), "FP32")
    inp.set_data_from_numpy(canary.input.astype(np.float32))
    out = client.infer("vit-nano", [inp]).as_numpy(meta["outputs"][0]["name"])
    return compare_canary(out, canary)
