import sqlite3

import pytest
from alembic import command
from sqlalchemy import create_engine

from tunefw.errors import UserError
from tunefw.store import open_store, upgrade_store
from tunefw.store import queries as q
from tunefw.store.session import alembic_config, current_revision, head_revision
from tunefw.study.spec import parse_study


def _spec(name="s"):
    return parse_study({"name": name, "problems": ["64x64x64", "128x256x512"]}, "t")


def test_fresh_database_is_created_at_head_in_wal_mode(db_url):
    store = open_store(db_url)
    assert current_revision(store.engine) == head_revision()
    path = db_url.removeprefix("sqlite:///")
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"tunefw_study", "tunefw_problem", "tunefw_trial", "tunefw_winner",
            "tunefw_meta", "tunefw_alembic_version"} <= tables


def test_a_plain_file_path_opens_that_sqlite_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store("sweeps.db").session() as s:
        q.create_study(s, _spec("by-path"))
    assert (tmp_path / "sweeps.db").exists()
    with open_store(f"sqlite:///{tmp_path / 'sweeps.db'}").session() as s:
        assert q.get_study(s, "by-path").name == "by-path"


def test_study_roundtrip_and_duplicate_name(db_url):
    store = open_store(db_url)
    with store.session() as s:
        q.create_study(s, _spec())
    with store.session() as s:
        study = q.get_study(s, "s")
        assert [p.key for p in study.problems] == ["64x64x64:bf16:TN", "128x256x512:bf16:TN"]
        assert q.get_study(s, None).name == "s"  # newest by default
    with pytest.raises(UserError, match="already exists"):
        with store.session() as s:
            q.create_study(s, _spec())
    with pytest.raises(UserError, match="study 'nope' not found in .*; known: s"):
        with store.session() as s:
            q.get_study(s, "nope")


def test_older_schema_is_refused_then_upgraded(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as conn:  # a database made by the first release (revision 0001)
        command.upgrade(alembic_config(engine, conn), "0001")
    engine.dispose()
    with pytest.raises(UserError) as exc:
        open_store(url)
    assert "older tunefw schema (0001)" in str(exc.value)
    assert "tunefw db upgrade" in str(exc.value)
    assert upgrade_store(url) == ("0001", head_revision())
    store = open_store(url)
    with store.session() as s:
        q.create_study(s, _spec())  # the upgraded schema takes the new columns


def test_unknown_schema_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "alien.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE tunefw_alembic_version (version_num VARCHAR(32) PRIMARY KEY)")
    con.execute("INSERT INTO tunefw_alembic_version VALUES ('9999')")
    con.commit()
    con.close()
    before = path.read_bytes()
    url = f"sqlite:///{path}"
    with pytest.raises(UserError, match="unknown or newer schema.*tunefw db upgrade"):
        open_store(url)
    with pytest.raises(UserError, match="unknown or newer schema"):
        upgrade_store(url)
    assert path.read_bytes() == before


def test_not_a_database(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError, match="cannot open database"):
        open_store(f"sqlite:///{path}")


def test_top_trials_honours_n_including_zero(db_url):
    from tunefw.outcome import Outcome, Status
    store = open_store(db_url)
    with store.session() as s:
        study = q.create_study(s, _spec())
        problem = study.problems[0]
        for i, tflops in enumerate([10.0, 30.0, 20.0, 30.0]):
            q.record_trial(s, study, problem, "mma_sm80", {"i": i}, f"key{i % 3}",
                           Outcome(Status.OK, tflops=tflops, cublas_tflops=10.0), "src", None)
    with store.session() as s:
        study = q.get_study(s, "s")
        assert q.top_trials(s, study.problems[0], 0, 0) == []
        top = q.top_trials(s, study.problems[0], 0, 3)  # one row per config, best first
        assert [(t.config_key, t.tflops) for t in top] == [("key1", 30.0), ("key0", 30.0),
                                                           ("key2", 20.0)]
