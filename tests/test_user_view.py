"""The user's view: --db where people type it, and tables that survive a pipe."""
from __future__ import annotations

from tunefw.cli.app import hoist_db
from conftest import invoke_cli


def test_db_moves_to_the_front_from_anywhere():
    assert hoist_db(["study", "show", "q", "--db", "x.db"]) == ["--db", "x.db", "study", "show", "q"]
    assert hoist_db(["export", "--db=y.db", "out.json"]) == ["--db=y.db", "export", "out.json"]
    assert hoist_db(["--db", "a.db", "study", "list"]) == ["--db", "a.db", "study", "list"]
    assert hoist_db(["trial", "show", "--", "--db", "z"]) == ["trial", "show", "--", "--db", "z"]
    assert hoist_db(["study", "show", "--db"]) == ["study", "show", "--db"]  # Typer says what is missing


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
