"""The study file's schema as pydantic models: unknown keys refused at every level, strict types,
every number finite and in its documented range; errors become one line naming the field."""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, StrictInt,
                      ValidationError, field_validator, model_validator)

from tunefw.problem import DIM_MAX, DTYPES, GATES
from tunefw.study.names import NAME_CHARS, NAME_MAX, NAME_PATTERN

SAMPLERS = ("tpe", "random", "grid", "uniform", "cmaes")
FAULTS = ("crash", "hang", "wrong", "compile_error")
DEFAULT_TRIALS = 64
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_SIM_TRIAL_S = 1.0
TRIALS_MAX = 100_000         # evaluated configs per problem
TIMEOUT_MAX_S = 86_400.0     # a trial's timeout: finite, > 0, at most a day
SIM_TRIAL_MAX_S = 3_600.0    # the simulator's wall time per trial
CONFIRM_TOP_MAX = 100
SEED_MAX = 2**32 - 1         # numpy's seed range (Optuna's samplers)
MODEL_NAME_MAX = 100         # leaves room for '.gate_up' within a label's 128 characters

Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Label = Annotated[str, Field(pattern=f"^(?:{NAME_CHARS}{{1,{NAME_MAX}}})?$")]
Dim = Annotated[StrictInt, Field(ge=1, le=DIM_MAX)]
Number = float  # strict: an int or a float (YAML writes 60 and 60.0 alike), never a bool
Rate = Annotated[Number, Field(ge=0.0, le=1.0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ProblemEntry(_Strict):
    """One explicit problem: {shape: MxNxK} or {M, N, K}, with an optional dtype, gate and
    label (gate silu: C = silu(A Bg^T) * (A Bu^T), B = [Bg; Bu] of 2N rows)."""

    shape: Optional[str] = None
    M: Optional[Dim] = None
    N: Optional[Dim] = None
    K: Optional[Dim] = None
    dtype: Optional[Literal["bf16", "fp16"]] = None
    layout: Literal["TN"] = "TN"
    gate: Literal[GATES] = "none"  # type: ignore[valid-type]
    label: Label = ""

    @model_validator(mode="after")
    def _shape_or_dims(self) -> "ProblemEntry":
        dims = [k for k in ("M", "N", "K") if getattr(self, k) is not None]
        if self.shape is not None and dims:
            raise ValueError(f"give shape or M, N, K, not both (got shape and {', '.join(dims)})")
        if self.shape is None and len(dims) < 3:
            missing = [k for k in ("M", "N", "K") if getattr(self, k) is None]
            raise ValueError(f"missing {', '.join(missing)}")
        return self


class ModelEntry(_Strict):
    """The linear layers of a transformer block, for each token count M."""

    name: Annotated[str, Field(pattern=f"^{NAME_CHARS}{{1,{MODEL_NAME_MAX}}}$")] | None = None  # model<i>
    hidden: Dim
    intermediate: Dim
    qkv: Dim
    M: Annotated[list[Dim], Field(max_length=1024)] | None = None  # added to the default grid
    # gate_up as the gated GEMM of a SwiGLU MLP (N = intermediate, silu) instead of a plain one
    gated: StrictBool = False


class Faults(_Strict):
    """Injected fault rates of the simulated device: each in [0, 1], together at most 1."""

    crash: Rate = 0.0
    hang: Rate = 0.0
    wrong: Rate = 0.0
    compile_error: Rate = 0.0

    @model_validator(mode="after")
    def _sum_at_most_one(self) -> "Faults":
        total = self.crash + self.hang + self.wrong + self.compile_error
        if total > 1.0 + 1e-12:
            raise ValueError(f"fault rates sum to {total:g}: expected at most 1")
        return self


class Sim(_Strict):
    """Settings of the simulated device."""

    trial_seconds: Annotated[Number, Field(ge=0.0, le=SIM_TRIAL_MAX_S, allow_inf_nan=False)] = \
        DEFAULT_SIM_TRIAL_S
    faults: Faults = Field(default_factory=Faults)


class StudyFile(_Strict):
    """A whole study file (also the normalized form stored in the database)."""

    name: Optional[Name] = None
    dtype: Literal["bf16", "fp16"] = "bf16"
    families: Optional[Annotated[list[str], Field(min_length=1, max_length=16)]] = None
    sampler: Literal["tpe", "random", "grid", "uniform", "cmaes"] = "tpe"
    trials: Annotated[StrictInt, Field(ge=1, le=TRIALS_MAX)] = DEFAULT_TRIALS
    timeout_s: Annotated[Number, Field(gt=0.0, le=TIMEOUT_MAX_S, allow_inf_nan=False)] = \
        DEFAULT_TIMEOUT_S
    seed: Annotated[StrictInt, Field(ge=0, le=SEED_MAX)] = 0
    confirm_top: Annotated[StrictInt, Field(ge=0, le=CONFIRM_TOP_MAX)] = 3
    reuse: StrictBool = True
    problems: Optional[Annotated[list[Union[str, ProblemEntry]], Field(max_length=4096)]] = None
    models: Optional[Annotated[list[ModelEntry], Field(max_length=64)]] = None
    sim: Optional[Sim] = None

    @field_validator("families", mode="before")
    @classmethod
    def _one_family(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("families")
    @classmethod
    def _known_families(cls, value: Optional[list[str]]) -> Optional[list[str]]:
        from tunefw.templates import FAMILIES
        for f in value or []:
            if f not in FAMILIES:
                raise ValueError(f"unknown family {f!r}; expected one of "
                                 f"{', '.join(sorted(FAMILIES))}")
        if value is not None and len(set(value)) != len(value):
            raise ValueError("a family is listed twice")
        return value


_EXPECTED = {
    "dtype": f"one of {', '.join(DTYPES)}",
    "sampler": f"one of {', '.join(SAMPLERS)}",
    "layout": "TN (the only layout)",
    "gate": f"one of {', '.join(GATES)}",
    "gated": "true or false",
    "trials": f"an integer 1..{TRIALS_MAX}",
    "seed": f"an integer 0..{SEED_MAX}",
    "confirm_top": f"an integer 0..{CONFIRM_TOP_MAX}",
    "timeout_s": f"a finite number of seconds > 0 and <= {TIMEOUT_MAX_S:g}",
    "trial_seconds": f"a finite number of seconds 0..{SIM_TRIAL_MAX_S:g}",
    "reuse": "true or false",
    "name": f"1-{NAME_MAX} characters of A-Z a-z 0-9 . _ -",
    "label": f"at most {NAME_MAX} characters of A-Z a-z 0-9 . _ -",
    "families": "a list of family names",
    "problems": "a list of {shape: MxNxK} or {M, N, K[, dtype, gate, label]}",
    "models": "a list of {name, hidden, intermediate, qkv, M: [..], gated}",
    "sim": "a mapping {trial_seconds, faults}",
    "faults": f"a mapping of fault rates in [0, 1] ({', '.join(FAULTS)})",
}
for _f in FAULTS:
    _EXPECTED[_f] = "a fault rate between 0 and 1"
for _d in ("M", "N", "K", "hidden", "intermediate", "qkv"):
    _EXPECTED[_d] = f"an integer 1..{DIM_MAX}"
_EXPECTED["ProblemEntry"] = "MxNxK or a mapping {shape: MxNxK} or {M, N, K[, dtype, gate, label]}"
_KEYS = {"": StudyFile, "problems": ProblemEntry, "models": ModelEntry, "sim": Sim,
         "faults": Faults}


def _path(loc: tuple) -> str:
    """('problems', 1, 'ProblemEntry', 'layout') -> 'problems[1].layout'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "ProblemEntry") or "[" in str(part):  # union branch tags
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _owner(loc: tuple) -> str:
    """The model a location's last key belongs to, by its parent's field name."""
    names = [p for p in loc[:-1] if isinstance(p, str) and p in _KEYS]
    return names[-1] if names else ""


def _pick(errors: list[dict]) -> dict:
    """One error to report: for a problem given as a mapping, the mapping branch's error."""
    for e in errors:
        if any("ProblemEntry" in str(p) for p in e["loc"]) or e["type"] != "string_type":
            return e
    return errors[0]


def describe(exc: ValidationError) -> str:
    """A ValidationError as one line: which field, what was expected."""
    e = _pick(exc.errors(include_url=False))
    loc, kind = tuple(e["loc"]), e["type"]
    where = _path(loc)
    key = loc[-1] if loc else ""
    if "ProblemEntry" in str(key):  # a problem that is neither a string nor a mapping
        key = "ProblemEntry"
    if kind == "extra_forbidden":
        parent = _path(loc[:-1])
        model = _KEYS[_owner(loc)] if parent else StudyFile
        known = ", ".join(model.model_fields)
        if parent.endswith("faults"):
            return f"{parent}: unknown fault {key!r}; expected {', '.join(FAULTS)}"
        return f"unknown key(s) {where}; expected some of {known}"
    if kind == "invalid_key":
        return f"{_path(loc[:-1]) or 'top level'}: key {_short(key)}: expected a string key"
    if kind == "missing":
        return f"{_path(loc[:-1]) or 'study'}: missing {key}"
    if kind == "value_error":
        msg = str(e.get("ctx", {}).get("error", e["msg"]))
        return f"{where}: {msg}" if where else msg
    expected = _EXPECTED.get(key) if isinstance(key, str) else None
    if expected is None and isinstance(key, int) and len(loc) > 1 and loc[-2] == "M":
        expected = _EXPECTED["M"]  # a token count of a model
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        expected = expected or "a mapping"
    elif kind == "list_type":
        expected = expected or "a list"
    if expected is None:
        expected = e["msg"][0].lower() + e["msg"][1:]
    if "input" not in e:
        return f"{where}: expected {expected}"
    return f"{where}={_short(e['input'])}: expected {expected}"



def field_error(field: str, value: Any) -> str | None:
    """What a study file's top-level ``field`` expects where ``value`` breaks it (the command
    line's options are checked by the file's rules), e.g. 'expected an integer 0..100'; None
    where the value is fine."""
    try:
        StudyFile.model_validate({field: value})
    except ValidationError as exc:
        return describe(exc).split(": ", 1)[-1]
    return None
