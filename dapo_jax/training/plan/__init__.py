"""`dapo-jax plan CONFIG`: will the run fit, before anything is loaded. The per-device memory of each phase
(`memory.py`) from the run's programs on abstract inputs (`programs.py`) compiled one by one (`compile.py`),
the model shapes compiled (`model_config.py`, `known_shapes.py`, `reward_models.py`), TPU slices and local
chips (`slices.py`, `chips.py`), a step-time estimate (`estimate.py`), the smallest slice that fits
(`search.py`) and what is printed (`report.py`)."""
