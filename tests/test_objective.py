"""The search's objective is a trial's ratio to the cuBLAS of the same screen, not raw TFLOP/s:
raw TFLOP/s follow the GPU's clock, the ratio to a cuBLAS timed interleaved with it does not."""
from types import SimpleNamespace

import optuna
import pytest

from conftest import invoke_cli
from fakepool import finishing_pipeline
from tunefw.device import H200
from tunefw.outcome import Outcome, Status, fingerprint_key
from tunefw.report import best_so_far
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.study.spec import parse_study
from tunefw.tune.pipeline import ProblemState
from tunefw.tune.recorder import Row
from tunefw.tune.search import ProblemSearch

# X has the higher TFLOP/s, but its screen ran on a higher clock: its cuBLAS was faster too.
X = Outcome(Status.OK, tflops=700.0, cublas_tflops=800.0)  # 0.875x
Y = Outcome(Status.OK, tflops=600.0, cublas_tflops=500.0)  # 1.2x
NO_CUBLAS = Outcome(Status.OK, tflops=900.0)  # an OK row without a cuBLAS figure
H200_FP = {"name": H200.name, "cc": H200.cc, "sm_count": H200.sm_count, "driver": "580",
           "cuda": "13.0", "compiler": "nvrtc 13.0", "method": "anchored-2"}


@pytest.fixture
def store(db_url):
    store = open_store(db_url)
    with store.session() as s:
        q.create_study(s, parse_study({"name": "s", "problems": ["4096x4096x4096"]}, "t"))
    return store


def _record(store, *outcomes):
    with store.session() as s:
        study = q.get_study(s, "s")
        for i, outcome in enumerate(outcomes):
            q.record_trial(s, study, study.problems[0], "mma_sm80", {"i": i}, f"key{i}",
                           outcome, "src", None)


def test_an_outcome_has_a_ratio_only_with_both_figures():
    assert X.ratio == pytest.approx(0.875) and Y.ratio == pytest.approx(1.2)
    assert NO_CUBLAS.ratio is None and Outcome(Status.WRONG_ANSWER).ratio is None


def test_trials_rank_by_ratio_and_those_without_cublas_last(store):
    _record(store, NO_CUBLAS, X, Y, Outcome(Status.WRONG_ANSWER), Y)
    with store.session() as s:
        study = q.get_study(s, "s")
        problem = study.problems[0]
        top = q.top_trials(s, problem, 0, 5)
        # Y before X despite fewer TFLOP/s; equal ratios by id; no cuBLAS figure last
        assert [t.config_key for t in top] == ["key2", "key4", "key1", "key0"]
        assert top[0].ratio == pytest.approx(1.2) and top[-1].ratio is None
        assert q.best_trial(s, problem, 0).config_key == "key2"
        best = q.problem_summary(s, study, problem)["best"]
        assert best["ratio"] == pytest.approx(1.2) and best["tflops"] == 600.0


def test_study_show_gives_the_best_ratio_beside_the_tflops(store, db_url):
    _record(store, X, Y)
    shown = invoke_cli("study", "show", "s", db=db_url, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    row = next(line for line in shown.stdout.splitlines() if "4096x4096x4096" in line)
    assert "1.200x" in row and "600.0" in row and "500.0" in row


def _state(row, storage) -> ProblemState:
    search = ProblemSearch(storage, "s/r0", "random", 0, ["mma_sm80"], q.as_problem(row), H200)
    return ProblemState(search=search, budget=8, row=row)


def test_the_sweep_tells_the_search_the_ratio_and_resumes_with_it(store):
    with store.session() as s:
        row = q.get_study(s, "s").problems[0]
    st = _state(row, optuna.storages.InMemoryStorage())
    pipeline = finishing_pipeline(store, "s", st)
    keys = []
    for outcome in (X, Y, Outcome(Status.WRONG_ANSWER)):
        prop = st.search.ask(set(keys))
        keys.append(prop.key)
        pipeline.finish(st, Row(row.id, prop.family, prop.config, prop.key), outcome, prop.trial)
    told = [t.value for t in st.search.durable.get_trials()]
    assert told == [pytest.approx(0.875), pytest.approx(1.2), None]
    assert st.best == pytest.approx(1.2)
    assert st.values == {keys[0]: pytest.approx(0.875), keys[1]: pytest.approx(1.2)}
    # A launch killed before its durable writes: the next one replays the rows with their ratios.
    resumed = _state(row, optuna.storages.InMemoryStorage())
    with store.session() as s:
        study = q.get_study(s, "s")
        resumed.resume(q.problem_trials(s, study, study.problems[0]))
    assert [t.value for t in resumed.search.durable.get_trials()] == told
    assert (resumed.best, resumed.values, resumed.evaluated) == (st.best, st.values, 3)


def test_the_report_curve_is_the_best_ratio_so_far():
    trials = [SimpleNamespace(status=s, ratio=r) for s, r in
              [("OK", 0.875), ("INVALID", None), ("WRONG_ANSWER", None), ("OK", 1.2),
               ("OK", None), ("OK", 1.1)]]
    assert best_so_far(trials) == [0.875, 0.875, 1.2, 1.2, 1.2]


def test_a_measurement_is_reused_only_under_the_timing_method_that_took_it(store):
    old_method = dict(H200_FP, method=None)
    with store.session() as s:
        study = q.get_study(s, "s")
        q.record_trial(s, study, study.problems[0], "mma_sm80", {"i": 0}, "key0",
                       Outcome(Status.OK, tflops=600.0, cublas_tflops=500.0,
                               fingerprint=old_method), "src", None)
    with store.session() as s:
        problem = q.as_problem(q.get_study(s, "s").problems[0])
        same = q.find_reusable(s, problem, "key0", "src", "", fingerprint_key(old_method))
        now = q.find_reusable(s, problem, "key0", "src", "", fingerprint_key(H200_FP))
    assert same is not None and now is None
