"""``veo-edge deploy``: ship an image onto a device, a swarm, or into Kubernetes manifests.

veo-edge deploy IMAGE --to unix:///var/run/docker.sock | ssh://user@host | tcp://host:2376 [--name NAME]
veo-edge deploy IMAGE --swarm --to ... [--replicas N | --global]
veo-edge deploy IMAGE [IMAGE ...] --k8s OUT_DIR
veo-edge deploy status NAME --to ... [--swarm]
veo-edge deploy rollback NAME --to ... [--swarm]
veo-edge deploy remove NAME --to ... [--swarm] [--volumes]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from veo_edge.cli._common import console, print_json

ACTIONS = ("status", "rollback", "remove")


@dataclass(frozen=True)
class Trusting:
    """How a deploy decides an image may run (what ``--verify-key``, ``--signature`` and
    ``--allow-unsigned`` said)."""

    key: str | None
    signature: Path | None
    allow_unsigned: bool


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
        ..., help="IMAGE [IMAGE ...] (several only with --k8s), or status|rollback|remove NAME."
    ),
    to: str = typer.Option(
        None, "--to", help="The target's Docker engine: unix://, ssh://user@host, tcp://host:2376."
    ),
    name: str = typer.Option(None, "--name", help="Container or service name (default: the model's name)."),
    port: int = typer.Option(
        None,
        "--port",
        "-p",
        help="Port the server listens on (host networking; default 8000, or a swarm service's current one).",
    ),
    grpc_port: int = typer.Option(
        None,
        "--grpc-port",
        help="Its KServe v2 gRPC port (default: the image's, 8001; -1: off). Give each release on one "
        "device its own.",
    ),
    timeout: float = typer.Option(
        300.0, "--timeout", help="Seconds (above 0) to wait for the release to be healthy."
    ),
    registry: str = typer.Option(
        None, "--registry", help="Push, then pull by digest, through this registry."
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
        None,
        "--env",
        "-e",
        help="KEY=VALUE for the server's environment (repeatable); a swarm update's -e set is the "
        "service's whole environment (variables not given are removed, and named).",
    ),
    verify_key: str = typer.Option(
        None,
        "--verify-key",
        help="The trusted signing key (PEM public key or sha256:...; default $VEO_EDGE_TRUSTED_KEY, else "
        "the local key `veo-edge build` made here).",
    ),
    signature: Path = typer.Option(
        None, "--signature", help="A detached image signature (default: the <repo>:sha256-<id>.sig image)."
    ),
    allow_unsigned: bool = typer.Option(
        False,
        "--allow-unsigned",
        help="Deploy (or roll back to) an unsigned or unverified image anyway (loudly).",
    ),
    swarm: bool = typer.Option(
        False, "--swarm", help="Deploy a Docker Swarm service instead of a container."
    ),
    replicas: int = typer.Option(None, "--replicas", help="Swarm/Kubernetes replicas (default 1)."),
    global_mode: bool = typer.Option(False, "--global", help="One task/pod per labelled node (DaemonSet)."),
    update_monitor: float = typer.Option(
        None,
        "--update-monitor",
        help="Swarm: seconds a new task must stay healthy before the update (or rollback) moves on "
        "(default 15).",
    ),
    update_delay: float = typer.Option(
        None, "--update-delay", help="Swarm: seconds to pause after each replaced task (default 5)."
    ),
    k8s: Path = typer.Option(None, "--k8s", help="Render Kubernetes/k3s manifests into this directory."),
    cache_host_path: str = typer.Option(
        None, "--cache-host-path", help="Kubernetes: keep the engine cache in this node path."
    ),
    user: str = typer.Option(
        None, "--user", help="UID:GID the server runs as (non-root; default 10001:10001)."
    ),
    cap_add: list[str] = typer.Option(
        None,
        "--cap-add",
        help="Give back one Linux capability (all are dropped; repeatable; none: no capability, e.g. to "
        "drop what a swarm service has).",
    ),
    allow_privilege_escalation: bool = typer.Option(
        None,
        "--allow-privilege-escalation/--no-allow-privilege-escalation",
        help="Do not set no-new-privileges (default: set).",
    ),
    pids_limit: int = typer.Option(
        None, "--pids-limit", help="Most processes+threads (default 1024; 0: no limit)."
    ),
    gpus: str = typer.Option(
        None, "--gpus", help="GPUs on x86 GPU targets: a count, 'all', or 0,2 (default 1)."
    ),
    control_token_file: Path = typer.Option(
        None,
        "--control-token-file",
        help="Turn on model load/unload, guarded by the bearer token in this file (kept in a volume or "
        "a Swarm secret on the target, never in the image; a swarm re-deploy without it keeps the "
        "service's).",
    ),
    control_token_secret: str = typer.Option(
        None, "--control-token-secret", help="Kubernetes: the Secret whose key control-token holds it."
    ),
    volumes: bool = typer.Option(
        False, "--volumes", help="remove: also remove the release's engine-cache volume (kept by default)."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Verify an image by its ID, ship exactly that ID, prove it healthy, and roll back when it is not.

    `deploy status NAME` shows the release and the kept previous one, `deploy rollback NAME` swaps
    them once the kept one passes a deploy's checks (its signature and files, and the least-privilege
    flags as given), `deploy remove NAME` stops and removes both (and the control-token volume or secrets; the
    engine-cache volume with --volumes)."""
    from veo_edge.cli._common import interrupt_on_signals
    from veo_edge.errors import UsageError

    trusting = Trusting(verify_key, signature, allow_unsigned)
    if not timeout > 0:  # 0 would give up before the engine is asked; -1 and nan make no sense either
        raise UsageError(f"--timeout {timeout:g} must be a number of seconds above 0")
    if args[0] in ACTIONS:
        if len(args) != 2:
            raise UsageError(f"usage: veo-edge deploy {args[0]} NAME --to ENGINE")
        with interrupt_on_signals():
            address = _address(to, tls_ca, tls_cert, tls_key)
            if args[0] == "remove":
                _remove(args[1], address, swarm, volumes, timeout, json_out)
            else:
                least = _least_privilege(user, cap_add, allow_privilege_escalation, pids_limit, gpus)
                _action(args[0], args[1], address, swarm, timeout, json_out, trusting, least)
        return
    from veo_edge.packaging.image import check_reference, check_registry

    for image in args:  # a name Docker refuses: one line before any engine is asked
        check_reference(image, "IMAGE", image_id=True)
    if registry is not None:
        check_registry(registry)
    if replicas is not None and global_mode:
        raise UsageError("--replicas and --global exclude each other")
    if replicas is not None and replicas < 1:  # `replicas or 1` below would turn 0 into 1 without a word
        raise UsageError(f"--replicas {replicas} must be at least 1 (or --global: one on every node)")
    pacing = {"monitor_s": update_monitor, "update_delay_s": update_delay}
    pacing = {k: v for k, v in pacing.items() if v is not None}
    if pacing and not swarm:
        raise UsageError("--update-monitor and --update-delay pace a Swarm service's updates: add --swarm")
    run_env = _env(env)
    from veo_edge.deploy.runopts import check_env

    check_env(run_env, allow_unsigned)
    given_port, port = port, 8000 if port is None else port
    if grpc_port is not None:
        from veo_edge.deploy.profiles import GRPC_PORT_ENV

        if (grpc_port != -1 and not 0 < grpc_port < 65536) or grpc_port == port:
            raise UsageError(
                f"--grpc-port {grpc_port} is not a free TCP port beside --port {port} (1..65535, or -1: off)"
            )
        if run_env.get(GRPC_PORT_ENV, str(grpc_port)) != str(grpc_port):
            raise UsageError(f"--grpc-port {grpc_port} and --env {GRPC_PORT_ENV}=... disagree; give one")
        run_env[GRPC_PORT_ENV] = str(grpc_port)  # what the image's entrypoint serves gRPC on
    least = _least_privilege(user, cap_add, allow_privilege_escalation, pids_limit, gpus)
    if k8s is not None:
        from veo_edge.deploy import Workload
        from veo_edge.deploy.k8s_options import least_privilege

        # what every image's workload shares; name and target "" = each image's own (see k8s_render)
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
            env=run_env,
            control_token_secret=control_token_secret,
            **least_privilege(**least),
        )
        from veo_edge.cli._deploy_k8s import k8s_render

        k8s_render(args, k8s, shared, trusting, registry, json_out)
        return
    if len(args) != 1:
        raise UsageError(f"one image at a time onto an engine (got {len(args)}); several only with --k8s")
    if to is None:
        raise UsageError(
            "--to is required: the target's Docker engine (unix://..., ssh://user@host, tcp://host:2376)"
        )
    from veo_edge.deploy import RunOptions, ServiceOptions

    if swarm:
        # what the command did not give, an update keeps from the running service (defaults: on create)
        given = {
            "replicas": replicas is not None or global_mode,
            "port": given_port is not None,
            "grpc_port": grpc_port is not None,
            "monitor_s": update_monitor is not None,
            "update_delay_s": update_delay is not None,
            "memory": memory is not None,
            "cpus": cpus is not None,
            "user": user is not None,
            "cap_add": bool(cap_add),
            "privilege_escalation": allow_privilege_escalation is not None,
            "pids_limit": pids_limit is not None,
            "gpus": gpus is not None,
            "selinux_type": selinux_type is not None,
            "control_token": control_token_file is not None,
        }
        plan = ServiceOptions(
            replicas=None if global_mode else (replicas or 1),
            port=port,
            env=run_env,
            memory=memory,
            cpus=cpus,
            selinux_type=selinux_type,
            keep=frozenset(k for k, v in given.items() if not v),
            **pacing,
            **least,
        )
    else:
        plan = RunOptions(
            port=port, selinux_type=selinux_type, memory=memory, cpus=cpus, env=run_env, **least
        )
    plan.check()
    from veo_edge.cli._deploy_run import ship

    with interrupt_on_signals():
        ship(args[0], _address(to, tls_ca, tls_cert, tls_key), name, target, registry, trusting, plan,
             control_token_file, timeout, json_out)  # fmt: skip


def _least_privilege(user, cap_add, allow_privilege_escalation, pids_limit, gpus) -> dict:
    """The least-privilege flags with their defaults filled in (``--cap-add none``: no capability)."""
    from veo_edge.deploy.runopts import DEFAULT_PIDS_LIMIT, DEFAULT_USER

    caps = tuple(c for c in cap_add or () if c.strip().lower() != "none")
    return {
        "user": DEFAULT_USER if user is None else user,
        "cap_add": caps,
        "privilege_escalation": bool(allow_privilege_escalation),
        "pids_limit": DEFAULT_PIDS_LIMIT if pids_limit is None else pids_limit,
        "gpus": "1" if gpus is None else gpus,
    }


def _address(to, tls_ca, tls_cert, tls_key):
    from veo_edge.deploy import EngineAddress, TlsFiles
    from veo_edge.errors import UsageError

    if to is None:
        raise UsageError("--to is required: the engine that runs the release")
    given = [p for p in (tls_ca, tls_cert, tls_key) if p is not None]
    if given and len(given) != 3:
        raise UsageError("--tls-ca, --tls-cert and --tls-key go together")
    tls = TlsFiles(tls_ca, tls_cert, tls_key) if given else None
    return EngineAddress(to, tls)


def _action(action, name, address, swarm, timeout, json_out, trusting=None, least=None) -> None:
    from veo_edge.cli._deploy_ui import Status
    from veo_edge.deploy import rollback_service, service_status, status

    client = address.connect()
    out = console(stderr=True)
    if action == "status":
        with Status(out, f"status of {name}", json_out) as note:
            report = (
                service_status(client, name)
                if swarm
                else status(client, name, timeout, lambda c, h, t: note(f"{c}: {h} ({t:.0f} s)"))
            )
        if json_out:
            print_json(report)
            return
        if report.get("recovered"):
            typer.echo(report["recovered"])
        if swarm:
            typer.echo(
                f"service {name}: {report['image']} ({report['bound_to']}), update "
                f"{(report['update_status'] or {}).get('State', 'none')}"
            )
            for t in report["tasks"]:
                typer.echo(
                    f"  task {t['id']} slot {t['slot']} {t['state']}{'/' + t['health'] if t['health'] else ''} "
                    f"{t['image']} {t['error'] or ''}"
                )
            return
        for key in ("current", "previous"):
            c = report[key]
            if c:
                kept = key == "previous" and c["state"] == "exited" and not c["error"]
                typer.echo(
                    f"{key}: {c['container']} {c['image']} {c['state']}{'/' + c['health'] if c['health'] else ''}"
                    f"{' (' + c['error'] + ')' if c['error'] else ''}"
                    f"{f' (stopped, kept for `veo-edge deploy rollback {name}`)' if kept else ''}"
                )
            else:
                typer.echo(f"{key}: none")
        return
    if swarm:
        with Status(out, f"rolling back service {name}", json_out) as note:
            report = rollback_service(client, name, timeout, lambda s, t: note(f"{s} ({t:.0f} s)"))
    else:
        from veo_edge.cli._deploy_run import rollback_release

        report = rollback_release(client, name, timeout, out, json_out, trusting, least)
    signer = report.pop("trust", "")
    if json_out:
        print_json(report)
    else:
        if report.get("recovered"):
            typer.echo(report["recovered"])
        now = report.get("image") or report.get("bound_to")
        typer.echo(f"rolled back: {name} on {address.url}{f' runs {now} again' if now else ''}{signer}")


def _remove(name, address, swarm, volumes, timeout, json_out) -> None:
    from veo_edge.cli._deploy_ui import Status
    from veo_edge.deploy.remove import remove_release, remove_service

    client = address.connect()
    what = f"service {name}" if swarm else name
    with Status(console(stderr=True), f"removing {what}", json_out):
        if swarm:
            report = remove_service(client, name, volumes, timeout)
        else:
            report = remove_release(client, name, volumes)
    if json_out:
        print_json(report)
        return
    gone = report["removed"] + report.get("removed_secrets", []) + report["removed_volumes"]
    typer.echo(f"removed from {address.url}: {', '.join(gone)}")
    if report["kept_volumes"]:
        typer.echo(
            f"kept the engine-cache volume {', '.join(report['kept_volumes'])} (a later deploy of {name} "
            "reuses it; --volumes removes it)"
        )


def register(app: typer.Typer) -> None:
    app.command("deploy", context_settings={"allow_interspersed_args": True})(deploy)
