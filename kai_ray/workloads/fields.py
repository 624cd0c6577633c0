"""Reading typed fields out of a workload's plain dict, collecting what is wrong.

Workloads arrive as the dicts a YAML file or the API server gives. `FieldReader`
reads one field at a time, falls back to a default when a field is wrong so that
one pass finds every problem, and raises them all together at the end, each
naming its field by path (`spec.workerGroupSpecs[1].minReplicas`).
Pure: no I/O; it must not know about any workload kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kai_ray.values.errors import InvalidFieldError, InvalidObjectError, ObjectRef, Problem
from kai_ray.values.resources import parse_amount
from kai_ray.workloads.pod_fields import container_requests

EMPTY: Mapping[str, Any] = {}
RESTART_POLICIES = ("Always", "OnFailure", "Never")


def child(path: str, key: str | int) -> str:
    """The path of `key` under `path`: `spec.replicas`, `cliques[0]`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def keyed(path: str, key: str) -> str:
    """The path of a map entry whose key has dots or slashes: `metadata.labels[a/b]`."""
    return f"{path}[{key}]"


class FieldReader:
    """Reads the fields of one object and remembers every problem it meets."""

    def __init__(self, ref: ObjectRef) -> None:
        self.ref = ref
        self.problems: list[Problem] = []

    def problem(self, path: str, message: str) -> None:
        self.problems.append(Problem(self.ref, path, message))

    def raise_problems(self) -> None:
        """Raise everything found so far, if anything was."""
        if self.problems:
            raise InvalidObjectError(self.problems)

    def section(
        self, parent: Mapping[str, Any], key: str, path: str, required: bool = False
    ) -> Mapping[str, Any]:
        """A nested object; empty when absent (a problem if required) or not an object."""
        value = parent.get(key)
        where = child(path, key)
        if value is None:
            if required:
                self.problem(where, "missing")
            return EMPTY
        if not isinstance(value, Mapping):
            self.problem(where, f"expected an object, got {value!r}")
            return EMPTY
        return value

    def entries(
        self, parent: Mapping[str, Any], key: str, path: str, required: bool = False
    ) -> list[tuple[str, Mapping[str, Any]]]:
        """A list of objects, each with its path; entries that are not objects are problems."""
        value = parent.get(key)
        where = child(path, key)
        if value is None or value == []:
            if required:
                self.problem(where, "missing: needs at least one entry")
            return []
        if not isinstance(value, list):
            self.problem(where, f"expected a list, got {value!r}")
            return []
        found = [(child(where, i), item) for i, item in enumerate(value)]
        return [(at, item) for at, item in found if self._is_object(item, at)]

    def _is_object(self, item: Any, path: str) -> bool:
        if isinstance(item, Mapping):
            return True
        self.problem(path, f"expected an object, got {item!r}")
        return False

    def count(
        self, parent: Mapping[str, Any], key: str, path: str, default: int, minimum: int = 0
    ) -> int:
        """A whole number of at least `minimum`; `default` when absent or wrong."""
        value = self.optional_count(parent, key, path, minimum)
        return default if value is None else value

    def optional_count(
        self, parent: Mapping[str, Any], key: str, path: str, minimum: int = 0
    ) -> int | None:
        """A whole number of at least `minimum`, or None when absent or wrong."""
        value = parent.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.problem(child(path, key), f"expected a whole number, got {value!r}")
            return None
        if value < minimum:
            self.problem(child(path, key), f"must be at least {minimum}, got {value}")
            return None
        return value

    def text(
        self, parent: Mapping[str, Any], key: str, path: str, required: bool = False
    ) -> str | None:
        """A non-empty string, or None when absent (a problem if required) or wrong."""
        value = parent.get(key)
        if value is None or value == "":
            if required:
                self.problem(child(path, key), "missing")
            return None
        if not isinstance(value, str):
            self.problem(child(path, key), f"expected a string, got {value!r}")
            return None
        return value

    def choice(
        self, parent: Mapping[str, Any], key: str, path: str, allowed: tuple[str, ...]
    ) -> str | None:
        """One of `allowed`, or None when absent or wrong."""
        value = self.text(parent, key, path)
        if value is not None and value not in allowed:
            self.problem(child(path, key), f"must be one of {', '.join(allowed)}, got {value!r}")
            return None
        return value

    def flag(self, parent: Mapping[str, Any], key: str, path: str) -> bool | None:
        """A boolean, or None when absent or wrong."""
        value = parent.get(key)
        if value is None or isinstance(value, bool):
            return value
        self.problem(child(path, key), f"expected true or false, got {value!r}")
        return None

    def string_map(self, parent: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
        """Labels or annotations: string keys to string values; wrong entries are dropped."""
        found: dict[str, str] = {}
        for name, value in self.section(parent, key, path).items():
            if isinstance(value, str):
                found[str(name)] = value
            else:
                where = keyed(child(path, key), str(name))
                self.problem(where, f"expected a string, got {value!r}")
        return found

    def pod_spec(self, template: Mapping[str, Any], path: str) -> Mapping[str, Any]:
        """The `spec` of a pod template, checked as `pod_fields` checks it."""
        spec = self.section(template, "spec", path, required=True)
        if spec is not EMPTY:
            self.pod_fields(spec, child(path, "spec"))
        return spec

    def pod_fields(self, pod_spec: Mapping[str, Any], path: str) -> None:
        """A pod spec: the scheduler and restart policy as Kubernetes allows them, containers."""
        self.text(pod_spec, "schedulerName", path)
        self.choice(pod_spec, "restartPolicy", path, RESTART_POLICIES)
        self._containers(pod_spec, path)

    def _containers(self, pod_spec: Mapping[str, Any], path: str) -> None:
        """A pod spec's containers: at least one, each named, requests and limits quantities."""
        for where, container in self.entries(pod_spec, "containers", path, required=True):
            found = len(self.problems)
            self.text(container, "name", where, required=True)
            self.text(container, "image", where)
            resources = self.section(container, "resources", where)
            for kind in ("requests", "limits"):
                self.quantities(resources, kind, child(where, "resources"))
            if len(self.problems) == found:
                self._requests(container, where)

    def _requests(self, container: Mapping[str, Any], path: str) -> None:
        """The rules on a container's requests as a whole: whole GPUs, limits equal requests."""
        try:
            container_requests(container, path)
        except InvalidFieldError as err:
            self.problem(err.field, err.message)

    def quantities(self, parent: Mapping[str, Any], key: str, path: str) -> None:
        for name, value in self.section(parent, key, path).items():
            try:
                parse_amount(value, str(name))
            except InvalidFieldError as err:
                self.problem(keyed(child(path, key), str(name)), err.message)
