"""The sweep's pipeline and confirmation on an in-process pool (tests/fakepool.py, no Ray): the
rows it stores, each problem's budget, the winners, a worker's death as a WORKER_LOST row with
its retry linked to it, and a launch that ends midway resuming to the budget."""
from __future__ import annotations

import json
from collections import Counter

import optuna
import pytest

from conftest import invoke_cli
from fakepool import FakeCompiler, FakePool, Killed
from tunefw.evaluate.sim import SimEvaluator, model_time_ms
from tunefw.outcome import NOT_COUNTED, Outcome, Status
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.store.models import Problem, Trial, Winner
from tunefw.study.spec import SimSettings, parse_study
from tunefw.templates import config_key, get_family
from tunefw.tune.pipeline import ProblemState
from tunefw.tune.recorder import Recorder, Row
from tunefw.tune.search import ProblemSearch
from tunefw.tune.sweep import LaunchOptions, Sweep, storage_for

SHAPES = ["256x256x256", "512x256x128"]


@pytest.fixture
def store(db_url):
    store = open_store(db_url)
    yield store
    store.close()


def _study(store, trials: int, shapes=SHAPES, confirm_top: int = 2) -> None:
    with store.session() as s:
        q.create_study(s, parse_study({"name": "s", "trials": trials, "sampler": "random",
                                       "families": ["mma_sm80"], "confirm_top": confirm_top,
                                       "problems": shapes}, "test"))


def _launch(store, pool: FakePool, **options) -> dict:
    sweep = Sweep(store, "s", LaunchOptions(gpus=len(pool.slots), backend="sim", **options),
                  pool_factory=lambda opts, spec, replay: pool)
    return sweep.run()


def _rows(store) -> list[Trial]:
    with store.session() as s:
        return s.query(Trial).order_by(Trial.id).all()


def _evaluated(rows: list[Trial], problem_id: int) -> list[Trial]:
    return [t for t in rows if t.problem_id == problem_id and t.status not in NOT_COUNTED]


class SecondLaunch(SimEvaluator):
    """The simulator, except that a config's second confirmation (the pick's re-run) measures 3%
    slower, or, with ``fail_first``, the first such re-run gives a wrong answer."""

    def __init__(self, fail_first: bool = False) -> None:
        super().__init__(SimSettings(trial_seconds=0.0))
        self.fail_first, self.runs, self.failed = fail_first, Counter(), None

    def confirm(self, spec, compiled=None) -> Outcome:
        key = config_key(spec.family, spec.config)
        self.runs[key] += 1
        outcome = super().confirm(spec, compiled)
        if self.runs[key] == 2 and self.fail_first and self.failed is None:
            self.failed = key
            return Outcome(Status.WRONG_ANSWER, log="rows over their limit", evaluator="sim")
        if self.runs[key] == 2:
            outcome.tflops *= 0.97
        return outcome


@pytest.mark.parametrize("fail_first", [False, True])
def test_the_pick_is_re_timed_on_its_own_and_a_wrong_re_run_is_passed_over(store, fail_first):
    _study(store, trials=6, shapes=SHAPES[:1])
    evaluator = SecondLaunch(fail_first)
    _launch(store, FakePool(workers=2, evaluator=evaluator))
    with store.session() as s:
        (w,) = s.query(Winner).all()
        trial, problem = s.get(Trial, w.trial_id), q.as_problem(s.get(Problem, w.problem_id))
        top = [t.config_key for t in q.top_trials(s, s.get(Problem, w.problem_id), 0, 2)]
    noise_free = problem.flops / model_time_ms(trial.family, trial.config, problem) / 1e9
    assert w.tflops == pytest.approx(0.97 * noise_free)  # the re-run's figure, not the pick's
    assert evaluator.runs[trial.config_key] == 2 and trial.config_key in top
    if fail_first:  # the pick failed on its re-run: the other confirmed config won, re-run too
        assert evaluator.failed in top and evaluator.failed != trial.config_key
        assert evaluator.runs[evaluator.failed] == 2


class UnsoundTop(SimEvaluator):
    """The simulator, except that confirming any of ``bad`` (config keys) gives a wrong answer."""

    def __init__(self, bad: set[str]) -> None:
        super().__init__(SimSettings(trial_seconds=0.0))
        self.bad, self.confirmed = bad, []

    def confirm(self, spec, compiled=None) -> Outcome:
        key = config_key(spec.family, spec.config)
        self.confirmed.append(key)
        if key in self.bad:
            return Outcome(Status.WRONG_ANSWER, log="rows over their limit", evaluator="sim")
        return super().confirm(spec, compiled)


def test_when_every_top_config_fails_its_confirmation_the_next_ones_are_confirmed(store):
    """The two best screened configs give wrong answers on their confirmation: the winner is
    the best of the next two that holds, and the study is done (no launch left to run)."""
    _study(store, trials=6, shapes=SHAPES[:1])
    _launch(store, FakePool(workers=1))  # the search, and a first (sound) confirmation
    with store.session() as s:
        problem = s.get(Problem, 1)
        ranked_keys = [t.config_key for t in q.top_trials(s, problem, 0, 6)]
        s.query(Winner).delete()  # as if that confirmation had never run
    evaluator = UnsoundTop(set(ranked_keys[:2]))
    stats = _launch(store, FakePool(workers=1, evaluator=evaluator))
    assert stats["confirmed"] == 1
    with store.session() as s:
        (w,) = s.query(Winner).all()
        assert s.get(Trial, w.trial_id).config_key in ranked_keys[2:4]
        assert not q.has_work(s, q.get_study(s, "s"), 6, 2)
    assert evaluator.confirmed[:2] == ranked_keys[:2] and set(evaluator.confirmed[2:4]) == set(
        ranked_keys[2:4])


def test_a_launch_fills_each_budget_and_confirms_each_winner(store, db_url):
    _study(store, trials=5)
    pool = FakePool(workers=3)
    stats = _launch(store, pool)
    rows = _rows(store)
    for problem_id in (1, 2):
        evaluated = _evaluated(rows, problem_id)
        assert len(evaluated) == 5 and len({t.config_key for t in evaluated}) == 5
        assert all(t.status == "OK" and t.evaluator == "sim" and t.attempts == 1
                   and t.retry_of is None and t.gpu.startswith("fake") for t in evaluated)
    assert stats["trials"] == 10 and stats["workers"] == 3 and not stats["stopped_at_time_limit"]
    evaluate = [j for j in pool.jobs if j.kind == "evaluate"]
    confirm = [j for j in pool.jobs if j.kind == "confirm"]
    assert len(evaluate) == 10 and len(confirm) == 6  # confirm_top 2 per problem, a re-run each
    with store.session() as s:
        winners = {w.problem_id: w for w in s.query(Winner)}
        assert set(winners) == {1, 2} and all(w.confirmed for w in winners.values())
        for problem_id, w in winners.items():  # the winner is one of the confirmed top two
            assert w.trial_id in [t.id for t in q.top_trials(s, s.get(Problem, problem_id), 0, 2)]
        assert q.get_study(s, "s").stats == stats
    durable = optuna.load_study(study_name="s/256x256x256:bf16:TN/r0", storage=db_url)
    assert sorted(t.user_attrs["tunefw_trial_id"] for t in durable.trials) == \
        [t.id for t in _evaluated(rows, 1)]
    assert pool.shut


def test_trials_start_on_the_first_worker_up_and_a_late_one_joins(store):
    """The pool is handed out with one worker up: the search starts on it; the other takes
    jobs once up, its wait charged to its start, and the launch stores both times."""
    _study(store, trials=6)
    pool = FakePool(workers=2, up_after={1: 4})
    stats = _launch(store, pool)
    gpus = [t.gpu for t in _rows(store) if t.status == "OK"]
    assert len(gpus) == 12 and "fake1" in gpus
    assert gpus[:3] == ["fake0"] * 3  # before worker 1 came up, at the fourth poll
    assert stats["starved_s"]["start"] > 0
    assert 0 <= stats["first_worker_s"] <= stats["workers_up_s"] <= stats["first_trial_s"] + 60


def test_a_worker_that_never_comes_up_runs_nothing_and_is_named_by_its_index(store):
    _study(store, trials=3)
    stats = _launch(store, FakePool(workers=2, up_after={1: 10**9}))
    assert {t.gpu for t in _rows(store)} == {"fake0"}
    assert stats["workers_up_s"] is None and stats["first_worker_s"] is not None
    assert stats["gpu_busy"]["worker 1 (never up)"] == 0.0


def test_a_lost_worker_leaves_a_worker_lost_row_and_a_linked_retry(store, db_url):
    """The second trial's worker dies once (its retry is OK), the fourth's on both attempts
    (RUNTIME_CRASH). Neither loss counts against the budget of 5."""
    _study(store, trials=5, shapes=SHAPES[:1])
    pool = FakePool(workers=1, dies=lambda job, i: (i, job.attempt) in {(1, 1), (3, 1), (3, 2)})
    stats = _launch(store, pool)
    rows = [t for t in _rows(store) if t.status != "INVALID"]
    assert [(t.status, t.attempts) for t in rows] == [
        ("OK", 1), ("WORKER_LOST", 1), ("OK", 2), ("OK", 1), ("WORKER_LOST", 1),
        ("RUNTIME_CRASH", 2), ("OK", 1)]
    lost, retried, lost2, crashed = rows[1], rows[2], rows[4], rows[5]
    assert (retried.retry_of, crashed.retry_of) == (lost.id, lost2.id)
    assert retried.config_key == lost.config_key and crashed.config_key == lost2.config_key
    assert lost.optuna_trial is None and lost.log == "attempt 1: WORKER_LOST (worker process died)"
    assert retried.log.startswith(f"retry of trial {lost.id} (its worker died)\n")
    assert "attempt 2: WORKER_LOST" in crashed.log and "the config kills it" in crashed.log
    assert stats["restarts"] == 3 and stats["trials"] == 4  # results a worker returned
    assert stats["rejected"] == len([t for t in _rows(store) if t.status == "INVALID"])
    shown = json.loads(invoke_cli("study", "show", "s", "--json", db=db_url).stdout)
    (problem,) = shown["problems"]
    assert problem["evaluated"] == 5
    assert {k: v for k, v in problem["outcomes"].items() if k != "INVALID"} == {
        "OK": 4, "RUNTIME_CRASH": 1, "WORKER_LOST": 2}
    durable = optuna.load_study(study_name="s/256x256x256:bf16:TN/r0", storage=db_url)
    assert len(durable.trials) == 5  # a lost attempt is no Optuna trial: its retry is


def test_a_launch_ended_midway_resumes_to_the_budget(store):
    _study(store, trials=6)
    with pytest.raises(Killed):
        _launch(store, FakePool(workers=2, stop_after=5))
    before = [(t.id, t.config_key, t.status, t.tflops) for t in _rows(store)]
    assert 0 < len([r for r in before if r[2] != "INVALID"]) < 12
    pool = FakePool(workers=2)
    stats = _launch(store, pool)
    rows = _rows(store)
    assert [(t.id, t.config_key, t.status, t.tflops) for t in rows][:len(before)] == before
    for problem_id in (1, 2):
        evaluated = _evaluated(rows, problem_id)
        assert len(evaluated) == 6 and len({t.config_key for t in evaluated}) == 6
    resumed = len([r for r in before if r[2] != "INVALID"])
    assert stats["trials"] == 12 - resumed  # only the rest ran
    with store.session() as s:
        assert {w.problem_id for w in s.query(Winner)} == {1, 2}


class CountedConfirms(SimEvaluator):
    """The simulator, counting confirmations; the ``at``-th moves ``clock`` past any deadline."""

    def __init__(self, clock: list[float] | None = None, at: int = 0) -> None:
        super().__init__(SimSettings(trial_seconds=0.0))
        self.clock, self.at, self.confirms = clock, at, 0

    def confirm(self, spec, compiled=None) -> Outcome:
        self.confirms += 1
        if self.clock is not None and self.confirms == self.at:
            self.clock[0] = 1e12
        return super().confirm(spec, compiled)


def _winners(store) -> dict[int, tuple[int, float]]:
    with store.session() as s:
        return {w.problem_id: (w.trial_id, w.tflops) for w in s.query(Winner) if w.confirmed}


def test_a_launch_killed_while_confirming_keeps_its_winners_and_confirms_only_the_rest(store):
    """Each problem's winner is stored when its held-out re-run is in (one worker: problem 1's
    two confirmations, then its re-run before problem 2's); the next launch runs no trial and
    confirms the two problems left, problem 1's winner untouched."""
    _study(store, trials=3, shapes=SHAPES + ["128x128x128"])
    with pytest.raises(Killed):  # 9 trials, problem 1's 2 confirmations + re-run, 1 more
        _launch(store, FakePool(workers=1, stop_after=9 + 3 + 1))
    first = _winners(store)
    assert list(first) == [1]
    evaluator = CountedConfirms()
    stats = _launch(store, FakePool(workers=1, evaluator=evaluator))
    assert stats["trials"] == 0 and stats["confirmed"] == 2 and not stats["stopped_at_time_limit"]
    assert evaluator.confirms == 2 * 3  # problems 2 and 3: two confirmations and a re-run each
    winners = _winners(store)
    assert set(winners) == {1, 2, 3} and winners[1] == first[1]


def test_the_time_limit_cuts_the_confirmation_between_problems(store, monkeypatch):
    """A deadline passed during problem 1's re-run: its winner is stored, nothing more starts,
    the launch says it stopped at its time limit; the next launch confirms the rest."""
    import tunefw.tune.pipeline as pipeline_module

    clock = [0.0]
    monkeypatch.setattr(pipeline_module, "time", type("Clock", (), {
        "monotonic": staticmethod(lambda: clock[0])}))
    _study(store, trials=3)
    evaluator = CountedConfirms(clock, at=3)
    stats = _launch(store, FakePool(workers=1, evaluator=evaluator), time_limit_s=1000.0)
    assert stats["trials"] == 6 and stats["confirmed"] == 1 and stats["stopped_at_time_limit"]
    assert evaluator.confirms == 3 and list(_winners(store)) == [1]
    with store.session() as s:
        assert q.get_study(s, "s").stats == stats
        assert q.has_work(s, q.get_study(s, "s"), 3, 2)
    again = _launch(store, FakePool(workers=1))
    assert again["confirmed"] == 1 and not again["stopped_at_time_limit"]
    with store.session() as s:
        assert set(_winners(store)) == {1, 2} and not q.has_work(s, q.get_study(s, "s"), 3, 2)


def test_a_study_that_confirms_nothing_is_done_at_its_budget(store):
    """confirm_top 0 (no confirmation asked for): a problem at its budget has nothing left, so
    a finished study is not launched again for a confirmation it never runs."""
    _study(store, trials=3, confirm_top=0)
    pool = FakePool(workers=1)
    assert _launch(store, pool)["trials"] == 6
    assert not [j for j in pool.jobs if j.kind == "confirm"] and _winners(store) == {}
    with store.session() as s:
        assert not q.has_work(s, q.get_study(s, "s"), 3, 0)
        assert q.has_work(s, q.get_study(s, "s"), 3, 2)  # a confirming study would have work


def test_a_lost_attempt_without_its_retry_frees_the_config_on_resume(store):
    """A launch killed between a WORKER_LOST row and its retry: the config is not counted, and
    not known (it may be asked again), unlike a finished trial."""
    _study(store, trials=4, shapes=SHAPES[:1])
    with store.session() as s:
        study = q.get_study(s, "s")
        problem, study_id = study.problems[0], study.id
    recorder = Recorder(store, study_id, "sim")
    done, lost = (Row(problem.id, "mma_sm80", c, config_key("mma_sm80", c))
                  for c in get_family("mma_sm80").seed_configs()[:2])
    recorder.trial(done, Outcome(Status.OK, tflops=90.0, cublas_tflops=100.0), 0)
    recorder.trial(lost, Outcome(Status.WORKER_LOST, log="worker process died"), None)
    search = ProblemSearch(storage_for(store), "s/p/r0", "random", 0, ["mma_sm80"],
                           q.as_problem(problem), FakePool().infos[0]["device"])
    st = ProblemState(search=search, budget=4, row=problem)
    with store.session() as s:
        st.resume(q.problem_trials(s, q.get_study(s, "s"), problem))
    assert (st.known, st.evaluated, st.values) == ({done.key}, 1, {done.key: 0.9})
    assert len(search.durable.trials) == 1  # the finished trial restored, not the lost one


def test_a_time_limit_reached_at_once_runs_nothing_and_confirms_nothing(store):
    _study(store, trials=4)
    pool = FakePool(workers=2)
    stats = _launch(store, pool, time_limit_s=0.0)
    assert stats["stopped_at_time_limit"] and stats["trials"] == 0 and not pool.jobs
    with store.session() as s:
        assert s.query(Winner).count() == 0 and q.get_study(s, "s").stats is None
    assert all(t.status in NOT_COUNTED for t in _rows(store))


def test_compiles_ahead_and_a_failed_compile_is_a_counted_outcome(store, db_url):
    """Every evaluated config goes through the compiler first; a failed compile never reaches a
    worker, is stored with its compile time and counts against the budget."""
    _study(store, trials=6, shapes=SHAPES[:1])
    compiler = FakeCompiler(fails=lambda config: config["STAGES"] % 2 == 0,
                            ptxas=lambda config: (100 + config["STAGES"], 512, 8))
    pool = FakePool(workers=2)
    sweep = Sweep(store, "s", LaunchOptions(gpus=2, backend="sim"),
                  pool_factory=lambda opts, spec, replay: pool,
                  compiler_factory=lambda opts: compiler)
    sweep.run()
    evaluated = _evaluated(_rows(store), 1)
    failed = [t for t in evaluated if t.status == "COMPILE_ERROR"]
    assert len(evaluated) == 6 and failed and all(t.compile_s == 0.25 for t in evaluated)
    assert all(t.config["STAGES"] % 2 == 0 and t.log == "error: fake" for t in failed)
    # each row keeps ptxas's figures for its kernel; a failed compile has none
    assert [(t.ptxas_regs, t.ptxas_smem_bytes, t.ptxas_spill_bytes) for t in evaluated] == [
        (None, None, None) if t.status == "COMPILE_ERROR" else (100 + t.config["STAGES"], 512, 8)
        for t in evaluated]
    ok = next(t for t in evaluated if t.status == "OK")
    shown = invoke_cli("trial", "show", str(ok.id), db=db_url)
    assert (f"ptxas: {100 + ok.config['STAGES']} registers/thread, 512 B static shared memory, "
            "8 B spilled") in shown.stdout.splitlines()
    ran = [j for j in pool.jobs if j.kind == "evaluate"]
    assert len(ran) == 6 - len(failed) and all(j.compiled.cubin == b"cubin" for j in ran)
    confirmed = [j for j in pool.jobs if j.kind == "confirm"]
    re_runs = [j for j in confirmed if j.context[2] == "held_out"]
    assert re_runs and all(j.compiled.cubin == b"cubin" for j in confirmed)
    # a pick's re-run takes its confirmation's cubin: the compiler is not asked again
    assert compiler.submitted == 6 + len(confirmed) - len(re_runs) and compiler.closed
