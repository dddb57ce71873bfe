"""Export with --min-ratio, model tables, `study show` marks, and `tunefw dispatch explain /
calibrate / schema` (calibration with a fake timer)."""
import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tunefw.cli.app import app
from conftest import invoke_cli
from tunefw.errors import UserError
from tunefw.export import calibrate as cal
from tunefw.outcome import Outcome, Status
from tunefw.problem import GemmProblem
from tunefw.runtime.dispatch import load
from tunefw.runtime.rules import decide, lookup
from tunefw.store import open_store
from tunefw.store import queries as q
from tunefw.study.spec import parse_study
from tunefw.templates import FAMILIES

FP = {"name": "NVIDIA H200", "cc": 90, "sm_count": 132}
WG = dict(FAMILIES["wgmma_sm90"].default_config(), CLUSTER_M=1)
SRC = FAMILIES["wgmma_sm90"].source_hash()  # the trials measured today's kernel


@pytest.fixture
def tuned_db(db_url):
    """A model study (one layer over the M grid) with a winner per problem; some lose to cuBLAS."""
    spec = parse_study({"name": "m", "models": [{"name": "tiny", "hidden": 1024, "intermediate": 2048,
                                                 "qkv": 1536, "M": [300]}]}, "t")
    store = open_store(db_url)
    with store.session() as s:
        study = q.create_study(s, spec)
        for prow in study.problems:
            ratio = 0.8 if prow.M in (16, 300) else 1.05
            outcome = Outcome(Status.OK, tflops=100.0 * ratio, cublas_tflops=100.0,
                              fingerprint=FP, evaluator="cuda")
            trial = q.record_trial(s, study, prow, "wgmma_sm90", WG, "k", outcome, SRC, None)
            q.set_winner(s, prow, trial, trial.tflops, trial.cublas_tflops, confirmed=True)
    return db_url


def _run(*args):
    result = CliRunner().invoke(app, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def test_models_tune_each_layer_over_the_m_grid():
    spec = parse_study({"name": "m", "models": [{"hidden": 1024, "intermediate": 2048,
                                                 "qkv": 1536, "M": [300, 16]}]}, "t")
    ms = sorted({p.M for p in spec.problems})
    assert ms == sorted({2**i for i in range(14)} | {300})
    assert len(spec.problems) == 4 * 15 and spec.labels[0] == "model0.qkv"
    default = parse_study({"name": "m", "models": [{"hidden": 1024, "intermediate": 2048,
                                                   "qkv": 1536}]}, "t")
    assert len(default.problems) == 4 * 14
    with pytest.raises(UserError, match=r"t: models\[0\]\.M\[0\]=0: expected an integer 1\.\.2147483647"):
        parse_study({"name": "m", "models": [{"hidden": 8, "intermediate": 8, "qkv": 8, "M": [0]}]}, "t")


def test_export_ships_losses_as_cublas_routes(tuned_db, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFW_DB", tuned_db)
    out = tmp_path / "d.json"
    assert _run("export", str(out), "--study", "m").exit_code == 0
    table = load(out)
    assert table.min_ratio == 1.0
    lost = {(e.M, e.N, e.K) for e in table.entries if e.is_cublas}
    assert lost == {(m, n, k) for m in (16, 300) for n, k in
                    [(1536, 1024), (1024, 1024), (4096, 1024), (1024, 2048)]}
    e = next(e for e in table.entries if e.M == 300 and e.N == 1536)
    assert (e.label, e.reason) == ("tiny.qkv", "confirmed ratio 0.800 < min ratio 1")
    # served: the exact loss and the M in its bucket are cuBLAS; an M below a winner its kernel
    assert decide(table, GemmProblem(300, 1536, 1024)).path == "cublas"
    assert decide(table, GemmProblem(290, 1536, 1024)).rule == "bucket"
    assert lookup(table, GemmProblem(290, 1536, 1024)) is None
    assert lookup(table, GemmProblem(400, 1536, 1024)).M == 512
    # --min-ratio 0.5 keeps them; CSV and the header carry the route and the ratio
    assert _run("export", str(out), "--study", "m", "--min-ratio", "0.5").exit_code == 0
    assert not any(e.is_cublas for e in load(out).entries)
    _run("export", str(tmp_path / "d.csv"), "--study", "m", "--format", "csv")
    rows = list(csv.DictReader(io.StringIO((tmp_path / "d.csv").read_text())))
    assert {r["route"] for r in rows if r["M"] == "16"} == {"cublas"}
    assert {r["ratio"] for r in rows if r["M"] == "16"} == {"0.8000"}
    _run("export", str(tmp_path / "d.h"), "--study", "m", "--format", "cpp")
    assert "true, 80.0, 100.0, 0.8, " in (tmp_path / "d.h").read_text()


def test_export_says_how_many_entries_are_not_confirmed_yet(tuned_db, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFW_DB", tuned_db)
    said = _run("export", str(tmp_path / "d.json"), "--study", "m").stdout
    assert "not confirmed" not in said
    con = sqlite3.connect(tuned_db.removeprefix("sqlite:///"))
    con.execute("UPDATE tunefw_winner SET confirmed = 0 WHERE problem_id IN (1, 2)")
    con.commit()
    con.close()
    said = _run("export", str(tmp_path / "d.json"), "--study", "m").stdout.splitlines()
    assert said[-1] == ("2 of them from screened figures, not confirmed yet: launch the study "
                        "again to confirm them")


def test_study_show_marks_problems_exported_as_cublas(tuned_db, monkeypatch):
    monkeypatch.setenv("TUNEFW_DB", tuned_db)
    shown = json.loads(_run("study", "show", "m", "--json").stdout)
    routes = {(p["M"], p["N"]): p["export_route"] for p in shown["problems"]}
    assert routes[(16, 1536)] == "cublas" and routes[(32, 1536)] == "kernel"
    from rich.console import Console
    import tunefw.cli.study
    monkeypatch.setattr(tunefw.cli.study, "out", Console(width=300))
    text = _run("study", "show", "m").stdout
    assert "cuBLAS (loses)" in text


def test_a_winner_measured_with_another_kernel_source_is_exported_as_cublas(tuned_db, tmp_path,
                                                                             monkeypatch):
    """The kernel today's source builds was never timed or verified: export ships cuBLAS for it
    (JSON and header alike) and `study show` says why; the other winners are untouched."""
    con = sqlite3.connect(tuned_db.removeprefix("sqlite:///"))
    con.execute("UPDATE tunefw_trial SET source_hash = '0123456789abcdef' WHERE problem_id IN "
                "(SELECT id FROM tunefw_problem WHERE M = 32 AND N = 1536)")
    con.commit()
    con.close()
    monkeypatch.setenv("TUNEFW_DB", tuned_db)
    assert _run("export", str(tmp_path / "d.json"), "--study", "m").exit_code == 0
    table = load(tmp_path / "d.json")
    stale = next(e for e in table.entries if (e.M, e.N) == (32, 1536))
    assert stale.is_cublas and stale.reason == (
        f"wgmma_sm90's kernel source changed since trial {stale.trial_id} was measured "
        f"(0123456789abcdef -> {SRC}): launch a new round to tune it again")
    kept = next(e for e in table.entries if (e.M, e.N) == (64, 1536))
    assert not kept.is_cublas and kept.source_hash == SRC  # what a runtime checks its own against
    shown = json.loads(_run("study", "show", "m", "--json").stdout)
    why = {(p["M"], p["N"]): (p["export_route"], p["export_why"]) for p in shown["problems"]}
    assert why[(32, 1536)] == ("cublas", "source changed") and why[(16, 1536)] == ("cublas", "loses")
    assert why[(64, 1536)] == ("kernel", None)


def _fake_timer(ratios):
    calls = []

    def measure(entry, problem):
        calls.append((entry.M, problem.M))
        return 100.0 * ratios.get(problem.M, 1.1), 100.0
    return measure, calls


def test_calibrate_records_evidence_and_routes_losses(tuned_db, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFW_DB", tuned_db)
    path = tmp_path / "d.json"
    _run("export", str(path), "--study", "m")
    shapes = tmp_path / "shapes.txt"
    shapes.write_text("# M in between\n600x1536x1024\n700x1536x1024 bf16\n1024x1536x1024\n"
                      "3000x1536x1024\n200x1536x1024\n900x1536x1024\n")
    measure, calls = _fake_timer({600: 0.7})
    monkeypatch.setattr(cal, "cuda_measure", lambda *a: measure)
    result = _run("dispatch", "calibrate", str(path), "--shapes", str(shapes))
    assert result.exit_code == 0, result.stdout
    # exact (1024) and cuBLAS-route-served (200: bucket 256... is a kernel; 300 lost) shapes
    assert (512 < 600 <= 1024) and calls[:2] == [(1024, 600), (1024, 700)]
    table = load(path)
    assert {(v.M, v.served_by[0], v.rule) for v in table.evidence} >= {(600, 1024, "bucket"),
                                                                       (3000, 4096, "bucket")}
    assert all(v.M != 1024 for v in table.evidence)  # an exact entry needs no evidence
    assert decide(table, GemmProblem(600, 1536, 1024)).path == "cublas"
    assert decide(table, GemmProblem(650, 1536, 1024)).path == "cublas"  # between 0.7x and 1.1x
    assert decide(table, GemmProblem(800, 1536, 1024)).path == "calibrated"  # between 700 and 900
    assert decide(table, GemmProblem(1000, 1536, 1024)).path == "unproven"  # above 900 only
    explained = _run("dispatch", "explain", str(path), "600x1536x1024", "800x1536x1024",
                     "1000x1536x1024").stdout
    lines = explained.splitlines()
    assert lines[0].startswith("600x1536x1024 bf16: cublas: calibration measured 0.700x at M=600 "
                               "for the bucket entry 1024x1536x1024 (tiny.qkv) (< 1)")
    assert lines[1].startswith("800x1536x1024 bf16: calibrated: bucket entry 1024x1536x1024 (tiny.qkv)")
    assert "calibration measured 1.100x at M=700, 1.100x at M=900; kernel" in lines[1]
    assert lines[2].startswith("1000x1536x1024 bf16: unproven: calibration measured 1.100x at "
                               "M=900 only, on one side of M=1000 for the bucket entry "
                               "1024x1536x1024 (tiny.qkv): unproven, cuBLAS unless the guard "
                               "measures it; kernel ")
    # the header carries the evidence and answers alike
    _run("export", str(tmp_path / "d.h"), "--from", str(path), "--format", "cpp")
    header = (tmp_path / "d.h").read_text()
    assert f"kNumEvidence = {len(table.evidence)};" in header and "0.7}," in header
    # --min-ratio 0.5 keeps the measured 0.7x shape on the kernel
    _run("dispatch", "calibrate", str(path), "--shapes", str(shapes), "--min-ratio", "0.5")
    assert decide(load(path), GemmProblem(600, 1536, 1024)).path == "calibrated"


def test_calibrate_bad_input(tmp_path):
    bad = tmp_path / "s.txt"
    bad.write_text("600x1536\n")
    with pytest.raises(UserError, match="s.txt: shape 1: shape '600x1536': expected MxNxK"):
        cal.read_shapes(bad)
    bad.write_text('[{"M": 1, "N": 8}]')
    with pytest.raises(UserError, match="shape 1: .*expected MxNxK"):
        cal.read_shapes(bad)
    bad.write_text("")
    with pytest.raises(UserError, match="no shapes"):
        cal.read_shapes(bad)
    assert cal.read_shapes(_write(tmp_path, '["8x8x8", {"M": 2, "N": 8, "K": 16, "dtype": "fp16"}]')) == [
        GemmProblem(8, 8, 8), GemmProblem(2, 8, 16, "fp16")]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "shapes.json"
    path.write_text(text)
    return path


def test_calibrate_refuses_a_bad_measurement(tuned_db, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFW_DB", tuned_db)
    _run("export", str(tmp_path / "d.json"), "--study", "m")
    table = load(tmp_path / "d.json")
    with pytest.raises(UserError, match="measured tflops nan"):
        cal.calibrate(table, [GemmProblem(600, 1536, 1024)], lambda e, p: (float("nan"), 1.0))


def test_dispatch_schema_command_prints_the_committed_schema(tmp_path):
    from tunefw.runtime.dispatch_schema import json_schema
    assert _run("dispatch", "schema").stdout == json_schema()
    _run("dispatch", "schema", str(tmp_path / "s.json"))
    assert (tmp_path / "s.json").read_text() == json_schema()


def test_explain_command_one_line_errors(tmp_path):
    bad = invoke_cli("dispatch", "explain", str(tmp_path / "missing.json"), "8x8x8")
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "cannot read" in bad.stderr


def test_calibrate_a_model_s_in_between_shapes(tuned_db, tmp_path, monkeypatch):
    monkeypatch.setenv("TUNEFW_DB", tuned_db)
    path = tmp_path / "d.json"
    _run("export", str(path), "--study", "m")
    table = load(path)
    layers = table.layers()
    assert list(layers) == sorted(layers) and len(layers) == 4  # export groups entries by layer
    assert [e.M for e in layers[(1536, 1024, "bf16", "TN", "none")]] == sorted({2**i for i in range(14)} | {300})
    shapes = cal.between_shapes(table, "tiny")
    assert GemmProblem(3, 1536, 1024) in shapes and GemmProblem(181, 1536, 1024) in shapes
    assert all((p.M & (p.M - 1)) != 0 or p.M == 2 for p in shapes if p.M != 300)  # never a tuned M
    with pytest.raises(UserError, match="--model 'llama': no layer"):
        cal.between_shapes(table, "llama")
    measure, calls = _fake_timer({})
    monkeypatch.setattr(cal, "cuda_measure", lambda *a: measure)
    assert _run("dispatch", "calibrate", str(path), "--model", "tiny").exit_code == 0
    measured = load(path).evidence
    assert len(measured) == len(calls) and {(v.M, v.N) for v in measured} <= {(p.M, p.N) for p in shapes}
    with pytest.raises(UserError, match="give --shapes FILE or --model NAME"):
        _run("dispatch", "calibrate", str(path))
