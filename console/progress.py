"""Rich progress bars for long operations, shown only when stderr is a terminal."""

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

ProgressCallback = Callable[[str, int, int], None]


@contextmanager
def stage_progress(description: str) -> Iterator[ProgressCallback | None]:
    """Yields a `(stage, done, total)` callback driving one bar per stage, or None off a TTY."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(f"{description} [bold]{{task.description}}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as progress:
        tasks: dict[str, int] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = progress.add_task(stage, total=max(total, 1))
            progress.update(tasks[stage], completed=done, total=max(total, 1))

        yield update
