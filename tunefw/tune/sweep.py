"""One launch of one study (driver side): holds the study's launch lease, guards the round, sets
up the workers, the searches and the asker, runs the pipeline to each problem's budget, then the
confirmation; stores the launch's figures."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import optuna

from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.outcome import fingerprint_key
from tunefw.store import Store
from tunefw.store import queries as q
from tunefw.store.files import optuna_storage
from tunefw.store.lease import Lease, take
from tunefw.store.models import Problem, Study
from tunefw.study.spec import StudySpec
from tunefw.templates import FAMILIES, changed_source, get_family, installed_source
from tunefw.tune.asker import Asker
from tunefw.tune.confirm import Confirmer
from tunefw.tune.interrupt import deferred
from tunefw.tune.pipeline import Pipeline, ProblemState, ProgressHook
from tunefw.tune.pool import WorkerPool
from tunefw.tune.recorder import Recorder
from tunefw.tune.sampler_host import SamplerHost
from tunefw.tune.search import DurableMirror, ProblemSearch
from tunefw.tune.stats import sweep_stats


@dataclass
class LaunchOptions:
    """How a launch runs: its workers, their evaluator, and when it stops."""

    gpus: int
    backend: str  # "sim" | "cuda" | "replay"
    address: str | None = None
    new_round: bool = False
    cache_dir: Any = None
    time_limit_s: float | None = None
    replay: str | None = None  # backend "replay": "replay:PATH[?delay=S]"
    # time.monotonic() when the command started: the first trial's wait counts from it (None:
    # from the start of Sweep.run)
    started_at: float | None = None


PoolFactory = Callable[["LaunchOptions", StudySpec, str | None], WorkerPool]
CompilerFactory = Callable[["LaunchOptions"], Any]


def storage_for(store: Store) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage in the same database (its own tables, no tunefw_ prefix)."""
    return optuna_storage(store.url, store.engine)


def optuna_study_name(study: Study, problem: Problem) -> str:
    return q.optuna_name(study.name, problem.key, study.round)


def usable_families(spec: StudySpec, device: DeviceSpec) -> list[str]:
    """The study's families (default: all) that run on the device; none is a one-line error."""
    names = spec.families or sorted(FAMILIES)
    usable = [f for f in names if get_family(f).supports(device)]
    if not usable:
        raise UserError(f"families {names}: none runs on {device.name} (cc {device.cc})")
    return usable


def guard_round(s, study: Study, fingerprint: dict, families: list[str],
                new_round: bool) -> None:
    """Refuse to resume on another device, after a family's space changed, or after the kernel
    source of a family the round measured changed (its ranking and the confirmation would mix
    two kernels under one config), unless a new round."""
    hashes = {f: get_family(f).space_hash() for f in families}
    if study.fingerprint is not None and new_round:
        study.round += 1
        study.fingerprint = None
    if study.fingerprint is None:
        study.fingerprint = fingerprint
        study.space_hashes = hashes
        return
    if fingerprint_key(study.fingerprint) != fingerprint_key(fingerprint):
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
    for family, measured in sorted(q.round_source_hashes(s, study).items()):
        if any(changed_source(family, m) for m in measured):  # one kernel per round's config
            raise UserError(f"study {study.name!r} round {study.round}: {family}'s kernel source "
                            f"changed since its trials were measured ({', '.join(sorted(measured))}"
                            f" -> {installed_source(family)}): pass --new-round to start a new "
                            "round (unchanged families' results are reused)")


def ray_pool(options: LaunchOptions, spec: StudySpec, replay: str | None) -> WorkerPool:
    """The Ray actor pool: a local Ray, or the cluster at ``options.address``."""
    from tunefw.tune.cluster import RayPool, connect
    connect(options.address, options.gpus, options.backend)
    return RayPool(options.gpus, options.backend, spec.sim, spec.timeout_s, replay)


def compile_pool(options: LaunchOptions) -> Any:
    """The compiler processes of a cuda launch (None for the others: no cubins)."""
    if options.backend != "cuda":
        return None
    from tunefw.cuda.compiler import CompilePool
    return CompilePool(cache_dir=options.cache_dir)


class Sweep:
    """One launch of one study on the workers ``pool_factory`` starts (None: Ray's, ray_pool),
    compiling ahead with what ``compiler_factory`` gives (None: compile_pool)."""

    def __init__(self, store: Store, study_name: str | None, options: LaunchOptions,
                 progress: ProgressHook | None = None, pool_factory: PoolFactory | None = None,
                 compiler_factory: CompilerFactory | None = None) -> None:
        self.store = store
        self.options = options
        self.progress = progress or (lambda event, data: None)
        self.pool_factory = pool_factory or ray_pool
        self.compiler_factory = compiler_factory or compile_pool
        with store.session() as s:
            study = q.get_study(s, study_name)
            self.study_id, self.name = study.id, study.name
            self.spec = StudySpec.from_dict(study.spec)
        self.pool: WorkerPool | None = None
        self.compiler = None
        self.mirror: DurableMirror | None = None
        self.sampler_hosts: list[SamplerHost] = []
        self.asker: Asker | None = None
        self.lease: Lease | None = None

    def run(self) -> dict:
        """Run the search to its budget (resuming where a previous launch stopped), confirm the
        winners not yet confirmed, store and return the sweep figures. With a time limit, stop
        asking (or confirming) when it is reached, finish the jobs in flight and return (a later
        launch resumes). The study's launch lease is held throughout: a live one elsewhere
        refuses this launch (before any worker starts), a stale one is taken over and said so."""
        started = self.options.started_at or time.monotonic()
        self.lease = take(self.store.engine, self.study_id, self.name)
        if self.lease.took_over is not None:
            self.progress("lease", {"line": self.lease.takeover_line()})
        self.lease.start()
        try:
            return self._run(started)
        finally:
            with deferred():  # a second Ctrl-C waits for the lease's row to go
                self.lease.release()

    def _run(self, started: float) -> dict:
        try:
            pipeline = self._open()
            limit = self.options.time_limit_s
            deadline = None if limit is None else time.monotonic() + limit
            wall_s, stopped = pipeline.search(limit)
            stats = sweep_stats(self.pool, pipeline.times, self.asker, wall_s,
                                len(self.sampler_hosts), self.options.backend, stopped,
                                started, pipeline.first_result_at, pipeline.rejected)
            if not stopped:  # the time limit covers the confirmation too: it resumes as well
                stats["confirmed"] = len(Confirmer(pipeline, self.round,
                                                   self.spec.confirm_top).run(deadline))
                stats["stopped_at_time_limit"] = pipeline.cut
            if stats["trials"]:
                pipeline.recorder.stats(stats)
            self.progress("end", stats)
            return stats
        finally:
            self._close()

    def _open(self) -> Pipeline:
        replay = replay_spec = None
        if self.options.backend == "replay":  # the driver reads the sweeps too: it checks them
            from tunefw.evaluate.replay import ReplaySource, parse_backend
            path, delay = parse_backend(self.options.replay or "")
            replay, replay_spec = ReplaySource(path), f"replay:{path}?delay={delay!r}"
        # While Ray and the first worker start (seconds), the rest starts beside them: the
        # sampler processes' imports, Optuna's storage and the progress display's "starting"
        # (the launch's space estimate), in a thread of its own.
        self.sampler_hosts = self._sampler_hosts(replay)
        with ThreadPoolExecutor(1, thread_name_prefix="tunefw-start") as beside:
            early = beside.submit(self._beside_the_pool)
            self.pool = self.pool_factory(self.options, self.spec, replay_spec)
            storage = early.result()
        info = self.pool.first_info
        device: DeviceSpec = info["device"]
        fingerprint: dict = info["fingerprint"]
        families = usable_families(self.spec, device)
        if replay is not None:
            replay.check(self.spec.problems, families)
        self.compiler = self.compiler_factory(self.options)
        with self.store.session() as s:  # commit the round first: Optuna writes on its own
            self.lease.fence(s)
            study = s.get(Study, self.study_id)
            guard_round(s, study, fingerprint, families, self.options.new_round)
            study.backend = self.options.backend
            self.round = study.round
            study_name = study.name
        states = self._states(device, families, replay, storage)
        # Problem i is asked by thread i % n, which talks to sampler process i % n (_states).
        self.asker = Asker(states.values(), ahead=2 * self.options.gpus + 2,
                           threads=max(1, len(self.sampler_hosts)))
        self.asker.start()
        self.progress("start", {"study": study_name, "backend": self.options.backend,
                                "device": fingerprint.get("name"), "device_spec": device,
                                "families": families,
                                "workers": [i["gpu"] for i in self.pool.infos if i],
                                "worker_count": len(self.pool.slots),
                                "problems": [st.progress_row() for st in states.values()]})
        recorder = Recorder(self.store, self.study_id, self.options.backend, self.lease.fence)
        return Pipeline(self.pool, recorder, states, self.asker, self.spec, device, fingerprint,
                        self.compiler, self.progress)

    def _beside_the_pool(self) -> optuna.storages.RDBStorage:
        """What runs while the workers start: the progress hook's "starting", Optuna's storage."""
        self.progress("starting", {})
        return storage_for(self.store)

    def _sampler_hosts(self, replay) -> list[SamplerHost]:
        """The TPE sampler processes (TPE off the driver's thread and GIL), started now."""
        if self.spec.sampler != "tpe" or replay is not None:
            return []
        return [SamplerHost() for _ in range(self._asker_threads(len(self.spec.problems)))]

    def _states(self, device: DeviceSpec, families: list[str], replay,
                storage: optuna.storages.RDBStorage) -> dict[int, ProblemState]:
        """Each problem's search (resumed from the round's rows) and bookkeeping."""
        with self.store.session() as s:
            study = s.get(Study, self.study_id)
            problems = list(study.problems)
            names = {p.id: optuna_study_name(study, p) for p in problems}
            prior = {p.id: q.previous_round_best(s, study, p, self.spec.confirm_top)
                     for p in problems}
        self.mirror = DurableMirror()
        states = {}
        for i, prow in enumerate(problems):
            host = self.sampler_hosts[i % len(self.sampler_hosts)] if self.sampler_hosts else None
            search = ProblemSearch(storage, names[prow.id], self.spec.sampler,
                                   self.spec.seed + prow.id, families, q.as_problem(prow),
                                   device, self.mirror, host, prior[prow.id])
            states[prow.id] = ProblemState(search=search, budget=self.spec.trials, row=prow)
            if replay is not None:  # the search proposes recorded configs only
                states[prow.id].recorded = replay.recorded_keys(q.as_problem(prow))
        with self.store.session() as s:
            study = s.get(Study, self.study_id)
            for prow in problems:
                states[prow.id].resume(q.problem_trials(s, study, prow))
        return states

    def _asker_threads(self, problems: int) -> int:
        """Sampler processes (and asker threads): $TUNEFW_SAMPLER_PROCESSES, else one per two
        GPUs and per four CPU cores (the compiler pool needs the rest); at most one per problem."""
        wanted = os.environ.get("TUNEFW_SAMPLER_PROCESSES", "")
        if wanted.isdigit() and int(wanted) > 0:
            return min(problems, int(wanted))
        return max(1, min(problems, self.options.gpus // 2, (os.cpu_count() or 1) // 4))

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
