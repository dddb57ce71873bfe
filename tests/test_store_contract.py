"""The storage contract: every store function behaves the same on each backend.

One test body per behaviour, run over SQLite and a real PostgreSQL server (the ``store_url``
fixture of conftest.py; the PostgreSQL case skips only where $TUNEFW_TEST_POSTGRES_URL is unset,
and fails where it is set but unreachable). In the style of Optuna's
testing/pytest_storages.py: the backend is a fixture parameter, never a branch in a test.
"""
from __future__ import annotations

import optuna
import pytest
from sqlalchemy import text

from tunefw.errors import UserError
from tunefw.outcome import Outcome, Status, fingerprint_key
from tunefw.store import open_store, upgrade_store
from tunefw.store import queries as q
from tunefw.store.models import Problem, Study, Trial, Winner
from tunefw.store.session import Store, current_revision, head_revision
from tunefw.study.spec import StudySpec, parse_study

FP = {"name": "NVIDIA H200", "cc": 90, "sm_count": 132, "driver": "570.1", "cuda": "12.8",
      "compiler": "nvrtc 12.8", "method": "anchored-1", "sm_clock_mhz": 1980}
OTHER_FP = dict(FP, name="NVIDIA A100-SXM4-80GB", cc=80)


def _spec(name: str, *shapes: str) -> StudySpec:
    return parse_study({"name": name, "problems": list(shapes or ("64x64x64", "128x256x512"))},
                       "contract")


def _ok(tflops: float, cublas: float | None = 100.0, fp: dict = FP, **kw) -> Outcome:
    return Outcome(Status.OK, log="ok", median_ms=1.0, min_ms=0.9, iqr_ms=0.05, tflops=tflops,
                   rel_err=1e-3, cublas_tflops=cublas, fingerprint=fp, gpu="0", evaluator="cuda",
                   compile_s=0.5, **kw)


def _record(s, study: Study, problem: Problem, key: str, outcome: Outcome, source: str = "src",
            optuna_trial: int | None = None, **kw) -> Trial:
    return q.record_trial(s, study, problem, "mma_sm80", {"BM": 128, "KEY": key}, key, outcome,
                          source, optuna_trial, **kw)


def _count(store: Store, model) -> int:
    with store.session() as s:
        return s.query(model).count()


@pytest.fixture
def store(store_url: str):
    handle = open_store(store_url)
    yield handle
    handle.close()


def test_a_new_database_is_created_at_head_and_reopens(store_url: str) -> None:
    first = open_store(store_url)
    assert current_revision(first.engine) == head_revision()
    first.close()
    again = open_store(store_url)  # state 'current': opened as it is
    with again.session() as s:
        assert q.list_studies(s) == []
    again.close()
    assert upgrade_store(store_url) == (head_revision(), head_revision())  # nothing to do


def test_opening_without_create_refuses_an_empty_database(store_url: str) -> None:
    with pytest.raises(UserError, match="no tunefw database there|no such database file"):
        open_store(store_url, create=False)


def test_studies_create_get_list_and_refuse_duplicates(store: Store) -> None:
    with store.session() as s:
        q.create_study(s, _spec("first"))
    with store.session() as s:
        q.create_study(s, _spec("second", "4096x4096x4096"))
    with store.session() as s:
        study = q.get_study(s, "first")
        assert [(p.key, p.M, p.N, p.K, p.dtype, p.layout) for p in study.problems] == [
            ("64x64x64:bf16:TN", 64, 64, 64, "bf16", "TN"),
            ("128x256x512:bf16:TN", 128, 256, 512, "bf16", "TN")]
        assert study.spec["name"] == "first" and study.round == 0
        assert study.fingerprint is None and study.stats is None
        assert q.get_study(s, None).name == "second"  # the newest by default
        assert [st.name for st in q.list_studies(s)] == ["first", "second"]
    with pytest.raises(UserError, match="'first' already exists"):
        with store.session() as s:
            q.create_study(s, _spec("first"))
    with pytest.raises(UserError, match="study 'nope' not found in .*; known: first, second"):
        with store.session() as s:
            q.get_study(s, "nope")
    assert _count(store, Study) == 2 and _count(store, Problem) == 3  # the refusal wrote nothing


def test_no_study_yet_is_a_user_error(store: Store) -> None:
    with pytest.raises(UserError, match="no study yet"):
        with store.session() as s:
            q.get_study(s, None)


def test_a_failed_transaction_leaves_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError):
        with store.session() as s:
            study = q.create_study(s, _spec("doomed"))
            _record(s, study, study.problems[0], "k", _ok(10.0))
            raise RuntimeError("the driver died mid-write")
    assert (_count(store, Study), _count(store, Problem), _count(store, Trial)) == (0, 0, 0)


def test_a_trial_row_keeps_every_value(store: Store) -> None:
    outcome = Outcome(Status.WRONG_ANSWER, log="row 17 over its limit: 0.31 > 0.02 ✗",
                      median_ms=1.25, min_ms=1.125, iqr_ms=0.0625, tflops=123.456789,
                      rel_err=0.31, cublas_tflops=456.789, fingerprint=FP, gpu="GPU-1234",
                      evaluator="cuda", compile_s=2.5)
    with store.session() as s:
        study = q.create_study(s, _spec("s"))
        row = _record(s, study, study.problems[1], "key-1", outcome, source="abc123",
                      optuna_trial=7, attempts=2, reused_from=None)
        trial_id = row.id
    with store.session() as s:
        study = q.get_study(s, "s")
        (t,) = q.problem_trials(s, study, study.problems[1])
        assert t.id == trial_id and t.study_id == study.id and t.round == 0
        assert (t.family, t.config, t.config_key, t.source_hash) == (
            "mma_sm80", {"BM": 128, "KEY": "key-1"}, "key-1", "abc123")
        assert (t.status, t.log) == ("WRONG_ANSWER", "row 17 over its limit: 0.31 > 0.02 ✗")
        assert (t.median_ms, t.min_ms, t.iqr_ms, t.tflops, t.rel_err, t.cublas_tflops) == (
            1.25, 1.125, 0.0625, 123.456789, 0.31, 456.789)
        assert t.fingerprint == FP and t.fingerprint_key == fingerprint_key(FP)
        assert (t.gpu, t.evaluator, t.compile_s, t.attempts, t.optuna_trial) == (
            "GPU-1234", "cuda", 2.5, 2, 7)
        assert t.reused_from is None and t.created_at is not None
        assert t.ratio == pytest.approx(123.456789 / 456.789)
        assert q.problem_trials(s, study, study.problems[0]) == []


def test_ranking_is_by_ratio_with_missing_cublas_last(store: Store) -> None:
    with store.session() as s:
        study = q.create_study(s, _spec("s"))
        p, other = study.problems
        ids = {}
        for key, outcome in [("slow", _ok(50.0)), ("best", _ok(90.0, cublas=60.0)),
                             ("nocublas", _ok(900.0, cublas=None)), ("tie", _ok(150.0, cublas=100.0)),
                             ("mid", _ok(120.0)), ("best2", _ok(90.0, cublas=60.0)),
                             ("wrong", Outcome(Status.WRONG_ANSWER, tflops=999.0,
                                               cublas_tflops=1.0))]:
            ids[key] = _record(s, study, p, key, outcome).id
        _record(s, study, other, "elsewhere", _ok(10_000.0))
    with store.session() as s:
        study = q.get_study(s, "s")
        p = study.problems[0]
        assert q.best_trial(s, p, 0).id == ids["best"]  # 1.5x, the oldest of three at 1.5x
        assert [t.config_key for t in q.top_trials(s, p, 0, 10)] == [
            "best", "tie", "best2", "mid", "slow", "nocublas"]  # equal ratios by id
        assert [t.config_key for t in q.top_trials(s, p, 0, 2)] == ["best", "tie"]
        assert q.top_trials(s, p, 0, 0) == []
        assert q.best_trial(s, p, 1) is None  # another round has nothing
        assert q.outcome_counts(s, p, 0) == {"OK": 6, "WRONG_ANSWER": 1}


def test_top_trials_keep_one_row_per_config(store: Store) -> None:
    with store.session() as s:
        study = q.create_study(s, _spec("s"))
        p = study.problems[0]
        for key, tflops in [("a", 10.0), ("b", 30.0), ("c", 20.0), ("b", 25.0), ("a", 40.0)]:
            _record(s, study, p, key, _ok(tflops, cublas=10.0))
    with store.session() as s:
        p = q.get_study(s, "s").problems[0]
        assert [(t.config_key, t.tflops) for t in q.top_trials(s, p, 0, 3)] == [
            ("a", 40.0), ("b", 30.0), ("c", 20.0)]


def test_resume_sees_only_its_round_and_reuses_only_real_measurements(store: Store) -> None:
    """A resumed launch reads its round's rows (by id) and answers a repeat config from a stored
    measurement of the same problem, config, sources, evaluator and device, across studies."""
    fp_key = fingerprint_key(FP)
    with store.session() as s:
        a = q.create_study(s, _spec("a", "256x256x256"))
        b = q.create_study(s, _spec("b", "256x256x256", "512x512x512"))
        pa = a.problems[0]
        for status in (Status.INVALID, Status.WORKER_LOST, Status.TIMEOUT):
            _record(s, a, pa, "cfg", Outcome(status, fingerprint=FP, evaluator="cuda"))
        first = _record(s, a, pa, "cfg", _ok(10.0)).id
        _record(s, a, pa, "cfg", _ok(11.0))  # a later measurement of the same config
        _record(s, b, b.problems[0], "cfg", _ok(12.0), reused_from=first)  # a copy, not a source
        a.round = 1
        _record(s, a, pa, "next-round", _ok(5.0))
    with store.session() as s:
        a, b = q.get_study(s, "a"), q.get_study(s, "b")
        assert [t.config_key for t in q.problem_trials(s, a, a.problems[0])] == ["next-round"]
        a.round = 0  # not committed below: only to read round 0
        assert [t.status for t in q.problem_trials(s, a, a.problems[0])] == [
            "INVALID", "WORKER_LOST", "TIMEOUT", "OK", "OK"]
        p256 = q.as_problem(b.problems[0])
        assert q.find_reusable(s, p256, "cfg", "src", "cuda", fp_key).id == first
        for args in (("other-cfg", "src", "cuda", fp_key), ("cfg", "new-src", "cuda", fp_key),
                     ("cfg", "src", "sim", fp_key), ("cfg", "src", "cuda", "other-device")):
            assert q.find_reusable(s, p256, *args) is None, args
        assert q.find_reusable(s, q.as_problem(b.problems[1]), "cfg", "src", "cuda", fp_key) is None
        s.rollback()
    with store.session() as s:
        assert q.get_study(s, "a").round == 1


def test_study_fields_written_at_launch_read_back(store: Store) -> None:
    stats = {"trials": 16, "trials_per_s": 3.2, "starved_s": {"compile": 0.0, "ask": 1.5}}
    with store.session() as s:
        study = q.create_study(s, _spec("s"))
        study.fingerprint, study.space_hashes, study.backend = FP, {"mma_sm80": "abcd"}, "cuda"
        study.stats = stats
    with store.session() as s:
        study = q.get_study(s, "s")
        assert (study.fingerprint, study.space_hashes, study.backend, study.stats) == (
            FP, {"mma_sm80": "abcd"}, "cuda", stats)


def test_winner_is_set_replaced_and_summarized(store: Store) -> None:
    with store.session() as s:
        study = q.create_study(s, _spec("s"))
        p = study.problems[0]
        t1 = _record(s, study, p, "one", _ok(80.0))
        t2 = _record(s, study, p, "two", _ok(90.0))
        _record(s, study, p, "bad", Outcome(Status.COMPILE_ERROR, log="error"))
        _record(s, study, p, "no", Outcome(Status.INVALID, log="BM too big"))
        ids = t1.id, t2.id
    with store.session() as s:
        study = q.get_study(s, "s")
        p = study.problems[0]
        summary = q.problem_summary(s, study, p)  # no winner yet: the best ratio, unconfirmed
        assert summary["best"]["trial_id"] == ids[1] and summary["best"]["confirmed"] is False
        assert (summary["evaluated"], summary["ok"]) == (3, 2)  # INVALID costs nothing
        assert summary["outcomes"] == {"COMPILE_ERROR": 1, "INVALID": 1, "OK": 2}
        q.set_winner(s, p, s.get(Trial, ids[0]), 85.0, 100.0, confirmed=False)
    with store.session() as s:
        study = q.get_study(s, "s")
        p = study.problems[0]
        q.set_winner(s, p, s.get(Trial, ids[1]), 95.0, 99.0, confirmed=True)  # replaces it
    with store.session() as s:
        study = q.get_study(s, "s")
        p = study.problems[0]
        (w,) = s.query(Winner).all()
        assert (w.problem_id, w.trial_id, w.family, w.tflops, w.cublas_tflops, w.confirmed) == (
            p.id, ids[1], "mma_sm80", 95.0, 99.0, True)
        assert w.config == {"BM": 128, "KEY": "two"} and w.fingerprint == FP
        best = q.problem_summary(s, study, p)["best"]
        assert (best["trial_id"], best["tflops"], best["confirmed"]) == (ids[1], 95.0, True)
        assert best["ratio"] == pytest.approx(95.0 / 99.0)


def test_deleting_a_study_removes_its_rows_and_no_other(store: Store) -> None:
    with store.session() as s:
        for name in ("gone", "kept"):
            study = q.create_study(s, _spec(name))
            for p in study.problems:
                trial = _record(s, study, p, f"{name}-{p.key}", _ok(50.0))
                q.set_winner(s, p, trial, 50.0, 100.0, confirmed=True)
    with store.session() as s:
        assert q.delete_study(s, "gone").name == "gone"
    with store.session() as s:
        assert [st.name for st in q.list_studies(s)] == ["kept"]
        kept = q.get_study(s, "kept")
        assert {t.study_id for t in s.query(Trial)} == {kept.id}
        assert {w.problem_id for w in s.query(Winner)} == {p.id for p in kept.problems}
    assert (_count(store, Problem), _count(store, Trial), _count(store, Winner)) == (2, 2, 2)
    with pytest.raises(UserError, match="study 'gone' not found"):
        with store.session() as s:
            q.delete_study(s, "gone")


def test_optuna_storage_lives_in_the_same_database(store_url: str) -> None:
    """Optuna's tables beside tunefw's, made in either order, leave both readable."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    durable = optuna.create_study(storage=store_url, study_name="s/64x64x64:bf16:TN/r0",
                                  direction="maximize")
    durable.add_trial(optuna.trial.create_trial(
        params={"mma_sm80.BM": 128},
        distributions={"mma_sm80.BM": optuna.distributions.CategoricalDistribution([64, 128])},
        value=1.25))
    store = open_store(store_url)  # Optuna's tables alone are not a foreign tunefw schema
    with store.session() as s:
        q.create_study(s, _spec("s"))
    store.close()
    loaded = optuna.load_study(study_name="s/64x64x64:bf16:TN/r0", storage=store_url)
    assert [(t.params, t.value) for t in loaded.trials] == [({"mma_sm80.BM": 128}, 1.25)]
    with open_store(store_url).session() as s:
        assert q.get_study(s, "s").name == "s"


def test_a_first_release_database_upgrades_with_its_rows(store_url: str) -> None:
    """A schema at revision 0001 (no study stats, no trial attempts) is refused, then
    `tunefw db upgrade` takes it to head keeping every row; the new columns get defaults."""
    from alembic import command
    from sqlalchemy import create_engine

    from tunefw.store.session import alembic_config

    engine = create_engine(store_url)
    with engine.begin() as conn:
        command.upgrade(alembic_config(engine, conn), "0001")
        # Rows as the first release wrote them: ids from the database, not given.
        study_id = conn.execute(text(
            "INSERT INTO tunefw_study (name, created_at, spec, round) VALUES "
            "('old', '2025-01-01 00:00:00+00:00', '{\"name\": \"old\"}', 0) RETURNING id"
        )).scalar_one()
        problem_id = conn.execute(text(
            "INSERT INTO tunefw_problem (study_id, key, \"M\", \"N\", \"K\", dtype, layout, "
            "label) VALUES (:s, '64x64x64:bf16:TN', 64, 64, 64, 'bf16', 'TN', '') RETURNING id"),
            {"s": study_id}).scalar_one()
        conn.execute(text(
            "INSERT INTO tunefw_trial (study_id, problem_id, round, family, config, "
            "config_key, source_hash, status, log, tflops, cublas_tflops, fingerprint, "
            "fingerprint_key, gpu, evaluator, created_at) VALUES (:s, :p, 0, 'mma_sm80', "
            "'{\"BM\": 64}', 'k', 's', 'OK', '', 40.0, 50.0, '{}', '', '0', 'cuda', "
            "'2025-01-01 00:00:00+00:00')"), {"s": study_id, "p": problem_id})
    engine.dispose()
    with pytest.raises(UserError, match=r"older tunefw schema \(0001\).*tunefw db upgrade"):
        open_store(store_url)
    assert upgrade_store(store_url) == ("0001", head_revision())
    store = open_store(store_url)
    with store.session() as s:
        study = q.get_study(s, "old")
        (t,) = q.problem_trials(s, study, study.problems[0])
        assert (t.config, t.tflops, t.cublas_tflops, t.attempts) == ({"BM": 64}, 40.0, 50.0, 1)
        assert study.stats is None
        q.create_study(s, _spec("new"))  # the upgraded schema takes new rows
    store.close()
