"""The launch lease on each storage backend: of processes taking it at once exactly one holds it
and the others name that one; a stale lease (no heartbeat, or a dead pid on this host) is taken
over; the heartbeat advances; a launch that lost its lease writes no row; the row is gone after."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert, select

from conftest import REPO, invoke_cli
from tunefw.errors import UserError
from tunefw.outcome import Outcome, Status
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.store.lease import TABLE, LeaseLost, holder_of, take
from tunefw.store.models import Trial
from tunefw.study.spec import parse_study
from tunefw.tune.recorder import Recorder, Row


@pytest.fixture
def study(store_url):
    """(store, study id) of a one-problem study on each backend."""
    store = open_store(store_url)
    with store.session() as s:
        study = q.create_study(s, parse_study({"name": "l", "problems": ["128x128x128"]}, "t"))
        study_id = study.id
    yield store, study_id
    store.close()


def _lease_rows(store) -> list[dict]:
    with store.engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(TABLE)).mappings()]


def _plant(store, study_id: int, host: str, pid: int, beat_ago_s: float) -> None:
    """A lease row as another launch left it."""
    now = datetime.now(timezone.utc)
    with store.engine.begin() as conn:
        conn.execute(insert(TABLE).values(
            study_id=study_id, token="f" * 32, host=host, pid=pid, beats=3, timeout_s=60.0,
            started_at=now - timedelta(seconds=beat_ago_s + 30),
            beat_at=now - timedelta(seconds=beat_ago_s)))


TAKER = """
import sys, time
from tunefw.errors import UserError
from tunefw.store import open_store
from tunefw.store.lease import take
store = open_store(sys.argv[1], create=False)
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
try:
    lease = take(store.engine, 1, "l")
except UserError as exc:
    print(f"REFUSED {exc}", flush=True)
    sys.exit(1)
with lease:
    print("HELD", flush=True)
    sys.stdin.read()  # hold it until the test has every answer
"""


def test_of_launches_taking_the_lease_at_once_exactly_one_holds_it(study, store_url):
    store, _ = study
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    start = time.time() + 4.0  # every process imported and waiting by then
    procs = [subprocess.Popen([sys.executable, "-c", TAKER, store_url, str(start)], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    answers = {p.pid: p.stdout.readline().strip() for p in procs}
    for p in procs:
        p.stdin.close()
        p.wait(timeout=60)
    held = [pid for pid, line in answers.items() if line == "HELD"]
    assert len(held) == 1, answers
    host = socket.gethostname()
    for pid, line in answers.items():
        if pid != held[0]:
            assert line.startswith(f"REFUSED study 'l' is being launched by {host} pid "
                                   f"{held[0]} since "), line
    assert _lease_rows(store) == []  # released when the holder ended


def test_a_lease_without_heartbeat_elsewhere_is_taken_over(study):
    store, study_id = study
    _plant(store, study_id, "gpu-node-7", 4242, beat_ago_s=120)
    lease = take(store.engine, study_id, "l")
    assert lease.takeover_line().startswith(
        "study l: took over the launch lease of gpu-node-7 pid 4242 since ")
    assert lease.takeover_line().endswith(": no heartbeat for 120 s (timeout 60 s)")
    (row,) = _lease_rows(store)
    assert (row["host"], row["pid"], row["token"], row["beats"]) == (
        socket.gethostname(), os.getpid(), lease.token, 0)
    lease.release()
    assert _lease_rows(store) == []


def test_a_lease_of_a_dead_process_on_this_host_is_taken_over(study):
    store, study_id = study
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    _plant(store, study_id, socket.gethostname(), gone.pid, beat_ago_s=1)
    lease = take(store.engine, study_id, "l")
    assert lease.takeover_line().endswith(f"pid {gone.pid} since "
                                          f"{lease.took_over[0].started_at:%Y-%m-%d %H:%M:%S} "
                                          "UTC: its process is gone")
    lease.release()


def test_a_live_lease_refuses_another_launch_and_a_delete(study, store_url):
    store, study_id = study
    _plant(store, study_id, "gpu-node-7", 4242, beat_ago_s=5)
    with pytest.raises(UserError, match=r"^study 'l' is being launched by gpu-node-7 pid 4242 "
                                         r"since \S+ \S+ UTC \(last heartbeat \d+ s ago\)"):
        take(store.engine, study_id, "l")
    deleted = invoke_cli("--db", store_url, "study", "delete", "l")
    assert deleted.returncode == 1
    assert deleted.stderr.strip().startswith(
        "tunefw: error: study 'l' is being launched by gpu-node-7 pid 4242 since ")
    shown = invoke_cli("--db", store_url, "status")
    assert "launched by gpu-node-7 pid 4242 since " in shown.stdout
    (listed,) = json.loads(invoke_cli("--db", store_url, "status", "--json").stdout)
    assert (listed["lease"]["host"], listed["lease"]["pid"], listed["lease"]["stale"]) == (
        "gpu-node-7", 4242, None)
    assert [r["pid"] for r in _lease_rows(store)] == [4242]  # the refusals changed nothing


def test_the_heartbeat_advances_and_the_row_goes_on_release(study):
    store, study_id = study
    with take(store.engine, study_id, "l", timeout_s=0.3) as lease:  # a beat every 0.05 s
        first = _lease_rows(store)[0]
        deadline = time.monotonic() + 30
        while _lease_rows(store)[0]["beats"] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        now = _lease_rows(store)[0]
        assert now["beats"] >= 3 and now["token"] == lease.token
        with store.engine.connect() as conn:
            holder = holder_of(conn, study_id)
        assert holder.beat_at > holder.started_at
        assert now["started_at"] == first["started_at"]
    assert _lease_rows(store) == []


def test_a_launch_that_lost_its_lease_records_nothing(study):
    store, study_id = study
    lease = take(store.engine, study_id, "l")
    with store.engine.begin() as conn:  # what another launch's takeover does to the row
        conn.execute(TABLE.update().values(token="e" * 32, host="gpu-node-8", pid=77))
    with store.session() as s:
        problem_id = q.get_study(s, "l").problems[0].id
    recorder = Recorder(store, study_id, "sim", lease.fence)
    with pytest.raises(LeaseLost, match="lease was taken over by gpu-node-8 pid 77 since "):
        recorder.trial(Row(problem_id, "mma_sm80", {"BM": 64}, "k"),
                       Outcome(Status.OK, tflops=1.0, cublas_tflops=2.0), None)
    with store.session() as s:
        assert s.query(Trial).count() == 0
    lease.release()  # not its row any more: the new holder's stays
    assert [r["pid"] for r in _lease_rows(store)] == [77]
