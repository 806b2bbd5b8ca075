"""``veo-edge deploy``: ship an image onto a device, a swarm, or into Kubernetes manifests.

veo-edge deploy IMAGE --to unix:///var/run/docker.sock | ssh://user@host | tcp://host:2376 [--name NAME]
veo-edge deploy IMAGE --swarm --to ... [--replicas N | --global]
veo-edge deploy IMAGE [IMAGE ...] --k8s OUT_DIR
veo-edge deploy status NAME --to ... [--swarm]
veo-edge deploy rollback NAME --to ... [--swarm]
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from veo_edge.cli._common import console, print_json

if TYPE_CHECKING:
    from veo_edge.deploy.k8s import Workload

ACTIONS = ("status", "rollback")


def _env(pairs: list[str] | None) -> dict[str, str]:
    from veo_edge.errors import UsageError

    out = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {pair!r} is not KEY=VALUE")
        out[key] = value
    return out


def deploy(
    args: list[str] = typer.Argument(
        ..., help="IMAGE [IMAGE ...] (several only with --k8s), or status|rollback NAME."
    ),
    to: str = typer.Option(
        None, "--to", help="The target's Docker engine: unix://, ssh://user@host, tcp://host:2376."
    ),
    name: str = typer.Option(None, "--name", help="Container or service name (default: the model's name)."),
    port: int = typer.Option(8000, "--port", "-p", help="Port the server listens on (host networking)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds to wait for the release to be healthy."),
    registry: str = typer.Option(
        None, "--registry", help="Push/pull through this registry instead of streaming."
    ),
    tls_ca: Path = typer.Option(None, "--tls-ca", help="CA of the engine's TLS certificate (tcp://)."),
    tls_cert: Path = typer.Option(None, "--tls-cert", help="Client certificate the engine trusts (tcp://)."),
    tls_key: Path = typer.Option(None, "--tls-key", help="Key of the client certificate (tcp://)."),
    target: str = typer.Option(
        None, "--target", help="Device class (default: the image's io.veo-edge.target label)."
    ),
    selinux_type: str = typer.Option(
        None, "--selinux-type", help="Run under this SELinux type (label=type:...)."
    ),
    memory: str = typer.Option(None, "--memory", help="Memory limit, e.g. 2g."),
    cpus: float = typer.Option(None, "--cpus", help="CPU limit, e.g. 1.5."),
    env: list[str] = typer.Option(
        None, "--env", "-e", help="KEY=VALUE for the server's environment (repeatable)."
    ),
    verify_key: Path = typer.Option(
        None, "--verify-key", help="Verify the image's signed manifest with this public key first."
    ),
    swarm: bool = typer.Option(
        False, "--swarm", help="Deploy a Docker Swarm service instead of a container."
    ),
    replicas: int = typer.Option(None, "--replicas", help="Swarm/Kubernetes replicas (default 1)."),
    global_mode: bool = typer.Option(False, "--global", help="One task/pod per labelled node (DaemonSet)."),
    k8s: Path = typer.Option(None, "--k8s", help="Render Kubernetes/k3s manifests into this directory."),
    cache_host_path: str = typer.Option(
        None, "--cache-host-path", help="Kubernetes: keep the engine cache in this node path."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Ship an image, prove it healthy, and roll back when it is not."""
    from veo_edge.errors import UsageError

    if args[0] in ACTIONS:
        if len(args) != 2:
            raise UsageError(f"usage: veo-edge deploy {args[0]} NAME --to ENGINE")
        _action(args[0], args[1], to, tls_ca, tls_cert, tls_key, swarm, timeout, json_out)
        return
    if replicas is not None and global_mode:
        raise UsageError("--replicas and --global exclude each other")
    if k8s is not None:
        from veo_edge.deploy import Workload

        # what every image's workload shares; name and target "" = each image's own (see _k8s)
        shared = Workload(
            name=name or "",
            image="",
            target=target or "",
            replicas=None if global_mode else (replicas or 1),
            port=port,
            cache_host_path=cache_host_path,
            selinux_type=selinux_type,
            memory=memory,
            cpus=cpus,
            env=_env(env),
        )
        _k8s(args, k8s, shared, json_out)
        return
    if len(args) != 1:
        raise UsageError(f"one image at a time onto an engine (got {len(args)}); several only with --k8s")
    if to is None:
        raise UsageError(
            "--to is required: the target's Docker engine (unix://..., ssh://user@host, tcp://host:2376)"
        )
    from veo_edge.deploy import (
        ImageFacts,
        RunOptions,
        ServiceOptions,
        deploy_container,
        deploy_service,
        local_engine,
        transfer_image,
    )

    image = args[0]
    client = _address(to, tls_ca, tls_cert, tls_key).connect()
    local = local_engine()
    pinned = {}
    if verify_key is not None:
        from veo_edge.deploy.verify import verify_image

        trust = verify_image(local, image, verify_key)
        # the container's own entrypoint check then requires the same signer, not just the baked key
        pinned = {"VEO_EDGE_TRUSTED_KEY": str(trust["signed_by"])}
    out = console(stderr=True)
    with _bar(out, f"transferring {image}", json_out) as tick:
        moved = transfer_image(local, client, image, registry, progress=tick)
    if moved.method == "present":
        out.print(f"{to} already has {image} ({moved.image_id[:19]}): no transfer") if not json_out else None
    facts = ImageFacts.read(client, image, target)
    name = name or _default_name(facts)
    if swarm:
        sopts = ServiceOptions(
            replicas=None if global_mode else (replicas or 1),
            port=port,
            env={**_env(env), **pinned},
            memory=memory,
            cpus=cpus,
        )
        with _status(out, f"waiting for service {name} to be healthy", json_out) as note:
            result = deploy_service(
                client, facts, name, sopts, timeout, lambda s, t: note(f"{s} ({t:.0f} s)")
            )
        report = result.to_dict()
    else:
        ropts = RunOptions(
            port=port, selinux_type=selinux_type, memory=memory, cpus=cpus, env={**_env(env), **pinned}
        )
        with _status(out, f"waiting for {name} to be healthy", json_out) as note:
            result = deploy_container(
                client, facts, name, ropts, timeout, lambda c, h, t: note(f"{c}: {h} ({t:.0f} s)")
            )
        report = result.to_dict()
    report["transfer"] = moved.to_dict()
    if json_out:
        print_json(report)
    elif swarm:
        typer.echo(
            f"deployed: service {name} {report['action']} on {to}, {len(report['tasks'])} task(s), {image} healthy"
        )
    else:
        prev = (
            f" (previous {report['previous_image']} kept stopped as {name}-previous)"
            if report["previous_image"]
            else ""
        )
        typer.echo(
            f"deployed: {image} healthy as {name} on {to} after {report['healthy_after_s']:.1f} s{prev}"
        )


def _default_name(facts) -> str:
    import re

    base = facts.model or facts.ref.rsplit("/", 1)[-1].split(":")[0].split("@")[0]
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", base).strip("-.") or "veo-edge"


def _address(to, tls_ca, tls_cert, tls_key):
    from veo_edge.deploy import EngineAddress, TlsFiles
    from veo_edge.errors import UsageError

    given = [p for p in (tls_ca, tls_cert, tls_key) if p is not None]
    if given and len(given) != 3:
        raise UsageError("--tls-ca, --tls-cert and --tls-key go together")
    tls = TlsFiles(tls_ca, tls_cert, tls_key) if given else None
    return EngineAddress(to, tls)


def _action(action, name, to, tls_ca, tls_cert, tls_key, swarm, timeout, json_out) -> None:
    from veo_edge.deploy import rollback, rollback_service, service_status, status
    from veo_edge.errors import UsageError

    if to is None:
        raise UsageError(f"--to is required: the engine that runs {name}")
    client = _address(to, tls_ca, tls_cert, tls_key).connect()
    out = console(stderr=True)
    if action == "status":
        report = service_status(client, name) if swarm else status(client, name)
        if json_out:
            print_json(report)
            return
        if swarm:
            typer.echo(
                f"service {name}: {report['image']}, update {(report['update_status'] or {}).get('State', 'none')}"
            )
            for t in report["tasks"]:
                typer.echo(
                    f"  task {t['id']} {t['state']}{'/' + t['health'] if t['health'] else ''} {t['image']} {t['error'] or ''}"
                )
            return
        for key in ("current", "previous"):
            c = report[key]
            if c:
                typer.echo(
                    f"{key}: {c['container']} {c['image']} {c['state']}{'/' + c['health'] if c['health'] else ''}"
                )
            else:
                typer.echo(f"{key}: none")
        return
    if swarm:
        with _status(out, f"rolling back service {name}", json_out) as note:
            report = rollback_service(client, name, timeout, lambda s, t: note(f"{s} ({t:.0f} s)"))
    else:
        with _status(out, f"rolling back {name}", json_out) as note:
            report = rollback(client, name, timeout, lambda c, h, t: note(f"{c}: {h} ({t:.0f} s)")).to_dict()
    if json_out:
        print_json(report)
    else:
        typer.echo(f"rolled back: {name} on {to}")


def _k8s(images: list[str], out_dir: Path, shared: Workload, json_out: bool) -> None:
    """One workload per image from ``shared``, with the image's own name, target, port variable and
    cache directory read from its labels on the local engine (``shared.name``/``shared.target``, when
    set, win); rendered into ``out_dir``."""
    import dataclasses

    from veo_edge.deploy import write_manifests
    from veo_edge.deploy.profiles import ImageFacts
    from veo_edge.errors import DeployError, EngineUnreachableError, UsageError

    name, target = shared.name or None, shared.target or None
    if name and len(images) > 1:
        raise UsageError("--name names one workload; leave it out with several images")
    workloads = []
    local = None
    for image in images:
        facts = None
        try:
            from veo_edge.deploy import local_engine

            local = local or local_engine(timeout=10)
            facts = ImageFacts.read(local, image, target)
        except (DeployError, EngineUnreachableError):
            if target is None:
                raise
        except Exception as e:  # docker.errors.ImageNotFound: render from --target alone
            if target is None:
                raise UsageError(
                    f"image {image} is not on the local engine ({e}); pass --target to render without it"
                ) from e
        tgt = facts.target if facts else target
        base = name or (_default_name(facts) if facts else image.rsplit("/", 1)[-1].split(":")[0])
        wname = base if name else f"{base}-{tgt}"
        own = {"port_env": facts.port_env, "cache_dir": facts.cache_dir} if facts else {}
        workloads.append(dataclasses.replace(shared, name=wname, image=image, target=tgt, **own))
    written = write_manifests(workloads, out_dir)
    if json_out:
        print_json({"out": str(out_dir), "files": [str(p) for p in written]})
    else:
        typer.echo(f"wrote {len(written)} manifests to {out_dir}: kubectl apply -k {out_dir}")


class _bar:
    """A transfer progress bar on stderr (nothing with --json)."""

    def __init__(self, out, description: str, quiet: bool) -> None:
        self.out, self.description, self.quiet = out, description, quiet
        self.progress = None
        self.task = None

    def __enter__(self):
        if self.quiet:
            return None
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=self.out,
        )
        self.progress.start()
        self.task = self.progress.add_task(self.description, total=None)

        def tick(done: int, total: int | None) -> None:
            # the image size is an estimate of the stream's length: never show more than 100 %
            self.progress.update(self.task, completed=done, total=max(total, done) if total else None)

        return tick

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()


class _status:
    """A one-line live status on stderr while waiting for health (nothing with --json)."""

    def __init__(self, out, description: str, quiet: bool) -> None:
        self.out, self.description, self.quiet = out, description, quiet
        self.live = None

    def __enter__(self):
        if self.quiet:
            return lambda text: None
        self.live = self.out.status(self.description)
        self.live.start()
        return lambda text: self.live.update(f"{self.description}: {text}")

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.stop()


def register(app: typer.Typer) -> None:
    app.command("deploy", context_settings={"allow_interspersed_args": True})(deploy)
