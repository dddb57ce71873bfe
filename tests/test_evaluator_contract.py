"""One contract over every evaluator (tunefw/evaluate/protocol.py): the simulator, the replay of a
recorded sweep and, on a GPU, the real one, each asked the same trial (the recorded winner of a
decode sweep) and held to the same answers."""
from __future__ import annotations

import pytest

from conftest import REPO
from tunefw.device import DeviceSpec
from tunefw.evaluate.protocol import Evaluator
from tunefw.evaluate.sweepfile import read_sweep
from tunefw.outcome import Status, TrialSpec, fingerprint_key
from tunefw.study.spec import SimSettings
from tunefw.templates import get_family

SWEEP = REPO / "benchmarks" / "sweeps" / "decode2_h200"
WINNER = read_sweep(SWEEP / "16x4096x14336_bf16_TN.jsonl.gz")
FINGERPRINT_FIELDS = {"name", "cc", "sm_count", "driver", "cuda", "compiler", "method"}


def _spec() -> TrialSpec:
    winner = WINNER.header["winner"]
    return TrialSpec(trial_id=7, family=winner["family"], config=dict(winner["config"]),
                     problem=WINNER.problem.as_dict(), timeout_s=60.0)


def _evaluator(kind: str) -> tuple[Evaluator, object]:
    """The evaluator and the compiled kernel it takes (None where it compiles nothing)."""
    if kind == "sim":
        from tunefw.evaluate.sim import SimEvaluator
        return SimEvaluator(SimSettings(trial_seconds=0.0)), None
    if kind == "replay":
        from tunefw.evaluate.replay import ReplayEvaluator
        return ReplayEvaluator(f"replay:{SWEEP}"), None
    from tunefw.cuda.compiler import compile_kernel
    from tunefw.evaluate.cuda import CudaEvaluator
    evaluator = CudaEvaluator(0)
    spec = _spec()
    return evaluator, compile_kernel(get_family(spec.family), spec.config,
                                     spec.problem["dtype"], evaluator.device_spec().arch)


KINDS = ["sim", "replay", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("kind", KINDS)
def test_every_evaluator_keeps_the_contract(kind):
    evaluator, compiled = _evaluator(kind)
    assert isinstance(evaluator, Evaluator)
    fp, device = evaluator.fingerprint(), evaluator.device_spec()
    assert isinstance(device, DeviceSpec) and FINGERPRINT_FIELDS <= set(fp)
    assert fp["cc"] == device.cc and fp["sm_count"] == device.sm_count
    spec = _spec()
    assert get_family(spec.family).check(spec.config, WINNER.problem, device) is None
    for outcome in (evaluator.evaluate(spec, compiled), evaluator.confirm(spec, compiled)):
        assert outcome.status == Status.OK, outcome.log
        assert outcome.evaluator == kind and outcome.tflops > 0 and outcome.cublas_tflops > 0
        assert outcome.ratio == pytest.approx(outcome.tflops / outcome.cublas_tflops)
        assert fingerprint_key(outcome.fingerprint) == fingerprint_key(fp)  # clocks aside
