"""Shipped cubin directories: ``ship_cubins`` writes one, ``read_manifest`` reads it::

    cubin_dir/manifest.json  {"format": 1, "arch": "sm_90a",
                              "kernels": {"<name expression>": {"file": "<cache key>.cubin",
                                                                "lowered_name": "<mangled>"}}}
    cubin_dir/<cache key>.cubin

The name expression (e.g. ``gemm_wgmma_sm90<0, 128, ...>``; KernelTemplate.name_expression: a
gated one with GATED = 1 after the knobs) names the instantiation; the Dispatcher uses a cubin only when the manifest's arch equals this
GPU's; a kernel missing from the manifest is compiled (a compile that fails sends its shapes to
cuBLAS).
"""
from __future__ import annotations

import json
from pathlib import Path

from tunefw.errors import UserError
from tunefw.runtime.dispatch import DispatchTable
from tunefw.templates import FAMILIES

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


def read_manifest(cubin_dir: Path) -> dict:
    """The manifest of a shipped cubin directory; a one-line UserError if it is unusable."""
    path = cubin_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT \
            or not isinstance(manifest.get("kernels"), dict) or not isinstance(manifest.get("arch"), str):
        raise UserError(f"{path}: expected {{'format': {MANIFEST_FORMAT}, 'arch': ..., 'kernels': {{...}}}}")
    return manifest


def ship_cubins(table: DispatchTable, cubin_dir: str | Path, arch: str, *,
                cache_dir: str | Path | None = None) -> dict:
    """Compile every entry's kernel for ``arch`` into ``cubin_dir`` with its manifest; returns it."""
    from tunefw.cuda.compiler import compile_kernel

    out = Path(cubin_dir)
    out.mkdir(parents=True, exist_ok=True)
    kernels: dict[str, dict] = {}
    for entry in table.entries:
        family = FAMILIES[entry.family]
        name = family.name_expression(entry.config, entry.dtype, entry.gate)
        if name in kernels:
            continue
        result = compile_kernel(family, entry.config, entry.dtype, arch, cache_dir=cache_dir,
                                gate=entry.gate)
        if not result.ok:
            raise UserError(f"{name}: {result.status.value}: {(result.log.strip().splitlines() or [''])[0]}")
        (out / f"{result.key}.cubin").write_bytes(result.cubin)
        # whether the cubin waits for the kernel before it (a cubin shipped before its family
        # did, read without this key, is never launched programmatically: runtime/plan.py)
        kernels[name] = {"file": f"{result.key}.cubin", "lowered_name": result.lowered_name,
                         "programmatic": family.programmatic_launch,
                         # the source it was built from: a newer tunefw still runs this kernel
                         "source_hash": family.source_hash()}
    manifest = {"format": MANIFEST_FORMAT, "arch": arch, "kernels": kernels}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
