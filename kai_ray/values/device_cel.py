"""CEL device selectors (DeviceClass and ResourceClaim `selectors[].cel.expression`).

Evaluated with the `common-expression-language` package (the Rust CEL
implementation behind a Python binding), never a hand-written CEL. Each
expression is compiled once and cached, malformed ones included, so a broken
selector costs one parse per process, not one per device.

A selector sees one object, `device`, as Kubernetes gives it: `device.driver`,
`device.attributes["<domain>"].<name>` and `device.capacity["<domain>"].<name>`.
A domain no device of the cluster publishes is an empty map, as in Kubernetes
(the caller names the cluster's domains). Capacities are quantities and version
attributes are semantic versions, with Kubernetes' CEL functions for them:
`quantity()`, `isQuantity()`, `semver()`, `isSemver()`, and on their values
`compareTo`, `isGreaterThan`, `isLessThan`, `add`, `sub`, `sign`, `isInteger`,
`asInteger`, `asApproximateFloat`, `major`, `minor`, `patch`. Kubernetes'
`cel.bind()` and `includes()` are not available (docs/dra.md).

Pure: no I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import cel

from kai_ray.values.dra import (
    AttributeValue,
    DeviceClass,
    DeviceSelector,
    ResourceClaim,
    ResourceClaimTemplate,
)
from kai_ray.values.errors import InvalidFieldError, ObjectRef, Problem
from kai_ray.values.resources import parse_amount

#: How a quantity and a version travel through CEL: a one-key map, so that `==`
#: compares values and the functions below can tell the two apart.
QUANTITY_KEY = "__quantity__"
SEMVER_KEY = "__semver__"

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$"
)
_ERRORS = (KeyError, RuntimeError, TypeError, ValueError, OverflowError, IndexError)


class SelectorError(Exception):
    """A selector could not be evaluated on a device (not: did not match)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class CompiledSelector:
    """An expression, and either its program or why it does not compile."""

    expression: str
    program: cel.Program | None
    error: str | None


@functools.lru_cache(maxsize=4096)
def compile_selector(expression: str) -> CompiledSelector:
    """The one compilation of `expression`; a syntax error is kept, not raised."""
    try:
        return CompiledSelector(expression, cel.compile(expression), None)
    except _ERRORS as err:
        return CompiledSelector(expression, None, _one_line(str(err)))


def _one_line(text: str) -> str:
    """The library's diagnostics without the caret drawings."""
    lines = [line.strip() for line in text.splitlines()]
    kept = [line for line in lines if line and not line.startswith("|")]
    return "; ".join(kept) or "invalid CEL expression"


# ------------------------------------------------------------------ values in CEL


def quantity_value(amount: float) -> dict[str, float]:
    return {QUANTITY_KEY: amount}


def _quantity(text: Any) -> dict[str, float]:
    try:
        return quantity_value(parse_amount(str(text), "quantity"))
    except InvalidFieldError as err:
        raise ValueError(err.message) from None


def _is_quantity(text: Any) -> bool:
    try:
        parse_amount(str(text), "quantity")
    except InvalidFieldError:
        return False
    return True


def _semver(text: Any) -> dict[str, str]:
    if not isinstance(text, str) or not _SEMVER.match(text):
        raise ValueError(f"{text!r} is not a semantic version")
    return {SEMVER_KEY: text}


def _is_semver(text: Any) -> bool:
    return isinstance(text, str) and bool(_SEMVER.match(text))


def _semver_key(
    value: Mapping[str, str],
) -> tuple[int, int, int, int, tuple[tuple[int, int | str], ...]]:
    match = _SEMVER.match(value[SEMVER_KEY])
    if match is None:
        raise ValueError(f"{value[SEMVER_KEY]!r} is not a semantic version")
    major, minor, patch, pre = match.groups()
    parts = tuple((0, int(p)) if p.isdigit() else (1, p) for p in (pre or "").split(".") if p)
    # A release sorts after every pre-release of the same version.
    return (int(major), int(minor), int(patch), 0 if pre else 1, parts)


def _amount(value: Any) -> float:
    if isinstance(value, Mapping) and QUANTITY_KEY in value:
        return float(value[QUANTITY_KEY])
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"expected a quantity, got {value!r}")


def _compare(left: Any, right: Any) -> int:
    if isinstance(left, Mapping) and SEMVER_KEY in left:
        if not (isinstance(right, Mapping) and SEMVER_KEY in right):
            raise TypeError(f"a semantic version compares with a semantic version, not {right!r}")
        a_key, b_key = _semver_key(left), _semver_key(right)
        return (a_key > b_key) - (a_key < b_key)
    a, b = _amount(left), _amount(right)
    return (a > b) - (a < b)


def _version_part(index: int) -> Callable[[Any], int]:
    def part(value: Any) -> int:
        if not (isinstance(value, Mapping) and SEMVER_KEY in value):
            raise TypeError(f"expected a semantic version, got {value!r}")
        return _semver_key(value)[index]  # type: ignore[return-value]

    return part


_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": _compare,
    "isGreaterThan": lambda a, b: _compare(a, b) > 0,
    "isLessThan": lambda a, b: _compare(a, b) < 0,
    "add": lambda a, b: quantity_value(_amount(a) + _amount(b)),
    "sub": lambda a, b: quantity_value(_amount(a) - _amount(b)),
    "sign": lambda a: (_amount(a) > 0) - (_amount(a) < 0),
    "isInteger": lambda a: float(_amount(a)).is_integer(),
    "asInteger": lambda a: int(_amount(a)),
    "asApproximateFloat": _amount,
    "major": _version_part(0),
    "minor": _version_part(1),
    "patch": _version_part(2),
}


def _attribute_value(value: AttributeValue) -> Any:
    kind, raw = value
    if kind == "version":
        return {SEMVER_KEY: raw}
    if kind == "versions" and isinstance(raw, tuple):
        return [{SEMVER_KEY: v} for v in raw]
    return list(raw) if isinstance(raw, tuple) else raw


def _grouped(values: Mapping[str, Any], domains: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`{"gpu.example.com/model": v}` -> `{"gpu.example.com": {"model": v}}`, every
    known domain present (empty when the device has nothing there)."""
    grouped: dict[str, dict[str, Any]] = {domain: {} for domain in domains}
    for name, value in values.items():
        domain, _, short = name.rpartition("/")
        grouped.setdefault(domain, {})[short] = value
    return grouped


@dataclass
class DeviceView:
    """One device as a selector sees it; its CEL context is built on first use."""

    driver: str
    #: Fully qualified names (`<domain>/<name>`), as the inventory keeps them.
    attributes: Mapping[str, AttributeValue]
    capacity: Mapping[str, float]
    domains: frozenset[str]
    allow_multiple_allocations: bool = False
    _context: cel.Context | None = field(default=None, init=False, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Without the CEL context, which cannot be pickled (a snapshot sent to a Ray
        worker builds it again there on first use)."""
        return {**self.__dict__, "_context": None}

    def context(self) -> cel.Context:
        if self._context is None:
            attributes = {k: _attribute_value(v) for k, v in self.attributes.items()}
            capacity = {k: quantity_value(v) for k, v in self.capacity.items()}
            device = {
                "driver": self.driver,
                "attributes": _grouped(attributes, self.domains),
                "capacity": _grouped(capacity, self.domains),
                "allowMultipleAllocations": self.allow_multiple_allocations,
            }
            self._context = cel.Context(variables={"device": device}, functions=_FUNCTIONS)
        return self._context

    def matches(self, selector: CompiledSelector) -> bool:
        """True or False; SelectorError when the expression does not compile, fails on
        this device, or gives something other than a boolean."""
        if selector.program is None:
            raise SelectorError(selector.error or "invalid CEL expression")
        try:
            result = selector.program.execute(self.context())
        except _ERRORS as err:
            raise SelectorError(f"{type(err).__name__}: {_one_line(str(err))}") from None
        if not isinstance(result, bool):
            raise SelectorError(f"gave {result!r}, not true or false")
        return result


def selector_problems(obj: DeviceClass | ResourceClaim | ResourceClaimTemplate) -> list[Problem]:
    """Every selector of a class, claim or template that does not compile, as a
    problem naming the object and the field (for loaders and admission checks;
    the allocator says the same when it meets one)."""
    ref = ObjectRef(obj.kind, obj.metadata.name, obj.metadata.namespace)
    return [
        Problem(ref, f"{where}.cel.expression", compiled.error or "invalid CEL expression")
        for where, selector in _selectors(obj)
        if (compiled := compile_selector(selector.cel.expression)).program is None
    ]


def _selectors(
    obj: DeviceClass | ResourceClaim | ResourceClaimTemplate,
) -> list[tuple[str, DeviceSelector]]:
    if isinstance(obj, DeviceClass):
        return [(f"spec.selectors[{k}]", s) for k, s in enumerate(obj.spec.selectors)]
    spec, prefix = (
        (obj.spec.spec, "spec.spec")
        if isinstance(obj, ResourceClaimTemplate)
        else (obj.spec, "spec")
    )
    found: list[tuple[str, DeviceSelector]] = []
    for i, request in enumerate(spec.devices.requests):
        where = f"{prefix}.devices.requests[{i}]"
        if request.exactly is not None:
            found += [
                (f"{where}.exactly.selectors[{k}]", s)
                for k, s in enumerate(request.exactly.selectors)
            ]
        for j, sub in enumerate(request.firstAvailable):
            found += [
                (f"{where}.firstAvailable[{j}].selectors[{k}]", s)
                for k, s in enumerate(sub.selectors)
            ]
    return found
