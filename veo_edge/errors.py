"""One exception hierarchy for veo-edge.

Every error a user can cause or act on derives from :class:`VeoEdgeError`. The CLI prints each as one
line and exits with the class's ``exit_code``; the traceback shows only with ``--debug`` or
``VEO_EDGE_DEBUG=1``. Messages say what was wrong, what was received, what was expected, and what to
do next.
"""

from __future__ import annotations

#: exit code for a bug in veo-edge itself (sysexits' EX_SOFTWARE)
INTERNAL_ERROR = 70


def one_line(e: BaseException) -> str:
    """An error's message on one line, as the command line and the healthcheck probe print it."""
    return " ".join(part.strip() for part in str(e).splitlines() if part.strip())


class VeoEdgeError(Exception):
    """Base of every veo-edge error."""

    exit_code = 1
    #: machine-readable specifics (printed by the CLI with ``--json``, and with ``--debug``)
    details: dict | None = None


class UsageError(VeoEdgeError):
    """A command-line or API argument is invalid (unknown model, bad shape string, ...)."""

    exit_code = 2


class ModelLoadError(VeoEdgeError):
    """A model, checkpoint or ONNX file could not be loaded."""

    exit_code = 3


class InputError(VeoEdgeError):
    """An input tensor does not match what the model declares (name, shape, dtype)."""

    exit_code = 4


class OutputExistsError(VeoEdgeError):
    """The output directory exists and ``--force`` was not given."""

    exit_code = 5


class ParityError(VeoEdgeError):
    """Two implementations of the same model disagree beyond tolerance."""

    exit_code = 6


class BuildDirError(VeoEdgeError):
    """A build directory is missing, incomplete or corrupt."""

    exit_code = 7


class BackendUnavailableError(VeoEdgeError):
    """A runtime backend cannot be used on this machine (library, device or memory missing)."""

    exit_code = 8


class BackendError(VeoEdgeError):
    """A runtime backend failed while running (out of memory, device lost, ...)."""

    exit_code = 9


class OverloadedError(VeoEdgeError):
    """The request queue is full; retry later or add capacity."""

    exit_code = 10


class CudaOutOfMemoryError(BackendError):
    """The GPU ran out of memory while running (CUDA out of memory); the runtime falls back to the next
    backend and re-runs the batch."""


class DeviceLostError(BackendError):
    """The GPU stopped answering (device lost, Xid, driver reset); the runtime falls back."""


class NoBackendError(BackendUnavailableError):
    """No backend of the runtime's policy can run on this machine, or all of them failed."""


class DeployError(VeoEdgeError):
    """Shipping an image to a device or a fleet failed (``veo-edge deploy``)."""

    exit_code = 44


class InsecureEngineError(DeployError):
    """A plain ``tcp://`` engine address without TLS: refused, as it hands root on the device to the network."""

    exit_code = 45


class UnhealthyReleaseError(DeployError):
    """The new release never became healthy; it was removed and the previous release restored."""

    exit_code = 46


class DeployPendingError(DeployError):
    """The orchestrator accepted the release but cannot place it (no node satisfies its constraints)."""

    exit_code = 47


class RollbackFailedError(DeployError):
    """Restoring the previous release failed too: the device serves nothing; act now."""

    exit_code = 48


class AccuracyGuardError(VeoEdgeError):
    """A reduced CPU precision (bf16, int8) loses more accuracy against FP32 than the build allows."""

    exit_code = 14


class RunDirError(VeoEdgeError):
    """A soak run directory is missing, not empty, foreign, corrupt or already complete."""

    exit_code = 51


class ArtifactMismatchError(BuildDirError):
    """An artifact of a build directory does not match the sha256 (or size) its manifest records: the
    build was modified or corrupted after it was made, and nothing loads it."""

    exit_code = 30


class ManifestError(BuildDirError):
    """A build directory's ``manifest.json`` does not follow the manifest schema (a field is missing or
    has the wrong type or value)."""

    exit_code = 31


class OutputPathError(VeoEdgeError):
    """``--out`` cannot be written: it names a file or a directory veo-edge does not own, or its parent
    is a file, unwritable or on a read-only filesystem."""

    exit_code = 32


class DiskFullError(VeoEdgeError):
    """The filesystem of the output ran out of space (or would, by the build's estimate)."""

    exit_code = 33


class BuildLockedError(VeoEdgeError):
    """Another build holds the lock on the same output path."""

    exit_code = 34


class PackagingError(VeoEdgeError):
    """A container image context cannot be assembled (missing tool, source file, wheel or key)."""

    exit_code = 40


class EngineUnreachableError(VeoEdgeError):
    """No Docker engine answers at DOCKER_HOST (or the default socket)."""

    exit_code = 41


class ImageBuildError(PackagingError):
    """The Docker engine failed to build, save or inspect the image."""

    exit_code = 42


class ImageTrustError(VeoEdgeError):
    """An image's baked files do not match its manifest, or the manifest's signature does not verify."""

    exit_code = 43


class ImageNotFoundError(VeoEdgeError):
    """The image to verify or deploy is in no engine that was asked (the local one, the target)."""

    exit_code = 49


class DeployInterruptedError(DeployError):
    """A deploy or rollback was interrupted (Ctrl-C, SIGTERM, SIGHUP) and the previous release restored."""

    exit_code = 130
