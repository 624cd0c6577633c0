"""Placement: where a gang's pods go, inside the cycle's transaction.

Every action calls two functions and nothing else:
- `place_gang(tx, group, config)`: the group's missing minimum (and every
  subgroup's minimum, `minSubGroup` of them at the top), all or nothing; on
  failure the transaction is rolled back to where it was and the outcome says
  why, for a person, with a `Code` telling "no room now" from "asks for what
  does not exist";
- `place_extras(tx, group, config, limit)`: members above the minimum, one by one.
Neither commits: the caller commits or rolls back (`Transaction.attempt`).
Candidate topology domains are evaluated by a `PlacementBackend`: numpy
in-process, or Ray actors holding shards of the nodes (`backend.py`, `ray_backend.py`);
both give the same plan. See docs/placement.md.
Pure: no I/O.
"""

from __future__ import annotations

from kai_ray.decisions.placement.backend import LocalBackend, PlacementBackend, RoomQuery
from kai_ray.decisions.placement.gang_tree import GangOutcome, place_extras, place_gang
from kai_ray.decisions.placement.reasons import Code

__all__ = [
    "Code",
    "GangOutcome",
    "LocalBackend",
    "PlacementBackend",
    "RoomQuery",
    "place_extras",
    "place_gang",
]
