"""The naming rule for studies and labels: 1-128 characters of A-Z a-z 0-9 . _ - (no '/',
which separates the parts of an Optuna study name, no spaces, no newlines)."""
from __future__ import annotations

import re

from tunefw.errors import UserError

NAME_CHARS = r"[A-Za-z0-9._-]"
NAME_MAX = 128
NAME_PATTERN = f"^{NAME_CHARS}{{1,{NAME_MAX}}}$"
_NAME = re.compile(NAME_PATTERN)
RULE = f"1-{NAME_MAX} characters of A-Z a-z 0-9 . _ -"


def valid_name(name: object) -> bool:
    """True if ``name`` is a string that follows the naming rule."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


def check_name(name: object, what: str = "study name") -> str:
    """Return ``name`` if it follows the rule, else raise a one-line UserError."""
    if not valid_name(name):
        text = repr(name)
        raise UserError(f"{what} {text[:60] + '...' if len(text) > 60 else text}: "
                        f"expected {RULE}")
    return name  # type: ignore[return-value]
