"""The private Typer hook tunefw's exit codes rely on: typer >= 0.20 carries its own copy of
click (typer._click) and exports none of its usage exceptions, so tunefw/cli/exit.py catches
them there. If the copy moves, a usage error would end as an internal error (exit 3); these tests
fail loudly first. The typer version range they were checked on is pinned in pyproject.toml."""
from __future__ import annotations

from importlib.metadata import version

from conftest import invoke_cli


def test_an_unknown_option_is_a_usage_error_of_one_line_and_exit_2():
    done = invoke_cli("study", "list", "--no-such-option")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["tunefw study list: error: No such option: "
                                                "--no-such-option"]


def test_a_missing_argument_is_a_usage_error_too():
    done = invoke_cli("verify")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert done.stderr.startswith("tunefw verify: error: Missing argument")


def test_the_installed_typer_is_in_the_checked_range():
    major, minor = (int(x) for x in version("typer").split(".")[:2])
    assert (0, 12) <= (major, minor) < (0, 30)
