"""Outcomes are values, not exceptions: every trial ends as exactly one of these."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any


def cublas_ratio(tflops: float | None, cublas_tflops: float | None) -> float | None:
    """TFLOP/s over the cuBLAS TFLOP/s timed beside them (the search's objective, see
    evaluate/method.py's timing notes); None where either is missing."""
    return tflops / cublas_tflops if tflops is not None and cublas_tflops else None


def fingerprint_key(fingerprint: dict) -> str:
    """Identity of a device for reuse: what changes timings (not clocks read at one moment),
    the timing method included."""
    stable = {k: fingerprint.get(k) for k in ("name", "cc", "sm_count", "driver", "cuda",
                                              "compiler", "simulated", "method")}
    return hashlib.sha256(json.dumps(stable, sort_keys=True).encode()).hexdigest()[:16]


class Status(str, Enum):
    OK = "OK"
    INVALID = "INVALID"
    COMPILE_ERROR = "COMPILE_ERROR"
    COMPILE_TIMEOUT = "COMPILE_TIMEOUT"
    OUT_OF_RESOURCES = "OUT_OF_RESOURCES"
    WRONG_ANSWER = "WRONG_ANSWER"
    RUNTIME_CRASH = "RUNTIME_CRASH"
    TIMEOUT = "TIMEOUT"
    WORKER_LOST = "WORKER_LOST"
    NOT_RECORDED = "NOT_RECORDED"  # replay: the recorded sweep does not hold this config


# Outcomes never counted in a budget: configs answered without device time, and a worker's
# death under a trial (WORKER_LOST: the trial runs again, and its retry's row is counted).
NOT_COUNTED = (Status.INVALID.value, Status.NOT_RECORDED.value, Status.WORKER_LOST.value)


@dataclass
class TrialSpec:
    """What a worker is asked to do: one config of one family on one problem."""

    trial_id: int
    family: str
    config: dict
    problem: dict  # GemmProblem.as_dict()
    timeout_s: float
    seed: int = 0


@dataclass
class Outcome:
    """What a worker returns for a trial; stored as one row by the driver."""

    status: Status
    log: str = ""
    median_ms: float | None = None
    min_ms: float | None = None
    iqr_ms: float | None = None
    tflops: float | None = None
    rel_err: float | None = None
    cublas_tflops: float | None = None
    cublas_median_ms: float | None = None
    fingerprint: dict = field(default_factory=dict)
    gpu: str = ""  # the worker's CUDA_VISIBLE_DEVICES / UUID
    evaluator: str = ""  # "sim" | "cuda"
    compile_s: float | None = None
    # ptxas's figures for the kernel (tunefw.cuda.compiler.CompileResult): registers per thread,
    # static shared memory and spill bytes; None where nothing was compiled
    ptxas_regs: int | None = None
    ptxas_smem_bytes: int | None = None
    ptxas_spill_bytes: int | None = None
    busy_s: float = 0.0  # time the GPU spent on this trial's work (load, verify, time)
    poisoned: bool = False  # the worker's CUDA context is unusable: the pool must restart it

    @property
    def ok(self) -> bool:
        return self.status == Status.OK

    @property
    def ratio(self) -> float | None:
        """Ratio to the cuBLAS of the same screen: what the search ranks trials by."""
        return cublas_ratio(self.tflops, self.cublas_tflops)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d
