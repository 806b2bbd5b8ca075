"""What the least-privilege flags of ``veo-edge deploy`` mean for a Kubernetes pod, and what a user
should hear about the pod that the manifests do not say.

| flag | in the pod |
| --- | --- |
| ``--user UID:GID`` (numeric: a pod runs as numbers) | ``runAsUser``, ``runAsGroup``, ``fsGroup`` |
| ``--cap-add CAP`` | ``capabilities.add`` (after ``drop: [ALL]``) |
| ``--allow-privilege-escalation`` | ``allowPrivilegeEscalation: true`` |
| ``--gpus N`` (a count; the device plugin picks which) | ``nvidia.com/gpu: N`` on x86 GPU targets |
| ``--pids-limit`` | refused: pod pids limits are the kubelet's ``podPidsLimit``, per node |

Adding a capability other than ``NET_BIND_SERVICE``, or allowing privilege escalation, leaves the
restricted Pod Security Standard; a ``--cache-host-path`` (hostPath) leaves the baseline one too.
"""

from __future__ import annotations

import re
from typing import Any

from veo_edge.deploy.k8s import Workload
from veo_edge.deploy.profiles import gpu_run
from veo_edge.errors import UsageError

#: the one capability the restricted Pod Security Standard lets a container add
RESTRICTED_CAPS = frozenset({"NET_BIND_SERVICE"})


def least_privilege(
    user: str, cap_add: list[str] | tuple[str, ...], privilege_escalation: bool, pids_limit: int, gpus: str
) -> dict[str, Any]:
    """The ``--user``, ``--cap-add``, ``--allow-privilege-escalation``, ``--pids-limit`` and ``--gpus``
    of a deploy as :class:`Workload` fields, or a usage error for what a pod spec cannot say."""
    from veo_edge.deploy.runopts import DEFAULT_PIDS_LIMIT, gpu_request

    m = re.fullmatch(r"(\d+):(\d+)", user.strip())
    if not m:
        if re.fullmatch(r"\d+", user.strip()):
            raise UsageError(
                f"--user {user}: Kubernetes needs the group too (runAsGroup, fsGroup); give UID:GID, "
                f"e.g. --user {user.strip()}:{user.strip()}"
            )
        raise UsageError(
            f"--user {user!r}: Kubernetes runs a pod as numbers (runAsUser, runAsGroup); give a numeric "
            "UID:GID, e.g. --user 10001:10001"
        )
    uid, gid = int(m.group(1)), int(m.group(2))
    if uid == 0:
        raise UsageError(f"--user {user}: UID 0 is root and the pod runs with runAsNonRoot; give another UID")
    caps = []
    for cap in cap_add:
        c = cap.strip().upper().removeprefix("CAP_")
        if not re.fullmatch(r"[A-Z][A-Z0-9_]*", c):
            raise UsageError(f"--cap-add {cap!r} is not a Linux capability name, e.g. NET_BIND_SERVICE")
        if c not in caps:
            caps.append(c)
    if pids_limit != DEFAULT_PIDS_LIMIT:
        raise UsageError(
            f"--pids-limit {pids_limit}: a Kubernetes pod spec has no pids limit (it is the kubelet's "
            "podPidsLimit, set per node); leave --pids-limit out with --k8s"
        )
    count = gpu_request(gpus).get("count")
    if count is None or count < 1:
        raise UsageError(
            f"--gpus {gpus}: a Kubernetes pod asks for a number of nvidia.com/gpu and the device plugin "
            "picks which; give a count, e.g. --gpus 2"
        )
    return {"uid": uid, "gid": gid, "cap_add": tuple(caps), "privilege_escalation": privilege_escalation,
            "gpus": count}  # fmt: skip


def notes(w: Workload) -> list[str]:
    """What a user should know about ``w``'s pod that the manifests do not say: where it leaves the
    restricted Pod Security Standard, what a node must prepare, a flag its target ignores."""
    out = []
    extra = [c for c in w.cap_add if c not in RESTRICTED_CAPS]
    if extra:
        out.append(
            f"--cap-add {','.join(extra)}: the restricted Pod Security Standard allows adding only "
            "NET_BIND_SERVICE; a namespace enforcing it refuses this pod"
        )
    if "NET_BIND_SERVICE" in w.cap_add:
        out.append(
            "--cap-add NET_BIND_SERVICE: the pod's non-root server cannot use it (not ambient; python has "
            "no file capabilities); a --port below 1024 works through the pod's sysctl "
            "net.ipv4.ip_unprivileged_port_start, which the manifests set, so the capability can be left out"
        )
    if w.privilege_escalation:
        out.append(
            "--allow-privilege-escalation: allowPrivilegeEscalation: true; a namespace enforcing the "
            "restricted Pod Security Standard refuses this pod"
        )
    if w.cache_host_path:
        out.append(
            f"--cache-host-path {w.cache_host_path}: create it on every node before the pod starts, owned "
            f"by the pod's user (install -d -o {w.uid} -g {w.gid} {w.cache_host_path}): the pod waits "
            "while it is absent, and fsGroup does not apply to hostPath; hostPath volumes are outside "
            "the baseline and restricted Pod Security Standards"
        )
    gpu = gpu_run(w.target)
    if w.gpus != 1 and not gpu.device_requests:
        has = "its one integrated GPU" if gpu.k8s_gpu_resource else "no GPU"
        out.append(f"--gpus {w.gpus}: target {w.target} gets {has}; --gpus counts GPUs on x86 targets")
    return out
