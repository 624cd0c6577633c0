"""The Lease's holder writes only while its renewal is fresh (`LeaseElector.holds`):
a renewal that hangs or fails ends its writes before another replica may take the
Lease. A fake API answers the elector's requests; no cluster."""

from __future__ import annotations

import threading
from typing import Any

from kai_ray.effects.kube import ApiError, LeaseElector


class FakeLeases:
    """One Lease, GET, POST and PUT, in memory; `down` makes every request raise."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.down = False

    def call(self, method: str, path: str, query: Any = None, body: Any = None) -> Any:
        if self.down:
            raise ConnectionError("the API server cannot be reached")
        if method == "GET":
            if self.lease is None:
                raise ApiError(404, "Not Found")
            return dict(self.lease)
        self.lease = dict(body)
        return self.lease


def elector(api: FakeLeases, clock: list[float]) -> LeaseElector:
    lease = LeaseElector(api, "ns", "lease", "me", threading.Event(), duration_s=9, renew_s=2)  # type: ignore[arg-type]
    lease.monotonic = lambda: clock[0]
    return lease


def test_the_holder_stops_writing_once_its_renewal_is_two_thirds_of_the_lease_old() -> None:
    api, clock = FakeLeases(), [100.0]
    lease = elector(api, clock)
    assert not lease.holds()
    lease.renew_once()
    assert lease.holds()
    api.down = True  # renewals fail from here on, but the flag is cleared only by one
    clock[0] = 105.9
    assert lease.holds()  # 5.9 s of 9: still its own
    clock[0] = 106.1
    assert lease.leading.is_set() and not lease.holds()  # past 6 s: no more writes
    lease.renew_once()
    assert not lease.leading.is_set()
    api.down = False
    lease.renew_once()  # its own Lease again
    assert lease.holds()
