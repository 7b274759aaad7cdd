"""`python -m tests.parallel.agree_pair COORDINATOR PROCESS_ID CALLS_JSON`: one of two processes joined by
jax.distributed that calls `parallel.agree.agree(name, error, timeout_s=3)` for each `[name, error]` of
CALLS_JSON in turn and prints, as one JSON line, what each call returned (`PeerLost: ...` when it raised
that), so a test can check what every process agreed on."""

import json
import sys

from dapo_jax.parallel.agree import agree
from dapo_jax.parallel.mesh import maybe_initialize_distributed
from dapo_jax.parallel.peers import PeerLost


def main() -> None:
    coordinator, process_id, calls = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    maybe_initialize_distributed(coordinator, 2, process_id, start_timeout_s=120)
    out = []
    for name, error in calls:
        try:
            out.append(agree(name, error, timeout_s=3))
        except PeerLost as e:
            out.append(f"PeerLost: {e}")
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
