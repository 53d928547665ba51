"""benchmarks/lm_model.py: every matmul is a fused linear; chunked evaluation equals one call."""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))

import jaxnoise  # noqa: E402  pylint: disable=g-import-not-at-top
import lm_model  # noqa: E402  pylint: disable=g-import-not-at-top

CONFIG = lm_model.LMConfig(context=8, d_model=16, num_layers=1, num_heads=2)


def _fitness(member, sequences):
  return -lm_model.next_byte_loss(member, sequences)


def test_every_linear_is_fused_and_low_rank():
  model = lm_model.TransformerLM(CONFIG, rngs=nnx.Rngs(0))
  layout = jaxnoise.nn.parameter_layout(model, rank=1)
  # q, k, v, o, up, down per block, and the head.
  assert len(layout.linears) == 6 * CONFIG.num_layers + 1
  assert all(linear.fusable for linear in layout.linears)
  low_rank = {"/".join(map(str, b.path)) for b in layout.blocks if b.rank == 1}
  assert "token_embedding/embedding" not in low_rank and "head/kernel" in low_rank


def test_model_is_causal(rng):
  model = lm_model.TransformerLM(CONFIG, rngs=nnx.Rngs(0))
  tokens = jnp.asarray(rng.integers(0, 256, (2, CONFIG.context)), jnp.int32)
  changed = tokens.at[:, -1].set((tokens[:, -1] + 1) % 256)
  np.testing.assert_allclose(model(tokens)[:, :-1], model(changed)[:, :-1], rtol=1e-6,
                             atol=1e-6)


@pytest.mark.parametrize("rank", [1, None], ids=["rank1", "full"])
def test_chunked_evaluation_equals_one_call(rng, rank):
  model = lm_model.TransformerLM(CONFIG, rngs=nnx.Rngs(int(rng.integers(0, 1000))))
  es = jaxnoise.optim.evolution_strategy(0.05, optax.adam(1e-3), pop_size=8, rank=rank,
                                         implementation="reference")
  seeds, _ = es.ask(es.init(model))
  sequences = jnp.asarray(rng.integers(0, 256, (2, CONFIG.context + 1)), jnp.int32)
  whole = jax.jit(lambda: es.evaluate(model, seeds, _fitness, sequences))()
  chunked = jax.jit(lambda: lm_model.chunked_population_fitness(
      es, model, seeds, _fitness, sequences, chunk=4))()
  assert len(set(np.asarray(whole).tolist())) > 1  # the members differ
  np.testing.assert_allclose(chunked, whole, rtol=1e-5, atol=1e-6)


def test_chunk_members_is_an_even_divisor():
  assert lm_model.chunk_members(262144, 128, 1 << 20) == 8192
  assert lm_model.chunk_members(12, 1, 8) == 6
  with pytest.raises(ValueError, match="pop must be even"):
    lm_model.chunk_members(7, 1, 8)
  with pytest.raises(ValueError, match="even divisor"):
    lm_model.chunked_population_fitness(None, None, jnp.zeros(8, jnp.uint32), _fitness,
                                        chunk=3)
