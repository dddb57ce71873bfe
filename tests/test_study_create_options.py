"""`tunefw study create --seed/--timeout/--confirm-top`: stored as the study file's seed,
timeout_s and confirm_top, over a file's values, checked by the file's rules (one line naming
the option); the options' metavars read as words."""
from __future__ import annotations

import pytest
import yaml

from conftest import db_dump, invoke_cli, one_line_error
from tunefw.store import open_store
from tunefw.store import queries as q


def _spec(db_url: str, name: str) -> dict:
    store = open_store(db_url)
    with store.session() as s:
        spec = dict(q.get_study(s, name).spec)
    store.close()
    return spec


def test_the_options_are_stored_and_override_the_file(db_url, tmp_path):
    made = invoke_cli("study", "create", "a", "--shape", "256x256x256", "--seed", "7",
                      "--timeout", "12.5", "--confirm-top", "0", "--trials", "9", db=db_url)
    assert made.returncode == 0, made.stderr
    assert ("created study a: 1 problem(s), 9 trials each, sampler tpe, seed 7, timeout 12.5 s, "
            "confirm top 0") in made.stdout
    spec = _spec(db_url, "a")
    assert (spec["seed"], spec["timeout_s"], spec["confirm_top"], spec["trials"]) == (
        7, 12.5, 0, 9)
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump({"problems": ["256x256x256"], "seed": 3, "timeout_s": 30,
                                    "confirm_top": 2}))
    assert invoke_cli("study", "create", "b", "--from", str(path), "--seed", "11",
                      db=db_url).returncode == 0
    spec = _spec(db_url, "b")
    assert (spec["seed"], spec["timeout_s"], spec["confirm_top"]) == (11, 30.0, 2)


@pytest.mark.parametrize("args, needle", [
    (("--seed", "-1"), "--seed -1: expected an integer 0..4294967295"),
    (("--seed", "4294967296"), "--seed 4294967296: expected an integer 0..4294967295"),
    (("--timeout", "0"), "--timeout 0: expected a finite number of seconds > 0 and <= 86400"),
    (("--timeout", "nan"), "--timeout nan: expected a finite number of seconds"),
    (("--timeout", "inf"), "--timeout inf: expected a finite number of seconds"),
    (("--timeout", "86401"), "--timeout 86401: expected a finite number"),
    (("--confirm-top", "101"), "--confirm-top 101: expected an integer 0..100"),
    (("--confirm-top", "-2"), "--confirm-top -2: expected an integer 0..100"),
    (("--trials", "0"), "--trials 0: expected an integer 1..100000"),
    (("--seed", "one"), "Invalid value for '--seed'"),
])
def test_bad_values_are_one_line_and_change_nothing(db_url, args, needle):
    assert invoke_cli("study", "create", "base", "--shape", "64x64x64", db=db_url).returncode == 0
    before = db_dump(db_url)
    result = invoke_cli("study", "create", "x", "--shape", "64x64x64", *args, db=db_url)
    one_line_error(result.returncode, result.stderr, needle)
    assert db_dump(db_url) == before


def test_metavars_read_as_words():
    shown = invoke_cli("study", "create", "--help")
    assert shown.returncode == 0
    options = {line.split()[0]: line.split()[1] for line in shown.stdout.splitlines()
               if line.strip().startswith("--") and len(line.split()) > 1}
    assert {k: options[k] for k in ("--from", "--shape", "--family", "--trials", "--sampler",
                                    "--dtype", "--seed", "--timeout", "--confirm-top")} == {
        "--from": "FILE", "--shape": "MxNxK", "--family": "FAMILY", "--trials": "N",
        "--sampler": "tpe|random|grid|uniform|cmaes", "--dtype": "bf16|fp16", "--seed": "N",
        "--timeout": "SECONDS", "--confirm-top": "N"}
