"""The dispatch.json file format as pydantic models: strict types, no unknown keys, finite numbers.

Version 2 (written by this tunefw) adds per entry ``label``, ``route``, ``reason`` and
(optional) ``source_hash``, and at the top ``min_ratio``, ``evidence_min_ratio`` and
``evidence``; version-1 files still load (see tunefw.runtime.dispatch.load). ``json_schema()`` is the published schema (dispatch.schema.json).
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from tunefw.problem import GATES
from tunefw.templates import FAMILIES

MAX_DIM = 2**31 - 1  # what the kernels index with 32-bit ints
MAX_TFLOPS = 1e6
MAX_TEXT = 1000

Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
Tflops = Annotated[float, Field(ge=0, le=MAX_TFLOPS, allow_inf_nan=False)]
PositiveTflops = Annotated[float, Field(gt=0, le=MAX_TFLOPS, allow_inf_nan=False)]
Ratio = Annotated[float, Field(ge=0, le=1000, allow_inf_nan=False)]
Text = Annotated[str, Field(max_length=MAX_TEXT)]


def _config_values(config: dict[str, Any]) -> dict[str, Any]:
    """Config values are ints or strings; never bool, float, null or nested."""
    for key, value in config.items():
        name = key if key.isidentifier() else repr(key)  # a key with a newline stays one line
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError(f"{name}={value!r}: expected an integer or a string")
        if isinstance(value, int) and abs(value) > MAX_DIM:
            raise ValueError(f"{name}={value!r}: out of range")
    return config


Config = Annotated[dict[Annotated[str, Field(max_length=64)], Any],
                   AfterValidator(_config_values)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class EntryV1(_Strict):
    """One winner in a version-1 file."""

    M: Dim
    N: Dim
    K: Dim
    dtype: Literal["bf16", "fp16"]
    layout: Literal["TN"]
    family: Literal[tuple(sorted(FAMILIES))]  # type: ignore[valid-type]
    config: Config
    tflops: Tflops
    cublas_tflops: Optional[PositiveTflops]
    trial_id: Annotated[int, Field(ge=0, le=2**63 - 1)]


class Entry(EntryV1):
    """One winner: its shape, layer label, kernel config, measured speed, and how it is served."""

    label: Annotated[str, Field(max_length=200)] = ""
    route: Literal["kernel", "cublas"] = "kernel"
    reason: Optional[Text] = None
    # the kernel source (family template and headers, hashed) the winner was measured with
    source_hash: Optional[Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")]] = None
    # "silu": C = silu(A Bg^T) * (A Bu^T) over B = [Bg; Bu] (2N rows); served only when asked
    gate: Literal[GATES] = "none"  # type: ignore[valid-type]


class Evidence(_Strict):
    """One calibration measurement: a shape a non-exact rule serves, timed against cuBLAS."""

    M: Dim
    N: Dim
    K: Dim
    dtype: Literal["bf16", "fp16"]
    layout: Literal["TN"]
    rule: Literal["bucket", "nearest"]
    served_by: Annotated[list[Dim], Field(min_length=3, max_length=3)]  # the entry's M, N, K
    tflops: Tflops
    cublas_tflops: PositiveTflops


class Fingerprint(BaseModel):
    """The device the table was tuned on; ``name`` and ``cc`` are read, the rest is a record."""

    model_config = ConfigDict(extra="allow", strict=True)
    name: Optional[Annotated[str, Field(max_length=200)]] = None
    cc: Optional[Annotated[int, Field(ge=0, le=1000)]] = None
    mixed: Optional[list["Fingerprint"]] = None


class DispatchFileV1(_Strict):
    schema_version: Literal[1]
    simulated: bool
    fingerprint: Fingerprint
    entries: list[EntryV1]


class DispatchFile(_Strict):
    """A version-2 dispatch.json."""

    schema_version: Literal[2]
    simulated: bool
    fingerprint: Fingerprint
    min_ratio: Optional[Ratio] = None  # the export's --min-ratio
    evidence_min_ratio: Ratio = 1.0  # a measured ratio below this routes the shape to cuBLAS
    entries: list[Entry]
    evidence: list[Evidence] = []


MODELS = {1: DispatchFileV1, 2: DispatchFile}


def _where(loc: tuple) -> str:
    text = ""
    for part in loc:
        if not isinstance(part, int) and not str(part).isidentifier():
            part = repr(str(part))  # a crafted key ('\n', spaces) must not break the one line
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "top level"


def first_error(exc: ValidationError) -> str:
    """The first validation error as one line: where, the value, and the rule."""
    e = exc.errors(include_url=False)[0]
    loc = tuple(e["loc"])
    if e["type"] == "missing":
        return f"{_where(loc[:-1])}: missing {loc[-1]}"
    if e["type"] == "extra_forbidden":
        return f"{_where(loc)}: unknown key"
    if e["type"] == "value_error":
        return f"{_where(loc)}: {e['msg'].removeprefix('Value error, ')}"
    value = repr(e.get("input"))
    value = value if len(value) <= 60 else value[:57] + "..."
    return f"{_where(loc)}={value}: {e['msg']}"


def validate(data: Any) -> BaseModel:
    """The pydantic model of a decoded dispatch.json; ValueError (one line) if it is not one."""
    if not isinstance(data, dict):
        raise ValueError("expected a JSON object")
    version = data.get("schema_version")
    if type(version) is not int or version not in MODELS:
        raise ValueError(f"schema_version={version!r}: expected one of "
                         f"{', '.join(map(str, MODELS))}")
    try:
        return MODELS[version].model_validate(data)
    except ValidationError as exc:
        raise ValueError(first_error(exc)) from None


def json_schema() -> str:
    """The published JSON schema of a version-2 dispatch.json (dispatch.schema.json)."""
    schema = DispatchFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "tunefw dispatch.json (schema_version 2)"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"
