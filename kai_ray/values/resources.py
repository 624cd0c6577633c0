"""One resource-vector type used everywhere, and Kubernetes quantity parsing.

Units: cpu in cores, memory in bytes, GPUs in devices (fractions allowed), any
extended resource in its own unit. Names are Kubernetes resource names
(`cpu`, `memory`, `nvidia.com/gpu`, `example.com/foo`); a Queue may also say `gpu`,
which means `nvidia.com/gpu`. Parsing uses the `kubernetes` package's quantity
parser (a pure function; no client is created). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import ItemsView, Iterable, Iterator, Mapping, ValuesView
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from kai_ray.values.errors import InvalidFieldError


def _parse_quantity(text: str) -> Decimal:
    """The `kubernetes` package's parser, typed (it ships without annotations)."""
    value = parse_quantity(text)  # type: ignore[no-untyped-call]
    return Decimal(value)


#: The float tolerance: amounts closer than this are the same amount (0.1 + 0.2 + 0.7
#: of a device fills it; a request equal to what is free fits). The one definition.
EPSILON = 1e-9

CPU = "cpu"
MEMORY = "memory"
GPU = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"

#: Short names accepted in Queue.spec.resources and reports.
ALIASES: dict[str, str] = {"gpu": GPU}
#: The resources every vector reports, in this order, even when zero.
CORE = (CPU, MEMORY, GPU)


def canonical_name(name: str) -> str:
    """The Kubernetes name for a resource written in a Queue (`gpu` -> `nvidia.com/gpu`)."""
    return ALIASES.get(name, name)


def short_name(name: str) -> str:
    """The Queue-facing name for a resource (`nvidia.com/gpu` -> `gpu`)."""
    for short, full in ALIASES.items():
        if full == name:
            return short
    return name


def parse_amount(value: Any, field: str) -> float:
    """A Kubernetes quantity ("500m", "64Gi", 2, "0.5") as a float; never negative.

    Booleans and floats written as YAML numbers are accepted only when they are
    whole or fractional numbers; everything else must be a quantity string.
    """
    if isinstance(value, bool) or value is None:
        raise InvalidFieldError(field, f"expected a quantity, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidFieldError(field, f"expected a finite quantity, got {value!r}")
    try:
        amount = _parse_quantity(value if isinstance(value, str) else str(value))
    except (ValueError, InvalidOperation, TypeError):
        raise InvalidFieldError(field, f"{value!r} is not a Kubernetes quantity") from None
    if amount < Decimal(0):
        raise InvalidFieldError(field, f"must not be negative, got {value!r}")
    return float(amount)


def format_amount(name: str, amount: float) -> str:
    """Render an amount in the unit a person expects for that resource."""
    if name == MEMORY:
        for unit, size in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
            if amount >= size and amount % size == 0:
                return f"{int(amount // size)}{unit}"
        return str(int(amount))
    if name == CPU and amount != int(amount):
        return f"{round(amount * 1000)}m"
    return f"{amount:g}"


class Resources(Mapping[str, float]):
    """An immutable vector of resource amounts keyed by Kubernetes name.

    Missing names are zero. Arithmetic returns new vectors; nothing mutates.
    """

    __slots__ = ("_amounts", "_hash")

    def __init__(self, amounts: Mapping[str, float] | None = None) -> None:
        cleaned = {canonical_name(k): float(v) for k, v in (amounts or {}).items()}
        self._amounts = {k: v for k, v in cleaned.items() if v != 0.0}
        self._hash: int | None = None

    @classmethod
    def from_canonical(cls, amounts: dict[str, float]) -> Resources:
        """A vector from float amounts already keyed by Kubernetes name (another
        vector's keys, say): skips canonicalising, the hot path of every sum."""
        vector = cls.__new__(cls)
        vector._amounts = {k: v for k, v in amounts.items() if v != 0.0}
        vector._hash = None
        return vector

    @classmethod
    def parse(cls, quantities: Mapping[str, Any] | None, field: str) -> Resources:
        """Parse a Kubernetes `requests`/`capacity` map; errors name `field.<resource>`."""
        if quantities is None:
            return cls()
        if not isinstance(quantities, Mapping):
            raise InvalidFieldError(
                field, f"expected a map of resource quantities, got {quantities!r}"
            )
        return cls({str(k): parse_amount(v, f"{field}.{k}") for k, v in quantities.items()})

    @classmethod
    def of(cls, cpu: float = 0, memory: float = 0, gpu: float = 0, **extended: float) -> Resources:
        return cls({CPU: cpu, MEMORY: memory, GPU: gpu, **extended})

    def __getitem__(self, name: str) -> float:
        amount = self._amounts.get(name)
        if amount is not None:  # stored keys are canonical: no alias lookup needed
            return amount
        return self._amounts.get(canonical_name(name), 0.0)

    def get(self, key: str, default: object = None) -> float:
        """Missing names are zero, whatever `default` says (as Mapping.get did here)."""
        return self[key]

    def items(self) -> ItemsView[str, float]:
        return self._amounts.items()

    def values(self) -> ValuesView[float]:
        return self._amounts.values()

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and canonical_name(name) in self._amounts

    def __hash__(self) -> int:
        """Worked out once (the vector never changes): vectors key many memos."""
        if self._hash is None:
            self._hash = hash(frozenset(self._amounts.items()))
        return self._hash

    def __reduce__(self) -> tuple[Any, tuple[dict[str, float]]]:
        """Pickled as its amounts alone: a string's hash, so the kept one, differs
        from process to process (Ray's workers)."""
        return Resources.from_canonical, (dict(self._amounts),)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Resources):
            return self._amounts == other._amounts
        return NotImplemented

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={format_amount(k, v)}" for k, v in sorted(self._amounts.items()))
        return f"Resources({inner})"

    def __add__(self, other: Mapping[str, float]) -> Resources:
        if isinstance(other, Resources):
            return Resources.from_canonical(add_into(dict(self._amounts), other._amounts))
        return Resources({k: self[k] + other.get(k, 0.0) for k in _names(self, other)})

    def __sub__(self, other: Mapping[str, float]) -> Resources:
        if isinstance(other, Resources):
            return Resources.from_canonical(add_into(dict(self._amounts), other._amounts, -1.0))
        return Resources({k: self[k] - other.get(k, 0.0) for k in _names(self, other)})

    def scaled(self, factor: float) -> Resources:
        return Resources({k: v * factor for k, v in self._amounts.items()})

    def fits_in(self, available: Mapping[str, float], tolerance: float = EPSILON) -> bool:
        """True when every amount here is at most the same amount in `available`."""
        return all(v <= available.get(k, 0.0) + tolerance for k, v in self._amounts.items())

    def insufficient(self, available: Mapping[str, float]) -> list[str]:
        """Names of the resources that `available` lacks for this vector."""
        return sorted(k for k, v in self._amounts.items() if v > available.get(k, 0.0) + EPSILON)

    def is_negative_anywhere(self) -> bool:
        return any(v < 0 for v in self._amounts.values())

    def to_report(self) -> dict[str, float]:
        """Kubernetes names, the core three always present (for JSON reports)."""
        out = {name: self[name] for name in CORE}
        out.update(self._amounts)
        return out


#: The empty vector, shared (no vector is ever changed): a look-up's default.
NO_RESOURCES = Resources()

#: Vectors `interned` hands out, by value; emptied when it grows past `INTERNED_AT`.
_interned: dict[Resources, Resources] = {}
INTERNED_AT = 4096


def interned(vector: Resources) -> Resources:
    """The one vector kept for `vector`'s value: equal requests become the very same
    object, so the memos they key and the sorts they tie in compare them by
    identity first instead of by their amounts (a deep backlog is thousands of
    gangs asking a handful of requests). A cache of values only: any vector may be
    used where another equal one was, so emptying it changes nothing but speed."""
    found = _interned.get(vector)
    if found is None:
        if len(_interned) >= INTERNED_AT:
            _interned.clear()
        found = _interned[vector] = vector
    return found


def add_into(
    totals: dict[str, float], amounts: Mapping[str, float], sign: float = 1.0
) -> dict[str, float]:
    """Add (sign 1) or subtract (sign -1) canonical `amounts` into `totals` in place;
    returns `totals`. Exact: `x - y` and `x + -1.0 * y` are the same float."""
    for name, amount in amounts.items():
        totals[name] = totals.get(name, 0.0) + sign * amount
    return totals


def _names(a: Iterable[str], b: Iterable[str]) -> set[str]:
    return set(a) | set(b)
