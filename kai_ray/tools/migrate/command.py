"""`kai-ray migrate FILES...`: read KAI manifests, write kai-ray's, say what changed.

The converted documents go to `--output` (or standard output) as one YAML stream;
the findings go to standard error, one line each, changes first. Exit status: 0
when kai-ray will schedule these manifests as KAI did; 1 when something would
change behaviour (the output is still written: read the lines marked so); 2 when
the input cannot be read (one line naming the file, the object and the field).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

import yaml

from kai_ray.tools.migrate.convert import Document, Migration, migrate
from kai_ray.values.errors import InvalidObjectError, ObjectRef, Problem
from kai_ray.values.names import SCHEDULER_NAME

EXIT_CHANGES_BEHAVIOUR = 1
EXIT_INVALID_INPUT = 2


def add_migrate_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    migrate_parser = commands.add_parser(
        "migrate", help="convert KAI Scheduler manifests to kai-ray's and say what changes"
    )
    migrate_parser.add_argument("inputs", nargs="+", type=Path, help="YAML files or folders")
    migrate_parser.add_argument(
        "-o", "--output", type=Path, help="write the converted YAML here (default: stdout)"
    )
    migrate_parser.add_argument(
        "--scheduler-name",
        default=SCHEDULER_NAME,
        help="the schedulerName kai-ray runs under; pods naming KAI's are moved to it "
        f"(default {SCHEDULER_NAME}; KAI's own name to replace KAI in place)",
    )


def migrate_command(args: argparse.Namespace) -> int:
    try:
        return run_migrate(args.inputs, args.output, args.scheduler_name)
    except InvalidObjectError as err:
        for problem in err.problems:
            print(f"kai-ray migrate: invalid input: {problem}", file=sys.stderr)
        return EXIT_INVALID_INPUT


def run_migrate(
    inputs: Sequence[Path], output: Path | None, scheduler_name: str, err: TextIO | None = None
) -> int:
    migration = migrate(list(read_documents(inputs)), scheduler_name)
    text = yaml.safe_dump_all(migration.documents, sort_keys=False, width=100)
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
    report(migration, err or sys.stderr)
    return EXIT_CHANGES_BEHAVIOUR if migration.changes_behaviour else 0


def report(migration: Migration, err: TextIO) -> None:
    ordered = sorted(migration.findings, key=lambda f: not f.changes_behaviour)
    for finding in ordered:
        print(f"kai-ray migrate: {finding}", file=err)
    changes = sum(f.changes_behaviour for f in migration.findings)
    print(
        f"kai-ray migrate: {len(migration.documents)} documents written, "
        f"{changes} changes of behaviour, {len(migration.findings) - changes} notes",
        file=err,
    )


def read_documents(inputs: Sequence[Path]) -> Iterator[Document]:
    """Every YAML document of the files (folders: their *.yaml and *.yml, sorted)."""
    for path in _files(inputs):
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise _unreadable(path, str(exc)) from None
        for index, body in enumerate(loaded):
            if body is None:
                continue
            if not isinstance(body, dict):
                raise _unreadable(path, f"document {index + 1} is not a mapping")
            yield from _items(Document(str(path), body))


def _items(doc: Document) -> Iterator[Document]:
    """A `List` (as `kubectl get -o yaml` writes) is its items."""
    items = doc.body.get("items")
    if str(doc.body.get("kind", "")).endswith("List") and isinstance(items, list):
        for item in items:
            if isinstance(item, dict):
                yield Document(doc.source, item)
        return
    yield doc


def _files(inputs: Sequence[Path]) -> Iterator[Path]:
    for path in inputs:
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*") if p.suffix in (".yaml", ".yml"))
        else:
            yield path


def _unreadable(path: Path, message: str) -> InvalidObjectError:
    first = message.splitlines()[0] if message else "unreadable"
    ref = ObjectRef("File", str(path))
    return InvalidObjectError([Problem(ref, "(file)", first)])
