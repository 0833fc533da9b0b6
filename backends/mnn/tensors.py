"""Tensor naming and indexing of an ``.mnn`` graph.

MNN tensors are positions in ``Net.tensorName``; names must be unique (a duplicate makes
MNN's Module API return the wrong tensor without an error). Kiln's value names are
reserved up front, so the tensors Kiln adds (layout copies, intermediates of multi-op
lowerings) never take a name that a Kiln value keeps: they get derived names such as
``<value>__nc4hw4`` or ``<value>__before_tr``, made unique with a numeric suffix.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["TensorTable", "UniqueNames"]


class UniqueNames:
    """A set of unique names that derives a fresh name from a wanted one."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._reserved = set(reserved)
        self._used: set[str] = set()

    def take(self, want: str, *, exact: bool = False) -> str:
        """Claim ``want`` (a reserved name may be claimed exactly once, with ``exact``)."""
        want = want or "t"
        if exact and want not in self._used:
            self._used.add(want)
            return want
        name, i = want, 1
        while name in self._used or name in self._reserved:
            name = f"{want}_{i}"
            i += 1
        self._used.add(name)
        return name

    def release(self, name: str) -> None:
        """Give a name back."""
        self._used.discard(name)


class TensorTable:
    """The ordered tensor names of a net."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self._names: list[str] = []
        self._unique = UniqueNames(reserved)

    def add(self, want: str, *, exact: bool = False) -> int:
        """A new tensor named ``want`` (exactly, for a Kiln value name) or a derived name."""
        self._names.append(self._unique.take(want, exact=exact))
        return len(self._names) - 1

    def name(self, index: int) -> str:
        """The name of tensor ``index``."""
        return self._names[index]

    def rename(self, index: int, want: str, *, exact: bool = False) -> str:
        """Give tensor ``index`` another name; returns the name it got."""
        self._unique.release(self._names[index])
        self._names[index] = self._unique.take(want, exact=exact)
        return self._names[index]

    def names(self) -> list[str]:
        """All names in index order."""
        return list(self._names)

    def __len__(self) -> int:
        return len(self._names)
