"""Writing output files whole or not at all."""
from __future__ import annotations

from pathlib import Path

from tunefw.errors import UserError


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it into place; a one-line
    UserError on failure, and no half-written file either way."""
    tmp = Path(str(path) + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror})") from None
