"""The command line as a user meets it: help texts, and one-line errors that change nothing.

Commands run in-process (invoke_cli, through the real entry point); the few tests about the
process itself (the module entry point, a non-zero exit status) run it as a subprocess."""
import json

import pytest

from conftest import db_dump, invoke_cli, run_cli


def _one_line_error(result, needle):
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert needle in lines[0], lines[0]
    assert "Traceback" not in result.stderr + result.stdout


def test_help_lists_the_commands():
    result = run_cli("--help")  # a real process: `python -m tunefw` is the entry point
    assert result.returncode == 0
    for command in ("study", "launch", "export", "status", "compile", "trial", "db"):
        assert command in result.stdout


@pytest.mark.parametrize("args, options", [
    (("launch",), ("--gpus", "--backend", "--address", "--new-round")),
    (("export",), ("--study", "--format", "--allow-mixed-devices")),
    (("study", "create"), ("--from", "--shape", "--family", "--trials", "--seed", "--timeout",
                           "--confirm-top")),
    (("study", "show"), ("--json",)),
    (("study", "list"), ("--json",)),
    (("status",), ("--json",)),
    (("compile",), ("--arch", "--sample", "--check-sass", "--cache-dir", "--shape")),
    (("trial", "show"), ("--json",)),
    (("trial", "list"), ("--problem", "--outcome", "--top", "--json")),
])
def test_every_subcommand_explains_its_options(args, options):
    result = invoke_cli(*args, "--help")
    assert result.returncode == 0
    for option in options:
        assert option in result.stdout


@pytest.fixture
def seeded_db(db_url, tmp_path):
    result = invoke_cli("study", "create", "base", "--shape", "64x64x64", db=db_url)
    assert result.returncode == 0, result.stderr
    return db_url


@pytest.mark.parametrize("args, needle", [
    (("study", "create", "x", "--shape", "64x100x64"), "N=100"),
    (("study", "create", "x", "--shape", "64x64x0"), "K=0"),
    (("study", "create", "x", "--shape", "0x64x64"), "M=0"),
    (("study", "create", "x", "--shape", "64x64x64", "--family", "cutlass"), "unknown family 'cutlass'"),
    (("study", "create", "x", "--shape", "64x64x64", "--sampler", "bayes"), "sampler='bayes'"),
    (("study", "create", "base", "--shape", "64x64x64"), "already exists"),
    (("study", "show", "ghost"), "study 'ghost' not found"),
    (("launch", "ghost", "--backend", "sim"), "study 'ghost' not found"),
    (("launch", "base", "--backend", "cuda", "--gpus", "64"), "--gpus 64"),
    (("launch", "base", "--backend", "quantum"), "--backend 'quantum'"),
    (("export", "out.json", "--study", "base"), "no OK trial"),
    (("export", "out.json", "--study", "base", "--format", "xml"), "--format 'xml'"),
    (("trial", "show", "999"), "trial 999 not found"),
    (("launch", "--gpus", "two"), "Invalid value for '--gpus'"),
    (("study", "frobnicate"), "No such command"),
])
def test_bad_input_one_line_error_database_unchanged(seeded_db, tmp_path, args, needle):
    before = db_dump(seeded_db)
    result = invoke_cli(*args, db=seeded_db, cwd=tmp_path)
    _one_line_error(result, needle)
    assert db_dump(seeded_db) == before
    assert not (tmp_path / "out.json").exists()


def test_malformed_yaml_is_one_line_and_changes_nothing(seeded_db, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nproblems: [64x64x64\n")
    before = db_dump(seeded_db)
    _one_line_error(invoke_cli("study", "create", "x", "--from", str(bad), db=seeded_db),
                    "malformed YAML")
    assert db_dump(seeded_db) == before


@pytest.mark.parametrize("text, needle", [
    ('{"schema_version": 1, "entries": [', "not JSON"),
    ('{"schema_version": 7, "simulated": false, "fingerprint": {}, "entries": []}',
     "schema_version"),
    ('{"schema_version": 1, "simulated": false, "fingerprint": {}, "entries": [{"M": 64}]}',
     "entries[0]"),
])
def test_bad_dispatch_file_is_one_line_naming_the_file(seeded_db, tmp_path, text, needle):
    """`tunefw bench FILE` loads the table before it looks for a GPU: a broken file is refused
    with one line that names it and the problem."""
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    before = db_dump(seeded_db)
    result = invoke_cli("bench", str(bad), db=seeded_db, cwd=tmp_path)
    _one_line_error(result, str(bad))
    assert needle in result.stderr
    assert db_dump(seeded_db) == before


def test_unknown_schema_database_is_refused(tmp_path):
    import sqlite3
    path = tmp_path / "alien.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE tunefw_trial (id INTEGER PRIMARY KEY)")
    con.commit()
    con.close()
    before = path.read_bytes()
    result = invoke_cli("study", "list", db=f"sqlite:///{path}")
    _one_line_error(result, "tunefw db upgrade")
    assert path.read_bytes() == before


def test_study_create_show_json_and_delete(db_url, tmp_path):
    assert invoke_cli("study", "create", "s", "--from", "studies/quickstart.yaml", "--trials", "5",
                   db=db_url).returncode == 0
    shown = json.loads(invoke_cli("study", "show", "s", "--json", db=db_url).stdout)
    assert shown["name"] == "s"
    assert [(p["M"], p["N"], p["K"]) for p in shown["problems"]] == [
        (4096, 4096, 4096), (128, 6144, 4096), (2048, 4096, 14336)]
    assert all(p["evaluated"] == 0 and p["best"] is None for p in shown["problems"])
    assert "s" in invoke_cli("study", "list", db=db_url).stdout
    assert invoke_cli("study", "delete", "s", db=db_url).returncode == 0
    _one_line_error(invoke_cli("study", "show", "s", db=db_url), "not found")


@pytest.mark.slow
@pytest.mark.parametrize("family, arch", [("mma_sm80", "sm_80"), ("wgmma_sm90", "sm_90a")])
def test_compile_sample_passes_the_sass_check(tmp_path, family, arch):
    result = invoke_cli("compile", family, "--arch", arch, "--sample", "6", "--check-sass",
                        "--cache-dir", str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    assert "6 ok, 0 failed of 6" in result.stdout
    assert sum(line.startswith("ok ") for line in result.stdout.splitlines()) == 6


def test_failing_compile_command_exits_non_zero(tmp_path):
    result = invoke_cli("compile", "mma_sm80", "--arch", "sm_80", "--config", '{"BM": 7}')
    assert result.returncode != 0
    assert "BM=7" in result.stderr and len(result.stderr.strip().splitlines()) == 1
