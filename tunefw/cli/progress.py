"""Live launch display (rich): per problem trials done, the best ratio to cuBLAS screened so far,
trials/s; then each problem's confirmed best. Every line with a figure says SIMULATED or REPLAY
where the figures are not measurements."""
from __future__ import annotations

import time
from typing import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tunefw.cli.render import number, ratio, tag
from tunefw.cli.startup import KIND, space_lines
from tunefw.study.spec import StudySpec


class LaunchProgress:
    """A context manager whose ``hook(event, data)`` the sweep calls as things happen;
    ``spaces_for``: the study whose families' spaces to print once the workers report their
    device; ``while_starting``: the summary's lines to print while the workers start (the
    sweep calls the hook's "starting" from a thread of its own meanwhile)."""

    def __init__(self, console: Console, spaces_for: StudySpec | None = None,
                 while_starting: Callable[[], list[str]] | None = None) -> None:
        self.console = console
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[best]}"),
                                 TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                                 console=console, transient=False)
        self.tasks: dict[int, int] = {}
        self.start = time.monotonic()
        self.finished = 0
        self.kind: str | None = None
        self.spaces_for = spaces_for
        self.while_starting = while_starting

    def __enter__(self) -> "LaunchProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _rate(self) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        return f"{self.finished / elapsed:.2f} trials/s"

    def _print(self, text: str) -> None:
        self.progress.console.print(text, markup=False, highlight=False)

    def hook(self, event: str, data: dict) -> None:
        if event == "starting" and self.while_starting is not None:
            for line in self.while_starting():
                self._print(line)
        elif event == "start":
            self._start(data)
        elif event == "trial":
            row = data["problem"]
            self.finished += 1
            if not self.console.is_terminal:  # logs get a line per trial, not a redrawn bar
                tflops = f"{data['tflops']:.1f} TFLOP/s" if data["tflops"] else ""
                shown = f" {data['ratio']:.3f}x cuBLAS" if data["ratio"] else ""
                self._print(f"trial {data['trial_id']} {row['key']} {data['status']} "
                            f"{tflops}{shown} gpu {data['gpu']}{tag(self.kind)}")
            self.progress.update(self.tasks[row["id"]],
                                 completed=min(row["evaluated"], row["budget"]),
                                 best=self._best(row), rate=self._rate())
        elif event == "events":
            for line in data["events"]:
                self.progress.console.print(f"[dim]{line}[/]")
        elif event == "lease":  # a stale launch lease taken over
            self.console.print(data["line"], markup=False, highlight=False)
        elif event == "confirm":
            self._print(f"confirming {data['configs']} top config(s) against cuBLAS "
                        "(interleaved, longer runs)")
        elif event == "confirmed":
            for w in data["winners"]:
                screened = (f" (screened {ratio(w['screen_ratio'])})"
                            if ratio(w["screen_ratio"]) != ratio(w["ratio"]) else "")
                self._print(f"{w['key']}: confirmed best {ratio(w['ratio'])} cuBLAS, "
                            f"{number(w['tflops'])} TFLOP/s, trial {w['trial_id']}{screened}"
                            f"{tag(self.kind)}")

    def _start(self, data: dict) -> None:
        self.kind = KIND.get(data["backend"])
        up, count = len(data["workers"]), data.get("worker_count", len(data["workers"]))
        self.console.print(f"launch [bold]{data['study']}[/] on "
                           + (f"{up} worker(s)" if up == count else f"{up} of {count} workers")
                           + f" {data['workers']} - device {data['device']}"
                           + (f" [bold yellow]({self.kind})[/]" if self.kind else "")
                           + ("" if up == count else "; the others take trials as they start"))
        if self.spaces_for is not None:
            for line in space_lines(self.spaces_for, data["families"], data["device_spec"],
                                    data["backend"]):
                self._print(line)
        for row in data["problems"]:
            self.tasks[row["id"]] = self.progress.add_task(
                f"{row['key']}{' ' + self.kind if self.kind else ''}", total=row["budget"],
                completed=min(row["evaluated"], row["budget"]), best=self._best(row), rate="")

    @staticmethod
    def _best(row: dict) -> str:
        return (f"screened best {row['best']:.3f}x cuBLAS" if row["best"]
                else "screened best -")
