"""A run's configuration: the typed, validated YAML (`run.py`: `RunConfig`, `load_config`), its sections one
module per idea (`sections.py`, `data.py`, `objective.py`, `reward.py`, `agent.py`, on the shared `base.py`),
reading a file and overrides (`overrides.py`, `paths.py`, `keys.py`), the fast paths chosen after validation
(`resolve.py`), and its generated reference, docs/configuration.md (`reference.py`:
`python -m dapo_jax.training.config.reference --write`)."""
