"""Decisions: pure, cluster-free scheduling logic that turns a snapshot into a plan.

Nothing here performs I/O, reads the wall clock, or imports kopf or the
Kubernetes client; Ray is imported only by the Ray placement backend, lazily.
"""
