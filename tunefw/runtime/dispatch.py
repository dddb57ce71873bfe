"""dispatch.json: load and validate a table of winners, and pick the route for a problem.

The file format is tunefw.runtime.dispatch_schema (pydantic, published as
dispatch.schema.json); the serving rules are tunefw.runtime.rules. Version-1 files load as
version 2: their entries get the default ``min_ratio`` (1.0), so a winner that measured below
cuBLAS (or has no cuBLAS figure) becomes a cuBLAS route.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tunefw.device import H200, KNOWN_DEVICES, DeviceSpec
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.templates import FAMILIES

SCHEMA_VERSION = 2
DEFAULT_MIN_RATIO = 1.0
ENTRY_FIELDS = ("M", "N", "K", "dtype", "layout", "family", "config", "tflops",
                "cublas_tflops", "trial_id")
ROUTES = ("kernel", "cublas")


def ratio_of(tflops: float | None, cublas_tflops: float | None) -> float | None:
    """tflops / cublas_tflops, None when either is missing or cuBLAS is not positive."""
    if tflops is None or not cublas_tflops or cublas_tflops <= 0:
        return None
    return tflops / cublas_tflops


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
    label: str = ""
    route: str = "kernel"  # 'cublas': the winner lost to cuBLAS; lookup serves cuBLAS for it
    reason: str | None = None  # why a cuBLAS route
    # the family's kernel source hash the winner was measured with (None: a table written
    # before it was recorded); a runtime whose templates hash otherwise has not measured it
    source_hash: str | None = None
    gate: str = "none"  # the problem's gate (tunefw/problem.py): served only for that gate

    @property
    def problem(self) -> GemmProblem:
        return GemmProblem(self.M, self.N, self.K, self.dtype, self.layout, self.gate)

    @property
    def ratio(self) -> float | None:
        """Measured TFLOP/s over cuBLAS TFLOP/s (None without a cuBLAS figure)."""
        return ratio_of(self.tflops, self.cublas_tflops)

    @property
    def is_cublas(self) -> bool:
        """Whether the entry is exported as a cuBLAS route (lookup serves cuBLAS for it)."""
        return self.route == "cublas"

    def as_dict(self) -> dict:
        d = asdict(self)
        if d["source_hash"] is None:  # unknown: the key is left out, as older tables have it
            del d["source_hash"]
        if d["gate"] == "none":  # a plain GEMM's entry reads as before gates existed
            del d["gate"]
        return d


@dataclass(frozen=True)
class Evidence:
    """A calibration measurement of a non-exact rule: the asked shape, the entry serving it."""

    M: int
    N: int
    K: int
    dtype: str
    layout: str
    rule: str  # 'bucket' | 'nearest'
    served_by: tuple[int, int, int]  # the serving entry's (M, N, K), same dtype and layout
    tflops: float
    cublas_tflops: float

    @property
    def ratio(self) -> float:
        """Measured TFLOP/s of the serving kernel over cuBLAS TFLOP/s on this shape."""
        return self.tflops / self.cublas_tflops

    def as_dict(self) -> dict:
        """The evidence item as written in dispatch.json."""
        return dict(asdict(self), served_by=list(self.served_by))


@dataclass
class DispatchTable:
    simulated: bool
    fingerprint: dict
    entries: list[DispatchEntry]
    schema_version: int = SCHEMA_VERSION
    evidence: list[Evidence] = field(default_factory=list)
    evidence_min_ratio: float = DEFAULT_MIN_RATIO
    min_ratio: float | None = None

    def as_dict(self) -> dict:
        """The table as a version-2 dispatch.json document."""
        return {"schema_version": SCHEMA_VERSION, "simulated": self.simulated,
                "fingerprint": self.fingerprint, "min_ratio": self.min_ratio,
                "evidence_min_ratio": self.evidence_min_ratio,
                "entries": [e.as_dict() for e in self.entries],
                "evidence": [e.as_dict() for e in self.evidence]}

    def device(self) -> DeviceSpec:
        """The device the table was tuned on, for check() of non-exact entries."""
        return KNOWN_DEVICES.get(str(self.fingerprint.get("name", "")).removeprefix("SIMULATED "),
                                 H200)

    def layers(self) -> dict[tuple[int, int, str, str, str], list[DispatchEntry]]:
        """Entries grouped by layer (N, K, dtype, layout, gate), each group by tuned M."""
        groups: dict[tuple[int, int, str, str, str], list[DispatchEntry]] = {}
        for e in self.entries:
            groups.setdefault((e.N, e.K, e.dtype, e.layout, e.gate), []).append(e)
        return {k: sorted(v, key=lambda e: e.M) for k, v in groups.items()}


def apply_min_ratio(entry: DispatchEntry, min_ratio: float, what: str = "confirmed") -> DispatchEntry:
    """The entry as a cuBLAS route when its ratio is below ``min_ratio`` or unknown."""
    from dataclasses import replace

    if entry.is_cublas:
        return entry
    ratio = entry.ratio
    if ratio is None and min_ratio > 0:
        return replace(entry, route="cublas", reason="no cuBLAS measurement to compare with")
    if ratio is not None and ratio < min_ratio:
        return replace(entry, route="cublas",
                       reason=f"{what} ratio {ratio:.3f} < min ratio {min_ratio:g}")
    return entry


def _problem_at(raw, where: str) -> GemmProblem:
    """The problem of an entry or evidence point, or a one-line error naming where it is."""
    try:
        return GemmProblem(raw.M, raw.N, raw.K, raw.dtype, raw.layout, getattr(raw, "gate", "none"))
    except UserError as exc:
        raise UserError(f"{where}: {exc}") from None


def _semantic(data, path: str) -> DispatchTable:
    """Checks the schema cannot say: valid problems and configs, no duplicates, evidence refs."""
    entries, seen = [], {}
    for i, raw in enumerate(data.entries):
        where = f"{path}: entries[{i}]"
        problem = _problem_at(raw, where)
        config = FAMILIES[raw.family].upgrade(raw.config)  # tables written before a knob existed
        reason = config_reason(raw.family, config)
        if reason:
            raise UserError(f"{where}.config: {reason}")
        key = problem.key()
        if key in seen:
            raise UserError(f"{where}: duplicate of entries[{seen[key]}] ({key})")
        seen[key] = i
        extra = {} if data.schema_version == 1 else {
            "label": raw.label, "route": raw.route, "reason": raw.reason,
            "source_hash": raw.source_hash, "gate": raw.gate}
        entry = DispatchEntry(raw.M, raw.N, raw.K, raw.dtype, raw.layout, raw.family,
                              dict(config), raw.tflops, raw.cublas_tflops, raw.trial_id,
                              **extra)
        entries.append(apply_min_ratio(entry, DEFAULT_MIN_RATIO, "version-1 table:")
                       if data.schema_version == 1 else entry)
    if data.schema_version == 1:
        return DispatchTable(data.simulated, data.fingerprint.model_dump(exclude_unset=True),
                             entries, min_ratio=DEFAULT_MIN_RATIO)
    evidence, measured = [], {}
    for i, raw in enumerate(data.evidence):
        where = f"{path}: evidence[{i}]"
        problem = _problem_at(raw, where)
        donor = f"{'x'.join(map(str, raw.served_by))}:{raw.dtype}:{raw.layout}"
        if donor not in seen or entries[seen[donor]].is_cublas:  # a plain entry: no gate suffix
            raise UserError(f"{where}.served_by={raw.served_by}: no kernel entry {donor}")
        if problem.key() in seen:
            raise UserError(f"{where}: {problem.key()} is an exact entry (evidence is for "
                            "shapes a non-exact rule serves)")
        if problem.key() in measured:
            raise UserError(f"{where}: duplicate of evidence[{measured[problem.key()]}]")
        measured[problem.key()] = i
        evidence.append(Evidence(raw.M, raw.N, raw.K, raw.dtype, raw.layout, raw.rule,
                                 tuple(raw.served_by), raw.tflops, raw.cublas_tflops))
    return DispatchTable(data.simulated, data.fingerprint.model_dump(exclude_unset=True), entries,
                         evidence=evidence, evidence_min_ratio=data.evidence_min_ratio,
                         min_ratio=data.min_ratio)


def config_reason(family: str, config: dict) -> str | None:
    """Why a config is not in the family's space, types included (1.0 and True are not 1)."""
    return FAMILIES[family].space_reason(config)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")


def _unique_keys(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise ValueError(f"key {dup!r} appears twice in one object")
    return dict(pairs)


def parse(text: str | bytes, path: str = "dispatch.json") -> DispatchTable:
    """Validate a dispatch.json document; any problem is a one-line UserError."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UserError(f"{path}: not UTF-8 (byte {exc.start})") from None
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except RecursionError:
        raise UserError(f"{path}: not a dispatch table (nested too deeply)") from None
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc})") from None
    from tunefw.runtime.dispatch_schema import validate
    try:
        model = validate(data)
    except ValueError as exc:
        raise UserError(f"{path}: {exc}") from None
    except RecursionError:
        raise UserError(f"{path}: not a dispatch table (nested too deeply)") from None
    return _semantic(model, path)


def load(path: str | Path) -> DispatchTable:
    """Read and validate a dispatch.json; any problem is a one-line UserError."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    return parse(raw, str(path))
