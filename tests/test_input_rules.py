"""Input rules, one place (issue 16): every field of a study file checked with its path, names
and labels by one rule, numbers finite and in range; and the CLI's own numbers and names."""
import math

import optuna
import pytest

from conftest import cli_in_process as _cli, one_line_error as _one_line

from tunefw.cli.app import run
from tunefw.errors import UserError
from tunefw.problem import DIM_MAX, GemmProblem, parse_shape
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.study.schema import TIMEOUT_MAX_S, TRIALS_MAX
from tunefw.study.spec import SimSettings, StudySpec, load_study_file, parse_study

from pgdb import db_urls  # noqa: F401  (fixture: SQLite, and PostgreSQL when configured)

BASE = {"name": "s", "problems": ["64x64x64"]}


def _refused(change: dict, needle: str) -> str:
    with pytest.raises(UserError) as exc:
        parse_study({**BASE, **change}, "f.yaml")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("f.yaml: "), msg
    assert needle in msg, msg
    return msg


@pytest.mark.parametrize("change, needle", [
    # unknown keys, at every level, named by their path
    ({"problems": ["64x64x64", {"M": 64, "N": 64, "K": 64, "layuot": "TN"}]},
     "unknown key(s) problems[1].layuot"),
    ({"sim": {"trial_second": 2.0}}, "unknown key(s) sim.trial_second"),
    ({"models": [{"name": "m", "hidden": 64, "intermediate": 64, "qkv": 64, "M": [16],
                  "heads": 8}]}, "unknown key(s) models[0].heads"),
    ({"sim": {"faults": {"meteor": 0.1}}}, "sim.faults: unknown fault 'meteor'"),
    # only TN exists: NN is refused, not tuned as TN
    ({"problems": [{"M": 64, "N": 64, "K": 64, "layout": "NN"}]}, "problems[0].layout='NN'"),
    # booleans are booleans
    ({"reuse": "no"}, "reuse='no': expected true or false"),
    ({"reuse": 0}, "reuse=0"),
    ({"confirm_top": True}, "confirm_top=True"),
    ({"trials": True}, "trials=True"),
    ({"timeout_s": True}, "timeout_s=True"),
    # finite numbers in their documented ranges
    ({"timeout_s": math.nan}, "timeout_s=nan: expected a finite number"),
    ({"timeout_s": math.inf}, "timeout_s=inf"),
    ({"timeout_s": 0}, "timeout_s=0"),
    ({"timeout_s": TIMEOUT_MAX_S * 2}, "timeout_s="),
    ({"trials": 10**12}, f"trials=1000000000000: expected an integer 1..{TRIALS_MAX}"),
    ({"trials": "1e12"}, "trials='1e12'"),
    ({"trials": 64.0}, "trials=64.0"),
    ({"sim": {"trial_seconds": math.nan}}, "sim.trial_seconds=nan"),
    ({"sim": {"trial_seconds": -1}}, "sim.trial_seconds=-1"),
    ({"sim": {"faults": {"crash": 1.5}}}, "sim.faults.crash=1.5"),
    ({"sim": {"faults": {"crash": math.nan}}}, "sim.faults.crash=nan"),
    ({"sim": {"faults": {"crash": 0.6, "hang": 0.6}}}, "sim.faults: fault rates sum to 1.2"),
    ({"sim": {"faults": [0.1, 0.2]}}, "sim.faults=[0.1, 0.2]: expected a mapping"),
    ({"sim": [1]}, "sim=[1]: expected a mapping"),
    ({"seed": -1}, "seed=-1"),
    ({"problems": [{"M": 10**20, "N": 64, "K": 64}]}, "problems[0].M=100000000000000000000"),
    ({"problems": [{"M": 10**12, "N": 64, "K": 64}]}, "problems[0].M=1000000000000"),
    ({"problems": [{"M": 64, "N": 64, "K": DIM_MAX + 1}]}, "problems[0].K="),
    ({"problems": ["100000000000000000000x64x64"]}, "expected at most 2^31-1"),
    ({"problems": [{"M": 64.0, "N": 64, "K": 64}]}, "problems[0].M=64.0"),
    ({"problems": [{"M": "64", "N": 64, "K": 64}]}, "problems[0].M='64'"),
    ({"problems": [{"shape": "64x64x64", "M": 64}]}, "problems[0]: give shape or M, N, K"),
    ({"models": [{"name": "m", "hidden": 64, "intermediate": 64, "qkv": 64, "M": [16, 2.5]}]},
     "models[0].M[1]=2.5"),
    # names and labels: [A-Za-z0-9._-], 1-128 characters
    ({"name": "p/q"}, "name='p/q': expected 1-128 characters of A-Z a-z 0-9 . _ -"),
    ({"name": "a\nb"}, "name='a\\nb'"),
    ({"name": "a\n"}, "name='a\\n'"),
    ({"name": "   "}, "name='   '"),
    ({"name": ""}, "name=''"),
    ({"name": "x" * 300}, "name='xxxx"),
    ({"name": "x" * 129}, "name='xxxx"),
    ({"name": 12}, "name=12"),
    ({"problems": [{"M": 64, "N": 64, "K": 64, "label": "a b"}]}, "problems[0].label='a b'"),
    ({"problems": [{"M": 64, "N": 64, "K": 64, "label": "l" * 300}]}, "problems[0].label="),
    ({"models": [{"name": "m/x", "hidden": 64, "intermediate": 64, "qkv": 64, "M": [16]}]},
     "models[0].name='m/x'"),
    ({1: 2}, "top level: key 1: expected a string key"),
])
def test_study_field_refused_with_its_path(change, needle):
    _refused(change, needle)


def test_accepted_values_at_the_edges_of_the_ranges():
    spec = parse_study({**BASE, "name": "A." + "x" * 126, "trials": TRIALS_MAX, "timeout_s": 1e-3,
                        "reuse": False, "sim": {"trial_seconds": 0, "faults": {
                            "crash": 0.25, "hang": 0.25, "wrong": 0.25, "compile_error": 0.25}},
                        "problems": [{"M": DIM_MAX, "N": 2**31 - 8, "K": 8, "label": "a_b-c.d"}]},
                       "f.yaml")
    assert len(spec.name) == 128 and spec.trials == TRIALS_MAX and spec.reuse is False
    assert spec.problems == [GemmProblem(DIM_MAX, 2**31 - 8, 8)] and spec.labels == ["a_b-c.d"]
    assert spec.sim == SimSettings(0.0, {"crash": 0.25, "hang": 0.25, "wrong": 0.25,
                                         "compile_error": 0.25})
    assert StudySpec.from_dict(spec.to_dict()) == spec


def test_name_given_to_create_overrides_an_invalid_file_name_and_is_itself_checked():
    assert parse_study({**BASE, "name": "bad/name"}, "f.yaml", name="good").name == "good"
    with pytest.raises(UserError, match="name='bad name'"):
        parse_study(BASE, "f.yaml", name="bad name")


def test_problem_dims_capped_everywhere():
    with pytest.raises(UserError, match="expected at most 2"):
        GemmProblem(10**20, 64, 64)
    with pytest.raises(UserError, match="expected MxNxK"):
        parse_shape("1" * 100 + "x8x8")


def test_non_utf8_and_nested_yaml_give_one_line(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_bytes(b"name: s\nproblems: [64x64x64]\nlabel: \xff\xfe\n")
    with pytest.raises(UserError, match=r"s.yaml: not UTF-8 text \(byte \d+\)"):
        load_study_file(f)
    f.write_text("name: s\nproblems: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(UserError) as exc:
        load_study_file(f)
    assert "\n" not in str(exc.value)


def test_a_key_given_twice_is_refused(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("name: s\ntrials: 5\nproblems: [64x64x64]\ntrials: 5000\n")
    with pytest.raises(UserError, match=r"s.yaml: malformed YAML at line 4 \(duplicate key "
                                        r"'trials'\)"):
        load_study_file(f)
    f.write_text("name: s\nproblems: [{M: 8, N: 8, K: 8, M: 16}]\n")
    with pytest.raises(UserError, match="duplicate key 'M'"):
        load_study_file(f)


@pytest.mark.parametrize("args, needle", [
    (("study", "create", "p/q", "--shape", "64x64x64"), "name='p/q': expected 1-128"),
    (("study", "create", "a\nb", "--shape", "64x64x64"), "name='a\\nb'"),
    (("study", "create", "   ", "--shape", "64x64x64"), "name='   '"),
    (("study", "create", "x" * 300, "--shape", "64x64x64"), "name='xxx"),
    (("study", "create", "big", "--shape", "100000000000000000000x64x64"), "2^31-1"),
    (("study", "create", "big", "--shape", "1000000000000x64x64"), "2^31-1"),
    (("study", "create", "t", "--shape", "64x64x64", "--trials", "1000000000000"),
     "--trials 1000000000000: expected an integer 1..100000"),
])
def test_cli_names_and_sizes_refused_database_unchanged(capsys, db_urls, args, needle):
    for url in db_urls:
        assert run(["--db", url, "study", "create", "base", "--shape", "64x64x64"]) == 0
        capsys.readouterr()
        with open_store(url).session() as s:
            before = [(st.name, st.spec) for st in q.list_studies(s)]
        code, _, err = _cli(capsys, "--db", url, *args)
        _one_line(code, err, needle)
        with open_store(url).session() as s:
            assert [(st.name, st.spec) for st in q.list_studies(s)] == before


def test_longest_name_and_label_and_largest_dims_are_stored(capsys, db_urls, tmp_path):
    """128 characters and 2^31-1 fit the columns (PostgreSQL's VARCHAR(200) and INTEGER too)."""
    name = "n" * 128
    f = tmp_path / "s.yaml"
    f.write_text(f"problems: [{{M: {DIM_MAX}, N: {2**31 - 8}, K: 8, label: {'l' * 128}}}]\n")
    for url in db_urls:
        code, _, err = _cli(capsys, "--db", url, "study", "create", name, "--from", str(f))
        assert code == 0, err
        with open_store(url).session() as s:
            study = q.get_study(s, name)
            assert [(p.M, p.N, p.K, p.label) for p in study.problems] == [
                (DIM_MAX, 2**31 - 8, 8, "l" * 128)]


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "0"])
def test_time_limit_must_be_finite_and_positive(capsys, tmp_path, value):
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert run(["--db", url, "study", "create", "s", "--shape", "64x64x64"]) == 0
    capsys.readouterr()
    code, _, err = _cli(capsys, "--db", url, "launch", "s", "--backend", "sim",
                        f"--time-limit={value}")
    _one_line(code, err, "--time-limit")


def test_gpus_over_what_the_sim_can_give_is_refused_before_ray(capsys, tmp_path, monkeypatch):
    import tunefw.tune.cluster as cluster

    def no_ray(*args: object) -> None:
        raise AssertionError("the launch started Ray")  # would be an internal error, exit 3
    monkeypatch.setattr(cluster, "connect", no_ray)
    url = f"sqlite:///{tmp_path / 't.db'}"
    assert run(["--db", url, "study", "create", "s", "--shape", "64x64x64"]) == 0
    capsys.readouterr()
    code, _, err = _cli(capsys, "--db", url, "launch", "s", "--backend", "sim", "--gpus", "1000")
    _one_line(code, err, "--gpus 1000: the simulated device runs at most")


def test_delete_removes_exactly_its_own_optuna_studies(capsys, db_urls):
    """A database from before the naming rule can hold studies `p` and `p/q`: deleting `p`
    must leave every Optuna study of `p/q` (and of `pp`) alone."""
    for url in db_urls:
        store = open_store(url)
        legacy = StudySpec(name="p/q", problems=[GemmProblem(64, 64, 64)], labels=[""])
        with store.session() as s:  # written as an older tunefw did, without the rule
            for spec in (parse_study(BASE, "x", name="p"), legacy,
                         parse_study(BASE, "x", name="pp")):
                q.create_study(s, spec)
        storage = optuna.storages.RDBStorage(store.url)
        mine = q.optuna_name("p", "64x64x64:bf16:TN", 0)
        theirs = [q.optuna_name("p/q", "64x64x64:bf16:TN", 0), "p/q/64x64x64:bf16:TN/r0/x",
                  q.optuna_name("pp", "64x64x64:bf16:TN", 0)]
        for n in [mine, *theirs]:
            optuna.create_study(storage=storage, study_name=n)
        code, _, err = _cli(capsys, "--db", url, "study", "delete", "p")
        assert code == 0, err
        assert sorted(optuna.get_all_study_names(storage)) == sorted(theirs)
        with store.session() as s:
            assert [st.name for st in q.list_studies(s)] == ["p/q", "pp"]
        storage.engine.dispose()
        store.close()


def test_optuna_names_of_a_study_cover_every_round(db_url):
    from tunefw.tune.sweep import optuna_study_name
    store = open_store(db_url)
    with store.session() as s:
        study = q.create_study(s, parse_study({**BASE, "problems": ["64x64x64", "8x8x8"]}, "x"))
        study.round = 2
        names = q.optuna_study_names(study)
        assert len(names) == 6
        assert all(optuna_study_name(study, p) in names for p in study.problems)
