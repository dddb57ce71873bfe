"""Writing output files whole or not at all."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from tunefw.errors import UserError


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write text (or bytes) to a temporary file beside ``path`` and rename it into place; a
    one-line UserError on failure, and no file left behind (neither ``path`` nor the
    temporary) then."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        raise UserError(f"{path}: cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
