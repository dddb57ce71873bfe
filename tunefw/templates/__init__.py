"""Kernel families by name. Each family's file declares its parameter space once."""
from __future__ import annotations

import functools
import hashlib
import json

from tunefw.errors import UserError
from tunefw.templates.base import KernelTemplate


def _load() -> dict[str, KernelTemplate]:
    from tunefw.templates.mma_sm80 import MmaSm80
    from tunefw.templates.rows_sm90 import RowsSm90
    from tunefw.templates.skinny_sm90 import SkinnySm90
    from tunefw.templates.stream_sm90 import StreamSm90
    from tunefw.templates.wgmma_sm90 import WgmmaSm90
    return {t.family: t for t in (MmaSm80(), WgmmaSm90(), SkinnySm90(), StreamSm90(), RowsSm90())}


FAMILIES: dict[str, KernelTemplate] = _load()


def get_family(name: str) -> KernelTemplate:
    """The family called ``name``, or a one-line error listing the known ones."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise UserError(f"family {name!r}: expected one of {', '.join(sorted(FAMILIES))}") from None


def config_key(family: str, config: dict) -> str:
    """Canonical identity of a config: the reuse and dedupe key."""
    text = json.dumps({"family": family, "config": config}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache
def installed_source(family: str) -> str | None:
    """The family's kernel source hash in this installation (None: no such family here)."""
    return FAMILIES[family].source_hash() if family in FAMILIES else None


def changed_source(family: str, measured: str | None, built_from: str | None = None) -> str | None:
    """The source hash a kernel of ``family`` is built from here (``built_from``, e.g. a shipped
    cubin's, else this installation's; "unknown" for a family it lacks) where it differs from
    the ``measured`` one, else None (the same, or nothing recorded): that kernel was never timed."""
    now = built_from or installed_source(family) or "unknown"
    return now if measured and measured != now else None
