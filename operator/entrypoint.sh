#!/bin/sh
# Runs the kai-ray operator: kopf in module mode on kai_ray.controller.
# Extra arguments are passed to kopf (e.g. --namespace, --liveness).
set -eu
exec kopf run --standalone --all-namespaces -m kai_ray.controller "$@"
