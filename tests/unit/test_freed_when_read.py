"""`admission.FreedWhenRead` adds each queue's amounts up only when read, and reads
as `freed_in_queues` does: the same queues in the same order, each with the same
amounts to the bit (amounts whose sums depend on the order they are added in).
`first_breach` skips what a queue holds only where no bound is finite: limits
still refuse with the victims' amounts given back."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from kai_ray.decisions.admission import FreedWhenRead, freed_in_queues, limit_refusal
from kai_ray.decisions.ledger import QueueLedger
from kai_ray.state.snapshot import ClusterObjects, build_snapshot
from kai_ray.values.resources import CPU, GPU, Resources
from tests.builders import make_queue

#: root -> dept-a -> (a1, a2); root -> b1.
LEAVES = ("a1", "a2", "b1")


@dataclass(frozen=True)
class _Victim:
    queue: str
    requests: Resources


def _ledger(limit: float | None = None) -> QueueLedger:
    dept = make_queue("dept-a").parent("root")
    if limit is not None:
        dept = dept.gpu(limit=limit)
    queues = [
        make_queue("root").build(),
        dept.build(),
        make_queue("a1").parent("dept-a").build(),
        make_queue("a2").parent("dept-a").build(),
        make_queue("b1").parent("root").build(),
    ]
    return QueueLedger(build_snapshot(ClusterObjects(queues=queues)).queues, {})


# CPU amounts such as 0.1 and 0.7: their sums differ in the last bit by order.
victims = st.lists(
    st.builds(
        lambda leaf, cpu, gpu: _Victim(leaf, Resources({CPU: cpu, GPU: gpu})),
        st.sampled_from(LEAVES),
        st.sampled_from([0.1, 0.2, 0.3, 0.7, 1e-3, 3.0]),
        st.sampled_from([0.0, 1.0, 8.0]),
    ),
    max_size=12,
)


@settings(max_examples=200, deadline=None)
@given(victims=victims, reads=st.lists(st.sampled_from(("root", "dept-a", *LEAVES, "c9"))))
def test_each_queue_reads_what_freed_in_queues_gives(
    victims: list[_Victim], reads: list[str]
) -> None:
    ledger = _ledger()
    eager = freed_in_queues(ledger, ((v.queue, v.requests) for v in victims))
    lazy = FreedWhenRead(ledger, victims)
    for name in reads:  # read in any order, some twice, some on no victim's path
        assert lazy.get(name) == eager.get(name)
        if name in eager:
            assert dict(lazy[name].items()) == dict(eager[name].items())
    assert bool(lazy) == bool(eager)
    assert list(lazy) == list(eager)
    assert {name: dict(lazy[name].items()) for name in lazy} == {
        name: dict(amounts.items()) for name, amounts in eager.items()
    }


def test_a_limit_refuses_with_what_the_victims_give_back() -> None:
    ledger = _ledger(limit=16)
    ledger.add("a2", Resources({GPU: 16}), True)
    ask = Resources({GPU: 8})
    refused = limit_refusal(ledger, "a1", ask)
    assert refused is not None and "dept-a" in refused
    # One victim of a2 holding 8 GPUs gives dept-a back room enough; one of b1 does not.
    assert limit_refusal(ledger, "a1", ask, FreedWhenRead(ledger, [_Victim("a2", ask)])) is None
    assert limit_refusal(ledger, "a1", ask, FreedWhenRead(ledger, [_Victim("b1", ask)])) == refused
    # Without a limit nothing is refused, and nothing the victims free is added up.
    free = _ledger()
    free.add("a2", Resources({GPU: 16}), True)
    lazy = FreedWhenRead(free, [_Victim("a2", ask)])
    assert limit_refusal(free, "a1", ask, lazy) is None
    assert not lazy._amounts
