"""DRA claims in placement: which nodes can reach a pod's devices, and which devices it gets.

A pod with ResourceClaims (docs/dra.md) is placed like any other, with two more steps:
- a **filter** that does not change within a cycle (`claims_mask`, kept in the
  transaction's memo per claim signature): a node passes when, for every claim not
  allocated yet, each request can be met from the devices it reaches with nobody
  else's allocations taken into account (class and request selectors, tolerations,
  counts), and every claim already allocated can be used from it;
- the **allocation** on the node chosen (`allocation_on`): the allocator picks
  concrete devices that no claim holds (`Transaction.dra_taken`: the snapshot's
  allocated claims, less what evictions of this transaction free, plus what its
  placements took), keeping the claims' constraints. A claim the transaction
  allocated for another pod (the pods of a gang sharing one claim) is reused where
  its devices can be used.
Devices of mapped classes are also queue resources on the pod and the node
(`state/dra_view.py`), so quotas, fair share and the node's room see them; the
filter and the allocation see the devices themselves. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import numpy.typing as npt

from kai_ray.decisions.transaction import MemoKey, Transaction
from kai_ray.state.dra_allocate import (
    Allocation,
    ClaimAllocation,
    Unallocatable,
    allocate,
    claim_name,
    could_serve,
)
from kai_ray.state.pod_states import PodState
from kai_ray.values.dra import ResourceClaim

Flags = npt.NDArray[np.bool_]
CLAIMS_MASK = MemoKey[Flags]("claims mask")


def claims_signature(tx: Transaction, pod: PodState) -> Hashable:
    """What the filter depends on: each claim's spec and where an allocated one may be used."""
    if not pod.claim_entries:
        return ()
    if pod.claim_wait:
        return ("wait",)
    claims = tx.snapshot.dra.claims
    return tuple(_claim_signature(claims[key]) for key in pod.claims)


def _claim_signature(claim: ResourceClaim) -> Hashable:
    allocation = claim.status.allocation
    if allocation is None:
        return ("spec", claim.spec.model_dump_json())
    where = allocation.nodeSelector
    return ("allocated", where.model_dump_json() if where is not None else "")


def claims_mask(tx: Transaction, pod: PodState) -> Flags:
    """Nodes from which the pod's claims could be met (see the module docstring)."""

    def build() -> Flags:
        nodes = len(tx.snapshot.node_names)
        if pod.claim_wait:
            return np.zeros(nodes, dtype=np.bool_)
        claims = [tx.snapshot.dra.claims[key] for key in pod.claims]
        inventory = tx.snapshot.dra.inventory
        mask = np.fromiter(
            (could_serve(claims, name, inventory) for name in tx.snapshot.node_names),
            dtype=np.bool_,
            count=nodes,
        )
        mask.setflags(write=False)
        return mask

    return tx.memo.get(CLAIMS_MASK, claims_signature(tx, pod), build)


def allocation_on(tx: Transaction, pod: PodState, node: int) -> Allocation | Unallocatable:
    """The pod's claims on `node`, from devices free in the transaction, or why not."""
    if pod.claim_wait:
        return Unallocatable(pod.claim_wait)
    name = tx.snapshot.node_names[node]
    view = tx.snapshot.dra
    reused: list[ClaimAllocation] = []
    fresh: list[ResourceClaim] = []
    for key in pod.claims:
        held = tx.claim_allocations.get(key)
        if held is None:
            fresh.append(view.claims[key])
            continue
        where = held.node_selector
        if where is not None and not where.matches(name, view.inventory.labels_of(name)):
            return Unallocatable(
                f"{claim_name(view.claims[key])} was given devices {name} cannot reach"
            )
        reused.append(ClaimAllocation(held.namespace, held.name, held.devices, where, new=False))
    result = allocate(fresh, name, view.inventory, tx.dra_taken(), tx.dra_consumed())
    if isinstance(result, Unallocatable) or not reused:
        return result
    return Allocation(name, (*reused, *result.claims))


def claims_reason(tx: Transaction, pod: PodState) -> str:
    """Why the pod's claims keep it off every node, for its group's status."""
    if pod.claim_wait:
        return f"pod {pod.key} waits: {pod.claim_wait}"
    return f"pod {pod.key}: no node can reach the devices its ResourceClaims ask for"


def claims_example(tx: Transaction, pod: PodState, node: int) -> str:
    """Why the pod's claims cannot be met on `node` even with every device free,
    for a failure message ("" when they can)."""
    if pod.claim_wait:
        return pod.claim_wait
    view = tx.snapshot.dra
    claims = [view.claims[key] for key in pod.claims]
    result = allocate(claims, tx.snapshot.node_names[node], view.inventory, frozenset())
    return result.reason if isinstance(result, Unallocatable) else ""
