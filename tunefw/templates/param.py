"""Param: one tunable knob of a kernel family, declared once beside its template (values,
meaning, Optuna encoding, C++ spelling); tunefw.templates.base builds a family's space from them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

ENCODINGS = ("auto", "int", "categorical")
# Part of every space hash: bump it when the Optuna encoding of declared values changes, so a
# study stored under the old encoding is refused on resume (``--new-round``) instead of misread.
ENCODING_VERSION = "real-values-1"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Param:
    """One tunable knob: its name (a C++ template argument), values, meaning, Optuna encoding
    and C++ spelling. ``Param(name, values, help)`` is the whole declaration of most knobs.

    ``cpp`` maps a value to its C++ template-argument token (default ``str(int(v))``; needed for
    string values). ``encoding``: ``int`` asks Optuna for an IntDistribution over the values
    (they must form an arithmetic range), ``categorical`` for a CategoricalDistribution of the
    values, ``auto`` picks ``int`` where the int values form an arithmetic range (TPE then
    learns from neighbouring values) and ``categorical`` otherwise. Either way Optuna stores
    the real values.
    """

    name: str
    values: tuple
    help: str = ""
    cpp: Mapping[Any, str] | None = field(default=None, hash=False)
    encoding: str = "auto"
    # For a knob added to a family later: the value a config written before it existed means
    # (the kernel's old behaviour), so stored tables and trials keep loading (KernelTemplate.upgrade).
    absent: Any = None
    # A knob added after the kernel's GATED argument: declared after it with ``absent`` as its
    # C++ default, so a config at that value keeps the name, and so the shipped cubin, it had.
    after_gate: bool = False

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"{self.name}: no values")
        if len(set(self.values)) != len(self.values):
            raise ValueError(f"{self.name}: repeated values {list(self.values)}")
        if not (all(_is_int(v) for v in self.values)
                or all(isinstance(v, str) for v in self.values)):
            raise ValueError(f"{self.name}: values must be all ints or all strings")
        if self.encoding not in ENCODINGS:
            raise ValueError(f"{self.name}: encoding {self.encoding!r} not in {ENCODINGS}")
        if self.encoding == "int" and self.step is None:
            raise ValueError(f"{self.name}: encoding 'int' needs int values in an arithmetic range")
        if self.cpp is not None and set(self.cpp) != set(self.values):
            raise ValueError(f"{self.name}: cpp must map exactly the values {list(self.values)}")
        if self.after_gate and self.absent is None:
            raise ValueError(f"{self.name}: after_gate needs the absent value (its C++ default)")
        if self.absent is not None and self.absent not in self.values:
            raise ValueError(f"{self.name}: absent={self.absent!r} is not one of {list(self.values)}")

    @property
    def kind(self) -> type:
        """The Python type of every value (int or str)."""
        return str if isinstance(self.values[0], str) else int

    @property
    def step(self) -> int | None:
        """The common difference when the int values form an arithmetic range of 2+ values."""
        if self.kind is not int or len(self.values) < 2:
            return None
        ordered = sorted(self.values)
        step = ordered[1] - ordered[0]
        if any(b - a != step for a, b in zip(ordered, ordered[1:])):
            return None
        return step

    @property
    def int_encoded(self) -> bool:
        """Whether Optuna sees this knob as an IntDistribution (else categorical)."""
        return self.encoding == "int" or (self.encoding == "auto" and self.step is not None)

    def describe_encoding(self) -> str:
        """The Optuna encoding in words, e.g. ``int 2..6 step 1`` or ``categorical``."""
        if self.int_encoded:
            return f"int {min(self.values)}..{max(self.values)} step {self.step}"
        return "categorical"

    def distribution(self) -> Any:
        """The Optuna distribution over the real values (optuna is imported only here)."""
        from optuna.distributions import CategoricalDistribution, IntDistribution

        if self.int_encoded:
            return IntDistribution(min(self.values), max(self.values), step=self.step)
        return CategoricalDistribution(list(self.values))

    def type_reason(self, value: object) -> str | None:
        """Why ``value`` is not one of this knob's values (wrong type or not declared)."""
        if self.kind is int and not _is_int(value):
            return f"{self.name}={value!r} is a {type(value).__name__}, expected an int"
        if self.kind is str and not isinstance(value, str):
            return f"{self.name}={value!r} is a {type(value).__name__}, expected a string"
        if value not in self.values:
            return f"{self.name}={value!r} not in {list(self.values)}"
        return None

    def cpp_arg(self, value: Any) -> str:
        """The C++ template-argument token of a value (string values need ``cpp``)."""
        if self.cpp is not None:
            return self.cpp[value]
        if self.kind is str:
            raise ValueError(f"{self.name}: no C++ token for {value!r} (declare cpp=)")
        return str(int(value))
