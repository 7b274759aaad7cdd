"""`python -m dapo_jax.cli`: the same as the `dapo-jax` console script."""

import sys

from dapo_jax.cli import main

sys.exit(main())
