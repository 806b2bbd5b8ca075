"""``veo-edge deploy IMAGE [IMAGE ...] --k8s OUT_DIR``: one workload per image, each image verified on
the local engine and named by digest, its signer pinned in the pod (``VEO_EDGE_TRUSTED_KEY``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from veo_edge.cli._common import console, print_json


def _digest_ref(
    local, image: str, image_id: str, registry: str | None, signature_tag: str | None
) -> tuple[str | None, str | None]:
    """``repo@sha256:...`` of the verified image and, when it was not pushed now, a note saying which
    reference that is and why: pushed now (``--registry``), or the one digest the engine already knows
    for it (an earlier push or pull), the image's own repository first. Several: a usage error naming
    them, never an arbitrary pick."""
    from veo_edge.deploy.transfer import push
    from veo_edge.errors import UsageError
    from veo_edge.packaging.attest import repo_of

    if registry:
        return push(local, image, image_id, registry, signature_tag)[0], None
    digests = sorted(set(local.images.get(image_id).attrs.get("RepoDigests") or []))
    same = [d for d in digests if repo_of(d) == repo_of(image)]
    found = same or digests
    if len(found) > 1:
        raise UsageError(
            f"{image} has {len(found)} registry digests on the local engine ({', '.join(found)}); pass "
            "--registry REG to push it where the cluster pulls from and name that digest"
        )
    if not found:
        return None, None
    loopback = "; that registry is on this machine's loopback, which no cluster node reaches"
    return found[0], (
        f"{image} is named by {found[0]}, the digest the local engine recorded when it was pushed to or "
        "pulled from that registry (no --registry given)"
        + (loopback if _on_loopback(found[0]) else "")
        + "; pass --registry REG to push it where the cluster pulls from"
    )


def _on_loopback(ref: str) -> bool:
    """Whether ``ref``'s registry is this machine's loopback (``127.0.0.1:5000/...``, ``localhost/...``)."""
    import ipaddress

    head = ref.split("/", 1)[0] if "/" in ref else ""
    host = head.rsplit(":", 1)[0].strip("[]") if head.count(":") <= 1 or head.startswith("[") else head
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def k8s_render(
    images: list[str], out_dir: Path, shared, trusting, registry: str | None, json_out: bool
) -> None:
    """Render ``shared`` once per image into ``out_dir``: the image's own name, target, port variable
    and cache directory read from it on the local engine (``shared.name``/``shared.target`` win)."""
    from rich.markup import escape

    from veo_edge.cli._deploy_run import default_name
    from veo_edge.deploy import local_engine, write_manifests
    from veo_edge.deploy import ship as steps
    from veo_edge.errors import DeployError, EngineUnreachableError, ImageTrustError, UsageError

    name, target = shared.name or None, shared.target or None
    if name and len(images) > 1:
        raise UsageError("--name names one workload; leave it out with several images")
    out = console(stderr=True)
    workloads = []
    local = None
    for image in images:
        facts = trust = None
        try:
            local = local or local_engine(timeout=10)
            trust = steps.verify_for_deploy(
                local, local, image, trusting.key, trusting.signature, trusting.allow_unsigned
            )
            facts = steps.facts_for(local, trust.image_id, image, target)
        except (DeployError, EngineUnreachableError) as e:
            if target is None:
                raise
            if not trusting.allow_unsigned:
                raise ImageTrustError(
                    f"{image} cannot be verified: {e}; render it from the local engine that holds it, or "
                    "pass --allow-unsigned (with --target) to render an unverified image"
                ) from e
        ref = image
        if trust is not None:
            digest, why = _digest_ref(local, image, trust.image_id, registry, trust.signature_tag)
            if why:
                out.print(f"[bold yellow]NOTE:[/] {escape(why)}")
            if digest is None and not trusting.allow_unsigned:
                raise UsageError(
                    f"Kubernetes pulls {image} from a registry, and the manifests name it by digest: pass "
                    "--registry REG (deploy pushes it there first), or push it and render again"
                )
            ref = digest or image
        for warning in trust.warnings if trust else [f"{image} was not verified"]:
            out.print(f"[bold red]WARNING: rendering an UNVERIFIED image (--allow-unsigned):[/] {warning}")
        tgt = facts.target if facts else target
        base = name or (default_name(facts) if facts else image.rsplit("/", 1)[-1].split(":")[0])
        own = {"port_env": facts.port_env, "cache_dir": facts.cache_dir} if facts else {}
        verified = trust is not None and trust.verified
        workloads.append(
            dataclasses.replace(
                shared,
                name=base if name else f"{base}-{tgt}",
                image=ref,
                target=tgt,
                trusted_key=trust.signed_by if verified else None,
                allow_unsigned=not verified,
                **own,
            )
        )
    written = write_manifests(workloads, out_dir)
    from veo_edge.deploy.k8s_options import notes

    for note in dict.fromkeys(n for w in workloads for n in notes(w)):  # once each, in order
        out.print(f"[bold yellow]NOTE:[/] {escape(note)}")
    if json_out:
        print_json(
            {"out": str(out_dir), "files": [str(p) for p in written], "images": [w.image for w in workloads]}
        )
    else:
        typer.echo(f"wrote {len(written)} manifests to {out_dir}: kubectl apply -k {out_dir}")
