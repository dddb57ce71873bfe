"""The user's view: --db where people type it (and in the help of every command that opens the
database), and tables that survive a pipe."""
from __future__ import annotations

import json
import re

import pytest

from conftest import invoke_cli

# every command that opens the database, and the ones that never do (they refuse --db after them)
DATABASE = [("study", "create"), ("study", "list"), ("study", "show"), ("study", "delete"),
            ("trial", "list"), ("trial", "show"), ("launch",), ("export",), ("bench",),
            ("report",), ("status",), ("db", "upgrade")]
NO_DATABASE = [("family",), ("compile",), ("search-eval",), ("verify",),
               ("dispatch", "explain"), ("dispatch", "calibrate"), ("dispatch", "schema")]


def _leaves(command, path=()) -> list[tuple[str, ...]]:
    subs = getattr(command, "commands", None)
    if not subs:
        return [path]
    return [leaf for name, sub in sorted(subs.items()) for leaf in _leaves(sub, (*path, name))]


def test_the_lists_name_every_command():
    import typer

    from tunefw.cli.app import app
    assert sorted(_leaves(typer.main.get_command(app))) == sorted(DATABASE + NO_DATABASE)


@pytest.mark.parametrize("command", DATABASE + NO_DATABASE, ids=" ".join)
def test_every_option_and_argument_reads_as_words_in_the_help(command):
    """Each option's value is named (N, FILE, bf16|fp16), never a type (<int>, <path>, ...);
    each argument by a word (STUDY, DISPATCH.json), not the parameter's name."""
    shown = invoke_cli(*command, "--help", env={"COLUMNS": "200"}).stdout.splitlines()
    section = None
    for line in shown:
        if line in ("Arguments:", "Options:"):
            section = line
        elif section and line.startswith("  ") and not line.startswith("   "):
            first, *rest = line.split()
            if section == "Options:":  # rest: a named value and the help, or the help alone
                assert not (rest and rest[0].startswith("<")), line
            else:
                assert not re.fullmatch(r"[a-z_]+(\.\.\.)?", first), line


@pytest.mark.parametrize("command", DATABASE, ids=" ".join)
def test_db_is_in_the_help_of_every_command_that_opens_the_database(command):
    shown = invoke_cli(*command, "--help")
    assert shown.returncode == 0
    line = next(line for line in shown.stdout.splitlines() if line.strip().startswith("--db"))
    assert line.split()[:3] == ["--db", "URL", "Database:"]


@pytest.mark.parametrize("command", NO_DATABASE, ids=" ".join)
def test_a_command_without_a_database_has_no_db_option(command):
    assert "--db" not in invoke_cli(*command, "--help").stdout


def test_db_after_the_subcommand_and_tables_whole_in_a_pipe(cli, tmp_path):
    db = f"sqlite:///{tmp_path / 'view.db'}"
    made = invoke_cli("study", "create", "a_rather_long_study_name", "--shape", "16x28672x4096",
                      "--shape", "4097x4096x4096", "--family", "wgmma_sm90", "--db", db)
    assert made.returncode == 0, made.stderr
    shown = cli("study", "show", "a_rather_long_study_name", "--db", db)  # stdout is a pipe
    assert shown.returncode == 0, shown.stderr
    assert "16x28672x4096 bf16" in shown.stdout and "4097x4096x4096 bf16" in shown.stdout
    assert "…" not in shown.stdout
    missing = invoke_cli("study", "show", "nope", "--db", db)
    assert missing.returncode != 0 and str(tmp_path / "view.db") in missing.stderr
    # --db before the subcommand, in the =URL form, and the later one winning
    assert invoke_cli("--db", db, "study", "show", "a_rather_long_study_name").returncode == 0
    listed = json.loads(invoke_cli("study", "list", f"--db={db}", "--json").stdout)
    assert [study["name"] for study in listed] == ["a_rather_long_study_name"]
    gone = tmp_path / "gone.db"
    later = invoke_cli("--db", str(gone), "study", "list", "--db", db)
    assert later.returncode == 0 and not gone.exists()
