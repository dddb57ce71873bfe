"""Frozen databases of each released schema revision (tests/data/schema/rev*.sqlite3, made by
make.py there and never regenerated) upgrade to head with every row intact."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from conftest import invoke_cli
from tunefw.errors import UserError
from tunefw.outcome import Outcome, Status
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.store.lease import take
from tunefw.store.models import LaunchLease, Trial, Winner
from tunefw.store.session import MIGRATIONS, current_revision, head_revision

FROZEN = Path(__file__).resolve().parent / "data" / "schema"
REVISIONS = sorted(p.name.split("_", 1)[0] for p in (MIGRATIONS / "versions").glob("[0-9]*.py"))


def test_every_released_revision_has_a_frozen_database() -> None:
    """A new migration needs its frozen file (python3 tests/data/schema/make.py REVISION)."""
    assert REVISIONS and REVISIONS[-1] == head_revision()
    assert sorted(p.stem.removeprefix("rev") for p in FROZEN.glob("rev*.sqlite3")) == REVISIONS


def _copy(revision: str, tmp_path: Path) -> tuple[str, Path]:
    path = tmp_path / f"rev{revision}.db"
    shutil.copyfile(FROZEN / f"rev{revision}.sqlite3", path)
    con = sqlite3.connect(path)
    (stored,) = con.execute("SELECT version_num FROM tunefw_alembic_version").fetchone()
    con.close()
    assert stored == revision, "the frozen file is not at the revision its name says"
    return f"sqlite:///{path}", path


@pytest.mark.parametrize("revision", REVISIONS)
def test_frozen_database_upgrades_to_head_with_its_rows(revision: str, tmp_path: Path) -> None:
    url, path = _copy(revision, tmp_path)
    if revision != head_revision():
        before = path.read_bytes()
        with pytest.raises(UserError, match=rf"older tunefw schema \({revision}\)"):
            open_store(url)
        assert path.read_bytes() == before  # refusing touched nothing
    upgraded = invoke_cli("--db", url, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    store = open_store(url)
    assert current_revision(store.engine) == head_revision()
    with store.session() as s:
        study = q.get_study(s, "frozen")
        assert (study.round, study.backend, study.fingerprint["name"]) == (0, "cuda", "NVIDIA H200")
        assert study.space_hashes == {"mma_sm80": "aaaa", "wgmma_sm90": "bbbb"}
        assert [(p.key, p.label, p.gate) for p in study.problems] == [
            ("4096x4096x4096:bf16:TN", "", "none"), ("128x6144x4096:bf16:TN", "qkv", "none")]
        trials = s.query(Trial).order_by(Trial.id).all()
        lost = revision >= "0003"  # a WORKER_LOST row and its retry, linked by retry_of
        assert [(t.id, t.problem_id, t.family, t.status, t.tflops, t.cublas_tflops)
                for t in trials] == [
            (1, 1, "wgmma_sm90", "OK", 687.2, 701.5),
            (2, 1, "mma_sm80", "WRONG_ANSWER", None, None),
            (3, 2, "mma_sm80", "INVALID", None, None),
            (4, 2, "mma_sm80", "OK", 128.9, 160.2)] + ([
            (5, 2, "mma_sm80", "WORKER_LOST", None, None),
            (6, 2, "mma_sm80", "OK", 110.0, 160.2)] if lost else [])
        assert trials[0].config["CLUSTER_M"] == 2 and trials[1].log == "3 rows over their limit"
        # columns a later revision added: their values where the file had them, else defaults
        assert [t.attempts for t in trials][:4] == (
            [1, 1, 1, 1] if revision == "0001" else [1, 2, 1, 1])
        assert study.stats == (None if revision == "0001" else {"trials": 4, "trials_per_s": 3.1})
        assert [t.retry_of for t in trials] == [None] * 4 + ([None, 5] if lost else [])
        ptxas = [(t.ptxas_regs, t.ptxas_smem_bytes, t.ptxas_spill_bytes) for t in trials]
        assert ptxas[:2] == ([(168, 0, 0), (122, 0, 16)] if revision >= "0004"
                             else [(None, None, None)] * 2)  # older files compiled unrecorded
        assert ptxas[2:] == [(None, None, None)] * (len(trials) - 2)
        (winner,) = s.query(Winner).all()
        assert (winner.problem_id, winner.trial_id, winner.tflops, winner.confirmed) == (
            1, 1, 690.0, True)
        q.record_trial(s, study, study.problems[1], "mma_sm80", {"BM": 64}, "k-new", _ok(),
                       "src", 2)  # and it takes new rows
        leases = [(row.study_id, row.host, row.pid, row.beats)
                  for row in s.query(LaunchLease).all()]
        assert leases == ([(1, "gpu-node-7", 4242, 12)] if revision >= "0005" else [])
    lease = take(store.engine, 1, "frozen")  # a launch takes the lease (over a killed one's)
    assert (lease.took_over is not None) == (revision >= "0005")
    lease.release()
    store.close()
    shown = json.loads(invoke_cli("--db", url, "study", "show", "frozen", "--json").stdout)
    new_id = 7 if lost else 5
    assert [(p["evaluated"], p["ok"], p["best"]["trial_id"]) for p in shown["problems"]] == [
        (2, 1, 1), (3 if lost else 2, 3 if lost else 2, new_id)]  # the new row: 0.94x, best
    assert shown["problems"][1]["outcomes"] == (  # a WORKER_LOST row is shown, never counted
        {"INVALID": 1, "OK": 3, "WORKER_LOST": 1} if lost else {"INVALID": 1, "OK": 2})


def _ok() -> Outcome:
    return Outcome(Status.OK, tflops=150.0, cublas_tflops=160.0, evaluator="cuda")
