"""kai-ray: a Kubernetes scheduler for shared GPU clusters.

Layers (enforced by import-linter, see pyproject.toml), lowest first:
values -> workloads -> state -> decisions -> effects/controller -> tools/sim.
"""

__version__ = "0.2.0"
