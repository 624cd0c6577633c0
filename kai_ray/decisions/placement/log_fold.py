"""A value kept up to date with a transaction's log: what it placed and what it evicted.

Inter-pod rules count the pods the transaction placed (and take away those it
evicted) on top of what the snapshot holds. Reading the whole log at every pod
placed would cost the length of the log each time; a `LogFold` instead keeps
its value between calls and, at each call, undoes the entries a rollback took
away (each applied again with the opposite sign) and applies the new ones. It
tells the entries still in the log from those taken away by the transaction's
versions, which are never reused (`Transaction.version_at`), so the value is
exactly the plain fold of the log as it is. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from kai_ray.decisions.transaction import Transaction
from kai_ray.state.pod_states import PodState

S = TypeVar("S")
#: A log entry as a fold sees it: the pod, its node row, +1 placed or -1 evicted.
Change = tuple[PodState, int, int]


@dataclass
class LogFold(Generic[S]):
    """`state`, with `step` applied to every entry of the log the last `catch_up` read."""

    state: S
    #: Applies one change to the state; applied again with the sign turned, it undoes it.
    step: Callable[[S, Change], None]
    #: Per entry read: the change (None for a pod the snapshot does not know), and the
    #: transaction's version once it held that entry.
    read: list[tuple[Change | None, int]] = field(default_factory=list)

    def catch_up(self, tx: Transaction) -> S:
        """The state folded over the transaction's log as it is now."""
        held = tx.checkpoint()
        kept = min(len(self.read), held)
        while kept and self.read[kept - 1][1] != tx.version_at(kept):
            kept -= 1
        while len(self.read) > kept:
            change, _ = self.read.pop()
            if change is not None:
                pod, node, sign = change
                self.step(self.state, (pod, node, -sign))
        pods = tx.snapshot.pods
        for index in range(kept, held):
            placement = tx.placements[index]
            known = pods.get(placement.bind.pod)
            change = None
            if known is not None:
                change = (known, placement.node, -1 if placement.removal else 1)
                self.step(self.state, change)
            self.read.append((change, tx.version_at(index + 1)))
        return self.state
