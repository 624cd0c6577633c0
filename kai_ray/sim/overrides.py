"""`--set PATH=VALUE` and `--sweep PATH=V1,V2,...`: change the input's settings.

A path names one object and one of its fields:

- `SchedulerConfig.spec.timeBasedFairness.k` (the one SchedulerConfig);
- `Queue/team-b.spec.resources.gpu.overQuotaWeight` (a Queue by name).

Fields are dotted, as the object's YAML spells them; missing mappings on the way
are created (`Queue/a.spec.resources.gpu.quota` works on a queue with no
resources yet). A value is read as a YAML scalar or flow list (`1`, `0.5`, `1h`,
`[allocate, reclaim]`). The changed object is validated again, so a wrong path
or value raises `InvalidObjectError` naming the option, the path and the field.
Pure: no I/O.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from kai_ray.sim.loader import SimInput
from kai_ray.sim.references import check_references
from kai_ray.values.api import Queue
from kai_ray.values.config import SchedulerConfig
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.validation import parse_model

KINDS = ("SchedulerConfig", "Queue/<name>")


@dataclass(frozen=True)
class Override:
    option: str  # --set or --sweep, for messages
    path: str
    value: Any
    text: str  # the value as written

    @property
    def label(self) -> str:
        """A short, file-name-safe `field-value` naming this override in a variant."""
        leaf = self.path.rsplit(".", 1)[-1]
        return re.sub(r"[^A-Za-z0-9._-]+", "-", f"{leaf}-{self.text}").strip("-")


def _fail(option: str, path: str, message: str) -> InvalidObjectError:
    return InvalidObjectError([Problem(ObjectRef("Option", option), path, message)])


def parse_assignment(text: str, option: str) -> tuple[str, str]:
    path, sep, value = text.partition("=")
    if not sep or not path.strip() or not value.strip():
        raise _fail(option, text, "expected PATH=VALUE, e.g. SchedulerConfig.spec.cyclePeriod=5s")
    return path.strip(), value.strip()


def parse_value(text: str, option: str, path: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise _fail(option, path, f"{text!r} is not a value") from None


def parse_set(text: str) -> Override:
    path, value = parse_assignment(text, "--set")
    return Override("--set", path, parse_value(value, "--set", path), value)


def parse_sweep(text: str) -> list[Override]:
    """One override per value of `PATH=V1,V2,...` (a value may be a flow list `[a,b]`)."""
    path, values = parse_assignment(text, "--sweep")
    parts = [p.strip() for p in re.split(r",(?![^\[]*\])", values) if p.strip()]
    return [Override("--sweep", path, parse_value(p, "--sweep", path), p) for p in parts]


def variants(sweeps: Sequence[Sequence[Override]]) -> list[tuple[Override, ...]]:
    """The cartesian product of the sweeps, in the order given (one empty variant if none)."""
    return list(itertools.product(*sweeps))


def variant_name(variant: Sequence[Override]) -> str:
    return "_".join(o.label for o in variant) or "base"


def apply_overrides(sim: SimInput, overrides: Sequence[Override]) -> SimInput:
    """A copy of `sim` with every override applied and the references checked again."""
    for override in overrides:
        sim = _apply(sim, override)
    if overrides:
        check_references(sim)
    return sim


def _apply(sim: SimInput, override: Override) -> SimInput:
    target, _, field = override.path.partition(".")
    if not field:
        raise _fail(override.option, override.path, "name a field after the object")
    if target == "SchedulerConfig":
        config = _changed(SchedulerConfig, sim.config, field, override)
        return replace(sim, config=config)
    kind, _, name = target.partition("/")
    if kind != "Queue" or not name:
        known = ", ".join(KINDS)
        raise _fail(override.option, override.path, f"{target!r} is not one of {known}")
    if name not in {q.metadata.name for q in sim.queues}:
        raise _fail(override.option, override.path, f"no queue named {name!r}")
    queues = [
        _changed(Queue, q, field, override) if q.metadata.name == name else q for q in sim.queues
    ]
    return replace(sim, queues=queues)


def _changed(model: Any, obj: Any, field: str, override: Override) -> Any:
    raw = obj.model_dump(mode="json", exclude_none=True)
    node = raw
    keys = field.split(".")
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise _fail(override.option, override.path, f"{key!r} is not a mapping")
        node = child
    node[keys[-1]] = override.value
    try:
        return parse_model(model, raw)
    except InvalidObjectError as err:
        first = err.problems[0]
        raise _fail(override.option, override.path, f"{first.field}: {first.message}") from None
