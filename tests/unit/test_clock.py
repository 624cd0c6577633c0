"""Clocks: the virtual clock moves only forward, and only when told."""

from __future__ import annotations

import pytest

from kai_ray.values.clock import VirtualClock, WallClock


def test_virtual_clock_moves_forward_when_told() -> None:
    clock = VirtualClock(10.0)
    assert clock.now() == 10.0
    clock.advance_to(25.5)
    assert clock.now() == 25.5


def test_virtual_clock_refuses_to_go_back() -> None:
    clock = VirtualClock(5.0)
    with pytest.raises(ValueError, match="cannot go back"):
        clock.advance_to(4.0)


def test_wall_clock_reads_seconds_since_the_epoch() -> None:
    assert WallClock().now() > 1.7e9
