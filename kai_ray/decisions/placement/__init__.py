"""Placement: where a gang's pods go, inside the cycle's transaction.

The allocate action calls two functions and nothing else:
- `place_gang(tx, group, config)`: the group's missing minimum (and every
  subgroup's minimum), all or nothing; on failure the transaction is rolled back
  to where it was and the outcome says why, for a person;
- `place_extras(tx, group, config, limit)`: members above the minimum, one by one.
Both commit what they place. Pure: no I/O.
"""

from __future__ import annotations

from kai_ray.decisions.placement.first_fit import GangOutcome, place_extras, place_gang

__all__ = ["GangOutcome", "place_extras", "place_gang"]
