"""Workloads: which gang (PodGroup) each workload kind is, and which gang a pod joins.

Reads KubeRay RayClusters and RayJobs, batch Jobs, Grove PodCliqueSets and
PodGangs and bare pods as plain dicts and derives the PodGroups kai-ray
schedules them as (`kai_ray.workloads.grouping` is the entry point). Pure: no
I/O, no Kubernetes client; it may import only `kai_ray.values`.
"""
