"""The SELinux module, compiled as `veo-edge build --target` compiles it (against the pinned
container-selinux interfaces), then linked with the reference policy's base module and analysed with
setools' sesearch/seinfo: veo_edge_t is MCS-constrained like container_t and writes only its own
container files (its tmpfs and volumes), its host cache type and /proc/self."""

from __future__ import annotations

import bz2
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from veo_edge.packaging.selinux import compile_module

#: the reference policy's base module (Debian: selinux-policy-default); .ci/run unpacks it from the package
#: without installing it (whose postinst builds the whole policy, minutes) and names it here
BASE = Path(os.environ.get("VEO_EDGE_SELINUX_BASE", "/usr/share/selinux/default/base.pp.bz2"))
#: what container-selinux itself declares (container.te), which the module requires; a stub stands in
STUB = """module stub 1.0;
require { role system_r; }
attribute container_domain;
attribute container_runtime_domain;
type container_file_t;
type container_runtime_t;
type container_var_lib_t;
type container_ro_file_t;
type container_runtime_tmpfs_t;
"""


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    missing = [t for t in ("sesearch", "seinfo", "semodule_link", "semodule_expand") if not shutil.which(t)]
    if missing or not BASE.is_file():
        pytest.skip(f"policy analysis needs setools and selinux-policy-default (missing: {missing or BASE})")
    work = tmp_path_factory.mktemp("selinux")
    pp = compile_module(work / "module")
    (work / "base.pp").write_bytes(bz2.decompress(BASE.read_bytes()))
    (work / "stub.te").write_text(STUB)
    run = lambda *a: subprocess.run(a, cwd=work, check=True, capture_output=True, text=True)  # noqa: E731
    run("checkmodule", "-M", "-m", "-o", "stub.mod", "stub.te")
    run("semodule_package", "-o", "stub.pp", "-m", "stub.mod")
    run("semodule_link", "-o", "linked.lnk", "base.pp", "stub.pp", str(pp))
    run("semodule_expand", "linked.lnk", "policy.bin")
    return work / "policy.bin"


def _rules(policy: Path) -> list[tuple[str, str, set[str]]]:
    """Every allow rule of veo_edge_t as (target type, class, permissions), from one sesearch."""
    out = subprocess.run(["sesearch", "-A", "-s", "veo_edge_t", str(policy)],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    rules = []
    for line in out.splitlines():
        m = re.match(r"allow veo_edge_t (\S+):(\S+) (?:\{ (.*) \}|(\S+));", line)
        if m:
            rules.append((m[1], m[2], set((m[3] or m[4]).split())))
    return rules


def test_veo_edge_t_is_mcs_constrained_and_writes_only_its_own_files_and_cache(policy) -> None:
    seinfo = subprocess.run(["seinfo", "-a", "mcs_constrained_type", "-x", str(policy)],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert "veo_edge_t" in seinfo.split()
    rules = _rules(policy)

    def targets(cls: str, perm: str) -> set[str]:
        return {t for t, c, perms in rules if c == cls and perm in perms}

    assert targets("file", "write") == {"container_file_t", "veo_edge_cache_t", "veo_edge_t"}
    assert targets("dir", "write") == {"container_file_t", "veo_edge_cache_t", "tmpfs_t"}
    assert targets("file", "read") >= {"veo_edge_model_t", "container_file_t"}
    assert "veo_edge_model_t" not in targets("file", "write")
    # device nodes: the GPU's, and only the harmless ones every domain gets (null, zero, the tty)
    devices = targets("chr_file", "write")
    assert "xserver_misc_device_t" in devices
    assert devices <= {
        "xserver_misc_device_t",
        "container_file_t",
        "null_device_t",
        "zero_device_t",
        "devtty_t",
    }
    assert targets("tcp_socket", "name_bind") == {"veo_edge_port_t", "unreserved_port_t"}
    # the container runtime's entry: from the image's files (container_file_t), as container_t
    assert "container_file_t" in targets("file", "entrypoint")
