"""What a run keeps and guards across steps and restarts: checkpoints (`checkpoint.py`, `failed_save.py`), the
host-side carry they hold (`run_state.py`), the run directory (`run_dir.py`), the model's identity on resume
(`model_identity.py`), and what stops a run loudly (`guards.py`)."""
