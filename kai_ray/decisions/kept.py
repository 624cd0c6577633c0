"""Values derived from one group's state alone, kept from cycle to cycle.

A caller that runs cycle after cycle on snapshots of one cache (the operator,
the simulator) keeps a `KeptPerGroup` in its `totals.GroupTotals`, which drops
a group's values when the group changes or goes; each cycle hands it to the
actions through the cycle's memo (`PER_GROUP`). A value is used only for the
very object it was derived from. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from kai_ray.decisions.transaction import CycleMemo, MemoKey
from kai_ray.state.groups import PodGroupState

T = TypeVar("T")


class KeptPerGroup:
    """Values derived from one group's state alone (its victim units, whether it may
    be moved), kept from cycle to cycle while the cache keeps that state: a value is
    used only for the very object it was derived from, and a group that changed or
    went is dropped by `GroupTotals.update`.

    Values kept as keys (signatures) can be interned: a value equal to one built
    before, for any group, is replaced by that one, so that looking up equal keys
    of many groups meets the very same object and compares nothing deeper."""

    #: Past this many interned values the table starts afresh (interning only saves
    #: comparisons; a long-running operator sees ever new shapes).
    INTERNED_AT_MOST = 100_000

    def __init__(self) -> None:
        self._by_group: dict[str, dict[tuple[MemoKey[Any], Hashable], _Kept]] = {}
        self._interned: dict[Hashable, Hashable] = {}
        self._flat: dict[MemoKey[Any], tuple[Hashable, dict[str, tuple[PodGroupState, Any]]]] = {}

    def get(
        self,
        slot: MemoKey[T],
        argument: Hashable,
        group: PodGroupState,
        build: Callable[[], T],
        intern: bool = False,
    ) -> T:
        """The value under `slot` for `argument` (what else it depends on, such as a
        setting) derived from `group`, built unless kept for this very object;
        `intern`: a hashable value equal to one interned before is that one."""
        kept = self._by_group.get(group.key)
        if kept is None:
            kept = self._by_group[group.key] = {}
        found = kept.get((slot, argument))
        if found is not None and found.group is group:
            value: T = found.value
            return value
        value = build()
        if intern and value is not None:
            value = self._intern(value)
        kept[(slot, argument)] = _Kept(group, value)
        return value

    def _intern(self, value: T) -> T:
        table = self._interned
        found = table.get(value)
        if found is None:
            if len(table) >= self.INTERNED_AT_MOST:
                table.clear()
            table[value] = found = value
        same: T = found  # type: ignore[assignment]
        return same

    def entries(self, slot: MemoKey[T]) -> Iterator[tuple[str, PodGroupState, T]]:
        """(group key, group, value) of every value kept under `slot`."""
        for key, kept in self._by_group.items():
            for (found_slot, _), entry in kept.items():
                if found_slot is slot:
                    yield key, entry.group, entry.value

    def flat(self, slot: MemoKey[T], facts: Hashable) -> dict[str, tuple[PodGroupState, T]]:
        """Values under `slot` by group key, each with the very state it was derived
        from, for a caller that asks of many groups many times a cycle (one look-up
        each); also derived from `facts` (what the caller read besides the group),
        so they start afresh when the facts are not those they were kept under. A
        group that changed or went is dropped, as with `get`; the caller checks the
        state it meets is the one kept."""
        kept = self._flat.get(slot)
        if kept is None or kept[0] != facts:
            kept = self._flat[slot] = (facts, {})
        values: dict[str, tuple[PodGroupState, T]] = kept[1]
        return values

    def drop(self, key: str) -> None:
        self._by_group.pop(key, None)
        for _, values in self._flat.values():
            values.pop(key, None)


@dataclass(frozen=True)
class _Kept:
    group: PodGroupState
    value: Any


#: The cycle's handle on the values kept per group (`CycleMemo` slot; absent when
#: the caller keeps nothing from cycle to cycle).
PER_GROUP = MemoKey[KeptPerGroup]("values kept per group")


def kept_per_group(
    memo: CycleMemo,
    slot: MemoKey[T],
    argument: Hashable,
    group: PodGroupState,
    build: Callable[[], T],
    intern: bool = False,
) -> T:
    """`KeptPerGroup.get` of the cycle's kept values, or `build()` when none are kept."""
    kept = memo.find(PER_GROUP, None)
    return build() if kept is None else kept.get(slot, argument, group, build, intern)
