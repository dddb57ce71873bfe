"""The runtime's on/off environment switches ($TUNEFW_GUARD, $TUNEFW_VERIFY, $TUNEFW_PDL)."""
from __future__ import annotations

import os

OFF = ("0", "false", "no", "off")


def switch(name: str, default: bool = True) -> bool:
    """Whether the switch $name is on: anything but 0, false, no, off (any case); ``default``
    when it is unset or empty."""
    value = os.environ.get(name, "").strip().lower()
    return default if not value else value not in OFF
