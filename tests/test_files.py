"""Files (issue 16): read-only commands never write or create a database, a missing or wrong
database path is one line naming it, db upgrade never creates, no 0-byte leftovers, and
Optuna's tables exist as soon as a study is created."""
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tunefw.cli.app import run
from tunefw.errors import UserError
from tunefw.export.files import write_atomic
from tunefw.store import open_store, upgrade_store

from conftest import cli_in_process as _cli, one_line_error as _one_line, REPO
from pgdb import pg_url  # noqa: F401  (fixture)

READ_COMMANDS = [
    ("study", "list"), ("study", "show", "s"), ("status",), ("trial", "show", "1"),
    ("trial", "list", "s"),
    ("export", "{tmp}/out.json", "--study", "s"), ("report", "s", "--html", "{tmp}/r.html"),
]
NEEDS_A_DATABASE = READ_COMMANDS + [("study", "delete", "s"), ("db", "upgrade"),
                                    ("launch", "s", "--backend", "sim")]


def _files(tmp: Path) -> list[str]:
    return sorted(p.name for p in tmp.iterdir())


def _args(cmd, tmp):
    return [a.format(tmp=tmp) for a in cmd]


@pytest.mark.parametrize("cmd", NEEDS_A_DATABASE, ids=" ".join)
def test_missing_database_is_an_error_naming_it_and_nothing_is_created(capsys, tmp_path, cmd,
                                                                       monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default ./tunefw.db must not appear either
    monkeypatch.delenv("TUNEFW_DB", raising=False)
    for db in (str(tmp_path / "typo.db"), None):
        code, _, err = _cli(capsys, *(["--db", db] if db else []), *_args(cmd, tmp_path))
        _one_line(code, err, "typo.db" if db else "tunefw.db")
        assert "no such database file" in err
        assert _files(tmp_path) == []


def test_study_create_says_where_it_creates_the_database(capsys, tmp_path):
    db = tmp_path / "new.db"
    code, _, err = _cli(capsys, "--db", str(db), "study", "create", "s", "--shape", "64x64x64")
    assert code == 0 and f"created database sqlite:///{db}" in err
    code, _, err = _cli(capsys, "--db", str(db), "study", "create", "t", "--shape", "64x64x64")
    assert code == 0 and "created database" not in err


@pytest.mark.parametrize("where", ["/dev/null", "{tmp}/text.txt", "{tmp}/nodir/x.db", "{tmp}"])
@pytest.mark.parametrize("cmd", [("study", "list"), ("db", "upgrade"),
                                 ("study", "create", "s", "--shape", "64x64x64")], ids=" ".join)
def test_wrong_database_paths_give_one_line(capsys, tmp_path, where, cmd):
    (tmp_path / "text.txt").write_text("not a database\n" * 100)
    before = _files(tmp_path)
    db = where.format(tmp=tmp_path)
    code, _, err = _cli(capsys, "--db", db, *cmd)
    _one_line(code, err, db)
    assert _files(tmp_path) == before
    assert (tmp_path / "text.txt").read_text() == "not a database\n" * 100


def test_db_upgrade_never_creates(capsys, tmp_path):
    empty = tmp_path / "empty.db"
    sqlite3.connect(empty).close()  # an existing file without tunefw's tables
    before = empty.read_bytes()
    code, _, err = _cli(capsys, "--db", str(empty), "db", "upgrade")
    _one_line(code, err, "no tunefw database there; nothing to upgrade")
    assert empty.read_bytes() == before
    with pytest.raises(UserError, match="no such database file"):
        upgrade_store(str(tmp_path / "missing.db"))
    assert not (tmp_path / "missing.db").exists()
    assert run(["--db", str(tmp_path / "t.db"), "study", "create", "s", "--shape", "8x8x8"]) == 0
    capsys.readouterr()
    code, out, _ = _cli(capsys, "--db", str(tmp_path / "t.db"), "db", "upgrade")
    assert code == 0 and "already current" in out


@pytest.fixture
def seeded(capsys, tmp_path):
    db = tmp_path / "seeded.db"
    assert run(["--db", str(db), "study", "create", "s", "--shape", "64x64x64"]) == 0
    capsys.readouterr()
    return db


@pytest.mark.parametrize("cmd", READ_COMMANDS, ids=" ".join)
def test_read_only_commands_leave_the_database_bytes_alone(capsys, tmp_path, seeded, cmd):
    before = {p: p.read_bytes() for p in tmp_path.iterdir()}
    run(["--db", str(seeded), *_args(cmd, tmp_path)])
    capsys.readouterr()
    after = {p: p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("seeded")}
    assert after == {p: b for p, b in before.items() if p.name.startswith("seeded")}


def test_read_only_store_refuses_writes(seeded):
    store = open_store(str(seeded), create=False, readonly=True)
    with pytest.raises(Exception, match="readonly"):
        with store.session() as s:
            s.execute(__import__("sqlalchemy").text("DELETE FROM tunefw_study"))
    store.close()


def _read_only_mount(src: Path, dst: Path) -> bool:
    dst.mkdir()
    ok = subprocess.run(["mount", "--bind", str(src), str(dst)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,ro,bind", str(dst)],
                             capture_output=True).returncode == 0:
        return True
    if ok:
        subprocess.run(["umount", "-l", str(dst)], capture_output=True)
    return False


def test_read_only_database_file_serves_the_read_only_commands(capsys, tmp_path, seeded):
    """A database on a read-only mount (or a file without write permission, for non-root)."""
    ro = tmp_path / "ro"
    if os.geteuid() == 0:
        src = tmp_path / "src"
        src.mkdir()
        os.replace(seeded, src / "seeded.db")
        if not _read_only_mount(src, ro):
            pytest.skip("root without mount: cannot make a read-only file")
        db = ro / "seeded.db"
    else:
        seeded.chmod(0o444)
        tmp_path.chmod(0o555)
        db = seeded
    try:
        for cmd in READ_COMMANDS[:4] + [("export", str(tmp_path.parent / f"{tmp_path.name}.json"),
                                         "--study", "s")]:
            code, out, err = _cli(capsys, "--db", str(db), *cmd)
            assert "readonly" not in err and "internal error" not in err, err
            assert code in (0, 1), err  # 1: 'trial 1 not found' / 'no OK trial' are answers
        for cmd in (("study", "delete", "s"), ("db", "upgrade"), ("launch", "s", "--backend", "sim")):
            code, _, err = _cli(capsys, "--db", str(db), *cmd)
            _one_line(code, err, "read-only")
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", "-l", str(ro)], capture_output=True)
        else:
            tmp_path.chmod(0o755)


def test_failed_report_leaves_no_file(capsys, tmp_path, seeded):
    code, _, err = _cli(capsys, "--db", str(seeded), "report", "ghost", "--html",
                        str(tmp_path / "r.html"))
    _one_line(code, err, "ghost")
    assert [f for f in _files(tmp_path) if not f.startswith("seeded.db")] == []


def test_write_atomic_leaves_nothing_on_failure(tmp_path, monkeypatch):
    def boom(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(UserError, match="cannot write"):
        write_atomic(tmp_path / "x.html", "<html>")
    assert _files(tmp_path) == []


def test_optuna_tables_exist_right_after_study_create(seeded):
    url = f"sqlite:///{seeded}"
    tables = {r[0] for r in sqlite3.connect(seeded).execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"version_info", "studies", "trials", "alembic_version"} <= tables
    storage = optuna.storages.RDBStorage(url, skip_table_creation=True)  # as the dashboard does
    assert storage.get_all_studies() == []
    assert optuna.get_all_study_summaries(url) == []


FIRST_LAUNCH = """
import sys, time
from tunefw.store import open_store
from tunefw.store.files import optuna_storage
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
store = open_store(sys.argv[1])
optuna_storage(store.url, store.engine).engine.dispose()
"""


def _first_opens(url: str, n: int = 4) -> list[str]:
    """n processes open a fresh database and its Optuna storage at the same moment (what two
    first launches do before their sweeps); the stderr of those that failed."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    start = time.time() + 4.0  # every process imported and waiting by then
    procs = [subprocess.Popen([sys.executable, "-c", FIRST_LAUNCH, url, str(start)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(n)]
    results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    return [err.strip().splitlines()[-1] for code, err in results if code != 0]


def test_concurrent_first_opens_of_a_fresh_sqlite_database(tmp_path):
    assert _first_opens(f"sqlite:///{tmp_path / 'fresh.db'}") == []


def test_concurrent_first_launches_on_a_fresh_postgresql_database(pg_url):
    """Two studies launched at once on a new database: one died with UniqueViolation while
    Optuna's (or tunefw's) tables were created."""
    assert _first_opens(pg_url, 6) == []
    store = open_store(pg_url, create=False)
    assert optuna.storages.RDBStorage(pg_url, skip_table_creation=True).get_all_studies() == []
    store.close()


def test_a_database_without_optuna_tables_gets_them_under_the_lock(tmp_path):
    """Databases made before Optuna's tables were created up front: the first launches add
    them, one at a time."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    open_store(url).close()
    con = sqlite3.connect(tmp_path / "old.db")
    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'").fetchall():
        if not name.startswith("tunefw_"):
            con.execute(f'DROP TABLE "{name}"')
    con.commit()
    con.close()
    assert _first_opens(url) == []
