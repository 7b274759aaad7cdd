"""Saves a few-MB state over and over until killed: the subject of the SIGKILL-mid-save test.

    python -m tests.training.state.checkpoint_killer DIR    # prints "ready" once step 1 is on disk
"""

import sys

import numpy as np


def big_state(step: int) -> dict:
    """4 MB of float32 and a counter, the same for a step in every process."""
    rng = np.random.default_rng(step)
    return {"w": rng.standard_normal((1024, 1024), dtype=np.float32),
            "b": rng.standard_normal(16, dtype=np.float32), "step": np.int32(step)}


def big_carry(step: int) -> dict:
    return {"ids": np.arange(64, dtype=np.int32).reshape(8, 8) + step}


def main(directory: str) -> None:
    import jax.numpy as jnp

    from dapo_jax.training.state.checkpoint import Checkpointer

    ckpt = Checkpointer(directory, keep=2)  # async saves and garbage collection, as in training
    ckpt.save(1, {k: jnp.asarray(v) for k, v in big_state(1).items()}, meta={"seed": 1}, carry=big_carry(1))
    ckpt.wait()
    print("ready", flush=True)
    step = 2
    while True:
        ckpt.save(step, {k: jnp.asarray(v) for k, v in big_state(step).items()}, meta={"seed": step},
                  carry=big_carry(step))
        step += 1


if __name__ == "__main__":
    main(sys.argv[1])
