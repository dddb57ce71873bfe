"""KernelTemplate: a kernel family's one declaration of its parameter space, checks and launch.

Everything else (Optuna distributions, grid enumeration, CLI help, dispatch keys, docs) reads
``params`` from here; no other module lists parameter values.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from tunefw.device import DeviceSpec
from tunefw.errors import UserError
from tunefw.problem import GemmProblem
from tunefw.templates.param import ENCODING_VERSION, Param

__all__ = ["Config", "CostHint", "ENCODING_VERSION", "KernelTemplate", "Launch", "Param",
           "Resources", "TEMPLATE_DIR", "ptxas_register_cap", "source_files"]

Config = Mapping[str, Any]


def _find_template_dir() -> Path:
    """kernel_templates/ beside the package (installed as tunefw.kernel_templates) or in the repo."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "kernel_templates", package.parent / "kernel_templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("kernel_templates/ not found beside the tunefw package")


TEMPLATE_DIR = _find_template_dir()
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def source_files(source: Path, search: tuple[Path, ...]) -> list[Path]:
    """The source and every file it includes (recursively) that exists under the search dirs."""
    found: list[Path] = []
    pending = [source]
    while pending:
        path = pending.pop()
        if path in found:
            continue
        found.append(path)
        for name in _INCLUDE.findall(path.read_text()):
            for base in (path.parent, *search):
                candidate = (base / name).resolve()
                if candidate.is_file():
                    pending.append(candidate)
                    break
    return found


def ptxas_register_cap(device: DeviceSpec, threads: int, blocks_per_sm: int = 1) -> int:
    """The registers per thread ptxas allows a kernel of ``threads`` threads launched
    ``blocks_per_sm`` to an SM: it sizes blocks rounded up to 4 warps, in steps of 8 registers."""
    per_block = -(-threads // 128) * 128
    return min(device.max_regs_per_thread,
               device.regs_per_sm // (blocks_per_sm * per_block) // 8 * 8)


@dataclass(frozen=True)
class Resources:
    """Analytic estimate of what one block of a config needs."""

    threads: int
    regs_per_thread: int
    smem_bytes: int


@dataclass(frozen=True)
class CostHint:
    """What the SIMULATED device's cost model needs of a config: the block tile, K split,
    pipeline depth, whether shared memory is swizzled, and the family's share of the dense
    tensor-core peak."""

    tile_m: int
    tile_n: int
    tile_k: int
    split_k: int = 1
    stages: int = 3
    swizzled: bool = True
    efficiency: float = 0.5


@dataclass(frozen=True)
class Launch:
    """How a config is launched for a problem: grid, block, cluster, dynamic smem, workspace."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    cluster: tuple[int, int, int] = (1, 1, 1)
    workspace_bytes: int = 0
    extra: dict = field(default_factory=dict, compare=False)


class KernelTemplate:
    """Base class; subclasses set the class attributes and implement the four methods."""

    family: str = ""
    source: str = ""  # file in kernel_templates/
    # Files under kernel_templates/ that ``source`` includes (with the template: the family's
    # source hash). None: found by following the #includes (declare them; the compiler then
    # refuses a source that includes an undeclared file).
    headers: tuple[str, ...] | None = None
    kernel: str = ""  # C++ template kernel name
    min_cc: int = 80
    needs_arch_suffix: bool = False  # True where the kernel needs sm_90a-style features
    tensor_op: str | None = None  # the SASS opcode its math must compile to (HMMA, HGMMA)
    # True where the kernel touches no global memory until griddepcontrol.wait: the runtime may
    # then launch it programmatically (runtime/plan.py)
    programmatic_launch: bool = False
    dtype_codes: Mapping[str, int] = {"bf16": 0, "fp16": 1}  # the kernel's first template argument
    # Problem gates (tunefw/problem.py) the kernel computes: a gated one adds GATED=1 as the last
    # template argument (0 by default in the .cuh, so plain names stay as they were).
    gates: tuple[str, ...] = ("none",)
    params: tuple[Param, ...] = ()
    # Starting points every search evaluates first: overrides of default_config() that measured
    # well on real GPUs (recorded in benchmarks/results). Those check() rejects for a problem
    # are skipped; a sampler then takes over from what they taught it.
    seeds: tuple[dict, ...] = ()

    # ---- the space ------------------------------------------------------------------------
    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def default_config(self) -> dict:
        """A config that is valid for typical large problems: each param's first value."""
        return {p.name: p.values[0] for p in self.params}

    def describe(self) -> list[dict[str, str]]:
        """One row per knob as declared (name, values, default, Optuna encoding, C++ tokens,
        help): what ``tunefw family NAME`` prints."""
        return [{"name": p.name, "values": ", ".join(map(str, p.values)),
                 "default": str(p.values[0]), "optuna": p.describe_encoding(),
                 "cpp": (", ".join(f"{v}={p.cpp[v]}" for v in p.values) if p.cpp else "int"),
                 "help": p.help} for p in self.params]

    def upgrade(self, config: Config) -> Config:
        """A stored config with every knob added since it was written set to what its absence
        meant (Param.absent); anything else, valid or not, comes back unchanged."""
        if not isinstance(config, Mapping):
            return config
        missing = {k: v for k, v in self._absent_values().items() if k not in config}
        return {**config, **missing} if missing else config

    def _absent_values(self) -> dict:
        """Each later-added knob's Param.absent value, by name."""
        return {p.name: p.absent for p in self.params if p.absent is not None}

    def as_written_before(self, config: Config) -> Config:
        """The config without knobs at their Param.absent value: how it was written before those
        knobs existed (what deterministic draws of the simulated device hash, so adding a knob
        moves no modeled figure)."""
        absent = self._absent_values()
        return {k: v for k, v in config.items() if k not in absent or absent[k] != v}

    def seed_configs(self) -> list[dict]:
        """The default config, then each seed applied over it (duplicates dropped)."""
        configs: list[dict] = []
        for override in ({},) + tuple(self.seeds):
            config = {**self.default_config(), **override}
            if config not in configs:
                configs.append(config)
        return configs

    def space_declaration(self) -> list:
        """What space_hash() hashes: the encoding version, then each knob's name, values and
        Optuna encoding. A recorded sweep keeps it, so a later space that only adds knobs (with
        Param.absent) or values still reads the sweep (extension_reason)."""
        return [ENCODING_VERSION] + [[p.name, list(p.values), p.describe_encoding()]
                                     for p in self.params]

    def space_hash(self) -> str:
        """Changes whenever a parameter, one of its values or its Optuna encoding changes
        (the resume guard)."""
        return hashlib.sha256(json.dumps(self.space_declaration()).encode()).hexdigest()[:16]

    def extension_reason(self, declaration: Any) -> str | None:
        """None where this space extends a recorded declaration (space_declaration()): every
        recorded knob is still declared with each of its recorded values, and every knob added
        since has a Param.absent value (what the recorded configs meant); else why not, in a
        line. Recorded configs are then this space's configs once upgrade() adds the absent
        values (a sweep answers them; a config with an added knob elsewhere it never measured)."""
        if not isinstance(declaration, list) or not declaration \
                or declaration[0] != ENCODING_VERSION:
            return "recorded under another encoding of the space"
        try:
            recorded = {str(name): list(values) for name, values, _ in declaration[1:]}
        except (TypeError, ValueError):
            return "its recorded space declaration is malformed"
        now = {p.name: p for p in self.params}
        for name, values in recorded.items():
            if name not in now:
                return f"knob {name} is no longer declared"
            lost = [v for v in values if v not in now[name].values]
            if lost:
                return f"knob {name} no longer has the values {lost}"
        added = [p.name for p in self.params if p.name not in recorded and p.absent is None]
        if added:
            return f"knob(s) {', '.join(added)} added since, without an absent value"
        return None

    def source_paths(self, root: Path | None = None) -> list[Path]:
        """The family's own CUDA files under ``root``: its template and its headers."""
        root = Path(root or TEMPLATE_DIR).resolve()
        source = root / self.source
        if self.headers is None:
            found = source_files(source, (root / "include", root))
            return [source] + sorted(p for p in found[1:] if p.is_relative_to(root))
        return [source] + [root / h for h in self.headers]

    def source_hash(self, root: Path | None = None) -> str:
        """Hash of the family's template and declared headers: the result reuse key and the
        cubin cache key (another family's files never change it)."""
        root = Path(root or TEMPLATE_DIR).resolve()
        digest = hashlib.sha256()
        for path in self.source_paths(root):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
        return digest.hexdigest()[:16]

    def space_reason(self, config: Config) -> str | None:
        """Why a config is outside the declared space (missing/unknown keys, wrong types, bad
        values), naming the param, in one line."""
        if not isinstance(config, Mapping):
            return f"config for {self.family} is a {type(config).__name__}, expected an object"
        unknown = set(config) - set(self.param_names)
        if unknown:
            return f"unknown parameter(s) {sorted(map(str, unknown))} for {self.family}"
        for p in self.params:
            if p.name not in config:
                return f"missing parameter {p.name} for {self.family}"
            reason = p.type_reason(config[p.name])
            if reason:
                return reason
        return None

    def supports(self, device: DeviceSpec) -> bool:
        return device.cc >= self.min_cc and (not self.needs_arch_suffix or device.arch_suffix == "a")

    def iter_space(self) -> Iterator[dict]:
        """Every point of the declared space (valid or not), in a fixed order."""
        for values in itertools.product(*(p.values for p in self.params)):
            yield dict(zip(self.param_names, values))

    def check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        """None when the config can run on this problem and device, else the reason it cannot."""
        reason = self.space_reason(config)
        if reason:
            return reason
        if not self.supports(device):
            return f"{self.family} needs compute capability >= {self.min_cc} ({device.name} is {device.cc})"
        if problem.gate not in self.gates:
            return f"{self.family} has no gated epilogue: problem gate={problem.gate!r} is not in {self.gates}"
        return self._check(config, problem, device)

    # ---- what subclasses implement ----------------------------------------------------------
    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        raise NotImplementedError

    def estimate(self, config: Config) -> Resources:
        """Threads, registers per thread and shared memory of one block (for check())."""
        raise NotImplementedError

    def kernel_order(self, gate: str = "none") -> list[str]:
        """The kernel's template parameters after the dtype code, by name: the knobs in declared
        order, then GATED (where gated, or where knobs declared after it follow it) and those
        knobs (Param.after_gate). What template_args() and the C++ header's knob reads follow."""
        late = [p.name for p in self.params if p.after_gate]
        gated = ["GATED"] if gate != "none" or late else []
        return [p.name for p in self.params if not p.after_gate] + gated + late

    def template_args(self, config: Config, dtype: str, gate: str = "none") -> list[str]:
        """Every C++ template argument, in the kernel's order (kernel_order()): the dtype code,
        then each knob's token and GATED's (1 for a gated problem). A config outside the space
        is refused."""
        if dtype not in self.dtype_codes:
            raise UserError(f"dtype {dtype!r}: expected one of {sorted(self.dtype_codes)}")
        if gate not in self.gates:
            raise UserError(f"gate {gate!r}: {self.family} computes {', '.join(self.gates)}")
        reason = self.space_reason(config)
        if reason:
            raise UserError(reason)
        knobs = {p.name: p for p in self.params}
        return [str(self.dtype_codes[dtype])] + [
            ("0" if gate == "none" else "1") if name == "GATED"
            else knobs[name].cpp_arg(config[name]) for name in self.kernel_order(gate)]

    def launch(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> Launch:
        raise NotImplementedError

    def cost_hint(self, config: Config) -> CostHint:
        """The simulated cost model's view of a config. This default reads the conventional
        knobs BM, BN, BK, SPLIT_K, STAGES and SWIZZLE where declared; a family whose knobs
        are named otherwise overrides it."""
        return CostHint(tile_m=config.get("BM", 128), tile_n=config.get("BN", 128),
                        tile_k=config.get("BK", 32), split_k=config.get("SPLIT_K", 1),
                        stages=config.get("STAGES", 3),
                        swizzled=config.get("SWIZZLE") not in (0, "none"))

    def kernel_args(self, config: Config, problem: GemmProblem, ptrs: Mapping[str, int]) -> list[tuple[Any, Any]]:
        """Arguments for cuLaunchKernel as (value, ctypes type or None for driver objects).

        ``ptrs`` holds device addresses 'a', 'b', 'c' and 'workspace'.
        """
        raise NotImplementedError

    # ---- derived ----------------------------------------------------------------------------
    def name_expression(self, config: Config, dtype: str, gate: str = "none") -> str:
        """The instantiation NVRTC compiles and looks up, e.g. ``gemm_mma_sm80<...>``: the
        template arguments without the trailing ones at their C++ defaults (GATED 0, a later
        knob at its absent value), so adding a knob renames no stored kernel."""
        args, order = self.template_args(config, dtype, gate), self.kernel_order(gate)
        defaults = {"GATED": "0", **{p.name: p.cpp_arg(p.absent) for p in self.params
                                     if p.after_gate}}
        while order and order[-1] in defaults and args[-1] == defaults[order[-1]]:
            order, args = order[:-1], args[:-1]
        return f"{self.kernel}<{', '.join(args)}>"
