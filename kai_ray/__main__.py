"""`python -m kai_ray` is `kai-ray`."""

from kai_ray.tools.cli import run

run()
