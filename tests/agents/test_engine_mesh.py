"""The same episodes on one device and with the rows split over a 2-device mesh."""

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.agents.engine import EngineConfig, TurnEngine
from dapo_jax.agents.episodes import AgentLimits, run_episodes
from dapo_jax.sampling.config import SamplingConfig
from tests.agents.helpers import id_renderer, random_decoder
from tests.agents.test_episodes import Stochastic

ROWS = [{"ids": [6, 7, 8]}, {"ids": [9, 2]}]
CONFIG = EngineConfig(SamplingConfig(max_new_tokens=10, temperature=1.0, eos_token_ids=(1,)), cache_slots=80,
                      append_width=3, stop_sequences=((3,),))
LIMITS = AgentLimits(max_turns=3, max_episode_tokens=20)


def episodes(state, graphdef):
    engine = TurnEngine(graphdef, CONFIG)
    return engine, run_episodes(engine, state, ROWS, Stochastic, id_renderer(), LIMITS, jax.random.key(3),
                                group_size=2, prompt_width=4)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs the fake CPU devices from tests/conftest.py")
def test_two_device_mesh_gives_the_same_episodes():
    from dapo_jax.models.sharding import shard_model
    from dapo_jax.parallel.mesh import make_mesh

    graphdef, state = nnx.split(random_decoder())
    _, single = episodes(state, graphdef)
    mesh = make_mesh(data=2, fsdp=1, tensor=1, devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        model = random_decoder()
        shard_model(model, mesh)
        graphdef, state = nnx.split(model)
        engine, split = episodes(state, graphdef)
        es = engine.prefill(state, np.zeros((4, 4), np.int32), np.ones((4, 4), np.int32))
    assert {s.data.shape[1] for s in es.cache.k.addressable_shards} == {2}  # each device holds 2 of the 4 rows
    assert max(len(e.turn_ends) for e in single) >= 2
    for a, b in zip(single, split):
        assert a.ids == b.ids and a.loss_mask == b.loss_mask and a.status == b.status
        np.testing.assert_allclose(a.logp, b.logp, atol=1e-5)
