"""An in-process worker pool for the sweep's tests: no Ray, no processes. Each poll runs the
head job of every slot on the simulated device's evaluator; ``dies`` says where a worker dies
under a job, ``stop_after`` ends the launch (as a kill would) after that many results. A fake
compiler pool stands in for the cuda launch's; a pipeline without either runs its finish step."""
from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any, Callable

from tunefw.cuda.compiler import CompileResult
from tunefw.device import H200
from tunefw.evaluate.protocol import Evaluator
from tunefw.evaluate.sim import SimEvaluator
from tunefw.outcome import Outcome, Status
from tunefw.store import queries as q
from tunefw.study.spec import SimSettings, StudySpec
from tunefw.tune.pipeline import Pipeline, ProblemState
from tunefw.tune.pool import Job, Slot, WorkerPool
from tunefw.tune.recorder import Recorder


class Killed(Exception):
    """The launch ended under the pool (the in-process stand-in for a kill)."""


class FakePool(WorkerPool):
    """``workers`` simulated workers; ``dies(job, first_seen_index)`` kills the worker;
    ``up_after[i]``: worker i comes up at that poll (before it, it is starting: no jobs)."""

    def __init__(self, workers: int = 2, dies: Callable[[Job, int], bool] | None = None,
                 stop_after: int | None = None, evaluator: Evaluator | None = None,
                 up_after: dict[int, int] | None = None) -> None:
        """``evaluator``: what the workers run (default the simulator, no trial time)."""
        self.evaluator = evaluator or SimEvaluator(SimSettings(trial_seconds=0.0))
        self.up_after = up_after or {}
        self.infos = [None if i in self.up_after else self._info(i) for i in range(workers)]
        # The workers not told to start late come up together, at one instant: a Slot's own
        # default clock reading per worker made "every worker up" a few ms after "first worker
        # up" on a loaded machine (test_the_start_up_is_stored_and_shown failed on it once).
        up = time.monotonic()
        self.slots = [Slot(i, up_at=None if i in self.up_after else up) for i in range(workers)]
        self.polls = 0
        self.events: list[str] = []
        self.dies = dies or (lambda job, index: False)
        self.stop_after = stop_after
        self.seen: list[int] = []  # id() of each job, in the order first submitted
        self.jobs: list[Job] = []  # every submission (a retry again)
        self.results = 0
        self.shut = False

    def _info(self, index: int) -> dict:
        return {"gpu": f"fake{index}", "pid": 0, "device": self.evaluator.device_spec(),
                "fingerprint": self.evaluator.fingerprint()}

    def submit(self, slot: Slot, job: Job) -> None:
        if id(job) not in self.seen:
            self.seen.append(id(job))
        self.jobs.append(job)
        slot.queue.append((job, None))

    def poll(self, wait_s: float) -> tuple[list[tuple[Job, Outcome]], list[Job]]:
        done: list[tuple[Job, Outcome]] = []
        requeue: list[Job] = []
        self.polls += 1
        for slot in self.slots:
            if slot.up_at is None and self.polls >= self.up_after[slot.index]:
                slot.up_at, self.infos[slot.index] = time.monotonic(), self._info(slot.index)
            if not slot.queue:
                continue
            if self.stop_after is not None and self.results >= self.stop_after:
                raise Killed(f"stopped after {self.results} results")
            job, _ = slot.queue.popleft()
            self.results += 1
            if self.dies(job, self.seen.index(id(job))):
                requeue += [queued for queued, _ in slot.queue]
                slot.queue.clear()
                slot.restarts += 1
                self.events.append(f"worker {slot.index} restarted: worker process died")
                done.append((job, Outcome(Status.WORKER_LOST, log="worker process died",
                                          gpu=self.infos[slot.index]["gpu"], evaluator="sim")))
                continue
            run = self.evaluator.evaluate if job.kind == "evaluate" else self.evaluator.confirm
            outcome = run(job.spec, job.compiled)
            outcome.gpu = self.infos[slot.index]["gpu"]
            slot.trials += 1
            slot.busy_s += outcome.busy_s
            done.append((job, outcome))
        return done, requeue

    def shutdown(self) -> None:
        self.shut = True


class FakeCompiler:
    """A compiler pool that compiles nothing: each submit is a finished future, a
    COMPILE_ERROR (no ptxas figures) where ``fails(config)`` says so, else OK with ptxas's
    figures of ``ptxas(config)``; ``submitted`` counts them."""

    workers = 1

    def __init__(self, fails: Callable[[dict], bool],
                 ptxas: Callable[[dict], tuple[int, int, int]] = lambda config: (32, 0, 0)) -> None:
        self.fails = fails
        self.ptxas = ptxas
        self.submitted = 0
        self.closed = False

    def submit(self, template: Any, config: dict, dtype: str, arch: str,
               gate: str = "none") -> Future:
        self.submitted += 1
        bad = self.fails(config)
        future: Future = Future()
        regs, smem, spills = (None, None, None) if bad else self.ptxas(config)
        future.set_result(CompileResult(Status.COMPILE_ERROR if bad else Status.OK,
                                        None if bad else b"cubin", "kernel",
                                        "error: fake" if bad else "", regs, smem, spills, 0.25,
                                        False, "key"))
        return future

    def close(self) -> None:
        self.closed = True


def finishing_pipeline(store: Any, study_name: str, st: ProblemState) -> Pipeline:
    """A pipeline of one problem with no pool and no asker: enough for its finish step."""
    with store.session() as s:
        study = q.get_study(s, study_name)
        recorder, spec = Recorder(store, study.id, "sim"), StudySpec.from_dict(study.spec)
    return Pipeline(None, recorder, {st.row.id: st}, None, spec, H200, {})
