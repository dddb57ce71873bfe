"""The launch lease end to end (SIMULATED device, the session's Ray head, on SQLite and
PostgreSQL): of two launches of one study at once exactly one runs and the other's one line
names it; the runner's heartbeat advances; a killed launch's lease is taken over by the next,
saying so; Ctrl-C and SIGTERM release it, as a normal exit does."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import pytest
import yaml
from sqlalchemy import create_engine, func, select

from conftest import REPO, invoke_cli, launch_argv
from rayhead import RayHead
from tunefw.store.lease import TABLE
from tunefw.store.models import Trial

pytestmark = pytest.mark.slow


def _create(url: str, tmp_path, trials: int) -> None:
    study = {"name": "two", "trials": trials, "sampler": "random", "timeout_s": 30,
             "problems": [{"M": 4096, "N": 4096, "K": 4096}], "sim": {"trial_seconds": 0.25}}
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(study))
    created = invoke_cli("--db", url, "study", "create", "two", "--from", str(path))
    assert created.returncode == 0, created.stderr


def _launch(url: str, head: RayHead) -> subprocess.Popen:
    """`tunefw launch two` on the head, in a process group of its own (for kill -9)."""
    return subprocess.Popen(launch_argv(head, "two", "--backend", "sim", "--gpus", "1"),
                            cwd=REPO, env=dict(os.environ, TUNEFW_DB=url, **head.env),
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)


def _leases(url: str) -> list[tuple[int, int]]:
    """(pid, beats) of each lease row."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(select(TABLE.c.pid, TABLE.c.beats))]
    finally:
        engine.dispose()


def _evaluated(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(Trial)
                               .where(Trial.status != "INVALID"))
    finally:
        engine.dispose()


def _wait_for(what: Callable[[], bool], procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 240
    while not what():
        assert time.monotonic() < deadline, "waited 240 s"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.2)


def test_two_launches_at_once_one_runs_and_the_other_names_it(store_url, tmp_path, ray_head):
    _create(store_url, tmp_path, trials=10)
    launches = [_launch(store_url, ray_head), _launch(store_url, ray_head)]
    beats: dict[int, int] = {}
    while any(p.poll() is None for p in launches):
        for pid, n in _leases(store_url):
            beats[pid] = max(n, beats.get(pid, 0))
        time.sleep(0.2)
    ended = {p.pid: (p.returncode, *p.communicate()) for p in launches}
    (winner,) = [pid for pid, (code, _, _) in ended.items() if code == 0]
    (loser,) = [pid for pid in ended if pid != winner]
    code, _, err = ended[loser]
    assert code == 1, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tunefw: error: study 'two' is being launched by "
                               f"{socket.gethostname()} pid {winner} since "), err
    assert beats.get(winner, 0) >= 2  # it beat while it ran (each recorded trial beats too)
    assert loser not in beats  # never held it
    assert _leases(store_url) == [] and _evaluated(store_url) == 10


def test_a_killed_launchs_lease_is_taken_over_and_signals_release_it(store_url, tmp_path,
                                                                     ray_head):
    _create(store_url, tmp_path, trials=200)
    killed = _launch(store_url, ray_head)
    _wait_for(lambda: _evaluated(store_url) >= 1, [killed])
    os.killpg(killed.pid, signal.SIGKILL)
    killed.communicate()
    assert [pid for pid, _ in _leases(store_url)] == [killed.pid]  # left behind
    for sig, code in ((signal.SIGINT, 130), (signal.SIGTERM, 143)):
        launch = _launch(store_url, ray_head)
        _wait_for(lambda: [pid for pid, _ in _leases(store_url)] == [launch.pid], [launch])
        done = _evaluated(store_url)
        _wait_for(lambda: _evaluated(store_url) > done, [launch])  # running, not starting
        launch.send_signal(sig)
        out, err = launch.communicate(timeout=120)
        assert launch.returncode == code, err
        assert _leases(store_url) == []  # released on the way out
        if sig == signal.SIGINT:
            assert (f"study two: took over the launch lease of {socket.gethostname()} pid "
                    f"{killed.pid} since ") in out and ": its process is gone" in out
    assert _evaluated(store_url) < 200
