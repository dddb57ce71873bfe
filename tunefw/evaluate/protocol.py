"""What a GPU worker asks of its evaluator: the device it measures on and a trial's Outcome.
Implemented by sim.py (the modeled device), replay.py (recorded sweeps) and cuda.py (a real GPU);
tests/test_evaluator_contract.py runs one contract over each."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from tunefw.device import DeviceSpec
from tunefw.outcome import Outcome, TrialSpec


@runtime_checkable
class Evaluator(Protocol):
    def fingerprint(self) -> dict:
        """The device's identity and software (outcome.fingerprint_key's fields at least)."""

    def device_spec(self) -> DeviceSpec:
        """The limits template checks run against (the device measured, or the recorded one)."""

    def evaluate(self, spec: TrialSpec, compiled: Any) -> Outcome:
        """A search trial: verified, then screened against cuBLAS; failures as Outcomes."""

    def confirm(self, spec: TrialSpec, compiled: Any) -> Outcome:
        """A winner candidate's longer timing against cuBLAS."""
