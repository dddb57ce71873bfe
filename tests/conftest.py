"""Shared fixtures: an isolated database per test, the CLI as a subprocess, GPU skipping."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture
def cli():
    return run_cli


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
