"""End to end on the SIMULATED device: real Ray actors, real Optuna, a real SQLite file. The
quickstart flow and the launch without --address start a Ray of their own as a user's launch does;
the other launches join the session's Ray head (conftest.ray_head)."""
import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import optuna
import pytest
import yaml

from conftest import REPO, db_rows, invoke_cli, launch_argv, launch_on, run_cli, seed_study
from tunefw.evaluate import method

pytestmark = pytest.mark.slow


def _study_file(tmp_path, name="q", trials=6, trial_seconds=0.05, timeout_s=20, faults=None,
                shapes=("4096x4096x4096", "128x6144x4096"), families=None):
    data = {"name": name, "trials": trials, "timeout_s": timeout_s,
            "problems": [{"shape": s} for s in shapes],
            "sim": {"trial_seconds": trial_seconds, "faults": faults or {}}}
    if families:
        data["families"] = families
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_quickstart_flow_on_eight_pinned_workers(db_url, tmp_path, ray_head):
    study = _study_file(tmp_path, trials=8)
    assert invoke_cli("study", "create", "q", "--from", str(study), db=db_url).returncode == 0
    # Without --address a launch starts a Ray of its own, even with the session's head running
    # (plain ray.init() joined it, then refused num_gpus): 8 workers, more than the head has.
    assert ray_head.gpus < 8
    # two sampler processes, one per problem, each asked by its own thread
    launched = run_cli("launch", "q", "--gpus", "8", "--backend", "sim", db=db_url,
                       env={"TUNEFW_SAMPLER_PROCESSES": "2", **ray_head.env})
    assert launched.returncode == 0, launched.stderr
    assert "SIMULATED" in launched.stdout
    assert re.search(r"trial \d+ \S+ OK [\d.]+ TFLOP/s [\d.]+x cuBLAS gpu", launched.stdout)
    gpus = {g for (g,) in db_rows(db_url, "SELECT gpu FROM tunefw_trial WHERE status='OK'")}
    assert gpus and gpus <= {str(i) for i in range(8)}
    shown = json.loads(invoke_cli("study", "show", "q", "--json", db=db_url).stdout)
    # each worker its own GPU (the ones up before the search ended; fast trials may end it
    # first), 8 distinct names
    up = [g for g in shown["stats"]["gpu_busy"] if not g.endswith("(never up)")]
    assert len(shown["stats"]["gpu_busy"]) == 8 and set(up) <= {str(i) for i in range(8)}
    for p in shown["problems"]:
        assert p["evaluated"] == 8 and p["best"]["confirmed"] is True
        assert p["best"]["tflops"] > 0 and p["outcomes"]["OK"] == p["ok"]
    stats = shown["stats"]  # the figures that say where idle GPU time went
    assert stats["trials"] == 16 and stats["asks"] >= 16
    assert 0 < stats["ask_s"] < stats["sampler_processes"] * stats["wall_s"]  # per asker thread
    assert set(stats["starved_s"]) == {"start", "compile", "ask", "tail", "driver"}
    # trials start on the first worker up; the rest join as they come up (or after the search)
    assert 0 < stats["first_worker_s"] <= stats["first_trial_s"]
    assert stats["workers_up_s"] is None or stats["workers_up_s"] >= stats["first_worker_s"]
    assert all(0 <= v <= 8 * stats["wall_s"] for v in stats["starved_s"].values())
    assert stats["starved_s"]["compile"] == 0  # the simulated device compiles nothing ahead
    assert set(stats["mean_depth"]) == {"ready", "compiling", "pending"}
    assert stats["sampler_processes"] == 2
    out = tmp_path / "dispatch.json"
    exported = invoke_cli("export", str(out), "--study", "q", db=db_url)
    assert exported.returncode == 0, exported.stderr
    table = json.loads(out.read_text())
    assert table["simulated"] is True and table["schema_version"] == 2
    assert {(e["M"], e["N"], e["K"]) for e in table["entries"]} == {(4096, 4096, 4096),
                                                                    (128, 6144, 4096)}
    winners = {p["best"]["trial_id"] for p in shown["problems"]}
    assert {e["trial_id"] for e in table["entries"]} == winners
    # Optuna's own view of the same database
    names = [s.study_name for s in optuna.get_all_study_summaries(db_url)]
    assert "q/4096x4096x4096:bf16:TN/r0" in names
    loaded = optuna.load_study(study_name="q/4096x4096x4096:bf16:TN/r0", storage=db_url)
    _told_the_ratios(db_url, loaded, problem_id=1)


def _told_the_ratios(db_url, durable, problem_id):
    """Each OK row's durable Optuna trial holds its ratio to cuBLAS (the objective), not TFLOP/s;
    the study's best is the best ratio."""
    ratios = dict(db_rows(db_url, "SELECT optuna_trial, tflops / cublas_tflops FROM tunefw_trial "
                                f"WHERE status='OK' AND problem_id={problem_id}"))
    assert ratios and all(0 < r < 2 for r in ratios.values())
    assert {t.number: t.value for t in durable.trials if t.value is not None} == pytest.approx(ratios)
    assert durable.best_value == pytest.approx(max(ratios.values()))


def test_faults_become_outcomes_and_never_win(db_url, tmp_path, ray_head):
    faults = {"crash": 0.12, "hang": 0.08, "wrong": 0.15, "compile_error": 0.12}
    study = _study_file(tmp_path, trials=14, timeout_s=2, faults=faults)
    assert invoke_cli("study", "create", "f", "--from", str(study), db=db_url).returncode == 0
    launched = launch_on(ray_head, "f", "--gpus", "4", "--backend", "sim", db=db_url, timeout=600)
    assert launched.returncode == 0, launched.stderr
    statuses = {s for (s,) in db_rows(db_url, "SELECT status FROM tunefw_trial")}
    assert {"OK", "RUNTIME_CRASH", "TIMEOUT", "WRONG_ANSWER", "COMPILE_ERROR"} <= statuses
    logs = dict(db_rows(db_url, "SELECT status, log FROM tunefw_trial WHERE status IN "
                              "('COMPILE_ERROR', 'WRONG_ANSWER', 'RUNTIME_CRASH')"))
    assert "undefined_symbol_for_fault_injection" in logs["COMPILE_ERROR"]  # a real compiler log
    assert "rows over their limit" in logs["WRONG_ANSWER"]  # the real verifier's verdict
    assert "WORKER_LOST" in logs["RUNTIME_CRASH"]
    shown = json.loads(invoke_cli("study", "show", "f", "--json", db=db_url).stdout)
    assert shown["stats"]["restarts"] >= 2
    for p in shown["problems"]:
        assert p["evaluated"] == 14
        winner_status = db_rows(db_url, f"SELECT status FROM tunefw_trial WHERE id="
                                      f"{p['best']['trial_id']}")
        assert winner_status == [("OK",)]


def test_kill_minus_nine_then_resume(db_url, tmp_path, ray_head):
    study = _study_file(tmp_path, trials=12, trial_seconds=0.4)
    assert invoke_cli("study", "create", "k", "--from", str(study), db=db_url).returncode == 0
    env = dict(os.environ, TUNEFW_DB=db_url, **ray_head.env)
    proc = subprocess.Popen(launch_argv(ray_head, "k", "--gpus", "2", "--backend", "sim"),
                            cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    while time.time() < deadline:
        time.sleep(0.5)
        n = db_rows(db_url, "SELECT count(*) FROM tunefw_trial WHERE status != 'INVALID'")[0][0] \
            if Path(db_url.removeprefix("sqlite:///")).exists() else 0
        if n >= 5:
            break
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = db_rows(db_url, "SELECT id, config_key, status, tflops FROM tunefw_trial ORDER BY id")
    assert 0 < len([r for r in before if r[2] != "INVALID"]) < 24
    resumed = launch_on(ray_head, "k", "--gpus", "2", "--backend", "sim", db=db_url)
    assert resumed.returncode == 0, resumed.stderr
    after = db_rows(db_url, "SELECT id, config_key, status, tflops FROM tunefw_trial ORDER BY id")
    assert after[:len(before)] == before  # finished rows keep their ids and values
    for (pid,) in db_rows(db_url, "SELECT id FROM tunefw_problem"):
        evaluated = db_rows(db_url, f"SELECT config_key FROM tunefw_trial WHERE problem_id={pid} "
                                  "AND status != 'INVALID'")
        assert len(evaluated) == 12
        assert len(set(evaluated)) == 12  # no config measured twice
    for pid, key in db_rows(db_url, "SELECT id, key FROM tunefw_problem"):  # Optuna saw each once
        durable = optuna.load_study(study_name=f"k/{key}/r0", storage=db_url)
        assert len(durable.trials) == 12
        _told_the_ratios(db_url, durable, pid)
        numbers = db_rows(db_url, "SELECT t.optuna_trial FROM tunefw_trial t JOIN tunefw_problem p "
                                f"ON p.id = t.problem_id WHERE p.key = '{key}' AND "
                                "t.status != 'INVALID' ORDER BY t.optuna_trial")
        assert [n for (n,) in numbers] == list(range(12))


def test_launch_through_a_ray_head_address(db_url, tmp_path, ray_head):
    study = _study_file(tmp_path, name="r", trials=4, shapes=("256x256x256",))
    assert invoke_cli("study", "create", "r", "--from", str(study), db=db_url).returncode == 0
    launched = launch_on(ray_head, "r", "--gpus", "2", "--backend", "sim", db=db_url)
    assert launched.returncode == 0, launched.stderr
    assert db_rows(db_url, "SELECT count(*) FROM tunefw_trial WHERE status='OK'")[0][0] >= 1
    assert invoke_cli("study", "create", "r2", "--from", str(study), db=db_url).returncode == 0
    too_many = launch_on(ray_head, "r2", "--gpus", str(ray_head.gpus + 1), "--backend", "sim",
                         db=db_url)  # (r is finished: its launch would say so before Ray)
    assert too_many.returncode != 0
    assert too_many.stderr.strip().splitlines() == [
        f"tunefw: error: --gpus {ray_head.gpus + 1}: the Ray cluster has {ray_head.gpus} GPU(s)"]
    # (a launch without --address beside this head: the quickstart flow)


def test_time_limit_stops_cleanly_and_a_second_launch_finishes(db_url, tmp_path, ray_head):
    study = _study_file(tmp_path, name="t", trials=10, trial_seconds=0.5, shapes=("512x512x512",))
    assert invoke_cli("study", "create", "t", "--from", str(study), db=db_url).returncode == 0
    first = launch_on(ray_head, "t", "--gpus", "1", "--backend", "sim", "--time-limit", "2",
                      db=db_url)
    assert first.returncode == 0, first.stderr
    assert "time limit reached" in first.stdout
    done = db_rows(db_url, "SELECT count(*) FROM tunefw_trial WHERE status != 'INVALID'")[0][0]
    assert 1 <= done < 10
    assert db_rows(db_url, "SELECT count(*) FROM tunefw_winner") == [(0,)]  # not confirmed yet
    second = launch_on(ray_head, "t", "--gpus", "1", "--backend", "sim", db=db_url)
    assert second.returncode == 0, second.stderr
    keys = db_rows(db_url, "SELECT config_key FROM tunefw_trial WHERE status != 'INVALID'")
    assert len(keys) == 10 == len(set(keys))
    assert db_rows(db_url, "SELECT count(*) FROM tunefw_winner") == [(1,)]
    third = launch_on(ray_head, "t", "--gpus", "1", "--backend", "sim", db=db_url)
    assert "nothing left to run" in third.stdout


def test_resume_on_another_device_or_space_needs_a_new_round(db_url, ray_head):
    # round 0 as a SIMULATED launch stopped in its confirmation left it (work left: a launch
    # starts; a finished study is said so before that, whatever the device)
    seed_study(db_url, "g", ("256x256x256",), trials=3, sim={"trial_seconds": 0.05})
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    con.execute("DELETE FROM tunefw_winner")
    con.execute("""UPDATE tunefw_study SET fingerprint = json_set(fingerprint, '$.name',
                   'NVIDIA A100-SXM4-80GB')""")
    con.commit()
    con.close()
    before = db_rows(db_url, "SELECT id, status FROM tunefw_trial ORDER BY id")
    refused = launch_on(ray_head, "g", "--gpus", "1", "--backend", "sim", db=db_url)
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines() == [
        "tunefw: error: study 'g' round 0 ran on NVIDIA A100-SXM4-80GB, this launch is on "
        "SIMULATED NVIDIA H200: pass --new-round to start a new round"]
    assert db_rows(db_url, "SELECT id, status FROM tunefw_trial ORDER BY id") == before
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"))  # same GPU, older timing method
    con.execute("""UPDATE tunefw_study SET fingerprint = json_remove(json_set(fingerprint,
                   '$.name', 'SIMULATED NVIDIA H200'), '$.method')""")
    con.commit()
    con.close()
    refused = launch_on(ray_head, "g", "--gpus", "1", "--backend", "sim", db=db_url)
    assert refused.stderr.strip().splitlines() == [
        "tunefw: error: study 'g' round 0 was timed with method unversioned, this launch times "
        f"with {method.METHOD}: pass --new-round to start a new round"]
    assert db_rows(db_url, "SELECT id, status FROM tunefw_trial ORDER BY id") == before
    con = sqlite3.connect(db_url.removeprefix("sqlite:///"))
    con.execute("UPDATE tunefw_study SET fingerprint = NULL, space_hashes = '{}'")
    con.execute("UPDATE tunefw_study SET fingerprint = "
                "(SELECT fingerprint FROM tunefw_trial WHERE status = 'OK' LIMIT 1)")
    con.commit()
    con.close()
    changed = launch_on(ray_head, "g", "--gpus", "1", "--backend", "sim", db=db_url)
    assert "parameter space changed" in changed.stderr
    again = launch_on(ray_head, "g", "--gpus", "1", "--backend", "sim", "--new-round", db=db_url)
    assert again.returncode == 0, again.stderr
    rounds = db_rows(db_url, "SELECT round, count(*) FROM tunefw_trial WHERE status != 'INVALID' "
                           "GROUP BY round")
    assert rounds == [(0, 3), (1, 3)]


def test_a_second_study_reuses_stored_measurements(db_url, tmp_path, ray_head):
    first = _study_file(tmp_path, name="a", trials=4, shapes=("256x256x256",))
    assert invoke_cli("study", "create", "a", "--from", str(first), db=db_url).returncode == 0
    assert launch_on(ray_head, "a", "--gpus", "1", "--backend", "sim", db=db_url).returncode == 0
    second = _study_file(tmp_path, name="b", trials=4, shapes=("256x256x256",))
    assert invoke_cli("study", "create", "b", "--from", str(second), db=db_url).returncode == 0
    assert launch_on(ray_head, "b", "--gpus", "1", "--backend", "sim", db=db_url).returncode == 0
    reused = db_rows(db_url, "SELECT t.config_key, t.tflops, o.config_key, o.tflops FROM "
                           "tunefw_trial t JOIN tunefw_trial o ON o.id = t.reused_from")
    assert reused, "the seeds are proposed again and answered from study a's rows"
    assert all(k == ok and v == ov for k, v, ok, ov in reused)


def test_ctrl_c_stops_cleanly(db_url, tmp_path, ray_head):
    study = _study_file(tmp_path, name="c", trials=16, trial_seconds=0.25,
                        shapes=("512x512x512",))
    assert invoke_cli("study", "create", "c", "--from", str(study), db=db_url).returncode == 0
    env = dict(os.environ, TUNEFW_DB=db_url, **ray_head.env)
    proc = subprocess.Popen(launch_argv(ray_head, "c", "--gpus", "1", "--backend", "sim"),
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 120
    while time.time() < deadline and _count_ok(db_url) < 2:
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1].startswith("tunefw: interrupted;")
    assert "Traceback" not in err
    done = _count_ok(db_url)
    resumed = launch_on(ray_head, "c", "--gpus", "1", "--backend", "sim", db=db_url)
    assert resumed.returncode == 0 and _count_ok(db_url) == 16 > done


def _count_ok(db_url):
    if not Path(db_url.removeprefix("sqlite:///")).exists():
        return 0
    try:
        return db_rows(db_url, "SELECT count(*) FROM tunefw_trial WHERE status = 'OK'")[0][0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0


def test_export_refuses_mixed_devices_unless_allowed(db_url, tmp_path):
    """Rows written directly (no launch): one problem's winner was measured on another device."""
    from tunefw.evaluate.sim import sim_fingerprint
    other = dict(sim_fingerprint(), name="OTHER")
    seed_study(db_url, "m", ("256x256x256", "512x512x512"), trials=3, fingerprints={0: other})
    out = tmp_path / "d.json"
    refused = invoke_cli("export", str(out), "--study", "m", db=db_url)
    assert refused.returncode != 0 and not out.exists()
    assert refused.stderr.strip().splitlines() == [
        "tunefw: error: study 'm' mixes results from 2 devices (OTHER, SIMULATED NVIDIA H200): "
        "pass --allow-mixed-devices to export anyway"]
    allowed = invoke_cli("export", str(out), "--study", "m", "--allow-mixed-devices", db=db_url)
    assert allowed.returncode == 0, allowed.stderr
    table = json.loads(out.read_text())
    assert [fp["name"] for fp in table["fingerprint"]["mixed"]] == ["OTHER", "SIMULATED NVIDIA H200"]
    assert [(e["M"], e["tflops"]) for e in table["entries"]] == [(256, 120.0), (512, 120.0)]
