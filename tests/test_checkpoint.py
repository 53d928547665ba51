"""Checkpoint and resume of an ES run reproduce the uninterrupted run bit for bit."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnoise.optim.es import EvolutionStrategyState, evolution_strategy

STEPS = 6
SAVE_AFTER = 3


def make_model(seed):
  rngs = nnx.Rngs(seed)
  return nnx.Sequential(nnx.Linear(4, 8, rngs=rngs), nnx.relu, nnx.LayerNorm(8, rngs=rngs),
                        nnx.Linear(8, 2, rngs=rngs))


def make_run(rng):
  """A jitted ES step on fresh data; generation 1 has a NaN fitness (counted in the state)."""
  x = jnp.asarray(rng.normal(size=(16, 4)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 2, size=16))
  es = evolution_strategy(0.05, optax.adam(0.02), pop_size=8, weight_decay=1e-3,
                          seed=int(rng.integers(0, 2**31)))
  graphdef, _, rest = nnx.split(make_model(0), nnx.Param, ...)

  def fitness_fn(model):
    return -optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()

  @jax.jit
  def step(params, state):
    model = nnx.merge(graphdef, params, rest)
    seeds, state = es.ask(state)
    fitness = es.evaluate(model, seeds, fitness_fn)
    fitness = jnp.where(state.generation == 1, fitness.at[0].set(jnp.nan), fitness)
    updates, state = es.update(fitness, state, model)
    return optax.apply_updates(params, updates), state

  return es, step


def run(step, params, state, n):
  for _ in range(n):
    params, state = step(params, state)
  return params, state


def fresh_template(es, seed):
  """Structures to restore into: a differently initialised model and a new ES state."""
  model = make_model(seed)
  return nnx.state(model, nnx.Param), es.init(model, key=jax.random.key(seed))


def assert_bitwise_equal(tree_a, tree_b):
  leaves_a, treedef_a = jax.tree.flatten(tree_a)
  leaves_b, treedef_b = jax.tree.flatten(tree_b)
  assert treedef_a == treedef_b
  for a, b in zip(leaves_a, leaves_b):
    assert np.asarray(a).dtype == np.asarray(b).dtype
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_numpy_checkpoint_resume_is_bit_exact(rng, tmp_path):
  es, step = make_run(rng)
  model = make_model(0)
  params0, state0 = nnx.state(model, nnx.Param), es.init(model)
  final_params, final_state = run(step, params0, state0, STEPS)
  assert int(final_state.nonfinite_count) == 1

  params, state = run(step, params0, state0, SAVE_AFTER)
  leaves = [np.asarray(leaf) for leaf in jax.tree.leaves((params, state))]
  np.savez(tmp_path / "checkpoint.npz", *leaves)
  del params, state

  template = fresh_template(es, 7)
  loaded = np.load(tmp_path / "checkpoint.npz")
  restored = [jnp.asarray(loaded[f"arr_{i}"]) for i in range(len(loaded.files))]
  params, state = jax.tree.unflatten(jax.tree.structure(template), restored)
  assert isinstance(state, EvolutionStrategyState)
  resumed_params, resumed_state = run(step, params, state, STEPS - SAVE_AFTER)
  assert_bitwise_equal(resumed_params, final_params)
  assert_bitwise_equal(resumed_state, final_state)


def test_orbax_checkpoint_resume_is_bit_exact(rng, tmp_path):
  ocp = pytest.importorskip("orbax.checkpoint")
  es, step = make_run(rng)
  model = make_model(0)
  params0, state0 = nnx.state(model, nnx.Param), es.init(model)
  final_params, final_state = run(step, params0, state0, STEPS)

  params, state = run(step, params0, state0, SAVE_AFTER)
  checkpointer = ocp.StandardCheckpointer()
  checkpointer.save(tmp_path / "step_3", {"params": params, "es": state})
  checkpointer.wait_until_finished()
  del params, state

  template_params, template_state = fresh_template(es, 11)
  restored = checkpointer.restore(tmp_path / "step_3",
                                  {"params": template_params, "es": template_state})
  resumed_params, resumed_state = run(step, restored["params"], restored["es"],
                                      STEPS - SAVE_AFTER)
  assert_bitwise_equal(resumed_params, final_params)
  assert_bitwise_equal(resumed_state, final_state)
  # The resumed run is not trivially equal to a fresh start.
  assert not np.array_equal(np.asarray(jax.tree.leaves(final_params)[0]),
                            np.asarray(jax.tree.leaves(params0)[0]))
