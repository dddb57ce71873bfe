"""A launch's start-up: what it does before Ray. A finished study is said so without starting
Ray or importing torch (the GPU count comes from the CUDA driver, the simulated device from
tunefw.device); the processes a launch starts import the driver's own tunefw; a simulated
worker imports torch only where its study injects wrong answers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import tunefw
from conftest import REPO, db_dump, seed_study
from tunefw.framing import helper_pythonpath

PROBE = """import sys
from tunefw.cli.app import run
code = run(sys.argv[1:])
ray = sys.modules.get("ray")
print(code, "torch" in sys.modules, bool(ray and ray.is_initialized()))
"""


def test_a_finished_study_starts_no_ray_and_imports_no_torch(db_url):
    seed_study(db_url, "done", ("256x256x256", "512x512x512"), trials=3)  # budget and winners
    before = db_dump(db_url)
    env = dict(os.environ, TUNEFW_DB=db_url, PYTHONPATH=helper_pythonpath(),
               CUDA_VISIBLE_DEVICES="")  # no GPU: the auto backend picks the simulator
    ran = subprocess.run([sys.executable, "-c", PROBE, "launch", "done", "--gpus", "8"],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert ran.returncode == 0, ran.stderr
    *said, probe = ran.stdout.splitlines()
    assert said == ["study done: nothing left to run (every problem has its budget and its "
                    "confirmed winner); --new-round starts a new round"]
    assert probe == "0 False False"  # exit 0, torch never imported, no Ray session
    assert ran.stderr.splitlines() == ["no GPU visible: using the SIMULATED device (--backend sim)"]
    assert db_dump(db_url) == before


def test_helper_processes_import_the_drivers_tunefw(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    first, rest = helper_pythonpath().split(os.pathsep, 1)
    assert Path(first) / "tunefw" / "__init__.py" == Path(tunefw.__file__).resolve()
    assert rest == "/elsewhere"


def test_helper_processes_import_nvidias_cuda_not_tunefws():
    # tunefw/ itself on the path made `cuda` resolve to tunefw/cuda in every GPU worker, so
    # `from cuda.bindings import driver` failed there (seen on the H200 after the folder moves)
    root = Path(helper_pythonpath().split(os.pathsep)[0])
    assert not (root / "cuda").exists()
    probe = ("import importlib.util as u, tunefw; s = u.find_spec('cuda'); "
             "print(tunefw.__file__, s and s.origin)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(root)), cwd="/").stdout.split()
    assert Path(out[0]).resolve() == root / "tunefw" / "__init__.py"
    assert out[1] == "None" or not Path(out[1]).resolve().is_relative_to(root / "tunefw")


SIM_WORKER = """import sys
from tunefw.evaluate.sim import SimEvaluator
from tunefw.outcome import TrialSpec
from tunefw.study.spec import SimSettings
from tunefw.templates import get_family
import tunefw.evaluate.replay, tunefw.tune.cluster  # what a simulated or replay worker imports
spec = TrialSpec(1, "mma_sm80", get_family("mma_sm80").default_config(), {"M": 64, "N": 64, "K": 64, "dtype": "bf16"}, 10.0)
for faults in ({}, {"wrong": 1.0}):
    evaluator = SimEvaluator(SimSettings(trial_seconds=0.0, faults=faults))
    started_with_torch = "torch" in sys.modules
    done = evaluator.evaluate(spec)
    print(done.status.value, done.rel_err is None, started_with_torch, done.log)
"""


def test_a_simulated_worker_imports_torch_only_for_wrong_answers():
    """An OK simulated trial has no output to verify (no rel_err): a worker starts and runs
    without torch (seconds a process on a small machine); where the study injects wrong
    answers the worker has torch before its first trial, and a wrong answer is still the real
    verifier's verdict."""
    ran = subprocess.run([sys.executable, "-c", SIM_WORKER], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=helper_pythonpath()), cwd="/",
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    ok, wrong, *_ = ran.stdout.splitlines()
    assert ok.startswith("OK True False SIMULATED device: modeled timing")
    assert wrong.startswith("WRONG_ANSWER False True SIMULATED: ")
    assert "rows over their limit" in ran.stdout
