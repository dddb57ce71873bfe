"""SIGTERM to a launch stops it like Ctrl-C (issue 16): one line on stderr, a non-zero exit,
no Ray stack dump, and launching again resumes to exactly the budget (on the session's Ray head)."""
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from conftest import REPO, invoke_cli, launch_on

STUDY = """name: term
trials: 12
sampler: random
timeout_s: 30
problems: [{M: 128, N: 128, K: 128}]
sim: {trial_seconds: 0.25}
"""


def _rows(db) -> int:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
        try:
            return con.execute("SELECT count(*) FROM tunefw_trial WHERE status != 'INVALID'"
                               ).fetchone()[0]
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def test_sigterm_stops_a_launch_in_one_line_and_it_resumes(tmp_path, ray_head):
    db = tmp_path / "t.db"
    (tmp_path / "s.yaml").write_text(STUDY)
    assert invoke_cli("study", "create", "term", "--from", str(tmp_path / "s.yaml"),
                      db=str(db)).returncode == 0
    env = {k: v for k, v in os.environ.items() if k != "TUNEFW_DB"}
    launch = subprocess.Popen(
        [sys.executable, "-m", "tunefw", "--db", str(db), "launch", "term", "--backend", "sim",
         "--gpus", "1", "--address", ray_head.address], cwd=REPO, env=dict(env, **ray_head.env),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while _rows(db) < 2 and launch.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert launch.poll() is None, launch.communicate()
    launch.send_signal(signal.SIGTERM)
    _, err = launch.communicate(timeout=120)
    assert launch.returncode == 143, err
    lines = err.strip().splitlines()
    assert lines == ["tunefw: terminated (SIGTERM); trials in flight were discarded, "
                     "launch again to resume"], err
    assert "Traceback" not in err
    done = _rows(db)
    assert 2 <= done < 12
    again = launch_on(ray_head, "term", "--backend", "sim", "--gpus", "1", db=str(db))
    assert again.returncode == 0, again.stderr
    shown = json.loads(invoke_cli("study", "show", "term", "--json", db=str(db)).stdout)
    assert shown["problems"][0]["evaluated"] == 12


def test_ctrl_c_while_the_command_loads_is_one_line_and_130(monkeypatch, capsys):
    # before run_command's own handling: e.g. during the imports of typer, rich or SQLAlchemy
    import tunefw.cli.app
    from tunefw.cli import entry

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(tunefw.cli.app, "run", interrupted)
    monkeypatch.setattr("sys.argv", ["tunefw", "study", "list"])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "tunefw: interrupted before the command started; nothing was run\n"


@pytest.fixture
def stop_handlers(monkeypatch):
    """The launch's SIGINT/SIGTERM handlers installed in this process, with a state of their
    own; the handlers before are put back after."""
    from tunefw.tune import interrupt
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(interrupt, "_state", {"terminated": False, "installed": False,
                                              "deferring": 0, "pending": False})
    interrupt.stop_on_sigterm()
    yield interrupt
    for sig, handler in before.items():
        signal.signal(sig, handler)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_inside_a_write_lands_once_the_write_has_committed(stop_handlers, sig, tmp_path):
    from tunefw.outcome import Outcome, Status
    from tunefw.store import open_store
    from tunefw.store import queries as q
    from tunefw.store.models import Trial
    from tunefw.study.spec import parse_study
    from tunefw.tune.recorder import Recorder, Row

    store = open_store(f"sqlite:///{tmp_path / 'stop.db'}")
    with store.session() as s:
        study = q.create_study(s, parse_study({"name": "x", "problems": ["128x128x128"]}, "t"))
        study_id, problem_id = study.id, study.problems[0].id

    def fence(s):  # the signal arrives between the transaction's first and last statement
        os.kill(os.getpid(), sig)

    recorder = Recorder(store, study_id, "sim", fence)
    with pytest.raises(KeyboardInterrupt):
        recorder.trial(Row(problem_id, "mma_sm80", {"BM": 64}, "k"),
                       Outcome(Status.OK, tflops=1.0, cublas_tflops=2.0), None)
    with store.session() as s:
        assert s.query(Trial).count() == 1  # written whole, then stopped
    assert stop_handlers.terminated() is (sig == signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):  # outside a write a stop lands at once
        os.kill(os.getpid(), sig)
        time.sleep(5)
    store.close()


@pytest.mark.parametrize("sig, code, said", [(None, 130, "interrupted"),
                                             (signal.SIGTERM, 143, "terminated (SIGTERM)")])
def test_a_stop_that_cut_a_database_call_ends_as_the_stop(monkeypatch, sig, code, said):
    """CI saw psycopg refuse the cleanup of a connection a Ctrl-C had cut mid-statement
    ("can't change 'autocommit' now: connection in transaction status ACTIVE"): the command
    ended as an internal error (3) instead of the interrupt it was."""
    import io

    import typer
    from rich.console import Console

    from tunefw.cli import exit as cli_exit
    from tunefw.tune import interrupt

    monkeypatch.setattr(interrupt, "_state", {"terminated": sig == signal.SIGTERM,
                                              "installed": False, "deferring": 0,
                                              "pending": False})
    app = typer.Typer()

    @app.command()
    def cut() -> None:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:  # the connection's cleanup fails while the stop unwinds
            raise RuntimeError("can't change 'autocommit' now: connection in transaction "
                               "status ACTIVE")

    @app.command()
    def bug() -> None:
        raise RuntimeError("a real bug")

    out = io.StringIO()
    err = Console(file=out, width=200)
    command = typer.main.get_command(app)
    assert cli_exit.run_command(command, ["cut"], err) == code
    assert out.getvalue() == (f"tunefw: {said}; trials in flight were discarded, launch again "
                              "to resume\n")
    monkeypatch.delenv("TUNEFW_DEBUG", raising=False)
    assert cli_exit.run_command(command, ["bug"], err) == 3  # no stop in its chain: a bug
    assert "internal error: RuntimeError: a real bug" in out.getvalue()
