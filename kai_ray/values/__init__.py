"""Values: resources and quantities, the API models, settings, clock and errors.

Pure data. Nothing here performs I/O or knows about Kubernetes clients, kopf or Ray.
"""
