"""The README's 'Using it' commands, read from the README itself, run in sequence in a fresh
folder on the SIMULATED device: each exits 0, all of them use the one default database file, and
their output outside a terminal has no cut cell or wrapped row. The budget is cut to one trial
per problem (the commands' own --trials); the launch joins the session's Ray head
(conftest.ray_head) with --backend sim, the other commands run in this process."""
from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from conftest import REPO, db_rows, invoke_cli, run_cli

pytestmark = pytest.mark.slow


def readme_commands(heading: str) -> list[list[str]]:
    """The commands of the first indented code block under ``## heading`` in README.md, split
    as a shell would, comments dropped."""
    lines = (REPO / "README.md").read_text().splitlines()
    start = lines.index(f"## {heading}") + 1
    block: list[list[str]] = []
    for line in lines[start:]:
        if line.startswith("    "):
            block.append(shlex.split(line, comments=True))
        elif block or line.startswith("#"):
            break
    return block


def _cut(stdout: str) -> list[str]:
    """Lines with a cell rich cut short."""
    return [line for line in stdout.splitlines() if "…" in line]


def test_the_readme_sequence_runs_on_one_database(tmp_path: Path, ray_head):
    commands = readme_commands("Using it")
    assert [c[:3] for c in commands] == [
        ["tunefw", "study", "create"], ["tunefw", "launch", "llama"],
        ["tunefw", "study", "show"], ["tunefw", "trial", "list"], ["tunefw", "export",
                                                                   "dispatch.json"]]
    shutil.copytree(REPO / "studies", tmp_path / "studies")  # a fresh clone's layout
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p), **ray_head.env}
    outputs = []
    for argv in commands:
        args = argv[1:]
        if args[:2] == ["study", "create"]:
            args += ["--trials", "1"]
        if args[0] == "launch":  # the session's head: at most its GPUs, the simulator
            gpus = args.index("--gpus") + 1
            args[gpus] = str(min(int(args[gpus]), ray_head.gpus))
            done = run_cli(*args, "--backend", "sim", "--address", ray_head.address, env=env,
                           cwd=tmp_path)
        else:
            done = invoke_cli(*args, cwd=tmp_path)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
        assert not _cut(done.stdout), _cut(done.stdout)
        outputs.append(done)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dispatch.json", "studies",
                                                          "tunefw.db"]
    assert outputs[0].stderr.splitlines()[0] == "created database sqlite:///tunefw.db"
    url = f"sqlite:///{tmp_path / 'tunefw.db'}"
    problems = db_rows(url, "SELECT key, label FROM tunefw_problem ORDER BY id")
    assert len(problems) == 56 and db_rows(url, "SELECT name FROM tunefw_study") == [("llama",)]
    shown = outputs[2].stdout.splitlines()
    rows = [line for line in shown if line.startswith("│")]
    assert len(rows) == len(problems)  # one line per problem: no row wrapped
    for (key, label), row in zip(problems, rows):
        m_n_k, dtype = key.split(":")[:2]
        assert row.startswith(f"│ {m_n_k} {dtype}") and f" {label} " in row
    listed = [line for line in outputs[3].stdout.splitlines() if line.startswith("│")]
    assert len(listed) == 10
    table = json.loads((tmp_path / "dispatch.json").read_text())
    assert len(table["entries"]) == len(problems)
