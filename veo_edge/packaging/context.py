"""The build context of an image: everything the Docker engine reads, assembled next to the build.

::

    vit-nano.image-cpu/
      Dockerfile            packaging/Dockerfile (a100, cpu) or Dockerfile.jetson (orin)
      build-args.json       the --build-arg values and the stage (`docker build --target`)
      wheels/               the wheelhouse + requirements.lock (the venv stage installs it, no network)
      plugins/              (GPU targets) the C++/CUDA sources the builder stage compiles
      app/                  becomes /opt/veo-edge: model/ (the build directory), bin/entrypoint.sh,
                            healthcheck/healthcheck.sh, selinux/ (veo_edge.pp + sources),
                            sbom.cdx.json, requirements.lock
      sbom.cdx.json         the SBOM, next to the image as well as inside it
      context-manifest.json sha256 of every file above

Like a build directory, a context is assembled in a hidden staging directory and renamed into place only
when complete.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from veo_edge import __version__
from veo_edge.builddir import MANIFEST_NAME
from veo_edge.errors import DiskFullError, OutputExistsError, UsageError
from veo_edge.packaging import layout, platforms, sbom, selinux, wheelhouse
from veo_edge.packaging.sources import revision, source_root
from veo_edge.targets import Target

CONTEXT_MANIFEST = "context-manifest.json"
BUILD_ARGS = "build-args.json"

Progress = Callable[[str], None]


@dataclass
class ContextOptions:
    build_dir: Path
    target: Target
    out: Path | None = None  # default: <build dir>.image-<target> beside the build directory
    base_image: str | None = None
    builder_image: str | None = None
    force: bool = False
    #: False: only veo-edge's own wheel (structure checks of contexts for a platform not at hand)
    download_wheels: bool = True
    #: False: a GPU target's image without the plugin libraries (PLUGINS=no: a builder without CUDA or
    #: TensorRT); it serves on the CPU only, and its labels say so
    plugin_libs: bool = True
    #: the base image's ID where an engine holds it (the SBOM names it); None: only its reference
    base_image_id: str | None = None


@dataclass
class Context:
    path: Path
    target: Target
    build_args: dict[str, str]
    labels: dict[str, str]
    model: dict[str, Any] = field(default_factory=dict)

    @property
    def dockerfile(self) -> Path:
        return self.path / "Dockerfile"

    @property
    def stage(self) -> str:
        return self.target.stage


def default_out(build_dir: Path, target: Target) -> Path:
    build_dir = Path(build_dir).resolve()
    return build_dir.with_name(f"{build_dir.name}.image-{target.name}")


@contextlib.contextmanager
def _staged(out: Path, force: bool) -> Iterator[Path]:
    if out.exists() and not force:
        raise OutputExistsError(f"image context {out} already exists; pass --force to overwrite it")
    out.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.assembling-", dir=out.parent))
    try:
        yield stage
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    os.chmod(stage, 0o755)
    stage.rename(out)


def _model_info(build_dir: Path) -> dict[str, Any]:
    from veo_edge.builddir import BuildDir

    build = BuildDir.open(build_dir)
    build.verify()  # never bake a build that does not match its own manifest
    arts = build.manifest["artifacts"]
    return {
        "name": build.model_name,
        "sha256": arts["onnx"]["sha256"] if "onnx" in arts else "",
        "precision": build.manifest.get("precision", "fp32"),
        "max_batch": build.max_batch,
    }


def build_args(
    target: Target,
    model: dict[str, Any],
    base: str | None,
    builder: str | None,
    plugin_libs: bool = True,
) -> dict[str, str]:
    args = {
        "BASE_IMAGE": base or target.base_image,
        "VEO_EDGE_VERSION": __version__,
        "TARGET": target.name,
        "MODEL_NAME": model["name"],
        "MODEL_SHA256": model["sha256"],
        "PRECISION": model["precision"],
        "CUDA_VERSION": target.versions.get("cuda", "none"),
        "TENSORRT_VERSION": target.versions.get("tensorrt", "none"),
        "JETPACK_VERSION": target.versions.get("jetpack", "none"),
        "VCS_REF": revision(),
    }
    if target.has_gpu:
        # without the plugin libraries the builder stage builds nothing: the base serves as its image, so
        # the classic builder (which runs every stage before the target) pulls no CUDA/TensorRT image
        builder_image = target.builder_image if plugin_libs else None
        args["BUILDER_IMAGE"] = builder or builder_image or args["BASE_IMAGE"]
        args["CUDA_ARCHS"] = ";".join(str(a) for a in target.cuda_archs)
        if target.dockerfile == "packaging/Dockerfile":
            args["VENV_FLAGS"] = "--system-site-packages"
        args.update(plugin_args(plugin_libs))
    return args


def plugin_args(plugin_libs: bool) -> dict[str, str]:
    """The Dockerfiles' PLUGINS switch of a GPU target, with what the image then serves (a label)."""
    if plugin_libs:
        return {"PLUGINS": "yes", "SERVING": "tensorrt (GPU), openvino (CPU fallback)"}
    return {
        "PLUGINS": "no",
        "SERVING": "openvino (CPU) only: built without the plugin libraries (PLUGINS=no)",
        "PLUGIN_LIB": "",
        "MEMPOOL_LIB": "",
    }


def labels(args: dict[str, str]) -> dict[str, str]:
    """The OCI / veo-edge labels the Dockerfile sets from ``args`` (tests and inspect compare them)."""
    return {
        "org.opencontainers.image.version": args["VEO_EDGE_VERSION"],
        "org.opencontainers.image.revision": args.get("VCS_REF", "unknown"),
        "io.veo-edge.target": args["TARGET"],
        "io.veo-edge.model.name": args["MODEL_NAME"],
        "io.veo-edge.model.sha256": args["MODEL_SHA256"],
        "io.veo-edge.precision": args["PRECISION"],
        "io.veo-edge.cuda.version": args["CUDA_VERSION"],
        "io.veo-edge.tensorrt.version": args["TENSORRT_VERSION"],
        "io.veo-edge.jetpack.version": args["JETPACK_VERSION"],
        "io.veo-edge.plugins": args.get("PLUGINS", "no"),
        "io.veo-edge.serving": args.get("SERVING", "openvino (CPU)"),
    }


def _copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "engines", ".*"))


def _file_index(root: Path) -> dict[str, dict[str, Any]]:
    from veo_edge.builddir import sha256_file

    index = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != CONTEXT_MANIFEST:
            index[str(p.relative_to(root))] = {"sha256": sha256_file(p), "bytes": p.stat().st_size}
    return index


def check_build_dir(build_dir: Path) -> None:
    """A :class:`UsageError` for a build directory argument that is missing or not a directory."""
    build_dir = Path(build_dir)
    if build_dir.exists() and not build_dir.is_dir():
        named = build_dir.name == MANIFEST_NAME
        hint = f"; pass the directory that holds it, {build_dir.parent}" if named else ""
        raise UsageError(f"{build_dir} is a file, not a build directory{hint}")
    if not build_dir.is_dir():
        raise UsageError(f"build directory {build_dir} does not exist; run `veo-edge build` first")


def assemble_context(opts: ContextOptions, progress: Progress | None = None) -> Context:
    """Write the build context of ``opts.build_dir`` for ``opts.target``; returns it."""
    say = progress or (lambda _msg: None)
    target = opts.target
    build_dir = Path(opts.build_dir)
    check_build_dir(build_dir)
    model = _model_info(build_dir)
    note = platforms.check_servable(json.loads((build_dir / MANIFEST_NAME).read_text()), target.platform)
    if note:
        say(f"context: {note}")
    src = source_root()
    out = Path(opts.out) if opts.out is not None else default_out(build_dir, target)
    args = build_args(target, model, opts.base_image, opts.builder_image, opts.plugin_libs)
    try:
        _assemble(opts, out, args, model, src, say)
    except (OSError, shutil.Error) as e:
        if "No space left on device" not in str(e) and getattr(e, "errno", None) != errno.ENOSPC:
            raise
        free = shutil.disk_usage(out.parent).free if out.parent.exists() else 0
        need = sum(p.stat().st_size for p in build_dir.rglob("*") if p.is_file())
        raise DiskFullError(
            f"no space left on device writing the image context {out}: {free / 1e6:.0f} MB free there, the "
            f"build directory alone is {need / 1e6:.0f} MB and the wheelhouse several hundred more; free space "
            "or pass --context-dir DIR on another file system"
        ) from None
    return Context(path=out, target=target, build_args=args, labels=labels(args), model=model)


def _assemble(opts: ContextOptions, out: Path, args: dict[str, str], model: dict[str, Any], src: Path,
              say: Progress) -> None:  # fmt: skip
    target, build_dir = opts.target, Path(opts.build_dir)
    with _staged(out, opts.force) as stage:
        say(f"context: {target.dockerfile} for {target.name} ({target.platform}, base {args['BASE_IMAGE']})")
        shutil.copy2(src / target.dockerfile, stage / "Dockerfile")
        app = stage / "app"
        _copy_tree(build_dir, app / "model")
        (app / "bin").mkdir(parents=True)
        shutil.copy2(src / "packaging" / "entrypoint.sh", app / "bin" / "entrypoint.sh")
        (app / "healthcheck").mkdir()
        shutil.copy2(src / "healthcheck" / "healthcheck.sh", app / "healthcheck" / "healthcheck.sh")
        say("context: compiling the SELinux module (checkmodule, semodule_package)")
        selinux.compile_module(app / "selinux")
        if target.has_gpu:  # the sources the builder stage compiles; no host tests, no build folders
            for rel in layout.plugin_files(src):
                (stage / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src / rel, stage / rel)
        say(
            "context: wheelhouse (veo-edge + "
            + (", ".join(target.runtime_packages) if opts.download_wheels else "no downloads")
            + f"; {target.platform}, Python {target.python})"
        )
        lock = wheelhouse.build_wheelhouse(
            target, stage / "wheels", download=opts.download_wheels, progress=say
        )
        shutil.copy2(lock, app / wheelhouse.LOCK_NAME)
        say("context: CycloneDX SBOM of the image's Python environment (cyclonedx-py)")
        sbom.make_sbom(lock, src / "pyproject.toml", app / sbom.SBOM_NAME)
        sbom.complete(
            app / sbom.SBOM_NAME, stage / "wheels", build_dir, model, args["BASE_IMAGE"], opts.base_image_id
        )
        shutil.copy2(app / sbom.SBOM_NAME, stage / sbom.SBOM_NAME)
        # modes the image keeps: everything readable, only the scripts executable (owner root)
        for p in app.rglob("*"):
            p.chmod(0o755 if p.is_dir() or p.suffix == ".sh" else 0o644)
        (stage / BUILD_ARGS).write_text(
            json.dumps(
                {
                    "stage": target.stage,
                    "platform": target.platform,
                    "python": target.python,  # the wheelhouse's: the base image's, where it was read
                    "glibc": target.glibc,
                    "build_args": args,
                },
                indent=2,
            )
            + "\n"
        )
        index = {"schema": "veo-edge/context-manifest/v1", "target": target.name, "model": model}
        index["files"] = _file_index(stage)
        (stage / CONTEXT_MANIFEST).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
