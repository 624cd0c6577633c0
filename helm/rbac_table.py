"""The RBAC table of docs/operations.md, generated from the chart (`make rbac-docs`).

Renders helm/kai-ray with the helm that e2e/build.sh builds and writes what its
ClusterRole and Role grant, one row per rule, between the markers in
docs/operations.md. `--check` exits 1 when the docs differ from the chart
(tests/e2e/test_chart.py runs the same check).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "operations.md"
START, END = "<!-- rbac-table:start -->", "<!-- rbac-table:end -->"


def helm_binary() -> Path:
    folder = subprocess.run(
        [str(REPO / "e2e" / "build.sh"), "--print-dir", "helm"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(folder) / "helm"


def rendered_roles(helm: Path) -> list[dict[str, Any]]:
    """The chart's ClusterRole and Role, as `helm template` renders them by default."""
    args = [str(helm), "template", "kai-ray", str(REPO / "helm" / "kai-ray")]
    out = subprocess.run([*args, "--namespace", "kai-ray-system"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"helm template failed: {out.stderr}")
    docs = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    return [doc for doc in docs if doc["kind"] in ("ClusterRole", "Role")]


def _cell(values: list[str] | None) -> str:
    return ", ".join(f"`{v}`" if v else '`""` (core)' for v in values or [])


def table(roles: list[dict[str, Any]]) -> str:
    lines = [
        "| role | API group | resources | verbs | only these names |",
        "| --- | --- | --- | --- | --- |",
    ]
    for role in roles:
        scope = "ClusterRole" if role["kind"] == "ClusterRole" else "Role (release namespace)"
        for rule in role["rules"]:
            names = ", ".join(f"`{n}`" for n in rule.get("resourceNames") or []) or "any"
            row = [scope, _cell(rule["apiGroups"]), _cell(rule["resources"])]
            lines.append("| " + " | ".join([*row, _cell(rule["verbs"]), names]) + " |")
    return "\n".join(lines)


def with_table(text: str, generated: str) -> str:
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{generated}\n{END}{tail}"


def main(argv: list[str]) -> int:
    generated = table(rendered_roles(helm_binary()))
    current = DOCS.read_text()
    wanted = with_table(current, generated)
    if "--check" in argv:
        if wanted != current:
            print("docs/operations.md: the RBAC table differs from the chart: run `make rbac-docs`")
            return 1
        return 0
    DOCS.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
