"""`tunefw compile`: compile sampled (or given) valid configs of a family and report each one.

Works without a GPU: validity is judged for a representative problem on the known device that
matches the arch (sm_80 -> A100, sm_90/sm_90a -> H200).
"""
from __future__ import annotations

import json
import os
import random
import statistics
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from tunefw.cuda.compiler import CompilePool, CompileResult, check_arch, compiler_info, sass_check
from tunefw.device import A100, H200, DeviceSpec
from tunefw.errors import UserError
from tunefw.problem import GemmProblem, parse_shape
from tunefw.templates import get_family
from tunefw.templates.base import KernelTemplate

REPRESENTATIVE_SIZE = 4096
LOG_LINES_SHOWN = 6


def device_for_arch(arch: str) -> DeviceSpec:
    """The known device a compile target stands for (sm_90 is Hopper without the 'a' features)."""
    check_arch(arch)
    devices = {"sm_80": A100, "sm_90": replace(H200, arch_suffix=""), "sm_90a": H200}
    if arch not in devices:
        raise UserError(f"arch {arch!r}: expected one of {', '.join(devices)}")
    return devices[arch]


def parse_config(template: KernelTemplate, text: str) -> dict:
    """A config from JSON text, checked against the family's declared space."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"--config: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(config, dict):
        raise UserError("--config: expected a JSON object, e.g. '{\"BM\": 128}'")
    reason = template.space_reason(config)
    if reason:
        raise UserError(f"--config: {reason}")
    return config


def sample_configs(template: KernelTemplate, problem: GemmProblem, device: DeviceSpec, n: int,
                   seed: int) -> list[dict]:
    """Up to n distinct valid configs drawn uniformly from the space (rejection sampling)."""
    rng = random.Random(seed)
    found: dict[str, dict] = {}
    last_reason = "the space is empty"
    for _ in range(max(2000, 200 * n)):
        config = {p.name: rng.choice(p.values) for p in template.params}
        key = json.dumps(config, sort_keys=True)
        if key in found:
            continue
        reason = template.check(config, problem, device)
        if reason is None:
            found[key] = config
            if len(found) == n:
                break
        else:
            last_reason = reason
    if not found:
        raise UserError(f"no valid {template.family} config for {problem.key()} on {device.name}: "
                        f"{last_reason}")
    return list(found.values())


def dynamic_smem(template: KernelTemplate, config: dict, problem: GemmProblem,
                 device: DeviceSpec) -> str:
    """The dynamic shared memory a config asks for: its launch plan's for the problem, or the
    family's estimate (marked) where the config is not valid for it."""
    if template.check(config, problem, device) is None:
        return f"{template.launch(config, problem, device).smem_bytes:>6} B"
    return f"{template.estimate(config).smem_bytes:>6} B (est.)"


def _line(config: dict, result: CompileResult, sass_reason: str | None,
          dynamic: str | None) -> str:
    label = "SASS" if result.ok and sass_reason else ("ok" if result.ok else result.status.value)
    state = f"[{'green' if label == 'ok' else 'red'}]{label:<15}[/]"
    origin = "cached  " if result.cached else "compiled"
    figures = (f"regs {result.regs:>3}  static smem {result.smem:>6} B  spill "
               f"{result.spill_bytes:>4} B  dynamic smem {dynamic}" if result.ok else "")
    text = (f"{state} {result.seconds * 1e3:8.1f} ms  {origin}  {figures}  "
            f"{escape(json.dumps(config, separators=(',', ':')))}")
    if sass_reason:
        text += f"\n      [red]{escape(sass_reason)}[/]"
    if not result.ok:
        text += "".join(f"\n      {escape(l)}" for l in result.log.strip().splitlines()[:LOG_LINES_SHOWN])
    return text


def run_compile(family: str, arch: str, sample: int, seed: int, config_json: str | None,
                check_sass: bool, cache_dir: Path | None, dtype: str = "bf16",
                console: Console | None = None, source_dir: Path | None = None,
                shape: str | None = None) -> int:
    """Compile configs of a family (sampled valid for ``shape``, default 4096^3), print one line
    each (ptxas's registers, static shared memory and spills; the dynamic shared memory the
    launch asks for on ``shape``) and a summary; 1 if any failed."""
    console = console or Console()
    template = get_family(family)
    device = device_for_arch(arch)
    problem = (parse_shape(shape, dtype) if shape else
               GemmProblem(REPRESENTATIVE_SIZE, REPRESENTATIVE_SIZE, REPRESENTATIVE_SIZE, dtype))
    if config_json is not None:
        configs = [parse_config(template, config_json)]
        reason = template.check(configs[0], problem, device)
        if reason:
            console.print(f"[yellow]note:[/] invalid for {problem.key()} on {device.name}: "
                          f"{escape(reason)} (compiling anyway)", soft_wrap=True)
    else:
        if sample < 1:
            raise UserError(f"--sample {sample}: expected at least 1")
        configs = sample_configs(template, problem, device, sample, seed)
    console.print(f"{family}: {len(configs)} config(s) for {arch} with {compiler_info().label}")
    failed = 0
    results: list[CompileResult] = []
    with CompilePool(min(os.cpu_count() or 1, len(configs)), cache_dir=cache_dir,
                     source_dir=source_dir) as pool:
        futures = [pool.submit(template, config, dtype, arch, gate=problem.gate) for config in configs]
        for config, future in zip(configs, futures):
            result = future.result()
            sass_reason = (sass_check(result.cubin, require_op=template.tensor_op)
                           if check_sass and result.ok else None)
            failed += (not result.ok) or bool(sass_reason)
            results.append(result)
            dynamic = dynamic_smem(template, config, problem, device) if result.ok else None
            console.print(_line(config, result, sass_reason, dynamic), soft_wrap=True)
    console.print(_summary(results, failed))
    return 1 if failed else 0


def _summary(results: list[CompileResult], failed: int) -> str:
    fresh = [r.seconds for r in results if not r.cached and r.ok]
    timing = (f"; compile median {statistics.median(fresh) * 1e3:.0f} ms, max {max(fresh) * 1e3:.0f} ms"
              if fresh else "")
    hits = sum(r.cached for r in results)
    colour = "red" if failed else "green"
    return (f"[{colour}]{len(results) - failed} ok, {failed} failed[/] of {len(results)}; "
            f"{hits} cache hit(s){timing}")
