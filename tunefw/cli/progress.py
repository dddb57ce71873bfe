"""Live launch display (rich): per problem trials done, best ratio to cuBLAS so far, trials/s."""
from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class LaunchProgress:
    """A context manager whose ``hook(event, data)`` the sweep calls as things happen."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[best]}"),
                                 TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                 console=console, transient=False)
        self.tasks: dict[int, int] = {}
        self.start = time.monotonic()
        self.finished = 0
        self.label = ""

    def __enter__(self) -> "LaunchProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _rate(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        return f"{self.finished / elapsed:.2f} trials/s"

    def hook(self, event: str, data: dict) -> None:
        if event == "start":
            sim, replay = data["backend"] == "sim", data["backend"] == "replay"
            self.label = " SIM" if sim else " REPLAY" if replay else ""
            self.console.print(f"launch [bold]{data['study']}[/] on {len(data['workers'])} "
                               f"worker(s) {data['workers']} - device {data['device']}"
                               + (" [bold yellow](SIMULATED)[/]" if sim else "")
                               + (" [bold yellow](REPLAY)[/]" if replay else ""))
            for row in data["problems"]:
                self.tasks[row["id"]] = self.progress.add_task(
                    f"{row['key']}{self.label}", total=row["budget"],
                    completed=min(row["evaluated"], row["budget"]), best=self._best(row),
                    rate="")
        elif event == "trial":
            row = data["problem"]
            self.finished += 1
            if not self.console.is_terminal:  # logs get a line per trial, not a redrawn bar
                tflops = f"{data['tflops']:.1f} TFLOP/s" if data["tflops"] else ""
                ratio = f" {data['ratio']:.3f}x cuBLAS" if data["ratio"] else ""
                self.console.print(f"trial {data['trial_id']} {row['key']} {data['status']} "
                                   f"{tflops}{ratio} gpu {data['gpu']}", markup=False,
                                   highlight=False)
            self.progress.update(self.tasks[row["id"]],
                                 completed=min(row["evaluated"], row["budget"]),
                                 best=self._best(row), rate=self._rate())
        elif event == "events":
            for line in data["events"]:
                self.progress.console.print(f"[dim]{line}[/]")
        elif event == "lease":  # a stale launch lease taken over
            self.console.print(data["line"], markup=False, highlight=False)
        elif event == "confirm":
            self.progress.console.print(f"confirming {data['configs']} top config(s) against "
                                        "cuBLAS (interleaved, longer runs)")

    @staticmethod
    def _best(row: dict) -> str:
        return f"best {row['best']:.3f}x cuBLAS" if row["best"] else "best -"
