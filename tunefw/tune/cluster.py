"""The Ray worker pool: one actor per GPU (num_gpus=1 pins it), a watchdog, restarts.

Workers only evaluate and return Outcomes; the driver records them. A worker whose CUDA
context is poisoned, whose process died, or whose trial ran past its deadline is killed and
replaced; the sweep goes on (a death comes back as the job's WORKER_LOST outcome).
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import ray

from tunefw.errors import UserError
from tunefw.framing import helper_pythonpath
from tunefw.outcome import Outcome, Status, TrialSpec, fingerprint_key
from tunefw.evaluate.protocol import Evaluator
from tunefw.study.spec import SimSettings
from tunefw.tune.interrupt import stop_on_sigterm
from tunefw.tune.pool import Job, Slot, WorkerPool

STARTUP_GRACE_S = 60.0  # a fresh actor may take this long to come up before its first trial
WATCHDOG_SLACK_S = 5.0  # past the trial timeout before the worker is killed


@ray.remote(num_gpus=1, num_cpus=0, max_restarts=0, max_task_retries=0)
class GpuWorker:
    """Lives on one GPU (its own CUDA_VISIBLE_DEVICES) and evaluates trials there."""

    def __init__(self, backend: str, sim: SimSettings | None, replay: str | None = None) -> None:
        self.evaluator: Evaluator
        if backend == "replay":
            from tunefw.evaluate.replay import ReplayEvaluator
            self.evaluator = ReplayEvaluator(replay or "")
        elif backend == "cuda":
            from tunefw.evaluate.cuda import CudaEvaluator
            self.evaluator = CudaEvaluator()
        else:
            from tunefw.evaluate.sim import SimEvaluator
            self.evaluator = SimEvaluator(sim or SimSettings())

    def info(self) -> dict:
        return {"pid": os.getpid(), "gpu": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
                "fingerprint": self.evaluator.fingerprint(),
                "device": self.evaluator.device_spec()}

    def evaluate(self, spec: TrialSpec, compiled: Any) -> Outcome:
        return self.evaluator.evaluate(spec, compiled)

    def confirm(self, spec: TrialSpec, compiled: Any) -> Outcome:
        return self.evaluator.confirm(spec, compiled)


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """These environment variables set for the processes started inside, then as they were."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass
class RaySlot(Slot):
    """A slot and the actor behind it."""

    actor: Any = None
    started: float = 0.0
    ready_ref: Any = None  # the actor's info() call: done once the process is up
    ready_at: float = 0.0


def connect(address: str | None, gpus: int, backend: str) -> None:
    """Start a local Ray (with N logical GPUs for the simulator) or join a cluster."""
    if ray.is_initialized():
        return
    path = helper_pythonpath()  # the workers import this tunefw
    if address:
        ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": path}},
                 log_to_driver=False, logging_level="ERROR")
    else:
        # address="local": always a Ray of our own, never a cluster another process left
        # running (ray.init() alone joins one, and then refuses num_gpus: seen in CI). Its
        # workers inherit PYTHONPATH from the raylet this starts: without a runtime_env, the
        # workers Ray starts ahead serve the actors, where a runtime_env has each actor wait
        # for a fresh process of its own (seconds each on a small machine).
        with _environ(PYTHONPATH=path):
            ray.init(address="local", num_gpus=gpus, num_cpus=os.cpu_count() or 1,
                     include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    stop_on_sigterm()  # ray.init made SIGTERM a SystemExit with a stack dump
    have = int(ray.cluster_resources().get("GPU", 0))
    free = int(ray.available_resources().get("GPU", 0))
    if have < gpus or free < gpus:
        ray.shutdown()
        busy = f", {free} free" if free < have else ""
        raise UserError(f"--gpus {gpus}: the Ray cluster has {have} GPU(s){busy}")


class RayPool(WorkerPool):
    """N GPU actors; submit jobs to a free slot, poll for finished ones, enforce deadlines.
    The pool is handed out once its first actor is up (each one imports and sets up its
    evaluator: seconds on a small machine); the others take jobs as each comes up."""

    def __init__(self, n: int, backend: str, sim: SimSettings | None,
                 timeout_s: float, replay: str | None = None) -> None:
        self.backend = backend
        self.replay = replay  # replay:PATH[?delay=S] for the replay backend
        self.sim = sim
        self.timeout_s = timeout_s
        self.slots = [RaySlot(i, up_at=None) for i in range(n)]
        self.events: list[str] = []  # restarts, kills and late starts, for the status line
        self.infos: list[dict | None] = [None] * n
        for slot in self.slots:
            self._start(slot)
        self._starting = {slot.ready_ref: slot for slot in self.slots}
        first, _ = ray.wait(list(self._starting), num_returns=1)
        self._came_up(first)

    def _came_up(self, refs: list) -> None:
        """Take up the workers whose first info() is in: their slots take jobs from now. A
        late worker that fails to start, or reports another device than the first (a mixed
        cluster), stays out and is said so in the events; the first one's failure is the
        launch's."""
        for ref in refs:
            slot = self._starting.pop(ref)
            slot.ready_ref = None
            try:
                info = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                if all(i is None for i in self.infos):
                    raise
                self.events.append(f"worker {slot.index} failed to start: "
                                   f"{str(exc).strip().splitlines()[0]}")
                continue
            if any(self.infos) and (fingerprint_key(info["fingerprint"])
                                    != fingerprint_key(self.first_info["fingerprint"])):
                ray.kill(slot.actor, no_restart=True)
                self.events.append(f"worker {slot.index} left out: its device "
                                   f"{info['fingerprint'].get('name')} is not the first "
                                   f"worker's {self.first_info['fingerprint'].get('name')}")
                continue
            self.infos[slot.index] = info
            slot.up_at = slot.ready_at = time.monotonic()
        if refs and not self._starting and len(self.slots) > 1:
            ups = [s.up_at for s in self.slots if s.up_at is not None]
            self.events.append(f"{len(ups)} of {len(self.slots)} workers up, the last "
                               f"{max(ups) - min(ups):.1f} s after the first")

    def _start(self, slot: RaySlot) -> None:
        slot.actor = GpuWorker.remote(self.backend, self.sim, self.replay)
        slot.started = time.monotonic()
        slot.ready_ref = slot.actor.info.remote()

    def _restart(self, slot: RaySlot, why: str) -> None:
        ray.kill(slot.actor, no_restart=True)
        slot.restarts += 1
        self.events.append(f"worker {slot.index} restarted: {why}")
        self._start(slot)

    def submit(self, slot: RaySlot, job: Job) -> None:
        method = slot.actor.evaluate if job.kind == "evaluate" else slot.actor.confirm
        ref = method.remote(job.spec, job.compiled)
        job.submitted = time.monotonic()
        if not slot.queue:
            slot.head_since = job.submitted
        slot.queue.append((job, ref))

    def _deadline(self, slot: RaySlot, job: Job) -> float:
        if slot.ready_ref is not None:  # deadlines count from when the worker is up
            ready, _ = ray.wait([slot.ready_ref], timeout=0)
            if not ready:
                return slot.started + STARTUP_GRACE_S + job.spec.timeout_s
            slot.ready_ref = None
            slot.ready_at = time.monotonic()
        return max(slot.head_since, slot.ready_at) + job.spec.timeout_s + WATCHDOG_SLACK_S

    def poll(self, wait_s: float) -> tuple[list[tuple[Job, Outcome]], list[Job]]:
        if self._starting:
            self._came_up(ray.wait(list(self._starting), num_returns=len(self._starting),
                                   timeout=0)[0])
        heads = {s.queue[0][1]: s for s in self.slots if s.queue}
        done: list[tuple[Job, Outcome]] = []
        retry: list[Job] = []
        if heads:
            refs = list(heads)
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
            if ready:  # collect every head that is done, not just the first
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
            for ref in ready:
                slot = heads[ref]
                job, _ = slot.queue.popleft()
                now = time.monotonic()
                try:
                    outcome: Outcome = ray.get(ref)
                except ray.exceptions.RayActorError:
                    self._lost(slot, job, done, retry)
                    continue
                except ray.exceptions.RayTaskError as exc:  # an evaluator bug: the trial crashed
                    outcome = Outcome(Status.RUNTIME_CRASH, log=str(exc)[-4000:],
                                      evaluator=self.backend, poisoned=True)
                slot.trials += 1
                slot.busy_s += outcome.busy_s
                slot.head_since = now
                done.append((job, outcome))
                if outcome.poisoned:
                    self._requeue_rest(slot, retry)
                    self._restart(slot, f"{outcome.status.value} poisoned its CUDA context")
        elif wait_s:
            time.sleep(wait_s)
        self._watchdog(done, retry)
        return done, retry

    def _requeue_rest(self, slot: Slot, retry: list[Job]) -> None:
        while slot.queue:  # queued behind a killed head: never started, run them elsewhere
            retry.append(slot.queue.popleft()[0])

    def _lost(self, slot: RaySlot, job: Job, done: list, retry: list) -> None:
        """The worker process died under this job: its outcome is WORKER_LOST (the driver
        decides on a retry); the jobs queued behind it run elsewhere."""
        self._requeue_rest(slot, retry)
        done.append((job, Outcome(Status.WORKER_LOST, log="worker process died",
                                  evaluator=self.backend, gpu=self.infos[slot.index]["gpu"])))
        self._restart(slot, "worker process died")

    def _watchdog(self, done: list, retry: list) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if not slot.queue:
                continue
            job, _ = slot.queue[0]
            if now > self._deadline(slot, job):
                slot.queue.popleft()
                self._requeue_rest(slot, retry)
                self._restart(slot, f"trial {job.spec.trial_id} over its timeout")
                done.append((job, Outcome(
                    Status.TIMEOUT, evaluator=self.backend, gpu=self.infos[slot.index]["gpu"],
                    log=f"killed by the watchdog after {now - slot.head_since:.1f} s "
                                       f"(timeout {job.spec.timeout_s:g} s)")))

    def shutdown(self) -> None:
        for slot in self.slots:  # those still starting too
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # already gone
                pass
