"""`kai-ray migrate`: KAI Scheduler's manifests as kai-ray's (docs/migrating-from-kai.md).

- `convert`: the documents, in order, and the findings (pure);
- `queues`, `podgroups`, `scheduler`, `workloads`: one KAI kind or concern each;
- `units`: KAI's numbers and durations as kai-ray's quantities and durations;
- `findings`: notes (behaviour kept) and changes (behaviour not kept);
- `command`: files in, YAML out, findings on standard error, the exit status.
"""

from kai_ray.tools.migrate.command import add_migrate_parser, migrate_command, run_migrate
from kai_ray.tools.migrate.convert import Document, Migration, migrate

__all__ = [
    "Document",
    "Migration",
    "add_migrate_parser",
    "migrate",
    "migrate_command",
    "run_migrate",
]
