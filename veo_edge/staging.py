"""Writing a build directory safely: one build per output path at a time, staged, swapped in whole.

:class:`BuildOutput` takes an exclusive ``flock`` on ``.NAME.lock`` beside the output for the whole build
(stdlib ``fcntl``: the lock must also tell a later build that a staging directory's owner is gone,
which is exactly "the lock is free", and the lock libraries add nothing here). Holding it, it removes the
``.NAME.building-*`` and ``.NAME.old-*`` debris of builds that were killed, then stages the new build
in a hidden directory beside the output and renames it into place only when every stage passed.

It refuses, in one line naming the path: ``--out`` naming a file; an existing directory without
``--force``; with ``--force``, a directory that is not a veo-edge build; a parent that is a file,
unwritable or read-only; too little free space for the build (and a disk that fills up during it).
A failed build leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from veo_edge.builddir import MANIFEST_NAME
from veo_edge.errors import BuildLockedError, DiskFullError, OutputExistsError, OutputPathError

_DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
#: below this much free space after a failure, the failure is taken for a full disk (a native library
#: may report ENOSPC as e.g. ``basic_ios::clear``)
_NEARLY_FULL = 1 << 20


def mib(n: float) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def is_build_dir(path: Path) -> bool:
    """A directory with a veo-edge manifest (any schema version): one ``--force`` may replace."""
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "schema_version" in manifest and "artifacts" in manifest


def _file_ancestor(path: Path) -> Path | None:
    """The nearest ancestor of ``path`` that exists and is not a directory, if any."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def path_error(e: OSError, path: Path, doing: str) -> Exception:
    """One-line error for an OSError met while ``doing`` something to ``path``."""
    if e.errno in _DISK_FULL:
        return DiskFullError(
            f"no space left on the filesystem of {path} while {doing}; free space there or choose an "
            "--out on another filesystem"
        )
    if e.errno == errno.EROFS:
        return OutputPathError(
            f"{path} is on a read-only filesystem (while {doing}); choose an --out on a writable one"
        )
    if e.errno in (errno.EACCES, errno.EPERM):
        return OutputPathError(
            f"permission denied writing {path} (while {doing}, as uid {os.getuid()}); choose a writable "
            "--out or fix the directory's permissions"
        )
    if e.errno in (errno.ENOTDIR, errno.EEXIST) and (f := _file_ancestor(path)) is not None:
        return OutputPathError(f"--out {path} cannot be created: {f} is a file, not a directory")
    return OutputPathError(f"cannot write {path} (while {doing}): {e.strerror or e}")


class BuildOutput:
    """The output path of one build: checked, locked, cleaned of debris, then staged (see the module)."""

    def __init__(self, out: str | Path, force: bool = False, wait: bool = False) -> None:
        self.out = Path(out).resolve()  # one lock per directory, however it was spelled (or linked)
        self.force = force
        self.wait = wait
        self.lock_path = self.out.parent / f".{self.out.name}.lock"
        self.reclaimed: list[str] = []  # debris of killed builds removed under the lock
        self._fd: int | None = None

    # -- checks -----------------------------------------------------------------------------------
    def check(self) -> None:
        """The path checks (cheap, before any slow work)."""
        out = self.out
        if (f := _file_ancestor(out)) is not None:
            raise OutputPathError(
                f"--out {out} cannot be created: {f} is a file, not a directory; choose another --out"
            )
        if out.exists() and not out.is_dir():
            raise OutputPathError(
                f"--out {out} is a file, not a directory; choose a directory path (a build is a directory) "
                "or remove the file"
            )
        if not out.is_dir():
            return
        empty = not any(out.iterdir())
        if not is_build_dir(out) and not empty:
            raise OutputExistsError(
                f"--out {out} exists and is not a veo-edge build directory (no veo-edge {MANIFEST_NAME}); "
                "--force replaces only build directories: choose another --out or empty it yourself"
            )
        if not self.force:
            err = OutputExistsError(f"output directory {out} already exists; pass --force to overwrite it")
            err.details = {"path": str(out), "finished_build": is_build_dir(out)}
            raise err

    # -- the lock ---------------------------------------------------------------------------------
    def __enter__(self) -> BuildOutput:
        self.check()
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise path_error(e, self.out.parent, "creating the parent directory") from e
        self._lock()
        try:
            self.check()  # again: a build we waited for (--wait) may have made the output meanwhile
            self._reclaim()
        except BaseException:
            self._unlock()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._unlock()

    def _lock(self) -> None:
        announced = False
        while True:
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as e:
                raise path_error(e, self.out.parent, f"creating the lock file {self.lock_path.name}") from e
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = _owner(fd)
                if not self.wait:
                    os.close(fd)
                    raise BuildLockedError(
                        f"another veo-edge build{owner} is writing {self.out}; wait for it to finish, pass "
                        "--wait to queue behind it, or choose another --out"
                    ) from None
                if not announced:
                    sys.stderr.write(f"waiting for another veo-edge build{owner} of {self.out}\n")
                    sys.stderr.flush()
                    announced = True
                fcntl.flock(fd, fcntl.LOCK_EX)
            # the holder before us may have removed the lock file as it finished: lock the current one
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        self._fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.time(), "out": str(self.out)}
        with contextlib.suppress(OSError):  # a full disk is reported by the space check that follows
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)

    def _unlock(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.lock_path)  # still holding it: whoever waits re-checks the inode and retries
        os.close(self._fd)
        self._fd = None

    def _reclaim(self) -> None:
        """Remove the staging and swap directories of earlier builds of this output: holding the lock,
        no other build of it is alive, so their owners are gone."""
        prefixes = (f".{self.out.name}.building-", f".{self.out.name}.old-")
        for p in sorted(self.out.parent.iterdir()):
            if p.name.startswith(prefixes) and p.is_dir() and not p.is_symlink():
                size = _tree_bytes(p)
                shutil.rmtree(p)
                self.reclaimed.append(f"{p.name} ({mib(size)})")

    # -- staging ----------------------------------------------------------------------------------
    def check_space(self, need_bytes: int) -> None:
        """:class:`DiskFullError` when the output's filesystem has less free space than the estimate."""
        free = shutil.disk_usage(self.out.parent).free
        if free < need_bytes:
            err = DiskFullError(
                f"not enough space for the build in {self.out.parent}: {mib(free)} free, the build needs "
                f"about {mib(need_bytes)}; free space there or choose an --out on another filesystem"
            )
            err.details = {"path": str(self.out.parent), "free_bytes": free, "need_bytes": need_bytes}
            raise err

    @contextlib.contextmanager
    def staging(self, need_bytes: int | None = None) -> Iterator[Path]:
        """An empty staging directory; on success it replaces the output, on failure it is removed."""
        assert self._fd is not None, "stage only while holding the lock (use BuildOutput as a context)"
        if need_bytes is not None:
            self.check_space(need_bytes)
        try:
            stage = Path(
                tempfile.mkdtemp(prefix=f".{self.out.name}.building-{os.getpid()}-", dir=self.out.parent)
            )
        except OSError as e:
            raise path_error(e, self.out.parent, "creating the staging directory") from e
        try:
            yield stage
            self._swap(stage)
        except BaseException as e:
            full = _disk_full(e, stage)
            what = _exhausted(stage) or "space"
            written = _tree_bytes(stage)
            shutil.rmtree(stage, ignore_errors=True)
            if full and not isinstance(e, DiskFullError):
                need = f", the build needs about {mib(need_bytes)}" if need_bytes and what == "space" else ""
                fix = (
                    "free space there" if what == "space" else "remove files there (or raise its inode limit)"
                )
                raise DiskFullError(
                    f"the filesystem of {self.out.parent} ran out of {what} during the build "
                    f"({mib(written)} written{need}); {fix} or choose an --out on another filesystem; "
                    f"nothing was written to {self.out}"
                ) from e
            raise

    def _swap(self, stage: Path) -> None:
        out = self.out
        self.check()  # the output may have changed while the build ran (not by a build: we hold the lock)
        os.chmod(stage, 0o755)
        old = None
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            out.rename(old)
        try:
            stage.rename(out)
        except OSError:
            if old is not None:
                old.rename(out)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)


def _owner(fd: int) -> str:
    """`` (pid 123 on host, since 08:31:02 UTC)`` from the lock file, or nothing."""
    try:
        info: dict[str, Any] = json.loads(os.pread(fd, 4096, 0) or b"{}")
        since = time.strftime("%H:%M:%S UTC", time.gmtime(float(info["since"])))
        return f" (pid {info['pid']} on {info['host']}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _tree_bytes(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def _disk_full(e: BaseException, where: Path) -> bool:
    """Whether failure ``e`` came from a full disk: ENOSPC/EDQUOT in its chain, or (for a native library's
    own wording) hardly any space left where it was writing."""
    seen: set[int] = set()
    err: BaseException | None = e
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if (isinstance(err, OSError) and err.errno in _DISK_FULL) or "No space left on device" in str(err):
            return True
        err = err.__cause__ or err.__context__
    if isinstance(e, KeyboardInterrupt | SystemExit | DiskFullError):
        return False
    return _exhausted(where) is not None


def _exhausted(where: Path) -> str | None:
    """``"space"`` or ``"inodes"`` when the filesystem of ``where`` has (nearly) none left."""
    try:
        st = os.statvfs(where)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize < _NEARLY_FULL:
        return "space"
    if st.f_files and st.f_favail == 0:  # f_files is 0 where a filesystem has no inode limit
        return "inodes"
    return None
