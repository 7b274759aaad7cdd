"""`python -m dapo_jax.cli`: the same as the `dapo-jax` console script."""

import sys

from dapo_jax.cli import main

if __name__ == "__main__":  # importing the module (pkgutil.walk_packages, docs tools) runs nothing
    sys.exit(main())
