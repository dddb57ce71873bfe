"""KernelTemplate: a kernel family's one declaration of its parameter space, checks and launch.

Everything else (Optuna distributions, grid enumeration, CLI help, dispatch keys, docs) reads
``params`` from here; no other module lists parameter values.
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from tunefw.device import DeviceSpec
from tunefw.problem import GemmProblem

Config = Mapping[str, Any]



def _find_template_dir() -> Path:
    """kernel_templates/ beside the package (installed as tunefw.kernel_templates) or in the repo."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "kernel_templates", package.parent / "kernel_templates"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("kernel_templates/ not found beside the tunefw package")


TEMPLATE_DIR = _find_template_dir()


@dataclass(frozen=True)
class Param:
    """One tunable knob: its name (a C++ template argument), allowed values and meaning."""

    name: str
    values: tuple
    help: str


@dataclass(frozen=True)
class Resources:
    """Analytic estimate of what one block of a config needs."""

    threads: int
    regs_per_thread: int
    smem_bytes: int


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
    kernel: str = ""  # C++ template kernel name
    min_cc: int = 80
    needs_arch_suffix: bool = False  # True where the kernel needs sm_90a-style features
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

    def seed_configs(self) -> list[dict]:
        """The default config, then each seed applied over it (duplicates dropped)."""
        configs: list[dict] = []
        for override in ({},) + tuple(self.seeds):
            config = {**self.default_config(), **override}
            if config not in configs:
                configs.append(config)
        return configs

    def space_hash(self) -> str:
        """Changes whenever a parameter or one of its values changes (resume guard)."""
        text = json.dumps([[p.name, list(p.values)] for p in self.params])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def source_hash(self) -> str:
        """Hash of the family's CUDA sources (template + headers): part of the result reuse key."""
        digest = hashlib.sha256()
        for path in sorted(TEMPLATE_DIR.rglob("*")):
            if path.is_file() and path.suffix in (".cuh", ".h", ".cu"):
                digest.update(path.relative_to(TEMPLATE_DIR).as_posix().encode())
                digest.update(path.read_bytes())
        return digest.hexdigest()[:16]

    def space_reason(self, config: Config) -> str | None:
        """Why a config is outside the declared space (missing/unknown keys, bad values)."""
        unknown = set(config) - set(self.param_names)
        if unknown:
            return f"unknown parameter(s) {sorted(unknown)} for {self.family}"
        for p in self.params:
            if p.name not in config:
                return f"missing parameter {p.name} for {self.family}"
            if config[p.name] not in p.values:
                return f"{p.name}={config[p.name]!r} not in {list(p.values)}"
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
        return self._check(config, problem, device)

    # ---- what subclasses implement ----------------------------------------------------------
    def _check(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> str | None:
        raise NotImplementedError

    def estimate(self, config: Config) -> Resources:
        """Threads, registers per thread and shared memory of one block (for check())."""
        raise NotImplementedError

    def template_args(self, config: Config, dtype: str) -> list[str]:
        """The C++ template arguments, in the kernel's declared order."""
        raise NotImplementedError

    def launch(self, config: Config, problem: GemmProblem, device: DeviceSpec) -> Launch:
        raise NotImplementedError

    def kernel_args(self, config: Config, problem: GemmProblem, ptrs: Mapping[str, int]) -> list[tuple[Any, Any]]:
        """Arguments for cuLaunchKernel as (value, ctypes type or None for driver objects).

        ``ptrs`` holds device addresses 'a', 'b', 'c' and 'workspace'.
        """
        raise NotImplementedError

    # ---- derived ----------------------------------------------------------------------------
    def name_expression(self, config: Config, dtype: str) -> str:
        """The instantiation NVRTC compiles and looks up, e.g. ``gemm_mma_sm80<...>``."""
        return f"{self.kernel}<{', '.join(self.template_args(config, dtype))}>"
