"""Stage reporting for long work: a rich progress display on a terminal, nothing with ``quiet``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class StageReporter:
    """Times each stage and shows it; the timings go into the manifest."""

    quiet: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._progress = None
        if not self.quiet:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TimeElapsedColumn(),
                console=Console(stderr=True),
                transient=False,
            )

    def __enter__(self) -> StageReporter:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextlib.contextmanager
    def stage(self, key: str, description: str) -> Iterator[None]:
        task = None
        if self._progress is not None:
            task = self._progress.add_task(description, total=1)
        start = time.perf_counter()
        try:
            yield
        except BaseException:
            if task is not None:  # finished: its spinner column goes blank, as a ✓ stage's does
                self._progress.update(task, completed=1, description=f"[red]✗[/] {description}")
            raise
        self.timings[key] = round(time.perf_counter() - start, 3)
        if task is not None:
            self._progress.update(task, completed=1, description=f"[green]✓[/] {description}")

    def note(self, message: str) -> None:
        if self._progress is not None:
            self._progress.console.print(message)
