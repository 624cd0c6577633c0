"""Effects: the only layer that changes the world (the API adapter, the binder, metrics).

Everything below it is pure. The Kubernetes client is imported only by the API
adapter; kopf only by `kai_ray.controller`.
"""
