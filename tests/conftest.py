"""Shared fixtures: an isolated database per test, the CLI in-process (Typer's CliRunner) or as a
subprocess where the process itself is tested, one Ray head for the session's launches, GPU
skipping."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
from rayhead import RayHead, start_ray_head, stop_ray_head

REPO = Path(__file__).resolve().parent.parent


def _has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def cubin_cache(tmp_path_factory) -> Iterator[Path]:
    """One cubin cache for the session (and the CLI processes it starts): a kernel two tests
    build is built once, and no run reads a cache an earlier run (or a user) left warm. Under
    pytest-xdist the workers share it: their base temp folders sit in one folder of this run
    (entries are written whole and renamed into place, so concurrent writers are safe)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.getbasetemp().parent / "cubin-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("cubin-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEFW_CACHE_DIR", str(path))
        yield path


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tunefw.db'}"


def run_cli(*args: str, db: str | None = None, env: dict | None = None, cwd: Path | None = None,
            timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `tunefw ARGS` as a user would, in a subprocess."""
    full_env = dict(os.environ)
    full_env.pop("TUNEFW_DB", None)
    if db:
        full_env["TUNEFW_DB"] = db
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "tunefw", *args], capture_output=True,
                          text=True, env=full_env, cwd=cwd or REPO, timeout=timeout)


@dataclass
class CliResult:
    """What a CLI run left: the exit code and both streams (like subprocess.CompletedProcess)."""

    returncode: int
    stdout: str
    stderr: str


def invoke_cli(*args: str, db: str | None = None, env: dict | None = None,
               cwd: Path | None = None) -> CliResult:
    """Run `tunefw ARGS` in this process through the real entry point (`tunefw.cli.entry.main`, which
    turns every error into one stderr line and an exit code), its streams and environment
    captured by Typer's CliRunner. For commands that start no Ray and no signals: seconds
    faster than a subprocess, which pays the interpreter and the imports each time."""
    from typer.testing import CliRunner

    from tunefw.cli.entry import main

    full_env: dict[str, str | None] = {"TUNEFW_DB": db}
    full_env.update(env or {})
    old_argv, old_cwd = sys.argv, os.getcwd()
    with CliRunner().isolation(env=full_env) as streams:
        sys.argv = ["tunefw", *args]
        os.chdir(cwd or REPO)
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.stdout.flush()  # print() output sits in the text wrapper until flushed
            sys.stderr.flush()
            sys.argv = old_argv
            os.chdir(old_cwd)
        stdout, stderr = streams[0].getvalue(), streams[1].getvalue()
    return CliResult(code, stdout.decode(), stderr.decode())


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory) -> Iterator[RayHead]:
    """The session's Ray head, started on first use: launches whose subject is not how a launch
    starts its own Ray join it (launch_on) and pay no Ray start-up and shutdown each."""
    head = start_ray_head(tmp_path_factory.mktemp("ray-head") / "head.log")
    try:
        yield head
    finally:
        stop_ray_head(head)


def launch_on(head: RayHead, *args: str, db: str,
              timeout: float = 300) -> subprocess.CompletedProcess:
    """`tunefw launch ARGS --address HEAD` as a user would, in a subprocess."""
    return run_cli("launch", *args, "--address", head.address, db=db, env=head.env,
                   timeout=timeout)


# A child inherits an ignored SIGINT (a suite started in the background by a non-interactive
# shell, `cmd &`, runs with SIGINT ignored, and so would every launch it starts): the launch a
# test sends Ctrl-C to starts with Python's own handler, as one started from a terminal does.
_AS_FROM_A_TERMINAL = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                       "from tunefw.cli.entry import main; main()")


def launch_argv(head: RayHead, *args: str) -> list[str]:
    """The command line of `tunefw launch ARGS` on the head, for tests that signal the process
    (their environment needs ``head.env`` too)."""
    return [sys.executable, "-c", _AS_FROM_A_TERMINAL, "launch", *args, "--address", head.address]


def db_rows(url: str, sql: str) -> list[tuple]:
    """The rows one SQL query reads from a SQLite database file."""
    con = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def db_dump(url: str) -> list[str]:
    """Every row of every table, to prove a failed command changed nothing."""
    path = url.removeprefix("sqlite:///")
    if not Path(path).exists():
        return []
    con = sqlite3.connect(path)
    try:
        return list(con.iterdump())
    finally:
        con.close()


# ---- storage backends: SQLite always, PostgreSQL where CI (or you) started a server -------------
POSTGRES_ENV = "TUNEFW_TEST_POSTGRES_URL"


@contextmanager
def fresh_postgres_database(server_url: str) -> Iterator[str]:
    """A new, empty database on the server of ``server_url`` for one test, dropped after it.
    A set but unreachable server fails the test: it never turns into a skip."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import OperationalError

    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    name = f"tunefw_t_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except OperationalError as exc:
        admin.dispose()
        pytest.fail(f"${POSTGRES_ENV}={server_url} is set but the server cannot be used: "
                    f"{str(exc).splitlines()[0]}", pytrace=False)
    try:
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path: Path) -> Iterator[str]:
    """An empty database URL on each backend the storage contract runs over."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'contract.db'}"
        return
    server = os.environ.get(POSTGRES_ENV)
    if not server:
        pytest.skip(f"${POSTGRES_ENV} is not set, so no PostgreSQL server to run the storage "
                    "contract on (.ci/run starts one and sets it)")
    with fresh_postgres_database(server) as url:
        yield url


# ---- rows made directly (where a Ray launch is not what a test is about) ------------------------
def seed_study(db_url: str, name: str, shapes: tuple[str, ...], trials: int = 5,
               fingerprints: dict[int, dict] | None = None, sim: dict | None = None) -> list[int]:
    """A study as a finished SIMULATED launch leaves it, written through the store API: per
    problem ``trials`` evaluated rows (OK with rising ratios, one WRONG_ANSWER), one INVALID row,
    and a confirmed winner (its best); ``fingerprints`` overrides the fingerprint of the
    problem at that index, ``sim`` is the study's simulator settings for later launches.
    Returns the winners' trial ids."""
    from tunefw.evaluate.sim import sim_fingerprint
    from tunefw.outcome import Outcome, Status
    from tunefw.store import open_store
    from tunefw.store import queries as q
    from tunefw.study.spec import parse_study
    from tunefw.templates import FAMILIES, config_key

    family = FAMILIES["mma_sm80"]
    configs = family.seed_configs()
    spec = parse_study({"name": name, "trials": trials, "problems": list(shapes), "sim": sim or {}},
                       "seed_study")
    store = open_store(db_url)
    winners = []
    with store.session() as s:
        study = q.create_study(s, spec)
        study.fingerprint, study.backend = sim_fingerprint(), "sim"
        study.stats = {"simulated": True, "trials": trials * len(shapes)}
        for i, problem in enumerate(study.problems):
            fp = (fingerprints or {}).get(i, sim_fingerprint())
            invalid = dict(configs[0], BM=999)
            q.record_trial(s, study, problem, family.family, invalid,
                           config_key(family.family, invalid),
                           Outcome(Status.INVALID, log="BM=999: not a declared value"), "", None)
            rows = []
            assert trials <= len(configs), "one distinct seed config per row"
            for n in range(trials):
                config = configs[n % len(configs)]
                outcome = (Outcome(Status.WRONG_ANSWER, log="1 rows over their limit",
                                   fingerprint=fp, gpu="0", evaluator="sim") if n == 1 else
                           Outcome(Status.OK, median_ms=1.0, min_ms=0.9, iqr_ms=0.01,
                                   tflops=100.0 + 10 * n, rel_err=1e-3, cublas_tflops=150.0,
                                   fingerprint=fp, gpu=str(n % 2), evaluator="sim"))
                rows.append(q.record_trial(s, study, problem, family.family, config,
                                           config_key(family.family, config), outcome,
                                           family.source_hash(), n))
            best = q.best_trial(s, problem, study.round)
            q.set_winner(s, problem, best, best.tflops, best.cublas_tflops, confirmed=True)
            winners.append(best.id)
    store.close()
    return winners


def cli_in_process(capsys, *args: str) -> tuple[int, str, str]:
    """`tunefw ARGS` run in this process (tunefw.cli.app.run): exit code, stdout, stderr."""
    from tunefw.cli.app import run
    code = run(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code: int, err: str, needle: str) -> None:
    """A refused command: non-zero exit, one line on stderr naming ``needle``, no traceback."""
    assert code not in (0, 3), err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err and "internal error" not in err


@pytest.fixture
def no_table():
    """tunefw::gemm with no dispatch table (torch.matmul / F.linear), restored after the test."""
    from tunefw.runtime import ops

    saved = dict(ops._state)
    ops._state.update(dispatcher=None, env_read=True)
    yield
    ops._state.clear()
    ops._state.update(saved)


@pytest.fixture
def llama():
    """A tiny random bf16 transformers Llama (2 layers, hidden 64, vocabulary 256), eval mode."""
    import torch

    transformers = pytest.importorskip("transformers", reason="needs transformers (pip install 'tunefw[hf]')")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
