"""The sweep's pipeline (driver side): takes the asker's proposals, answers known ones from
stored rows, compiles ahead, keeps every worker of an injected pool fed, and hands each result
to the recorder. A worker's death is a WORKER_LOST row of its own; the retry is another row,
linked to it."""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable

from tunefw.device import DeviceSpec
from tunefw.outcome import NOT_COUNTED, Outcome, Status, TrialSpec
from tunefw.store import queries as q
from tunefw.store.models import Problem, Trial
from tunefw.study.spec import StudySpec
from tunefw.templates import get_family
from tunefw.tune.asker import Asker, AskState
from tunefw.tune.pool import Job, WorkerPool
from tunefw.tune.recorder import Recorder, Row
from tunefw.tune.search import Proposal, trial_attrs
from tunefw.tune.stats import LoopTimes

MAX_ATTEMPTS = 2  # a config whose worker died on each attempt kills workers: RUNTIME_CRASH

ProgressHook = Callable[[str, dict], None]


@dataclass
class ProblemState(AskState):
    """Driver bookkeeping of one problem during a launch (on top of what the asker shares)."""

    row: Problem | None = None
    best: float = 0.0  # the best ratio to cuBLAS so far

    @property
    def done(self) -> bool:
        return (self.in_flight == 0 and not self.ready
                and (self.exhausted or self.evaluated >= self.budget))

    def resume(self, rows: list[Trial]) -> None:
        """Take up the round's stored rows: durable trials a killed launch never mirrored, known
        configs, the evaluated count and each OK config's objective (its ratio to cuBLAS). A
        WORKER_LOST row whose retry never finished leaves its config free to be asked again."""
        self.search.restore([(t.optuna_trial, t.family, t.config,
                              t.ratio if t.status == Status.OK.value else None,
                              trial_attrs(t.tflops, t.cublas_tflops, t.id, t.status))
                             for t in rows if t.optuna_trial is not None])
        for t in rows:
            if t.status == Status.WORKER_LOST.value:
                continue
            self.known.add(t.config_key)
            if t.status not in NOT_COUNTED:
                self.evaluated += 1
            if t.status == Status.OK.value:
                self.best = max(self.best, t.ratio or 0.0)
                self.values[t.config_key] = t.ratio

    def progress_row(self) -> dict:
        return {"id": self.row.id, "key": self.row.key, "evaluated": self.evaluated,
                "budget": self.budget, "best": self.best, "done": self.done}


class Pipeline:
    """Runs one launch's search on ``pool``: ``search()`` to each problem's budget,
    ``run_jobs()`` for a list of jobs of its own (the confirmation)."""

    def __init__(self, pool: WorkerPool, recorder: Recorder, states: dict[int, ProblemState],
                 asker: Asker, spec: StudySpec, device: DeviceSpec, fingerprint: dict,
                 compiler: Any = None, progress: ProgressHook | None = None) -> None:
        """``compiler``: a CompilePool (cuda), or None where workers need no cubin."""
        self.pool = pool
        self.recorder = recorder
        self.states = states
        self.asker = asker
        self.spec = spec
        self.device = device
        self.fingerprint = fingerprint
        self.compiler = compiler
        self.progress = progress or (lambda event, data: None)
        self.pending: list[Job] = []  # ready to run on a worker
        self.compiling: list[tuple[Any, Job]] = []
        self.times = LoopTimes()
        self.first_result_at: float | None = None  # time.monotonic() of the first trial's result
        self.rejected = 0  # configs stored as INVALID or NOT_RECORDED, never run: rows (and ids)
        self.cut = False  # run_jobs stopped at its deadline with jobs left

    def trial_spec(self, st: ProblemState, trial_id: int, family: str,
                   config: dict) -> TrialSpec:
        return TrialSpec(trial_id=trial_id, family=family, config=config,
                         problem=q.as_problem(st.row).as_dict(), timeout_s=self.spec.timeout_s,
                         seed=self.spec.seed * 1_000_003 + st.row.id)

    # ---- the search -----------------------------------------------------------------------------
    def search(self, time_limit_s: float | None = None) -> tuple[float, bool]:
        """Run every problem to its budget (or its exhausted space); with a time limit, stop
        asking when it is reached and finish the trials in flight. Returns (wall seconds,
        stopped at the time limit)."""
        start = last = time.monotonic()
        stopped = False
        while not all(st.done for st in self.states.values()):
            now = time.monotonic()
            self._charge(now - last)
            last = now
            if time_limit_s is not None and not stopped and now - start > time_limit_s:
                stopped = True
                self.asker.stop()
            if stopped:  # trials never started (retries included) run in a later launch
                self._drop_queued()
                if not self.pool.in_flight:
                    break
            else:
                self._fill()
                for job, outcome in self._collect_compiles():
                    self._job_done(job, outcome)
                self._dispatch()
            if self.pool.in_flight:
                done, requeue = self.pool.poll(0.01)
            else:  # nothing running: wake for the asker's next proposal, not a fixed sleep
                self.asker.produced.wait(0.01)
                self.asker.produced.clear()
                done, requeue = self.pool.poll(0)
            finished = self._settle(done, requeue)
            for job, outcome in finished:
                self._job_done(job, outcome)
            if done:
                self.asker.wake()
            self._report_events()
        wall_s = time.monotonic() - start
        self.asker.stop()
        self._record_rejected()
        return wall_s, stopped

    def _fill(self) -> None:
        """Keep enough work compiled or queued that no worker waits."""
        self.asker.check()
        self._record_rejected()
        # Every worker's queue full, plus one compile per compiler process in flight.
        target = 2 * len(self.pool.slots) + (self.compiler.workers if self.compiler else 0)
        while len(self.pending) + len(self.compiling) < target:
            ready = [st for st in self.states.values() if st.ready]
            if not ready:
                return
            self._take(min(ready, key=lambda x: (x.evaluated + x.in_flight, x.row.id)))

    def _take(self, st: ProblemState) -> None:
        """Send a ready proposal to evaluation (or answer it from a stored measurement)."""
        with st.lock:  # claimed in one step: the asker sees the same room before and after
            st.in_flight += 1
            prop = st.ready.popleft()
        self.asker.wake()  # room to ask again now, not at the asker's next timed look
        st.known.add(prop.key)
        st.reserved.discard(prop.key)
        if self._reuse(st, prop):
            with st.lock:
                st.in_flight -= 1
            return
        spec = self.trial_spec(st, prop.trial.number, prop.family, prop.config)
        self._queue(Job(spec, context=(st.row.id, prop.trial, prop.key)))

    def _reuse(self, st: ProblemState, prop: Proposal) -> bool:
        """Answer from a stored measurement of the same config, sources, evaluator and device."""
        if not self.spec.reuse:
            return False
        found = self.recorder.reusable(st.row, prop.family, prop.key, self.fingerprint)
        if found is None:
            return False
        old_id, outcome = found
        self.finish(st, Row(st.row.id, prop.family, prop.config, prop.key), outcome,
                     prop.trial, reused=old_id)
        return True

    def _record_rejected(self) -> None:
        """Record (once each) the configs check() rejected while the asker was asking."""
        rows = []
        for st, prop in self.asker.drain_rejected():
            st.known.add(prop.key)
            st.reserved.discard(prop.key)
            status = (Status.NOT_RECORDED if prop.invalid_reason.startswith("NOT_RECORDED")
                      else Status.INVALID)
            rows.append((Row(st.row.id, prop.family, prop.config, prop.key),
                         Outcome(status, log=prop.invalid_reason,
                                 evaluator=self.recorder.evaluator)))
        self.recorder.rejected(rows)
        self.rejected += len(rows)

    def finish(self, st: ProblemState, row: Row, outcome: Outcome, trial, attempts: int = 1,
               reused: int | None = None, retry_of: int | None = None) -> None:
        """Close a proposal's Optuna trial with its outcome, store the row and its durable
        copy, count it. The objective is the ratio to the cuBLAS of the same screen."""
        value = outcome.ratio if outcome.ok else None
        told = st.search.tell(trial, value)
        row_id = self.recorder.trial(row, outcome, st.search.next_number, attempts, reused,
                                     retry_of)
        st.search.record(told, value, trial_attrs(outcome.tflops, outcome.cublas_tflops, row_id,
                                                  outcome.status.value))
        with st.lock:
            st.evaluated += outcome.status.value not in NOT_COUNTED
        if outcome.ok:
            st.best = max(st.best, value or 0.0)
            st.values[row.key] = value
        self.progress("trial", {"problem": st.progress_row(), "trial_id": row_id,
                                "status": outcome.status.value, "tflops": outcome.tflops,
                                "ratio": outcome.ratio, "gpu": outcome.gpu})

    def _job_done(self, job: Job, outcome: Outcome) -> None:
        if self.first_result_at is None:
            self.first_result_at = time.monotonic()
        problem_id, trial, key = job.context
        st = self.states[problem_id]
        if job.compiled is not None:
            compiled_figures(outcome, job.compiled)
        if job.retry_of is not None:
            outcome.log = f"retry of trial {job.retry_of} (its worker died)\n{outcome.log}"
        self.finish(st, _row(job), outcome, trial, job.attempt, retry_of=job.retry_of)
        with st.lock:  # after the count went up: the asker never sees a free slot early
            st.in_flight -= 1

    def _drop(self, job: Job) -> None:
        """Forget a trial that never ran (time limit): no row, its config may be asked again."""
        problem_id, _, key = job.context
        st = self.states[problem_id]
        with st.lock:
            st.in_flight -= 1
        st.known.discard(key)

    def _drop_queued(self) -> None:
        for job in self.pending + [job for _, job in self.compiling]:
            self._drop(job)
        self.pending, self.compiling = [], []
        for st in self.states.values():  # proposals never taken: asked again next launch
            while st.ready:
                st.reserved.discard(st.ready.popleft().key)

    def _charge(self, dt: float) -> None:
        self.times.charge(dt, self.pool.slots, sum(len(st.ready) for st in self.states.values()),
                          len(self.compiling), len(self.pending),
                          any(st.ready or st.room() > 0 for st in self.states.values()))

    # ---- jobs through compile and the pool ------------------------------------------------------
    def run_jobs(self, jobs: list[Job], then: Callable[[Job, Outcome], list[Job]],
                 deadline: float | None = None) -> None:
        """Compile and run ``jobs`` (the pipeline's search is over), handing each outcome to
        ``then`` as it arrives (what it returns runs too: a confirmation's next step). Past
        ``deadline`` (time.monotonic()) nothing more starts: queued jobs are dropped, the running
        ones finish; ``self.cut`` says whether that happened."""
        self.cut = False
        for job in jobs:
            self._queue(job)
        while self.pending or self.compiling or self.pool.in_flight:
            if deadline is not None and time.monotonic() > deadline and (
                    self.pending or self.compiling):
                self.cut = True
                self.pending, self.compiling = [], []
            finished = self._collect_compiles()
            self._dispatch()
            finished += self._settle(*self.pool.poll(0.05))
            for job, outcome in finished:
                for follow in then(job, outcome):
                    self._queue(follow, first=True)  # it finishes a problem: before the rest
            self._report_events()

    def _queue(self, job: Job, first: bool = False) -> None:
        """To the workers (first in line, or last), through the compiler unless compiled."""
        if self.compiler is None or job.compiled is not None:
            self.pending.insert(0 if first else len(self.pending), job)
            return
        spec = job.spec
        future = self.compiler.submit(get_family(spec.family), spec.config,
                                      spec.problem["dtype"], self.device.arch,
                                      gate=spec.problem.get("gate", "none"))
        self.compiling.append((future, job))

    def _collect_compiles(self) -> list[tuple[Job, Outcome]]:
        """Move finished compiles on to the workers; the failed ones with their outcome."""
        still, failed = [], []
        for future, job in self.compiling:
            if not future.done():
                still.append((future, job))
                continue
            result = future.result()
            if result.ok:
                job.compiled = result
                self.pending.append(job)
            else:
                failed.append((job, compiled_figures(
                    Outcome(result.status, log=result.log, evaluator=self.recorder.evaluator),
                    result)))
        self.compiling = still
        return failed

    def _dispatch(self) -> None:
        for slot in self.pool.free_slots():
            if not self.pending:
                return
            self.pool.submit(slot, self.pending.pop(0))

    def _settle(self, done: list[tuple[Job, Outcome]],
                requeue: list[Job]) -> list[tuple[Job, Outcome]]:
        """What a poll returned: jobs that never started go first in line again, a lost job is
        retried; the finished (job, outcome) pairs."""
        self.pending[:0] = requeue
        finished = []
        for job, outcome in done:
            if outcome.status == Status.WORKER_LOST:
                final = self._after_loss(job, outcome)
                if final is None:
                    continue
                outcome = final
            finished.append((job, outcome))
        return finished

    def _after_loss(self, job: Job, lost: Outcome) -> Outcome | None:
        """The worker died under ``job``: a search trial's loss is a WORKER_LOST row (counted in
        no budget) and the job runs again, linked to it; on the last attempt the outcome to
        finish it with (the config kills its workers)."""
        note = f"attempt {job.attempt}: WORKER_LOST ({lost.log})"
        if job.attempt >= MAX_ATTEMPTS:
            return Outcome(Status.RUNTIME_CRASH, evaluator=lost.evaluator, gpu=lost.gpu,
                           log=f"{note}\nthe worker died on each of {job.attempt} attempts: "
                               "the config kills it")
        if job.kind == "evaluate":
            job.retry_of = self.recorder.trial(_row(job), replace(lost, log=note), None,
                                               job.attempt, retry_of=job.retry_of)
        job.attempt += 1
        self.pending.insert(0, job)
        return None

    def _report_events(self) -> None:
        if self.pool.events:
            self.progress("events", {"events": self.pool.events[:]})
            self.pool.events.clear()


def compiled_figures(outcome: Outcome, compiled: Any) -> Outcome:
    """Put a compile's time (where the worker left it out) and ptxas's registers, static shared
    memory and spill bytes on the trial's outcome: the row keeps what the kernel was."""
    if outcome.compile_s is None:
        outcome.compile_s = compiled.seconds
    outcome.ptxas_regs = compiled.regs
    outcome.ptxas_smem_bytes = compiled.smem
    outcome.ptxas_spill_bytes = compiled.spill_bytes
    return outcome


def _row(job: Job) -> Row:
    problem_id, _, key = job.context
    return Row(problem_id, job.spec.family, job.spec.config, key)
