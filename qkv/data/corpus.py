"""What a corpus of examples by split name offers, whatever its examples are."""

from __future__ import annotations

from typing import Generic, TypeVar

E = TypeVar("E")

__all__ = ["Splits"]


class Splits(Generic[E]):
    """A mixin for a corpus that holds ``splits: dict[str, list[E]]`` (``train``, ``valid``, ``test``...)."""

    splits: dict[str, list[E]]

    def split(self, name: str) -> list[E]:
        """The examples of split ``name``; a ``ValueError`` naming the splits there are when it is not one."""
        if name not in self.splits:
            raise ValueError(f"no split {name!r}; one of {', '.join(self.splits)}")
        return self.splits[name]

    @property
    def train(self) -> list[E]:
        return self.split("train")

    def sizes(self) -> dict[str, int]:
        """The number of examples of each split."""
        return {k: len(v) for k, v in self.splits.items()}
