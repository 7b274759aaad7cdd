"""A run's configuration: the typed, validated YAML (`run.py`) and its generated reference, docs/configuration.md
(`reference.py`: `python -m dapo_jax.training.config.reference --write`)."""
