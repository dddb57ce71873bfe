"""What the sweep needs of its GPU workers: jobs go into per-worker slots, finished ones come
back as (job, outcome) pairs. The Ray actor pool (cluster.py) is one implementation; the tests
drive the sweep with an in-process one."""
from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

from tunefw.outcome import Outcome, TrialSpec

QUEUE_DEPTH = 2  # trials queued per worker: the next is ready the moment one finishes


@dataclass
class Job:
    """A trial on its way through the pool. ``attempt`` counts the workers it ran on;
    ``retry_of`` is the WORKER_LOST row of the attempt before (the driver's, never the pool's)."""

    spec: TrialSpec
    compiled: Any = None
    kind: str = "evaluate"  # or "confirm"
    attempt: int = 1
    retry_of: int | None = None
    submitted: float = 0.0
    context: Any = None  # the caller's bookkeeping, returned untouched


@dataclass
class Slot:
    """One worker's queue and its figures (the sweep's stats read them)."""

    index: int
    queue: deque = field(default_factory=deque)  # (job, the implementation's handle)
    # time.monotonic() when the worker first reported (None: still starting, takes no job)
    up_at: float | None = field(default_factory=time.monotonic)
    head_since: float = 0.0  # when the first queued job started running (estimate)
    restarts: int = 0
    busy_s: float = 0.0
    trials: int = 0


class WorkerPool(ABC):
    """N workers, each with a slot of up to QUEUE_DEPTH jobs. ``infos[i]`` describes worker i
    (gpu, device, fingerprint) once it is up (None before: a pool is handed out once one
    worker is up, the others may still be starting); ``events`` collects restarts, kills and
    late starts for the status line."""

    infos: list[dict | None]
    slots: Sequence[Slot]
    events: list[str]

    def free_slots(self) -> list[Slot]:
        """Slots of workers that are up with room, emptiest first."""
        return sorted((s for s in self.slots
                       if s.up_at is not None and len(s.queue) < QUEUE_DEPTH),
                      key=lambda s: len(s.queue))

    @property
    def first_info(self) -> dict:
        """The info of a worker that is up (the device and fingerprint the launch runs on)."""
        return next(info for info in self.infos if info is not None)

    @property
    def in_flight(self) -> int:
        return sum(len(s.queue) for s in self.slots)

    @abstractmethod
    def submit(self, slot: Slot, job: Job) -> None:
        """Queue ``job`` on ``slot``'s worker (its ``kind`` says evaluate or confirm)."""

    @abstractmethod
    def poll(self, wait_s: float) -> tuple[list[tuple[Job, Outcome]], list[Job]]:
        """Wait up to ``wait_s`` for finished jobs: (job, outcome) pairs, a WORKER_LOST outcome
        where the worker died under the job, and the jobs that never started on a worker that
        was restarted (to run again elsewhere)."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop every worker."""
