"""`python -m kai_ray` is `kai-ray`."""

import sys

from kai_ray.tools.cli import main

sys.exit(main())
