"""A reward with no signal, for the clip grid's control arm (scripts/clip_grid.py):

    reward:
      functions: [{name: scripts/random_reward.py:score}]

+1 or -1 from one bit of the SHA-256 of the response text: independent of the answer, the same for the same
text (so a group of identical responses stays a zero-advantage group), about half of each. Under it
anything the update does to entropy or length comes from the objective itself (its clip, its length
normalisation), not from learning the task. Held-out accuracy in such a run is this reward's too: noise.
"""

from __future__ import annotations

import hashlib


def score(response: str, ground_truth=None, **row) -> float:
    return 1.0 if hashlib.sha256(response.encode("utf-8")).digest()[0] & 1 else -1.0
