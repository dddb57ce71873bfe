"""The runtime's on/off environment switches ($TUNEFW_GUARD, $TUNEFW_VERIFY, $TUNEFW_PDL)."""
from __future__ import annotations

import os

OFF = ("0", "false", "no", "off")


def switch(name: str) -> bool:
    """Whether the switch $name is on: unset or anything but 0, false, no, off (any case)."""
    return os.environ.get(name, "1").strip().lower() not in OFF
