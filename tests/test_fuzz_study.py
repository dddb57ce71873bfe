"""Property-based fuzzing of study YAML (issue 16): documents generated from the schema, then
mutated. Every rejected one is one line on stderr, a non-zero exit, no traceback, and the
database's bytes unchanged; every accepted one round-trips (create -> show)."""
import itertools
import json
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tunefw.cli.app import run
from tunefw.problem import DIM_MAX
from tunefw.study.schema import FAULTS, SAMPLERS, TRIALS_MAX
from tunefw.study.spec import load_study_file

names = st.from_regex(r"\A[A-Za-z0-9._-]{1,20}\Z")
dims8 = st.integers(1, 1024).map(lambda v: 8 * v)
problem = st.one_of(
    st.builds(lambda m, n, k: f"{m}x{n}x{k}", st.integers(1, 8192), dims8, dims8),
    st.fixed_dictionaries({"shape": st.builds(lambda m, n, k: f"{m}x{n}x{k}",
                                              st.integers(1, 8192), dims8, dims8)},
                          optional={"label": names, "dtype": st.sampled_from(["bf16", "fp16"])}),
    st.fixed_dictionaries({"M": st.integers(1, 8192), "N": dims8, "K": dims8},
                          optional={"label": names, "layout": st.just("TN")}),
)
model = st.fixed_dictionaries(
    {"hidden": dims8, "intermediate": dims8, "qkv": dims8,
     "M": st.lists(st.integers(1, 8192), min_size=1, max_size=3)}, optional={"name": names})
rate = st.floats(0, 0.25, allow_nan=False)
valid_doc = st.fixed_dictionaries(
    {"problems": st.lists(problem, min_size=1, max_size=3)},
    optional={
        "dtype": st.sampled_from(["bf16", "fp16"]),
        "families": st.sampled_from([["mma_sm80"], ["wgmma_sm90"], "mma_sm80",
                                     ["mma_sm80", "wgmma_sm90"]]),
        "sampler": st.sampled_from(SAMPLERS), "trials": st.integers(1, TRIALS_MAX),
        "timeout_s": st.floats(0.01, 3600, allow_nan=False), "seed": st.integers(0, 2**32 - 1),
        "confirm_top": st.integers(0, 100), "reuse": st.booleans(),
        "models": st.lists(model, max_size=2),
        "sim": st.fixed_dictionaries({}, optional={
            "trial_seconds": st.floats(0, 10, allow_nan=False),
            "faults": st.fixed_dictionaries({}, optional={f: rate for f in FAULTS})}),
    })
junk = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from([DIM_MAX + 1, 10**20]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                         max_size=2))


def _paths(doc, prefix=()):
    """Every (path, value) inside a document, containers included."""
    yield prefix, doc
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) \
        else ()
    for key, value in items:
        yield from _paths(value, prefix + (key,))


def _set(doc, path, value):
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


@st.composite
def mutated_doc(draw):
    """A valid document with one change: a value replaced, a key added or removed. Returns the
    document and whether the change must be refused (an unknown key always is)."""
    doc = json.loads(json.dumps(draw(valid_doc)))
    paths = [p for p, _ in _paths(doc) if p]  # (non-mapping documents: test_arbitrary_bytes)
    path = draw(st.sampled_from(paths))
    kind = draw(st.sampled_from(["replace", "add_key", "drop_key"]))
    target = doc
    for key in path:
        target = target[key]
    if kind == "add_key" and isinstance(target, dict):
        target[draw(st.sampled_from(["layuot", "trial_second", "colour", "Trials", " name"]))] = 1
        return doc, True
    if kind == "drop_key" and isinstance(target, dict) and target:
        del target[draw(st.sampled_from(sorted(target)))]
        return doc, False
    return _set(doc, path, draw(junk)), False


def _raw_bytes():
    return st.one_of(st.binary(max_size=200),
                     st.builds(lambda b: b"name: s\nproblems: [64x64x64]\n# " + b,
                               st.binary(min_size=1, max_size=20)),
                     st.text(max_size=200).map(str.encode))


def _dump(doc) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True).encode()


def _db_bytes(db: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(db.parent.glob(db.name + "*"))}


@pytest.fixture(scope="module")
def fuzz_db(tmp_path_factory):
    db = tmp_path_factory.mktemp("fuzz") / "fuzz.db"
    assert run(["--db", str(db), "study", "create", "seed", "--shape", "64x64x64"]) == 0
    return db


_counter = itertools.count()


def _check(capsys, db: Path, data: bytes, must_refuse: bool) -> None:
    capsys.readouterr()
    f = db.parent / "doc.yaml"
    f.write_bytes(data)
    name = f"fuzz{next(_counter)}"
    before = _db_bytes(db)
    code = run(["--db", str(db), "study", "create", name, "--from", str(f)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "internal error" not in err, err
    if code != 0:
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1 and lines[0].startswith("tunefw: error: "), err
        assert _db_bytes(db) == before
        return
    assert not must_refuse, data
    spec = load_study_file(f, name)
    assert run(["--db", str(db), "study", "show", name, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["name"] == name
    assert [(p["M"], p["N"], p["K"], p["dtype"], p["label"]) for p in shown["problems"]] == [
        (p.M, p.N, p.K, p.dtype, label) for p, label in zip(spec.problems, spec.labels)]
    assert all(math.isfinite(v) for v in (spec.timeout_s, spec.sim.trial_seconds))


FUZZ = settings(max_examples=50, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


@FUZZ
@given(case=mutated_doc())
def test_mutated_study_documents(capsys, fuzz_db, case):
    doc, must_refuse = case
    _check(capsys, fuzz_db, _dump(doc), must_refuse)


@FUZZ
@given(doc=valid_doc)
def test_documents_from_the_schema_are_accepted_or_refused_in_one_line(capsys, fuzz_db, doc):
    _check(capsys, fuzz_db, _dump(doc), False)


@settings(max_examples=30, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=_raw_bytes())
def test_arbitrary_bytes(capsys, fuzz_db, data):
    _check(capsys, fuzz_db, data, False)
