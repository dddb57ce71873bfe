"""The GEMMs a model runs: its ``nn.Linear`` layers, as tunefw problems over an M grid.

A model comes from a ``transformers`` config (a config.json file, or a model directory already
on disk: no download), from a Python entry point ``module:function`` (or ``file.py:function``)
that returns an ``nn.Module``, or as an ``nn.Module``. Models named by a source are built on the
meta device (no weights are allocated or read). Every ``nn.Linear`` counts as it is (unfused,
lm_head included): one GEMM of N=out_features, K=in_features per call; with ``fuse``, a sibling
group (tunefw/study/siblings.py: the layers ``tunefw.patch(model, fuse=...)`` serves as one GEMM)
counts as that one GEMM instead; with ``gated``, a SwiGLU MLP's gate and up projections
(siblings.gated_mlps: what ``tunefw.patch(model, gated=True)`` serves by one gated GEMM) count as
one gated problem of N = the intermediate size. Layers tunefw cannot tune (N or K not a multiple
of 8) are reported, never silently dropped.

M is the number of tokens a call multiplies (batch x sequence). The grids (README):
decode ``M_GRIDS["decode"]`` (1 ... 256 sequences, one token each) and prefill
``M_GRIDS["prefill"]`` (512 ... 8192 tokens); ``both`` is their union.
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tunefw.errors import UserError
from tunefw.problem import DTYPES
from tunefw.study.siblings import gated_mlps, sibling_groups

M_GRIDS: dict[str, tuple[int, ...]] = {
    "decode": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "prefill": (512, 1024, 2048, 4096, 8192),
}
M_GRIDS["both"] = M_GRIDS["decode"] + M_GRIDS["prefill"]
DEFAULT_M_GRID = "both"
_TORCH_TO_TUNEFW = {torch.bfloat16: "bf16", torch.float16: "fp16"}
_INDEX = re.compile(r"\.\d+(?=\.|$)")


@dataclass
class LinearShape:
    """One distinct (N, K, dtype) among a model's ``nn.Linear`` layers, with the modules using it."""

    N: int
    K: int
    dtype: str  # the layers' dtype: 'bf16' | 'fp16' | torch's name ('float32', ...)
    names: list[str] = field(default_factory=list)
    gate: str = "none"  # 'silu': a gated MLP's gate and up as one GEMM (tunefw/problem.py)

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def invalid(self) -> str | None:
        """Why tunefw cannot tune this shape, or None."""
        bad = [f"{f}={v}" for f, v in (("N", self.N), ("K", self.K)) if v < 8 or v % 8]
        return f"{' and '.join(bad)} not a positive multiple of 8" if bad else None

    @property
    def label(self) -> str:
        """The layers' leaf names in model order, e.g. 'q_proj-o_proj': a valid tunefw label
        (tunefw/study/names.py: [A-Za-z0-9._-], at most 128 characters)."""
        leaves: list[str] = []
        for name in self.names:
            leaf = re.sub(r"[^A-Za-z0-9._]", "_", name.rsplit(".", 1)[-1] or name)
            if leaf not in leaves:
                leaves.append(leaf)
        return "-".join(leaves)[:128].rstrip("-")

    def patterns(self) -> list[str]:
        """The module names with layer indices as '*', distinct, in model order."""
        out: list[str] = []
        for name in self.names:
            pattern = _INDEX.sub(".*", name)
            if pattern not in out:
                out.append(pattern)
        return out


def dtype_label(dtype: torch.dtype) -> str:
    """'bf16' / 'fp16', else torch's name of the dtype (e.g. 'float32')."""
    return _TORCH_TO_TUNEFW.get(dtype, str(dtype).removeprefix("torch."))


def collect_linears(model: torch.nn.Module, fuse: bool | list = False,
                    gated: bool = False) -> list[LinearShape]:
    """The distinct (N, K, dtype, gate) of every ``nn.Linear`` in ``model``, in first-use order;
    with ``gated``, each SwiGLU MLP's gate and up as one gated layer 'mlp.gate_proj+up_proj' of
    N = its intermediate size; with ``fuse``, each other sibling group as one layer
    'parent.q_proj+k_proj+v_proj' of the summed N."""
    mlps = {m.names[0]: m for m in gated_mlps(model)} if gated else {}
    taken = {name for m in mlps.values() for name in m.names[:-1]}  # gate and up (or gate_up)
    groups = [g for g in sibling_groups(model, fuse) if not taken & set(g.names)] if fuse else []
    fused = {g.names[0]: g for g in groups}
    members = {name for g in groups for name in g.names[1:]} | (taken - set(mlps))
    shapes: dict[tuple[int, int, str, str], LinearShape] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name not in members:
            n, gate = module.out_features, "none"
            group, mlp = fused.get(name), mlps.get(name)
            if group is not None:
                n, name = group.N, group.name
            if mlp is not None:
                n, gate, name = mlp.N, "silu", f"{mlp.name}.{mlp.gate_up}"
            key = (n, module.in_features, dtype_label(module.weight.dtype), gate)
            shapes.setdefault(key, LinearShape(*key[:3], gate=gate)).names.append(name)
    return list(shapes.values())


def parse_m_grid(text: str | list[int] | tuple[int, ...]) -> list[int]:
    """'decode' | 'prefill' | 'both' | a comma list like '1,16,128' -> sorted distinct M values."""
    if not isinstance(text, str):
        values = list(text)
    elif text.strip() in M_GRIDS:
        values = list(M_GRIDS[text.strip()])
    else:
        try:
            values = [int(v) for v in text.split(",") if v.strip()]
        except ValueError:
            values = []
        if not values:
            raise UserError(f"--m-grid {text!r}: expected decode, prefill, both or a list like 1,16,128")
    for m in values:
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise UserError(f"--m-grid: M={m!r}: expected integers >= 1")
    return sorted(set(values))


# ---- loading a model without its weights ----------------------------------------------------
def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("a transformers config needs the transformers package: "
                        "pip install 'tunefw[hf]'") from None
    return transformers


def _config(path: Path):
    """The transformers config in a config.json file or a model directory (local files only)."""
    transformers = _transformers()
    file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except OSError as exc:
        raise UserError(f"{file}: cannot read ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{file}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise UserError(f"{file}: not a transformers config (no model_type)")
    model_type = data.pop("model_type")
    try:
        return transformers.AutoConfig.for_model(model_type, **data)
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{file}: {_first_line(exc)}") from None


def model_from_config(path: str | Path, dtype: str = "bf16") -> torch.nn.Module:
    """The model a transformers config describes, built on the meta device in ``dtype``."""
    transformers = _transformers()
    cfg = _config(Path(path))
    errors = []
    for auto in (transformers.AutoModelForCausalLM, transformers.AutoModel):
        try:
            with torch.device("meta"):
                model = auto.from_config(cfg)
            return model.to({v: k for k, v in _TORCH_TO_TUNEFW.items()}[dtype])
        except (ValueError, KeyError) as exc:  # not a causal LM: the base model has the layers
            errors.append(_first_line(exc))
    raise UserError(f"{path}: transformers cannot build this config ({errors[-1]})")


def model_from_entry_point(spec: str) -> torch.nn.Module:
    """``module:function`` or ``file.py:function``, called without arguments on the meta device."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr.isidentifier():
        raise UserError(f"{spec}: expected a config file, a model directory or module:function")
    try:
        if target.endswith(".py"):
            if not Path(target).is_file():
                raise UserError(f"{spec}: no such file {target}")
            name = f"_tunefw_entry_{Path(target).stem}"
            module_spec = importlib.util.spec_from_file_location(name, target)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            if "" not in sys.path:
                sys.path.insert(0, "")  # modules in the current directory, as `python -m` finds them
            module = importlib.import_module(target)
    except UserError:
        raise
    except Exception as exc:  # an import runs user code: any failure is one line
        raise UserError(f"{spec}: cannot import {target} ({type(exc).__name__}: {_first_line(exc)})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UserError(f"{spec}: {target} has no function {attr}")
    try:
        with torch.device("meta"):
            model = fn()
    except Exception as exc:
        raise UserError(f"{spec}: {attr}() raised {type(exc).__name__}: {_first_line(exc)}") from None
    if not isinstance(model, torch.nn.Module):
        raise UserError(f"{spec}: {attr}() returned {type(model).__name__}, expected an nn.Module")
    return model


def load_model(source: str | Path | torch.nn.Module, dtype: str = "bf16") -> torch.nn.Module:
    """A model from an nn.Module, a config.json / model directory (built in ``dtype``), or a
    module:function."""
    if isinstance(source, torch.nn.Module):
        return source
    text = str(source)
    path = Path(text)
    if path.exists():
        return model_from_config(path, dtype)
    if ":" in text and not text.endswith(".json"):
        return model_from_entry_point(text)
    raise UserError(f"{text}: no such file or directory (expected a config.json, a model "
                    "directory or module:function)")


# ---- problems -----------------------------------------------------------------------------
@dataclass
class ModelShapes:
    """A model's linear shapes and the study problems they give over an M grid."""

    source: str
    shapes: list[LinearShape]
    m_grid: list[int]
    dtype: str  # the dtype layers that are neither bf16 nor fp16 are tuned in

    def tuned_dtype(self, shape: LinearShape) -> str:
        return shape.dtype if shape.dtype in DTYPES else self.dtype

    @property
    def valid(self) -> list[LinearShape]:
        return [s for s in self.shapes if s.invalid is None]

    @property
    def invalid(self) -> list[LinearShape]:
        return [s for s in self.shapes if s.invalid is not None]

    def problems(self) -> list[dict]:
        """Study problems ``{M, N, K, dtype, label[, gate]}``: every valid shape at every M of
        the grid."""
        return [{"M": m, "N": s.N, "K": s.K, "dtype": self.tuned_dtype(s), "label": s.label,
                 **({"gate": s.gate} if s.gate != "none" else {})}
                for s in self.valid for m in self.m_grid]

    def notes(self) -> list[str]:
        """One line per distinct shape: what it is, where it is used, tuned or why not."""
        lines = []
        for s in self.shapes:
            where = f"{s.count} layer(s): {', '.join(s.patterns())}"
            if s.invalid:
                lines.append(f"skipped {s.N}x{s.K} {s.dtype}: {s.invalid} ({where})")
            else:
                cast = "" if s.dtype in DTYPES else f" (layers are {s.dtype})"
                gated = "" if s.gate == "none" else f" gate {s.gate} (weight of 2N rows)"
                lines.append(f"N={s.N} K={s.K}{gated} tuned as {self.tuned_dtype(s)}{cast}: {where}")
        return lines


def model_shapes(source: str | Path | torch.nn.Module, m_grid: str | list[int] = DEFAULT_M_GRID,
                 dtype: str = "bf16", fuse: bool = False, gated: bool = False) -> ModelShapes:
    """The linear shapes of a model (see the module docstring) over an M grid."""
    if dtype not in DTYPES:
        raise UserError(f"dtype={dtype!r}: expected one of {', '.join(DTYPES)}")
    grid = parse_m_grid(m_grid)
    model = load_model(source, dtype)
    label = source if not isinstance(source, torch.nn.Module) else type(source).__name__
    shapes = collect_linears(model, fuse, gated)
    if not shapes:
        raise UserError(f"{label}: the model has no nn.Linear layer")
    found = ModelShapes(str(label), shapes, grid, dtype)
    if not found.valid:
        raise UserError(f"{label}: no nn.Linear layer tunefw can tune ({shapes[0].invalid})")
    return found


def study_problems(source: str | Path | torch.nn.Module, m_grid: str | list[int] = DEFAULT_M_GRID,
                   dtype: str = "bf16", fuse: bool = False,
                   gated: bool = False) -> tuple[list[dict], list[str]]:
    """(problems for a study, one note per distinct shape) from a model; see model_shapes()."""
    found = model_shapes(source, m_grid, dtype, fuse, gated)
    return found.problems(), found.notes()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
