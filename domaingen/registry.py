"""A small name -> class table filled by a decorator.

Algorithms and datasets register themselves where they are defined, so adding
one is a new module and nothing else: there is no central if/elif chain. A table
may also hold entry objects that describe a function (selection methods,
launchers); such an entry names the function it describes as `__wrapped__`, and
that function is what `owner` and the clash check read.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

from domaingen.errors import DomaingenError

T = TypeVar("T")


class UnknownNameError(DomaingenError):
    """A name that is not in a registry."""


class NameClashError(DomaingenError, ValueError):
    """A name registered by two different classes (two plugins, or a plugin and a built-in)."""


def _definition(obj: object) -> object:
    """What defined a registry entry: a class itself, else the function an entry object wraps."""
    return obj if isinstance(obj, type) else getattr(obj, "__wrapped__", obj)


def owner(obj: object) -> str:
    """Who defined `obj`, for messages: its module, marked (built in) for domaingen's own."""
    module = getattr(_definition(obj), "__module__", None) or "?"
    return f"{module} (built in)" if module == "domaingen" or module.startswith("domaingen.") else module


def _same_definition(a: object, b: object) -> bool:
    # the same class statement run again (a module re-executed, e.g. reloaded) is not a clash
    a, b = _definition(a), _definition(b)
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None), getattr(b, "__qualname__", None))


class Registry(Generic[T]):
    """An ordered table of named classes (or entry objects) of one kind ("algorithm", "launcher")."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}
        self._modifiers: dict[str, Callable[[T], T]] = {}
        self._composed: dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Class decorator: add the class under `name` (default: its __name__)."""

        def decorate(cls: T) -> T:
            key = name or cls.__name__  # type: ignore[attr-defined]
            old = self._entries.get(key)
            if old is not None and old is not cls and not _same_definition(old, cls):
                raise NameClashError(
                    f"{self.kind} '{key}' is registered twice: by {owner(old)} and by {owner(cls)}; "
                    "rename one of them"
                )
            self._entries[key] = cls
            self._composed = {k: v for k, v in self._composed.items() if k.partition("+")[0] != key}
            return cls

        return decorate

    def unregister(self, name: str) -> None:
        """Remove an entry (used by tests that register temporary classes)."""
        self._entries.pop(name, None)
        self._composed = {k: v for k, v in self._composed.items() if k.partition("+")[0] != name}

    def owners(self) -> dict[str, str]:
        """name -> the module that registered it (see `owner`), in registration order."""
        return {name: owner(cls) for name, cls in self._entries.items()}

    def register_modifier(self, suffix: str, compose: Callable[[T], T]) -> None:
        """Make every `NAME+suffix` valid: `compose(get(NAME))`, built on first use and cached."""
        if suffix in self._modifiers:
            raise ValueError(f"{self.kind} modifier '{suffix}' is registered twice")
        self._modifiers[suffix] = compose

    def get(self, name: str) -> T:
        """Return the class registered as `name` (or composed as `BASE+MODIFIER`, modifiers
        chaining: `ERM+ModReg+SWAD` is SWAD applied to `ERM+ModReg`), in any case.

        An unknown name raises a message with the closest name, the valid names and
        how to load one's own (--plugins).
        """
        if name in self._entries:
            return self._entries[name]
        if name in self._composed:
            return self._composed[name]
        name = self.canonical(name)
        if name in self._entries:
            return self._entries[name]
        if name not in self._composed:
            base, _, suffix = name.rpartition("+")
            self._composed[name] = self._modifiers[suffix](self.get(base))
        return self._composed[name]

    def _spelled(self, name: str, table: dict[str, object]) -> str | None:
        """`name` as `table` spells it: itself, or its only case-insensitive match."""
        if name in table:
            return name
        matches = [key for key in table if key.casefold() == name.casefold()]
        return matches[0] if len(matches) == 1 else None

    def _canonical_or_none(self, name: str) -> str | None:
        entry = self._spelled(name, self._entries)
        if entry is not None:
            return entry
        base, plus, suffix = name.rpartition("+")
        if not plus or not base:
            return None
        base_name, suffix_name = self._canonical_or_none(base), self._spelled(suffix, self._modifiers)
        if base_name is None or suffix_name is None:
            return None
        return f"{base_name}+{suffix_name}"

    def canonical(self, name: str, where: str = "") -> str:
        """The registered spelling of `name` ("erm+modreg" -> "ERM+ModReg"); an unknown name raises
        UnknownNameError with the closest valid name, the valid names and a word on --plugins
        (`where`, e.g. " in 'algorithms'", follows the name in that message)."""
        if not isinstance(name, str):
            raise UnknownNameError(f"{self.kind} names are text, got {name!r}")
        spelled = self._canonical_or_none(name)
        if spelled is None:
            raise UnknownNameError(self._unknown(name, where))
        return spelled

    def _unknown(self, name: str, where: str = "") -> str:
        folded = {key.casefold(): key for key in [*self._entries, *self.composed_names()]}
        close = difflib.get_close_matches(name.casefold(), list(folded), n=1, cutoff=0.6)
        hint = f"did you mean '{folded[close[0]]}'? " if close else ""
        valid = ", ".join(self.names())
        if self._modifiers:
            valid += "; and X+" + ", X+".join(self._modifiers) + " for any of them"
        return (f"unknown {self.kind} '{name}'{where}; {hint}valid {self.kind}s: {valid} "
                f"(one of your own: load its module with --plugins MODULE)")

    def base_name(self, name: str) -> str:
        """The registered name under `name`: `BASE` for `BASE+MODIFIER` (and for chains), `name`
        itself otherwise. An unknown name raises the same message as `get`.
        """
        self.get(name)
        name = self.canonical(name)
        while name not in self._entries:
            name = name.rpartition("+")[0]
        return name

    def names(self) -> list[str]:
        """Registered names, in registration order."""
        return list(self._entries)

    def composed_names(self) -> list[str]:
        """Every `NAME+MODIFIER` the registered modifiers make valid."""
        return [f"{name}+{suffix}" for suffix in self._modifiers for name in self._entries]

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.get(name)
        except UnknownNameError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
