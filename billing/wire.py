"""How the named tuples that cross the billing worker's pipe (billing.client.pipe) pickle: as
``tuple.__new__`` of their class and one tuple of their values, rebuilt in C on unpickling, not
through their class's ``__new__`` in Python (pickle's default for a named tuple, twice as slow
both ways). Docs: docs/billing-and-console.md ("The billing client")."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T", bound=tuple)
_tuple_new = tuple.__new__


def _reduce(self: tuple) -> tuple[Any, tuple[type, tuple]]:
    return _tuple_new, (type(self), tuple(self))


def pickled_as_tuple(cls: type[T]) -> type[T]:
    """A NamedTuple class decorator: its instances pickle as their values in field order."""
    cls.__reduce__ = _reduce  # type: ignore[assignment,method-assign]
    return cls
