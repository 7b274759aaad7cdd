"""The jitted update programs: the policy update (`train_step.py`, packed: `packed_step.py`), the critic's
(`critic.py`), LoRA's weights (`lora.py`), a distillation teacher (`distill.py`), all built in one place
(`programs.py`) and compiled ahead of the first step (`compile_ahead.py`)."""
