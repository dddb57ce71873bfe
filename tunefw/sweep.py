"""The sweep scheduler (driver side): asks Optuna for configs, answers invalid and known ones at
once, compiles ahead, keeps every GPU worker fed, records each result in its own transaction,
then confirms each problem's top configs against cuBLAS and stores the winner."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import optuna

from tunefw.asker import Asker, AskState
from tunefw.cluster import Job, WorkerPool, connect
from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.evaluate.outcome import NOT_COUNTED, Outcome, Status, TrialSpec
from tunefw.sampler_host import SamplerHost
from tunefw.search import DurableMirror, ProblemSearch, trial_attrs
from tunefw.store.files import optuna_storage
from tunefw.store import Store
from tunefw.store import queries as q
from tunefw.store.models import Problem, Study, Trial
from tunefw.study import StudySpec
from tunefw.templates import FAMILIES, get_family

STARVED_BY = ("compile", "ask", "tail")  # why a GPU worker had nothing queued


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
        configs, the evaluated count and each OK config's objective (its ratio to cuBLAS)."""
        self.search.restore([(t.optuna_trial, t.family, t.config,
                              t.ratio if t.status == Status.OK.value else None,
                              trial_attrs(t.tflops, t.cublas_tflops, t.id, t.status))
                             for t in rows if t.optuna_trial is not None])
        for t in rows:
            self.known.add(t.config_key)
            if t.status not in NOT_COUNTED:
                self.evaluated += 1
            if t.status == Status.OK.value:
                self.best = max(self.best, t.ratio or 0.0)
                self.values[t.config_key] = t.ratio


@dataclass
class LaunchOptions:
    gpus: int
    backend: str  # "sim" | "cuda" | "replay"
    address: str | None = None
    new_round: bool = False
    cache_dir: Any = None
    time_limit_s: float | None = None
    replay: str | None = None  # backend "replay": "replay:PATH[?delay=S]"


ProgressHook = Callable[[str, dict], None]


def storage_for(store: Store) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the same database (its own tables, no tunefw_ prefix)."""
    return optuna_storage(store.url, store.engine)


def optuna_study_name(study: Study, problem: Problem) -> str:
    return q.optuna_name(study.name, problem.key, study.round)


def _families(spec: StudySpec, device: DeviceSpec) -> list[str]:
    names = spec.families or sorted(FAMILIES)
    usable = [f for f in names if get_family(f).supports(device)]
    if not usable:
        raise UserError(f"families {names}: none runs on {device.name} (cc {device.cc})")
    return usable


def _guard_round(s, study: Study, fingerprint: dict, families: list[str],
                 new_round: bool) -> None:
    """Refuse to resume on another device or after the space changed, unless a new round."""
    hashes = {f: get_family(f).space_hash() for f in families}
    if study.fingerprint is not None and new_round:
        study.round += 1
        study.fingerprint = None
    if study.fingerprint is None:
        study.fingerprint = fingerprint
        study.space_hashes = hashes
        return
    if q.fingerprint_key(study.fingerprint) != q.fingerprint_key(fingerprint):
        was, now = study.fingerprint.get("name"), fingerprint.get("name")
        if was == now and study.fingerprint.get("method") != fingerprint.get("method"):
            raise UserError(f"study {study.name!r} round {study.round} was timed with method "
                            f"{study.fingerprint.get('method') or 'unversioned'}, this launch "
                            f"times with {fingerprint.get('method')}: pass --new-round to start "
                            "a new round")
        raise UserError(f"study {study.name!r} round {study.round} ran on {was}, this launch is "
                        f"on {now}: pass --new-round to start a new round")
    if study.space_hashes != hashes:
        raise UserError(f"study {study.name!r}: a family's parameter space changed since round "
                        f"{study.round}: pass --new-round to start a new round")


def pick_confirmed(rows: list[tuple[int, Outcome]]) -> tuple[int, Outcome]:
    """The winner among a problem's confirmations: the best ratio to the cuBLAS interleaved with
    it. Each confirmation runs at its own point of the GPU's power cycle (on the H200 the clock
    moved 8% within a second at 4096^3); its own cuBLAS figure cancels that, raw TFLOP/s do not."""
    if all(o.ratio is not None for _, o in rows):
        return max(rows, key=lambda r: r[1].ratio)
    return max(rows, key=lambda r: r[1].tflops or 0.0)


class Sweep:
    """One launch of one study."""

    def __init__(self, store: Store, study_name: str | None, options: LaunchOptions,
                 progress: ProgressHook | None = None) -> None:
        self.store = store
        self.options = options
        self.progress = progress or (lambda event, data: None)
        with store.session() as s:
            study = q.get_study(s, study_name)
            self.study_id = study.id
            self.spec = StudySpec.from_dict(study.spec)
        self.pool: WorkerPool | None = None
        self.compiler = None
        self.mirror: DurableMirror | None = None
        self.sampler_hosts: list[SamplerHost] = []
        self.asker: Asker | None = None
        self.states: dict[int, ProblemState] = {}
        self.pending: list[Job] = []  # ready to run on a worker
        self.compiling: list[tuple[Any, Job]] = []
        self.source_hash = {f: get_family(f).source_hash() for f in FAMILIES}

    # ---- set-up -------------------------------------------------------------------------------
    def _open(self) -> None:
        replay = replay_spec = None
        if self.options.backend == "replay":  # the driver reads the sweeps too: it checks them
            from tunefw.evaluate.replay import ReplaySource, parse_backend
            path, delay = parse_backend(self.options.replay or "")
            replay, replay_spec = ReplaySource(path), f"replay:{path}?delay={delay!r}"
        connect(self.options.address, self.options.gpus, self.options.backend)
        self.pool = WorkerPool(self.options.gpus, self.options.backend, self.spec.sim,
                               self.spec.timeout_s, replay_spec)
        info = self.pool.infos[0]
        self.device: DeviceSpec = info["device"]
        self.fingerprint: dict = info["fingerprint"]
        self.families = _families(self.spec, self.device)
        if replay is not None:
            replay.check(self.spec.problems, self.families)
        if self.options.backend == "cuda":
            from tunefw.compiler import CompilePool
            self.compiler = CompilePool(cache_dir=self.options.cache_dir)
        with self.store.session() as s:  # commit the round first: Optuna writes on its own
            study = s.get(Study, self.study_id)
            _guard_round(s, study, self.fingerprint, self.families, self.options.new_round)
            study.backend = self.options.backend
            self.round = study.round
            self.study_name = study.name
        storage = storage_for(self.store)
        with self.store.session() as s:
            study = s.get(Study, self.study_id)
            problems = list(study.problems)
            names = {p.id: optuna_study_name(study, p) for p in problems}
        self.mirror = DurableMirror()
        if self.spec.sampler == "tpe" and replay is None:  # TPE off the driver's thread and GIL
            self.sampler_hosts = [SamplerHost() for _ in range(self._asker_threads(len(problems)))]
        for i, prow in enumerate(problems):
            host = self.sampler_hosts[i % len(self.sampler_hosts)] if self.sampler_hosts else None
            search = ProblemSearch(storage, names[prow.id], self.spec.sampler,
                                   self.spec.seed + prow.id, self.families, q.as_problem(prow),
                                   self.device, self.mirror, host)
            self.states[prow.id] = ProblemState(search=search, budget=self.spec.trials, row=prow)
            if replay is not None:  # the search proposes recorded configs only
                self.states[prow.id].recorded = replay.recorded_keys(q.as_problem(prow))
        with self.store.session() as s:
            study = s.get(Study, self.study_id)
            for prow in problems:
                self.states[prow.id].resume(q.problem_trials(s, study, prow))
        # Problem i is asked by thread i % n, which talks to sampler process i % n (see above).
        self.asker = Asker(self.states.values(), ahead=2 * self.options.gpus + 2,
                           threads=max(1, len(self.sampler_hosts)))
        self.asker.start()
        self.progress("start", {"study": self.study_name, "backend": self.options.backend,
                                "device": self.fingerprint.get("name"),
                                "workers": [i["gpu"] for i in self.pool.infos],
                                "problems": [self._progress_row(st) for st in self.states.values()]})

    def _progress_row(self, st: ProblemState) -> dict:
        return {"id": st.row.id, "key": st.row.key, "evaluated": st.evaluated,
                "budget": st.budget, "best": st.best, "done": st.done}

    # ---- asking -------------------------------------------------------------------------------
    def _spec(self, st: ProblemState, trial_id: int, family: str, config: dict) -> TrialSpec:
        return TrialSpec(trial_id=trial_id, family=family, config=config,
                         problem=q.as_problem(st.row).as_dict(), timeout_s=self.spec.timeout_s,
                         seed=self.spec.seed * 1_000_003 + st.row.id)

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
        spec = self._spec(st, prop.trial.number, prop.family, prop.config)
        self._compile_or_queue(Job(spec, context=(st.row.id, prop.trial, prop.key)))

    def _record_rejected(self) -> None:
        """Record (once each) the configs check() rejected while the asker was asking, in one
        transaction: TPE's rejects can outnumber the trials, and a commit each slowed the loop."""
        rejected = self.asker.drain_rejected()
        if not rejected:
            return
        with self.store.session() as s:
            study = s.get(Study, self.study_id)
            for st, prop in rejected:
                st.known.add(prop.key)
                st.reserved.discard(prop.key)
                status = (Status.NOT_RECORDED if prop.invalid_reason.startswith("NOT_RECORDED")
                          else Status.INVALID)
                q.record_trial(s, study, s.get(Problem, st.row.id), prop.family, prop.config,
                               prop.key, Outcome(status, log=prop.invalid_reason,
                                                 evaluator=self.options.backend),
                               self.source_hash[prop.family], None)

    def _reuse(self, st: ProblemState, prop) -> bool:
        """Answer from a stored measurement of the same config, sources, evaluator and device."""
        if not self.spec.reuse:
            return False
        with self.store.session() as s:
            old = q.find_reusable(s, q.as_problem(st.row), prop.key,
                                  self.source_hash[prop.family], self.options.backend,
                                  q.fingerprint_key(self.fingerprint))
            if old is None:
                return False
            outcome = Outcome(Status(old.status), log=f"reused trial {old.id}\n{old.log}",
                              median_ms=old.median_ms, min_ms=old.min_ms, iqr_ms=old.iqr_ms,
                              tflops=old.tflops, rel_err=old.rel_err,
                              cublas_tflops=old.cublas_tflops, fingerprint=old.fingerprint,
                              gpu=old.gpu, evaluator=old.evaluator)
            old_id = old.id
        self._finish(st, prop.family, prop.config, prop.key, outcome, prop.trial, reused=old_id)
        return True

    def _compile_or_queue(self, job: Job) -> None:
        if self.compiler is None:
            self.pending.append(job)
            return
        spec = job.spec
        future = self.compiler.submit(get_family(spec.family), spec.config,
                                      spec.problem["dtype"], self.device.arch)
        self.compiling.append((future, job))

    def _collect_compiles(self) -> None:
        still = []
        for future, job in self.compiling:
            if not future.done():
                still.append((future, job))
                continue
            result = future.result()
            if result.ok:
                job.compiled = result
                self.pending.append(job)
            else:
                self._job_done(job, Outcome(result.status, log=result.log,
                                            evaluator=self.options.backend,
                                            compile_s=result.seconds))
        self.compiling = still

    # ---- recording ----------------------------------------------------------------------------
    def _record(self, st: ProblemState, family: str, config: dict, key: str, outcome: Outcome,
                trial_no: int | None, attempts: int = 1, reused: int | None = None) -> int:
        with self.store.session() as s:
            study = s.get(Study, self.study_id)
            row = q.record_trial(s, study, s.get(Problem, st.row.id), family, config, key,
                                 outcome, self.source_hash[family], trial_no, attempts, reused)
            return row.id

    def _finish(self, st: ProblemState, family: str, config: dict, key: str, outcome: Outcome,
                trial, attempts: int = 1, reused: int | None = None) -> None:
        # The objective is the ratio to the cuBLAS of the same screen (method.py says why).
        value = outcome.ratio if outcome.ok else None
        told = st.search.tell(trial, value)
        row_id = self._record(st, family, config, key, outcome, st.search.next_number, attempts,
                              reused)
        st.search.record(told, value, trial_attrs(outcome.tflops, outcome.cublas_tflops, row_id,
                                                  outcome.status.value))
        with st.lock:
            st.evaluated += outcome.status.value not in NOT_COUNTED
        if outcome.ok:
            st.best = max(st.best, value or 0.0)
            st.values[key] = value
        self.progress("trial", {"problem": self._progress_row(st), "trial_id": row_id,
                                "status": outcome.status.value, "tflops": outcome.tflops,
                                "ratio": outcome.ratio, "gpu": outcome.gpu})

    def _job_done(self, job: Job, outcome: Outcome) -> None:
        problem_id, trial, key = job.context
        st = self.states[problem_id]
        if job.compiled is not None and outcome.compile_s is None:
            outcome.compile_s = getattr(job.compiled, "seconds", None)
        self._finish(st, job.spec.family, job.spec.config, key, outcome, trial, job.attempt)
        with st.lock:  # after the count went up: the asker never sees a free slot early
            st.in_flight -= 1

    # ---- the loop -----------------------------------------------------------------------------
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

    def _dispatch(self) -> None:
        for slot in self.pool.free_slots():
            if not self.pending:
                return
            self.pool.submit(slot, self.pending.pop(0))

    def run(self) -> dict:
        """Run the search to its budget (resuming where a previous launch stopped), confirm the
        winners, store and return the sweep figures. With a time limit, stop asking when it is
        reached, finish the trials in flight and return (a later launch resumes)."""
        self._open()
        start = last = time.monotonic()  # the sweep's wall time starts with its workers up
        limit = self.options.time_limit_s
        stopped = False
        self.starved = dict.fromkeys(STARVED_BY, 0.0)
        self.depth_s = dict.fromkeys(("ready", "compiling", "pending"), 0.0)
        try:
            while not all(st.done for st in self.states.values()):
                now = time.monotonic()
                self._count_starved(now - last)
                last = now
                if limit is not None and not stopped and time.monotonic() - start > limit:
                    stopped = True
                    self.asker.stop()
                    self._drop_queued()
                if stopped and not self.pool.in_flight:
                    break
                if not stopped:
                    self._fill()
                    if self.compiler is not None:
                        self._collect_compiles()
                    self._dispatch()
                if self.pool.in_flight:
                    done, retry = self.pool.poll(0.01)
                else:  # nothing running: wake for the asker's next proposal, not a fixed sleep
                    self.asker.produced.wait(0.01)
                    self.asker.produced.clear()
                    done, retry = self.pool.poll(0)
                if stopped:  # a worker died under these: they would run again, but no more
                    for job in retry:
                        self._drop(job)
                else:
                    self.pending[:0] = retry
                for job, outcome in done:
                    self._job_done(job, outcome)
                if done:
                    self.asker.wake()
                if self.pool.events:
                    self.progress("events", {"events": self.pool.events[:]})
                    self.pool.events.clear()
            stats = self._stats(time.monotonic() - start, stopped)
            self.asker.stop()
            self._record_rejected()
            if not stopped:
                self._confirm()
            self.progress("end", stats)
            return stats
        finally:
            self._close()

    def _asker_threads(self, problems: int) -> int:
        """Sampler processes (and asker threads): $TUNEFW_SAMPLER_PROCESSES, else one per two
        GPUs and per four CPU cores (the compiler pool needs the rest); at most one per problem."""
        wanted = os.environ.get("TUNEFW_SAMPLER_PROCESSES", "")
        if wanted.isdigit() and int(wanted) > 0:
            return min(problems, int(wanted))
        return max(1, min(problems, self.options.gpus // 2, (os.cpu_count() or 1) // 4))

    def _count_starved(self, dt: float) -> None:
        """Charge ``dt`` to each worker with nothing queued, by what it waits for: a compile in
        flight, a proposal (nothing ready or compiling), or the end of the search; and add up
        the pipeline's depths (proposals ready, compiles in flight, jobs compiled and waiting)."""
        self.depth_s["ready"] += dt * sum(len(st.ready) for st in self.states.values())
        self.depth_s["compiling"] += dt * len(self.compiling)
        self.depth_s["pending"] += dt * len(self.pending)
        idle = sum(1 for slot in self.pool.slots if not slot.queue)
        if not idle:
            return
        if self.compiling:
            cause = "compile"
        elif any(st.ready or st.room() > 0 for st in self.states.values()):
            cause = "ask"
        else:
            cause = "tail"
        self.starved[cause] += dt * idle

    def _drop(self, job: Job) -> None:
        """Forget a trial that never ran (time limit): no row, its config may be asked again."""
        problem_id, trial, key = job.context
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

    def _close(self) -> None:
        if self.asker is not None:
            self.asker.stop()
        for host in self.sampler_hosts:
            host.close()
        if self.mirror is not None:
            self.mirror.close()
        if self.compiler is not None:
            self.compiler.close()
        if self.pool is not None:
            self.pool.shutdown()

    # ---- confirmation -------------------------------------------------------------------------
    def _confirm(self) -> None:
        """Re-time each problem's top configs interleaved with cuBLAS; the best becomes winner."""
        jobs: list[Job] = []
        with self.store.session() as s:
            for st in self.states.values():
                for t in q.top_trials(s, st.row, self.round, self.spec.confirm_top):
                    spec = self._spec(st, t.optuna_trial or t.id, t.family, t.config)
                    jobs.append(Job(spec, kind="confirm", context=(st.row.id, t.id)))
        if not jobs:
            return
        self.progress("confirm", {"configs": len(jobs)})
        if self.compiler is not None:
            futures = [self.compiler.submit(get_family(j.spec.family), j.spec.config,
                                            j.spec.problem["dtype"], self.device.arch)
                       for j in jobs]
            for job, fut in zip(jobs, futures):
                job.compiled = fut.result()
        results: dict[int, list[tuple[int, Outcome]]] = {}
        queue = list(jobs)
        while queue or self.pool.in_flight:
            for slot in self.pool.free_slots():
                if queue:
                    self.pool.submit(slot, queue.pop(0))
            done, retry = self.pool.poll(0.05)
            queue[:0] = retry
            for job, outcome in done:
                problem_id, trial_id = job.context
                if outcome.ok:
                    results.setdefault(problem_id, []).append((trial_id, outcome))
        with self.store.session() as s:
            for problem_id, rows in results.items():
                trial_id, best = pick_confirmed(rows)
                q.set_winner(s, s.get(Problem, problem_id), s.get(Trial, trial_id),
                             best.tflops, best.cublas_tflops, confirmed=True)

    def _stats(self, wall_s: float, stopped: bool) -> dict:
        """Trials/s and GPU busy of this launch's search phase (confirmation not included);
        stored with the study when the launch ran any trial."""
        slots = self.pool.slots
        gpus = [self.pool.infos[s.index]["gpu"] for s in slots]
        trials = sum(s.trials for s in slots)
        wall_s = max(wall_s, 1e-9)
        stats = {
            "wall_s": round(wall_s, 3), "workers": len(slots), "trials": trials,
            "trials_per_s": trials / wall_s,
            "trials_per_s_per_gpu": {g: s.trials / wall_s for g, s in zip(gpus, slots)},
            "gpu_busy": {g: min(1.0, s.busy_s / wall_s) for g, s in zip(gpus, slots)},
            "restarts": sum(s.restarts for s in slots),
            # worker-seconds with an empty queue, by cause: the first place to look when busy is
            # low; "driver" is the rest of the idle time (a result waiting to be collected, Ray)
            "starved_s": {**{cause: round(v, 3) for cause, v in self.starved.items()},
                          "driver": round(max(0.0, len(slots) * wall_s
                                              - sum(s.busy_s for s in slots)
                                              - sum(self.starved.values())), 3)},
            "mean_depth": {stage: round(v / wall_s, 2) for stage, v in self.depth_s.items()},
            "asks": self.asker.asks, "ask_s": round(self.asker.ask_s, 3),
            "sampler_processes": len(self.sampler_hosts),
            "simulated": self.options.backend == "sim",
            "replay": self.options.backend == "replay",
            "stopped_at_time_limit": stopped,
        }
        stats["gpu_busy_mean"] = sum(stats["gpu_busy"].values()) / max(len(slots), 1)
        if trials:
            with self.store.session() as s:
                s.get(Study, self.study_id).stats = stats
        return stats
