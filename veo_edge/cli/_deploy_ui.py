"""The live displays of ``veo-edge deploy`` on stderr: a transfer progress bar and a one-line health
status."""

from __future__ import annotations


class Bar:
    """A transfer progress bar on stderr (nothing with --json)."""

    def __init__(self, out, description: str, quiet: bool) -> None:
        self.out, self.description, self.quiet = out, description, quiet
        self.progress = None
        self.task = None

    def __enter__(self):
        if self.quiet:
            return None

        def tick(done: int, total: int | None) -> None:
            # drawn from the first byte moved: a target that has the image moves none
            if self.progress is None:
                from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

                self.progress = Progress(
                    TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    console=self.out,
                )  # fmt: skip
                self.progress.start()
                self.task = self.progress.add_task(self.description, total=None)
            # the image size is an estimate of the stream's length: never show more than 100 %
            self.progress.update(self.task, completed=done, total=max(total, done) if total else None)

        return tick

    def __exit__(self, *exc) -> None:
        if self.progress is not None:
            self.progress.stop()


class Status:
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
