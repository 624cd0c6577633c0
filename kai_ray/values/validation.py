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


#: What a reference says where the object does not: the one pair of placeholders.
NO_KIND, NO_NAME = "(no kind)", "(no name)"


def object_ref(
    raw: Mapping[str, Any], source: str | None = None, *, kind: str | None = None
) -> ObjectRef:
    """Who an object is, read defensively (a badly broken object must still be
    named); `kind` is the kind the caller knows it to be, when the object may not say."""
    meta = raw.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    name = meta.get("name")
    namespace = meta.get("namespace")
    return ObjectRef(
        kind=str(kind or raw.get("kind") or NO_KIND),
        name=str(name) if name else NO_NAME,
        namespace=str(namespace) if namespace else None,
        source=source,
    )


def parse_model(model: type[M], raw: Mapping[str, Any], source: str | None = None) -> M:
    """Validate `raw` as `model`; raise InvalidObjectError naming object and fields."""
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise InvalidObjectError(problems_from(err, object_ref(raw, source))) from None
