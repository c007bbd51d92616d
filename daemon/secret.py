"""A string that never prints itself (config values such as API keys)."""

from __future__ import annotations


class Secret:
    """Holds a secret; ``repr``/``str`` show ``***``, :meth:`reveal` gives the value."""

    __slots__ = ("_value",)

    def __init__(self, value: str = "") -> None:
        self._value = value

    def reveal(self) -> str:
        """The real value, for the one place that sends or compares it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)
