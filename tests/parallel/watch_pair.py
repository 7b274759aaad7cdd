"""`python -m tests.parallel.watch_pair COORDINATOR PROCESS_ID LOST_S`: one of two processes joined by
jax.distributed inside a `PeerWatch(lost_s=LOST_S)`. Process 1 SIGKILLs itself once both are watching;
process 0 then waits in a barrier of the coordination service that process 1 never reaches (as a
checkpoint save waits for a killed peer: no error comes until JAX's heartbeat timeout)."""

import os
import signal
import sys

from dapo_jax.parallel.mesh import maybe_initialize_distributed
from dapo_jax.parallel.peers import PeerWatch, coordination_client


def main() -> None:
    coordinator, process_id, lost_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    maybe_initialize_distributed(coordinator, 2, process_id, start_timeout_s=120)
    client = coordination_client()
    with PeerWatch(lost_s=lost_s):
        client.wait_at_barrier("watching", 60_000)
        if process_id == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        print("waiting", flush=True)
        client.wait_at_barrier("never", 600_000)  # process 1 is dead: only the watch can end this
    print("the barrier returned", flush=True)


if __name__ == "__main__":
    main()
