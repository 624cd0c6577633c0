"""Turn pydantic validation errors into Problems that name the field.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem

M = TypeVar("M", bound=BaseModel)

#: A model-level validator may start its message with a sub-field: "levels[1]: ...".
_SUBFIELD = re.compile(
    r"^((?:[A-Za-z]\w*|\[[^\]]+\])(?:\[[^\]]+\])*(?:\.[A-Za-z]\w*(?:\[[^\]]+\])*)*): (.+)$"
)


def field_path(location: tuple[int | str, ...]) -> str:
    """`("spec", "subGroups", 0, "minMember")` -> `spec.subGroups[0].minMember`."""
    path = ""
    for part in location:
        if isinstance(part, int) or "." in part or "/" in part:
            path += f"[{part}]"
        else:
            path += f".{part}" if path else part
    return path or "(object)"


def _message(error: Mapping[str, Any]) -> str:
    text = str(error["msg"])
    return text.removeprefix("Value error, ")


def problems_from(err: ValidationError, obj: ObjectRef) -> list[Problem]:
    """One Problem per pydantic error; model-level errors that name a field keep it."""
    problems = []
    for error in err.errors():
        location = tuple(p for p in error["loc"] if p not in ("function-after", "function-before"))
        path, message = field_path(location), _message(error)
        nested = _SUBFIELD.match(message)
        if nested:
            sub = nested.group(1)
            path = f"{path}{sub}" if sub.startswith("[") or path == "(object)" else f"{path}.{sub}"
            message = nested.group(2)
        problems.append(Problem(obj, path, message))
    return problems


def object_ref(raw: Mapping[str, Any], source: str | None = None) -> ObjectRef:
    """Best-effort reference to a raw object, even a badly broken one."""
    meta = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name = meta.get("name")
    namespace = meta.get("namespace")
    return ObjectRef(
        kind=str(raw.get("kind") or "(no kind)"),
        name=str(name) if name else "(no name)",
        namespace=str(namespace) if namespace else None,
        source=source,
    )


def parse_model(model: type[M], raw: Mapping[str, Any], source: str | None = None) -> M:
    """Validate `raw` as `model`; raise InvalidObjectError naming object and fields."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise InvalidObjectError(problems_from(err, object_ref(raw, source))) from None
