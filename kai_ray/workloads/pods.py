"""The old name of `pod_fields` (confusable with `state/pod_states.py`), kept only
for the imports not moved yet: `effects/binder.py` and `state/cache.py`.

Import from `kai_ray.workloads.pod_fields`; this module goes once nothing imports it.
"""

from kai_ray.workloads.pod_fields import format_device_list as format_device_list
from kai_ray.workloads.pod_fields import gpu_share as gpu_share
from kai_ray.workloads.pod_fields import pod_key as pod_key
from kai_ray.workloads.pod_fields import pod_node as pod_node
from kai_ray.workloads.pod_fields import pod_requests as pod_requests
