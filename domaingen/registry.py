"""A small name -> class table filled by a decorator.

Algorithms and datasets register themselves where they are defined, so adding
one is a new module and nothing else: there is no central if/elif chain.
"""

from __future__ import annotations

from typing import Callable, Generic, Iterator, TypeVar

from domaingen.errors import DomaingenError

T = TypeVar("T")


class UnknownNameError(DomaingenError):
    """A name that is not in a registry."""


class Registry(Generic[T]):
    """An ordered table of named classes of one kind ("algorithm", "dataset")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Class decorator: add the class under `name` (default: its __name__)."""

        def decorate(cls: T) -> T:
            key = name or cls.__name__  # type: ignore[attr-defined]
            if key in self._entries and self._entries[key] is not cls:
                raise ValueError(f"{self.kind} '{key}' is registered twice")
            self._entries[key] = cls
            return cls

        return decorate

    def unregister(self, name: str) -> None:
        """Remove an entry (used by tests that register temporary classes)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """Return the class registered as `name`, or raise a message listing valid names."""
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'; valid {self.kind}s: {', '.join(self.names())}"
            ) from None

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
