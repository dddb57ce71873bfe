"""dispatch.json: load and validate a table of winners, and pick the entry for a problem."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tunefw.device import H200, KNOWN_DEVICES, DeviceSpec
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES

SCHEMA_VERSION = 1
ENTRY_FIELDS = ("M", "N", "K", "dtype", "layout", "family", "config", "tflops",
                "cublas_tflops", "trial_id")


@dataclass(frozen=True)
class DispatchEntry:
    M: int
    N: int
    K: int
    dtype: str
    layout: str
    family: str
    config: dict
    tflops: float
    cublas_tflops: float | None
    trial_id: int

    @property
    def problem(self) -> GemmProblem:
        return GemmProblem(self.M, self.N, self.K, self.dtype, self.layout)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class DispatchTable:
    simulated: bool
    fingerprint: dict
    entries: list[DispatchEntry]
    schema_version: int = SCHEMA_VERSION

    def as_dict(self) -> dict:
        return {"schema_version": self.schema_version, "simulated": self.simulated,
                "fingerprint": self.fingerprint, "entries": [e.as_dict() for e in self.entries]}

    def device(self) -> DeviceSpec:
        """The device the table was tuned on, for check() of nearest entries."""
        return KNOWN_DEVICES.get(str(self.fingerprint.get("name", "")).removeprefix("SIMULATED "),
                                 H200)

    def lookup(self, problem: GemmProblem, device: DeviceSpec | None = None) -> DispatchEntry | None:
        """The exact entry; else the nearest (log M, N, K) of the same dtype and layout whose
        config passes check() for this problem; else None (the caller uses cuBLAS)."""
        device = device or self.device()
        same = [e for e in self.entries if e.dtype == problem.dtype and e.layout == problem.layout]
        for e in same:
            if (e.M, e.N, e.K) == (problem.M, problem.N, problem.K):
                return e
        for e in sorted(same, key=lambda e: (problem.log_distance(e.problem), e.M, e.N, e.K)):
            if FAMILIES[e.family].check(e.config, problem, device) is None:
                return e
        return None


def _entry(i: int, raw: object, path: str) -> DispatchEntry:
    if not isinstance(raw, dict):
        raise UserError(f"{path}: entries[{i}]: expected an object")
    missing = [f for f in ENTRY_FIELDS if f not in raw]
    if missing:
        raise UserError(f"{path}: entries[{i}]: missing {', '.join(missing)}")
    try:
        problem = GemmProblem(raw["M"], raw["N"], raw["K"], raw["dtype"], raw["layout"])
    except UserError as exc:
        raise UserError(f"{path}: entries[{i}]: {exc}") from None
    family = FAMILIES.get(raw["family"])
    if family is None:
        raise UserError(f"{path}: entries[{i}].family={raw['family']!r}: expected one of "
                        f"{', '.join(sorted(FAMILIES))}")
    if not isinstance(raw["config"], dict) or family.space_reason(raw["config"]):
        reason = family.space_reason(raw["config"]) if isinstance(raw["config"], dict) else "not an object"
        raise UserError(f"{path}: entries[{i}].config: {reason}")
    if not isinstance(raw["tflops"], (int, float)):
        raise UserError(f"{path}: entries[{i}].tflops: expected a number")
    return DispatchEntry(problem.M, problem.N, problem.K, problem.dtype, problem.layout,
                         raw["family"], dict(raw["config"]), float(raw["tflops"]),
                         raw["cublas_tflops"], int(raw["trial_id"]))


def load(path: str | Path) -> DispatchTable:
    """Read and validate a dispatch.json; any problem is a one-line UserError."""
    path = str(path)
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a JSON object")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise UserError(f"{path}: schema_version={data.get('schema_version')!r}: expected "
                        f"{SCHEMA_VERSION}")
    for key, kind in (("simulated", bool), ("fingerprint", dict), ("entries", list)):
        if not isinstance(data.get(key), kind):
            raise UserError(f"{path}: {key}: expected {kind.__name__}")
    entries = [_entry(i, raw, path) for i, raw in enumerate(data["entries"])]
    return DispatchTable(data["simulated"], data["fingerprint"], entries)
