"""KAI's numbers and durations written as kai-ray's quantities and durations.

KAI's Queue counts GPUs in devices, CPU in millicores and memory in megabytes
(10^6 bytes) as plain numbers, with -1 meaning unlimited; kai-ray's Queue takes
Kubernetes quantities. KAI's durations are Go's (`1h0m0s`, `500ms`, `-1s`) or, for
the usage window, Prometheus' (`1w`, `7d`); kai-ray's are Go-style without days.
Pure: no I/O.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from kai_ray.values.errors import InvalidFieldError

#: KAI's "no bound" for a quota or a limit.
UNLIMITED = -1.0

_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
_GO_UNITS["h"] = 3600.0
_PROMETHEUS_UNITS = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PROMETHEUS_UNITS.update({"w": 7 * 86400.0, "y": 365 * 86400.0})
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_PROMETHEUS_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w|y)")


def number(value: Any, field: str) -> float:
    """A number as KAI's CRD types it (float64): an int or a float, never a string."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidFieldError(field, f"expected a number, got {value!r}")
    return float(value)


def whole(value: Any, field: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidFieldError(field, f"expected a whole number, got {value!r}")
    return value


def _decimal_text(amount: Decimal) -> int | str:
    """An integer when whole, else the shortest decimal string ("0.5", never "5E-1")."""
    if amount == amount.to_integral_value():
        return int(amount)
    return format(amount.normalize(), "f")


def _decimal(value: float) -> Decimal:
    return Decimal(repr(value))


def gpu_quantity(devices: float) -> int | str:
    """GPUs in devices: 2 -> 2, 0.5 -> "0.5" (kai-ray quotes fractions)."""
    return _decimal_text(_decimal(devices))


def cpu_quantity(millicores: float) -> int | str:
    """KAI's millicores as cores: 2000 -> 2, 1500 -> "1.5"."""
    return _decimal_text(_decimal(millicores) / 1000)


def memory_quantity(megabytes: float) -> int | str:
    """KAI's megabytes (10^6 bytes): 4096 -> "4096M"; a fraction in bytes."""
    amount = _decimal(megabytes)
    if amount == amount.to_integral_value():
        return f"{int(amount)}M" if amount else 0
    return _decimal_text(amount * 1_000_000)


def go_duration_seconds(text: Any, field: str) -> float:
    """Seconds in a Go duration: "1h0m0s", "500ms", "-1s", "0"."""
    if not isinstance(text, str):
        raise InvalidFieldError(field, f"expected a duration such as 90s, got {text!r}")
    sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
    if body == "0":
        return 0.0
    parts = _GO_PART.findall(body)
    if not parts or "".join(n + u for n, u in parts) != body:
        raise InvalidFieldError(field, f"{text!r} is not a duration such as 90s, 5m or 1h30m")
    return sign * sum(float(n) * _GO_UNITS[u] for n, u in parts)


def prometheus_duration_seconds(text: Any, field: str) -> float:
    """Seconds in a Prometheus duration, as KAI's usage window is written: "1w", "7d"."""
    if not isinstance(text, str):
        raise InvalidFieldError(field, f"expected a duration such as 1w or 168h, got {text!r}")
    parts = _PROMETHEUS_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise InvalidFieldError(field, f"{text!r} is not a duration such as 1w, 7d or 168h")
    return sum(float(n) * _PROMETHEUS_UNITS[u] for n, u in parts)


def duration_text(seconds: float) -> str:
    """kai-ray's spelling of a non-negative duration: 168h, 1h30m, 90s, 250ms, 0s."""
    millis = round(seconds * 1000)
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    whole_seconds, millis = divmod(millis, 1000)
    parts = [(hours, "h"), (minutes, "m"), (whole_seconds, "s"), (millis, "ms")]
    text = "".join(f"{n}{unit}" for n, unit in parts if n)
    return text or "0s"
