"""Writes while the API server cannot be reached: a refusal to try again, never an
exception out of the cycle (an eviction during an API server restart used to raise
inside `Binder.apply`)."""

from __future__ import annotations

import socket

import pytest
from kubernetes import client

from kai_ray.decisions.plan import Bind, Evict
from kai_ray.effects.binder import Outcome
from kai_ray.effects.kube import ApiError, KubeWriter, Rest, Unreachable


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again once the block ends


@pytest.fixture
def rest() -> Rest:
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{_closed_port()}"
    configuration.retries = False
    return Rest(client.ApiClient(configuration))


def test_a_request_to_a_server_that_is_not_there_is_a_503_refusal(rest: Rest) -> None:
    with pytest.raises(ApiError) as raised:
        rest.call("GET", "/api/v1/pods")
    assert isinstance(raised.value, Unreachable)
    assert raised.value.status == 503
    assert "refused" in raised.value.body.lower() or "connect" in raised.value.body.lower()


def test_evictions_and_binds_are_retried_later_when_the_server_is_down(rest: Rest) -> None:
    writer = KubeWriter(rest, lambda kind, key: None)
    evicted = writer.evict(Evict("team-a/p-0", "team-a/g", "reclaim", "team-b"), "why")
    assert evicted.outcome is Outcome.RETRY, evicted
    assert evicted.message.startswith("evicting team-a/p-0: 503 Unreachable"), evicted
    bound = writer.bind(Bind("team-a/p-1", "team-a/g", "n1"), {})
    assert bound.outcome is Outcome.RETRY, bound
    resumed = writer.resume_workload("RayCluster", "team-a/rc", ["n1"])
    assert resumed.outcome is Outcome.RETRY, resumed
