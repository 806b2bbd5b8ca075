"""``veo-edge deploy IMAGE --to ...``: the library's steps (:mod:`veo_edge.deploy.ship`) in order, with
their progress on stderr and one report at the end."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from veo_edge.cli._common import console, print_json


def default_name(facts) -> str:
    import re

    base = facts.model or facts.ref.rsplit("/", 1)[-1].split(":")[0].split("@")[0]
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", base).strip("-.") or "veo-edge"


def ship(
    image: str,
    address,
    name: str | None,
    target: str | None,
    registry: str | None,
    trusting,
    plan,
    control_token_file: Path | None,
    timeout: float,
    json_out: bool,
) -> dict[str, Any]:
    from veo_edge.cli._deploy_ui import Bar, Status
    from veo_edge.deploy import (
        ServiceOptions,
        deploy_container,
        deploy_service,
        local_engine,
        transfer_image,
    )
    from veo_edge.deploy import ship as steps
    from veo_edge.deploy.swarm import check_manager
    from veo_edge.errors import ImageTrustError

    client = address.connect()
    if isinstance(plan, ServiceOptions):
        check_manager(client)  # before an image moves onto an engine that cannot run the service
    local = local_engine()
    out = console(stderr=True)
    trust = steps.verify_for_deploy(
        local, client, image, trusting.key, trusting.signature, trusting.allow_unsigned
    )
    for warning in trust.warnings:
        out.print(f"[bold red]WARNING: deploying an UNVERIFIED image (--allow-unsigned):[/] {warning}")
    with Bar(out, f"transferring {image}", json_out) as tick:
        moved = transfer_image(local, client, image, registry, tick, trust.image_id, trust.signature_tag)
    if moved.image_id != trust.image_id:
        raise ImageTrustError(
            f"the target has {image} as {moved.image_id[:19]}, not the verified {trust.image_id[:19]}"
        )
    if moved.method == "present" and not json_out:
        out.print(f"{address.url} already has {image} ({moved.image_id[:19]}): no transfer")
    before = len(trust.warnings)  # the target's own copy, checked before anything runs or stops
    trust = steps.verify_on_target(
        client, trust, image, trusting.key, trusting.signature, trusting.allow_unsigned
    )
    for warning in trust.warnings[before:]:
        out.print(f"[bold red]WARNING: the target's copy is UNVERIFIED (--allow-unsigned):[/] {warning}")
    facts = steps.facts_for(client, trust.image_id, image, target)
    name = name or default_name(facts)
    env = {**plan.env, **trust.env}  # the pins win over -e
    cache = None
    if isinstance(plan, ServiceOptions):
        secrets: tuple = ()
        if control_token_file is not None:
            ref, control_env = steps.control_token_secret(client, name, control_token_file)
            secrets, env = (ref,), {**env, **control_env}
        plan = dataclasses.replace(plan, env=env, secrets=secrets)
        with Status(out, f"waiting for service {name} to be healthy", json_out) as note:
            result = deploy_service(
                client,
                facts,
                name,
                plan,
                timeout,
                lambda s, t: note(f"{s} ({t:.0f} s)"),
                image=moved.digest_ref or trust.image_id,
            )
    else:
        cache = steps.check_cache_volume(client, trust, plan.volume(name), facts.cache_dir)
        if control_token_file is not None:
            volume, control_env = steps.control_token_volume(client, trust.image_id, name, control_token_file)
            plan, env = dataclasses.replace(plan, secret_volume=volume), {**env, **control_env}
        plan = dataclasses.replace(plan, env=env)
        with Status(out, f"waiting for {name} to be healthy", json_out) as note:
            result = deploy_container(
                client, facts, name, plan, timeout, lambda c, h, t: note(f"{c}: {h} ({t:.0f} s)")
            )
    report = result.to_dict()
    report.update(
        transfer=moved.to_dict(),
        verified=trust.verified,
        signed_by=trust.signed_by,
        warnings=trust.warnings,
        cache=cache,
    )
    _print(report, name, image, address.url, isinstance(plan, ServiceOptions), json_out)
    return report


def _print(report: dict, name: str, image: str, to: str, swarm: bool, json_out: bool) -> None:
    if json_out:
        print_json(report)
        return
    if report.get("recovered"):
        typer.echo(report["recovered"])
    trust = f"image ID signed by {report['signed_by']}" if report["verified"] else "UNVERIFIED"
    if swarm:
        running = [t for t in report["tasks"] if t["desired"] == "running"]
        typer.echo(
            f"deployed: service {name} {report['action']} on {to}, {len(running)} task(s), {image} "
            f"({report['bound_to']}, {trust}) healthy"
        )
        if report["kept"]:
            typer.echo(f"kept from the running service (not given): {', '.join(report['kept'])}")
        if report["removed_env"]:
            typer.echo(
                f"removed from the service's environment (not given with -e): {', '.join(report['removed_env'])}"
            )
        return
    prev = (
        f" (previous {report['previous_image']} kept stopped as {name}-previous)"
        if report["previous_image"]
        else ""
    )
    typer.echo(
        f"deployed: {image} ({report['image_id'][:19]}, {trust}) healthy as {name} on {to} after "
        f"{report['healthy_after_s']:.1f} s{prev}"
    )


def rollback_release(client, name: str, timeout: float, out, json_out: bool, trusting, least) -> dict:
    """``deploy rollback NAME`` on one device: the kept release is checked as a deploy checks a new one
    (:mod:`veo_edge.deploy.release_check`) before the running one is touched."""
    from veo_edge.cli._deploy_ui import Status
    from veo_edge.deploy import rollback
    from veo_edge.deploy.release_check import previous_release_check

    check, seen = previous_release_check(client, name, trusting.key, trusting.signature,
                                         trusting.allow_unsigned, least)  # fmt: skip
    with Status(out, f"rolling back {name}", json_out) as note:
        report = rollback(client, name, timeout, lambda c, h, t: note(f"{c}: {h} ({t:.0f} s)"),
                          check=check).to_dict()  # fmt: skip
    report.update(verified=seen["verified"], signed_by=seen["signed_by"], warnings=seen["warnings"])
    for warning in report["warnings"]:
        out.print(
            f"[bold red]WARNING: rolling back to an UNVERIFIED release (--allow-unsigned):[/] {warning}"
        )
    signer = f"image ID signed by {report['signed_by']}" if report["verified"] else "UNVERIFIED"
    return {**report, "trust": f" ({signer})"}
