"""What Optuna stores of a tunefw search: the real knob values, the objective's name, and each
trial's tunefw figures as user attributes; a study stored under the old index encoding is refused
with a pointer to --new-round."""
from __future__ import annotations

import sqlite3

import optuna
import pytest
import yaml

from conftest import invoke_cli, launch_on
from fakepool import finishing_pipeline
from tunefw.device import H200
from tunefw.errors import UserError
from tunefw.outcome import Outcome, Status
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.study.spec import parse_study
from tunefw.templates import config_key, get_family
from tunefw.tune.pipeline import ProblemState
from tunefw.tune.recorder import Row
from tunefw.tune.search import ProblemSearch
from tunefw.tune.sweep import guard_round, storage_for

WGMMA = get_family("wgmma_sm90")
OUTCOMES = [Outcome(Status.OK, tflops=700.0, cublas_tflops=800.0),
            Outcome(Status.OK, tflops=600.0, cublas_tflops=500.0),
            Outcome(Status.WRONG_ANSWER, log="wrong")]


@pytest.fixture
def store(db_url):
    store = open_store(db_url)
    with store.session() as s:
        q.create_study(s, parse_study({"name": "s", "problems": ["4096x4096x4096"]}, "t"))
    return store


def _search(store, name):
    with store.session() as s:
        row = q.get_study(s, "s").problems[0]
    search = ProblemSearch(storage_for(store), name, "random", 0, ["wgmma_sm90"],
                           q.as_problem(row), H200)
    return ProblemState(search=search, budget=8, row=row)


def _run(store, st):
    """Three evaluated trials through the sweep's own finish step; their configs."""
    pipeline = finishing_pipeline(store, "s", st)
    configs = []
    for outcome in OUTCOMES:
        prop = st.search.ask(set())
        while prop.invalid_reason is not None:
            st.search.tell(prop.trial, None)
            prop = st.search.ask(set())
        configs.append(prop.config)
        pipeline.finish(st, Row(st.row.id, prop.family, prop.config, prop.key), outcome,
                        prop.trial)
    return configs


def _row_ids(db_url):
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    try:
        return [i for (i,) in con.execute("SELECT id FROM tunefw_trial ORDER BY id")]
    finally:
        con.close()


def test_optuna_stores_real_values_a_named_objective_and_tunefw_attributes(store, db_url):
    configs = _run(store, _search(store, "s/p/r0"))
    ids = _row_ids(db_url)
    study = optuna.load_study(study_name="s/p/r0", storage=db_url)
    assert study.metric_names == ["ratio_vs_cublas"]
    best = study.best_trial
    assert best.params == {f"wgmma_sm90.{k}": v for k, v in configs[1].items()}
    assert best.params["wgmma_sm90.BM"] in (64, 128, 256)
    assert best.params["wgmma_sm90.SCHEDULE"] in ("cooperative", "pingpong")
    assert best.value == pytest.approx(1.2)
    assert best.user_attrs == {"tflops": 600.0, "cublas_tflops": 500.0,
                               "tunefw_trial_id": ids[1], "outcome": "OK"}
    first, _, failed = study.trials
    assert first.user_attrs["tunefw_trial_id"] == ids[0] and first.value == pytest.approx(0.875)
    assert failed.state == optuna.trial.TrialState.FAIL
    assert failed.user_attrs == {"tflops": None, "cublas_tflops": None,
                                 "tunefw_trial_id": ids[2], "outcome": "WRONG_ANSWER"}


def test_trials_restored_from_rows_carry_the_same_attributes(store, db_url):
    st = _search(store, "s/p/r0")
    _run(store, st)
    told = optuna.load_study(study_name="s/p/r0", storage=db_url).trials
    # As after a kill before the durable writes: the rows replayed into an empty study.
    resumed = _search(store, "s/p/again")
    with store.session() as s:
        study = q.get_study(s, "s")
        resumed.resume(q.problem_trials(s, study, study.problems[0]))
    again = optuna.load_study(study_name="s/p/again", storage=db_url).trials
    assert [(t.params, t.value, t.user_attrs) for t in again] == \
        [(t.params, t.value, t.user_attrs) for t in told]


def test_an_index_encoded_optuna_study_is_refused_with_new_round(store, db_url):
    old = optuna.create_study(study_name="s/p/r0", storage=db_url, direction="maximize")
    dists = {f"wgmma_sm90.{p.name}": optuna.distributions.IntDistribution(0, len(p.values) - 1)
             if isinstance(p.values[0], int) else optuna.distributions.CategoricalDistribution(p.values)
             for p in WGMMA.params}
    params = {name: (0 if isinstance(d, optuna.distributions.IntDistribution) else d.choices[0])
              for name, d in dists.items()}
    old.add_trial(optuna.trial.create_trial(params=params, distributions=dists, value=1.0))
    with pytest.raises(UserError) as exc:
        _search(store, "s/p/r0")
    message = str(exc.value)
    assert "\n" not in message and message.endswith("pass --new-round to start a new round")
    assert "wgmma_sm90.BM" in message


def test_a_round_stored_under_the_old_space_hash_asks_for_new_round(store):
    fingerprint = {"name": "SIMULATED NVIDIA H200", "method": "anchored-1"}
    with store.session() as s:
        study = q.get_study(s, "s")
        study.fingerprint = fingerprint
        study.space_hashes = {"wgmma_sm90": "0123456789abcdef"}  # hashed without the encoding
        with pytest.raises(UserError, match="space changed .* pass --new-round"):
            guard_round(s, study, fingerprint, ["wgmma_sm90"], new_round=False)
        guard_round(s, study, fingerprint, ["wgmma_sm90"], new_round=True)
        assert study.round == 1 and study.space_hashes == {"wgmma_sm90": WGMMA.space_hash()}


def test_a_round_measured_with_another_kernel_source_asks_for_new_round(store):
    """Trials of the round ran an older wgmma_sm90 source: resuming would rank and confirm two
    kernels under one config, so the launch is refused until a new round; a trial measured
    with today's source resumes as before."""
    fingerprint = {"name": "NVIDIA H200", "method": "anchored-1"}
    config = WGMMA.seed_configs()[0]
    with store.session() as s:
        study = q.get_study(s, "s")
        study.fingerprint, study.space_hashes = fingerprint, {"wgmma_sm90": WGMMA.space_hash()}
        problem = study.problems[0]
        ok = Outcome(Status.OK, tflops=700.0, cublas_tflops=800.0)
        q.record_trial(s, study, problem, "wgmma_sm90", config, "k0", ok, WGMMA.source_hash(), 0)
        guard_round(s, study, fingerprint, ["wgmma_sm90"], new_round=False)  # today's source
        q.record_trial(s, study, problem, "wgmma_sm90", config, "k1", ok, "0123456789abcdef", 1)
        with pytest.raises(UserError) as exc:
            guard_round(s, study, fingerprint, ["wgmma_sm90"], new_round=False)
        assert str(exc.value) == (
            f"study 's' round 0: wgmma_sm90's kernel source changed since its trials were "
            f"measured (0123456789abcdef, {WGMMA.source_hash()} -> {WGMMA.source_hash()}): pass "
            "--new-round to start a new round (unchanged families' results are reused)")
        guard_round(s, study, fingerprint, ["wgmma_sm90"], new_round=True)
        assert study.round == 1


@pytest.mark.slow
def test_a_launched_sim_study_shows_real_values_in_optuna(db_url, tmp_path, ray_head):
    spec = {"name": "o", "trials": 3, "families": ["mma_sm80"], "problems": [{"shape": "256x256x256"}],
            "sim": {"trial_seconds": 0.01}}
    (tmp_path / "o.yaml").write_text(yaml.safe_dump(spec))
    assert invoke_cli("study", "create", "o", "--from", str(tmp_path / "o.yaml"),
                      db=db_url).returncode == 0
    launched = launch_on(ray_head, "o", "--gpus", "1", "--backend", "sim", db=db_url)
    assert launched.returncode == 0, launched.stderr
    study = optuna.load_study(study_name="o/256x256x256:bf16:TN/r0", storage=db_url)
    assert study.metric_names == ["ratio_vs_cublas"]
    mma = get_family("mma_sm80")
    for trial in study.trials:  # every knob, with a declared value of its declared type
        assert mma.space_reason({k.removeprefix("mma_sm80."): v
                                 for k, v in trial.params.items()}) is None
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    rows = {i: (t, c, s) for i, t, c, s in con.execute(
        "SELECT id, tflops, cublas_tflops, status FROM tunefw_trial WHERE status != 'INVALID'")}
    con.close()
    attrs = {t.user_attrs["tunefw_trial_id"]: (t.user_attrs["tflops"], t.user_attrs["cublas_tflops"],
                                               t.user_attrs["outcome"]) for t in study.trials}
    assert attrs == rows and len(rows) == 3
    best = study.best_trial
    assert best.params["mma_sm80.BM"] in (32, 64, 128, 256)
    assert best.value == pytest.approx(best.user_attrs["tflops"] / best.user_attrs["cublas_tflops"])


def test_deleting_a_study_deletes_its_optuna_studies_only(store, db_url):
    own = q.optuna_name("s", "4096x4096x4096:bf16:TN", 0)  # what a launch of study s names it
    _run(store, _search(store, own))
    optuna.create_study(study_name="other/p/r0", storage=db_url)
    optuna.create_study(study_name="s/p/r0", storage=db_url)  # not a name study s can own
    assert invoke_cli("study", "delete", "s", db=db_url).returncode == 0
    assert sorted(optuna.get_all_study_names(db_url)) == ["other/p/r0", "s/p/r0"]


def test_a_new_round_starts_from_every_earlier_rounds_best_latest_first(store):
    """Round 2 asks round 1's best, then round 0's that round 1 did not ask (a fresh search can
    miss an older round's find), each config once."""
    configs = [{**WGMMA.default_config(), "STAGES": st} for st in (3, 4, 5, 6)]
    with store.session() as s:
        study = q.get_study(s, "s")
        row = study.problems[0]
        for round_, picks in ((0, (0, 1)), (1, (2, 1))):  # ratios 0.875 and 1.2 in each round
            study.round = round_
            for config, outcome in zip([configs[i] for i in picks], OUTCOMES[:2]):
                q.record_trial(s, study, row, "wgmma_sm90", config,
                               config_key("wgmma_sm90", config), outcome, "src", None)
        study.round = 2
        assert q.previous_round_best(s, study, row, 3) == [
            ("wgmma_sm90", configs[1]), ("wgmma_sm90", configs[2]), ("wgmma_sm90", configs[0])]
        assert q.previous_round_best(s, study, row, 1) == [("wgmma_sm90", configs[1])]


def test_a_new_round_starts_from_the_previous_rounds_best_configs(store):
    """After a source change the previous round's best configs are asked first (best first,
    one per config, failures never), so a new round cannot end up knowing less than the last."""
    configs = [{**WGMMA.default_config(), "STAGES": st} for st in (3, 4, 5)]
    with store.session() as s:
        study = q.get_study(s, "s")
        row = study.problems[0]
        assert q.previous_round_best(s, study, row, 3) == []  # round 0 has no round before it
        for config, outcome in zip(configs, OUTCOMES):  # ratios 0.875, 1.2, a wrong answer
            q.record_trial(s, study, row, "wgmma_sm90", config, config_key("wgmma_sm90", config), outcome,
                           "src", None)
        q.record_trial(s, study, row, "wgmma_sm90", configs[1], config_key("wgmma_sm90", configs[1]),
                       OUTCOMES[1], "src", None)  # the same config again: asked once
        study.round = 1
        prior = q.previous_round_best(s, study, row, 3)
        assert prior == [("wgmma_sm90", configs[1]), ("wgmma_sm90", configs[0])]
        problem = q.as_problem(row)
    search = ProblemSearch(optuna.storages.InMemoryStorage(), "s/r1", "tpe", 0,
                           ["wgmma_sm90"], problem, H200, prior=prior)
    asked = []
    for _ in range(3):
        prop = search.ask(set())
        asked.append(prop.config)
        search.tell(prop.trial, 1.0)
    seeds = [c for c in WGMMA.seed_configs()
             if WGMMA.check(c, problem, H200) is None and c not in configs]
    assert asked == [configs[1], configs[0], seeds[0]]  # then the seeds not asked already
