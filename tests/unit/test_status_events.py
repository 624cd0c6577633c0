"""The Event a PodGroup gets when its waiting reason changes: a Warning when the
cycle refused the gang, a Normal one while its controller has not made its pods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from kai_ray.effects.binder import DONE, WriteResult
from kai_ray.effects.scheduling_loop import LoopOptions, SchedulingLoop
from kai_ray.state.cache import POD_GROUP
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import ObjectRef

NO_ROOM = "gang of 4 does not fit: needs 4 pods with 8 GPUs each; best rack has 6"


class Recording:
    """A status writer that records the Events it is told to post."""

    def __init__(self) -> None:
        self.events: list[tuple[bool, str, str]] = []

    def patch_status(self, kind: str, key: str, status: Mapping[str, Any]) -> WriteResult:
        return DONE

    def record_event(self, ref: ObjectRef, warning: bool, reason: str, message: str) -> None:
        self.events.append((warning, reason, message))


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        pytest.param(
            "waiting for its pods to be created",
            (False, "WaitingForPods"),
            id="released, its pods not made yet: Normal",
        ),
        pytest.param(
            "2 of its pods held by scheduling gates grove.io/podgang-pending-creation",
            (False, "WaitingForPods"),
            id="Grove's gates still on: Normal",
        ),
        pytest.param(NO_ROOM, (True, "Unschedulable"), id="refused by the cycle: Warning"),
    ],
)
def test_the_event_of_a_new_waiting_reason(reason: str, expected: tuple[bool, str]) -> None:
    loop = SchedulingLoop(None, LoopOptions(config=SchedulerConfig(), leader_elect=False))  # type: ignore[arg-type]
    writer = Recording()
    loop.writer = writer  # type: ignore[assignment]
    ref = ObjectRef(POD_GROUP, "g", "ns")
    loop._write_status(POD_GROUP, "ns/g", {"phase": "Pending", "reason": reason}, ref)
    assert [(warning, kind) for warning, kind, _ in writer.events] == [expected]
    assert writer.events[0][2] == reason
    loop._write_status(POD_GROUP, "ns/g", {"phase": "Pending", "reason": reason}, ref)
    assert len(writer.events) == 1, "the same reason again is not told twice"
