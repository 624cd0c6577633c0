"""State: the immutable cluster snapshot the scheduling cycle reads.

`build_snapshot` (in `snapshot`) turns the plain Kubernetes objects the cache
holds into one value per cycle: numpy arrays of node capacity and free
resources, per-device GPU occupancy, topology trees, the queue tree and the pod
groups with their pods, plus every problem found in the input. Bad objects
become problems; they never crash the build. This layer imports only
`kai_ray.values` and `kai_ray.workloads`; it performs no I/O.
"""
