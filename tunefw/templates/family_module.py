"""Kernel families from a Python file outside tunefw (`tunefw verify --families FILE`): the file
defines FAMILIES, a list or tuple of KernelTemplate instances, whose sources (the template and its
include/ folder) lie in the file's own folder."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from tunefw.errors import UserError
from tunefw.templates import FAMILIES, get_family
from tunefw.templates.base import KernelTemplate


@dataclass(frozen=True)
class FamilyModule:
    """The families a file declares, beside tunefw's own."""

    path: Path | None
    families: dict[str, KernelTemplate]

    def all_families(self) -> dict[str, KernelTemplate]:
        """tunefw's families and this file's, by name."""
        return {**FAMILIES, **self.families}

    def get(self, name: str) -> KernelTemplate:
        """The family called ``name`` (this file's or tunefw's), or a one-line error."""
        return self.families[name] if name in self.families else get_family(name)

    def source_dir(self, name: str) -> Path | None:
        """Where family ``name``'s sources lie: this file's folder for its own, else None
        (tunefw's kernel templates)."""
        return self.path.parent if self.path and name in self.families else None


def load_family_module(path: Path | str | None) -> FamilyModule:
    """Import ``path`` and collect its FAMILIES (none for None); a one-line error when it cannot."""
    if path is None:
        return FamilyModule(None, {})
    path = Path(path).resolve()
    where = f"--families {path}"
    if path.suffix != ".py" or not path.is_file():
        raise UserError(f"{where}: expected a Python file")
    module_spec = importlib.util.spec_from_file_location(f"_tunefw_families_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:  # an import runs user code: any failure is one line
        first = (str(exc).splitlines() or [""])[0]
        raise UserError(f"{where}: cannot import it ({type(exc).__name__}: {first})") from None
    declared = getattr(module, "FAMILIES", None)
    if (not isinstance(declared, (list, tuple)) or not declared
            or not all(isinstance(t, KernelTemplate) for t in declared)):
        raise UserError(f"{where}: expected FAMILIES, a list of KernelTemplate instances")
    clash = sorted(t.family for t in declared if t.family in FAMILIES)
    if clash:
        raise UserError(f"{where}: family {clash[0]!r} is one of tunefw's own")
    return FamilyModule(path, {t.family: t for t in declared})
