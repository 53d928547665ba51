"""The optax-style ES transform (jaxnoise.optim.es) and the minimal example."""

import functools
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnoise.nn.population import fitness_gradient, perturb_params
from jaxnoise.ops.virtual_noise import config as config_lib
from jaxnoise.optim import es as es_lib
from jaxnoise.optim.es import (EvolutionStrategyState, centered_rank, evolution_strategy,
                               replace_nonfinite, shape_fitness, z_score)

REPO = pathlib.Path(__file__).resolve().parents[1]


def random_params(rng):
  return {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
          "count": jnp.int32(2)}


# ----------------------------------------------------------------------------
# Fitness shaping.


def test_centered_rank_values_ties_and_permutation(rng):
  fitness = jnp.asarray(rng.normal(size=9), jnp.float32)
  ranks = centered_rank(fitness)
  expected = np.argsort(np.argsort(np.asarray(fitness))) / 8.0 - 0.5
  np.testing.assert_allclose(ranks, expected, atol=1e-7)
  permutation = rng.permutation(9)
  np.testing.assert_allclose(centered_rank(fitness[permutation]), ranks[permutation], atol=1e-7)
  # Ties share the average rank: equal members cancel, an all-equal population is zero.
  np.testing.assert_allclose(centered_rank(jnp.array([5.0, 1.0, 5.0, 3.0])),
                             [(2.5 / 3) - 0.5, -0.5, (2.5 / 3) - 0.5, 1 / 3 - 0.5], atol=1e-7)
  np.testing.assert_array_equal(centered_rank(jnp.full(6, 2.5)), 0.0)
  np.testing.assert_array_equal(centered_rank(jnp.array([4.0])), 0.0)


@pytest.mark.parametrize("pop", [2, 7, 64, 1001])
def test_centered_rank_matches_average_ranks_with_many_ties(rng, pop):
  # Few distinct values (long tie runs, -0.0 beside 0.0) and a run at each end of the order.
  values = rng.integers(-3, 4, size=pop).astype(np.float32) * np.float32(1e30)
  values[rng.random(pop) < 0.2] = -0.0
  below = (values[None, :] < values[:, None]).sum(axis=1)
  up_to = (values[None, :] <= values[:, None]).sum(axis=1)
  expected = (below + up_to - 1) / 2.0 / (pop - 1) - 0.5
  shaped = jax.jit(centered_rank)(jnp.asarray(values))
  np.testing.assert_allclose(shaped, expected, atol=1e-7)
  # Batched populations shape each row on its own.
  batch = jnp.stack([jnp.asarray(values), -jnp.asarray(values)])
  np.testing.assert_array_equal(jax.vmap(centered_rank)(batch)[0], shaped)


@pytest.mark.parametrize("pop", [2, 33, 1024, 1025])
def test_centered_rank_counting_and_sorting_agree_bit_for_bit(rng, pop):
  # Below the limit ranks are counted, above it sorted: the two must give the same bits.
  # Long tie runs (-0.0 beside 0.0) mixed with distinct values.
  values = np.where(rng.random(pop) < 0.5, rng.integers(-4, 5, size=pop) * 0.75,
                    rng.normal(size=pop)).astype(np.float32)
  values[rng.random(pop) < 0.1] = -0.0
  fitness = jnp.asarray(values)
  counted = jax.jit(es_lib._average_ranks_by_counting)(fitness)
  sorted_ = jax.jit(es_lib._average_ranks_by_sorting)(fitness)
  np.testing.assert_array_equal(np.asarray(counted).view(np.uint32),
                                np.asarray(sorted_).view(np.uint32))
  below = (values[None, :] < values[:, None]).sum(axis=1)
  up_to = (values[None, :] <= values[:, None]).sum(axis=1)
  np.testing.assert_array_equal(counted, (below + up_to - 1) / 2.0)


def test_z_score_and_raw(rng):
  fitness = jnp.asarray(rng.normal(3.0, 2.0, size=16), jnp.float32)
  shaped = z_score(fitness)
  np.testing.assert_allclose(float(jnp.mean(shaped)), 0.0, atol=1e-6)
  np.testing.assert_allclose(float(jnp.std(shaped)), 1.0, atol=1e-5)
  np.testing.assert_array_equal(z_score(jnp.full(4, 7.0)), 0.0)
  np.testing.assert_array_equal(shape_fitness(fitness, "raw"), fitness)
  with pytest.raises(ValueError, match="fitness_shaping"):
    shape_fitness(fitness, "rank")


def test_replace_nonfinite():
  fixed, count = replace_nonfinite(jnp.array([2.0, -jnp.inf, jnp.nan, 0.5, jnp.inf]))
  np.testing.assert_array_equal(fixed, [2.0, 0.5, 0.5, 0.5, 0.5])
  assert int(count) == 3
  fixed, count = replace_nonfinite(jnp.full(4, jnp.nan))
  np.testing.assert_array_equal(fixed, 0.0)
  assert int(count) == 4


# ----------------------------------------------------------------------------
# The transform.


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("antithetic", [True, False])
def test_update_is_the_signed_es_gradient(rng, maximize, antithetic):
  params = random_params(rng)
  es = evolution_strategy(0.2, optax.sgd(0.5), pop_size=8, antithetic=antithetic,
                          fitness_shaping="raw", maximize=maximize)
  state = es.init(params)
  seeds, asked = es.ask(state)
  assert asked is state
  fitness = jnp.asarray(rng.normal(size=8), jnp.float32)
  updates, new_state = jax.jit(es.update)(fitness, state, params)
  oriented = fitness if maximize else -fitness
  ascent = jax.jit(lambda f, s: fitness_gradient(params, f, s, 0.2, antithetic=antithetic))(
      oriented, seeds)
  for name in ("w", "b"):
    np.testing.assert_allclose(updates[name], 0.5 * ascent[name], rtol=1e-6, atol=1e-7)
  assert int(updates["count"]) == 0
  assert int(new_state.generation) == 1 and int(new_state.nonfinite_count) == 0
  # With antithetic pairs and raw fitness, a step along the update provably raises a
  # linear objective (the estimate is sum_m (N_m . d)^2 d-ward): the sign convention.
  es = evolution_strategy(0.2, optax.sgd(0.5), pop_size=8, fitness_shaping="raw",
                          maximize=maximize)
  state = es.init(params)
  seeds, _ = es.ask(state)
  direction = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
               "b": jnp.asarray(rng.normal(size=3), jnp.float32)}
  objective = lambda p: sum(jnp.sum(p[k] * direction[k]) for k in ("w", "b"))
  fitness = jax.jit(jax.vmap(lambda s, g: objective(es.perturb(params, s, g))))(
      *es.individuals(seeds))
  updates, _ = jax.jit(es.update)(fitness if maximize else -fitness, state, params)
  assert float(objective(optax.apply_updates(params, updates))) > float(objective(params))


def test_weight_decay_is_added_to_the_loss_gradient(rng):
  params = random_params(rng)
  es = evolution_strategy(0.1, optax.sgd(0.1), pop_size=6, weight_decay=0.3)
  state = es.init(params)
  updates, _ = jax.jit(es.update)(jnp.full(6, 4.0), state, params)  # equal fitness: no ES gradient
  for name in ("w", "b"):
    np.testing.assert_allclose(updates[name], -0.1 * 0.3 * params[name], rtol=1e-6)
  assert int(optax.apply_updates(params, updates)["count"]) == 2  # integers never decay
  with pytest.raises(ValueError, match="weight_decay"):
    evolution_strategy(0.1, optax.sgd(0.1), pop_size=6, weight_decay=-1.0)


def test_nonfinite_fitness_worst_policy(rng):
  params = random_params(rng)
  es = evolution_strategy(0.1, optax.adam(0.1), pop_size=8)
  state = es.init(params)
  fitness = jnp.asarray(rng.normal(size=8), jnp.float32)
  broken = fitness.at[1].set(jnp.nan).at[4].set(jnp.inf).at[6].set(-jnp.inf)
  worst = float(jnp.min(fitness[jnp.array([0, 2, 3, 5, 7])]))
  repaired = broken.at[1].set(worst).at[4].set(worst).at[6].set(worst)
  update = jax.jit(es.update)
  updates, new_state = update(broken, state, params)
  expected, _ = update(repaired, state, params)
  for name in ("w", "b"):
    assert bool(jnp.all(jnp.isfinite(updates[name])))
    np.testing.assert_array_equal(updates[name], expected[name])
  assert int(new_state.nonfinite_count) == 3
  assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(new_state))
  # Nothing finite: no ES gradient (adam's first step is then zero), still no NaN.
  updates, all_bad = update(jnp.full(8, jnp.nan), state, params)
  np.testing.assert_array_equal(updates["w"], 0.0)
  assert int(all_bad.nonfinite_count) == 8


def test_nonfinite_fitness_skip_policy(rng):
  params = random_params(rng)
  es = evolution_strategy(0.1, optax.adam(0.1), pop_size=8, nonfinite="skip")
  state = es.init(params)
  update = jax.jit(es.update)
  updates, state = update(jnp.asarray(rng.normal(size=8), jnp.float32), state, params)
  assert float(jnp.abs(updates["w"]).max()) > 0
  broken = jnp.asarray(rng.normal(size=8), jnp.float32).at[3].set(jnp.nan)
  updates, skipped = update(broken, state, params)
  np.testing.assert_array_equal(updates["w"], 0.0)
  for kept, old in zip(jax.tree.leaves(skipped.inner_state), jax.tree.leaves(state.inner_state)):
    np.testing.assert_array_equal(kept, old)
  assert int(skipped.nonfinite_count) == 1 and int(skipped.generation) == 2


@pytest.mark.parametrize("nonfinite", ["worst", "skip"])
@pytest.mark.parametrize("optimizer", [optax.sgd(0.05, momentum=0.9), optax.adam(0.1)],
                         ids=["sgd_momentum", "adam"])
def test_without_the_finite_check_finite_generations_are_the_same(rng, optimizer, nonfinite):
  """check_finite=False leaves the check out and changes nothing else, skips included.

  Not bit for bit: without the check XLA fuses the optimizer's arithmetic
  differently, and on CPU a product may then be a fused multiply-add (1 ulp).
  """
  params = random_params(rng)
  checked, unchecked = (evolution_strategy(0.1, optimizer, pop_size=8, nonfinite=nonfinite,
                                           weight_decay=0.01, check_finite=check)
                        for check in (True, False))
  state = checked.init(params)
  for generation in range(4):
    fitness = jnp.asarray(rng.normal(size=8), jnp.float32)
    if generation == 2:
      fitness = fitness.at[5].set(jnp.nan)  # "skip" drops it; "worst" repairs it
    updates, new_state = jax.jit(checked.update)(fitness, state, params)
    others, other_state = jax.jit(unchecked.update)(fitness, state, params)
    close = functools.partial(np.testing.assert_allclose, rtol=1e-6, atol=1e-12)
    jax.tree.map(close, updates, others)
    jax.tree.map(close, new_state, other_state)
    if generation == 2 and nonfinite == "skip":
      jax.tree.map(lambda u: np.testing.assert_array_equal(u, 0), others)
      jax.tree.map(np.testing.assert_array_equal, other_state.inner_state, state.inner_state)
    else:
      assert float(jnp.abs(others["w"]).max()) > 0
    assert int(other_state.dropped_count) == 0
    params, state = optax.apply_updates(params, updates), new_state
  assert int(state.nonfinite_count) == 1


def test_without_the_finite_check_a_poisoned_state_is_applied_as_optax_would():
  """What check_finite=False gives up: the state's inf reaches the output, uncounted."""
  params = {"x": jnp.ones(3)}
  adam = optax.adam(0.01)
  es = evolution_strategy(0.1, adam, pop_size=4, check_finite=False,
                          implementation="reference")
  state = es.init(params)
  moments, rest = state.inner_state[0], state.inner_state[1:]
  poisoned = state._replace(inner_state=(moments._replace(nu={"x": jnp.full(3, jnp.inf)}),)
                            + rest)
  ascent = es.gradient(es.shape(jnp.arange(4.0))[0], es.seeds(state), params)
  want_updates, want_inner = adam.update(jax.tree.map(jnp.negative, ascent),
                                         poisoned.inner_state, params)
  updates, new = es.update(jnp.arange(4.0), poisoned, params)
  jax.tree.map(np.testing.assert_array_equal, updates, want_updates)
  jax.tree.map(np.testing.assert_array_equal, new.inner_state, want_inner)
  assert int(new.dropped_count) == 0
  assert not bool(jnp.all(jnp.isfinite(new.inner_state[0].nu["x"])))


def test_seeds_are_a_function_of_the_state():
  es = evolution_strategy(0.1, optax.sgd(0.1), pop_size=6, seed=3)
  state = es.init({"w": jnp.zeros(2)})
  seeds, _ = es.ask(state)
  assert seeds.dtype == jnp.uint32 and seeds.shape == (6,)
  np.testing.assert_array_equal(seeds[0::2], seeds[1::2])  # antithetic pairs
  np.testing.assert_array_equal(es.ask(state)[0], seeds)
  later = state._replace(generation=state.generation + 1)
  assert not np.array_equal(es.ask(later)[0], seeds)
  other = es.init({"w": jnp.zeros(2)}, key=jax.random.key(4))
  assert not np.array_equal(es.ask(other)[0], seeds)
  assert isinstance(state, EvolutionStrategyState)


def test_es_improves_a_pytree_objective_with_a_chained_optimizer(rng):
  target = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
  params = {"w": jnp.zeros((4, 5)), "b": jnp.zeros(4)}
  optimizer = optax.chain(optax.clip_by_global_norm(10.0), optax.adam(0.05))
  es = evolution_strategy(0.05, optimizer, pop_size=32, maximize=False)
  loss = lambda p: jnp.sum((p["w"] - target) ** 2) + jnp.sum((p["b"] - 1.0) ** 2)

  @jax.jit
  def step(params, state):
    seeds, state = es.ask(state)
    population = jax.vmap(es.perturb, in_axes=(None, 0, 0))(params, *es.individuals(seeds))
    updates, state = es.update(jax.vmap(loss)(population), state, params)
    return optax.apply_updates(params, updates), state

  state = es.init(params)
  start = float(loss(params))
  for _ in range(60):
    params, state = step(params, state)
  assert float(loss(params)) < 0.3 * start


def test_es_improves_an_nnx_model(rng):
  x = jnp.asarray(rng.normal(size=(32, 4)), jnp.float32)
  y = jnp.sin(x @ jnp.asarray(rng.normal(size=(4, 1)), jnp.float32))
  model = nnx.Sequential(nnx.Linear(4, 16, rngs=nnx.Rngs(0)), nnx.tanh,
                         nnx.LayerNorm(16, rngs=nnx.Rngs(0)), nnx.Linear(16, 1, rngs=nnx.Rngs(1)))
  es = evolution_strategy(0.05, optax.adam(0.03), pop_size=64, fitness_shaping="z_score")
  mse = lambda m: jnp.mean((m(x) - y) ** 2)

  @nnx.jit
  def step(model, state):
    seeds, state = es.ask(state)
    fitness = es.evaluate(model, seeds, lambda m: -mse(m))
    updates, state = es.update(fitness, state, model)
    nnx.update(model, optax.apply_updates(nnx.state(model, nnx.Param), updates))
    return state

  state = es.init(model)
  start = float(mse(model))
  for _ in range(40):
    state = step(model, state)
  assert float(mse(model)) < 0.5 * start


def test_perturb_matches_perturb_params(rng):
  params = random_params(rng)
  es = evolution_strategy(0.3, optax.sgd(0.1), pop_size=4, kind="normal")
  seeds = es.ask(es.init(params))[0]
  got = jax.jit(es.perturb)(params, seeds[2], -1.0)
  want = jax.jit(lambda p, s: perturb_params(p, s, 0.3, sign=-1.0, kind="normal"))(params,
                                                                                  seeds[2])
  for name in ("w", "b"):
    np.testing.assert_array_equal(got[name], want[name])


def test_validation():
  with pytest.raises(ValueError, match="even"):
    evolution_strategy(0.1, optax.sgd(0.1), pop_size=5)
  with pytest.raises(ValueError, match="fitness_shaping"):
    evolution_strategy(0.1, optax.sgd(0.1), pop_size=4, fitness_shaping="ranks")
  with pytest.raises(ValueError, match="nonfinite"):
    evolution_strategy(0.1, optax.sgd(0.1), pop_size=4, nonfinite="ignore")
  with pytest.raises(ValueError, match="sigma"):
    evolution_strategy(0.0, optax.sgd(0.1), pop_size=4)
  with pytest.raises(TypeError, match="optimizer"):
    evolution_strategy(0.1, "adam", pop_size=4)
  with pytest.raises(ValueError, match="implementation"):
    evolution_strategy(0.1, optax.sgd(0.1), pop_size=4, implementation="cuda")
  with pytest.raises(TypeError, match="check_finite must be a bool, got str"):
    evolution_strategy(0.1, optax.sgd(0.1), pop_size=4, check_finite="no")
  es = evolution_strategy(0.1, optax.sgd(0.1), pop_size=4)
  params = {"w": jnp.zeros(3)}
  with pytest.raises(ValueError, match=r"fitness must have shape \(4,\)"):
    es.update(jnp.zeros(5), es.init(params), params)
  with pytest.raises(TypeError, match="fitness"):
    es.update(jnp.zeros(4, jnp.int32), es.init(params), params)


# ----------------------------------------------------------------------------
# The README example.


def test_minimal_example_trains_well_above_chance():
  pytest.importorskip("sklearn")
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  result = subprocess.run([sys.executable, str(REPO / "examples" / "es_nnx_minimal.py")],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  accuracy = float(re.search(r"test accuracy .*: ([0-9.]+)", result.stdout).group(1))
  assert accuracy > 0.6, result.stdout  # chance is 0.1
  assert len((REPO / "examples" / "es_nnx_minimal.py").read_text().splitlines()) < 30


def test_config_tuple_routes_each_op_its_config():
  # One ES config argument carries the forward's and the estimate's configs: each op takes
  # its own type (a LowRankGradientConfig once reached the bias gradient and the forward).
  model = nnx.Sequential(nnx.Linear(12, 9, rngs=nnx.Rngs(0)), nnx.relu,
                         nnx.Linear(9, 5, rngs=nnx.Rngs(1)))
  x = jnp.asarray(np.random.default_rng(3).normal(size=(4, 12)), jnp.float32)
  loss = lambda m, x: -jnp.mean(jnp.square(m(x)))
  results = {}
  for name, config in (("none", None),
                       ("tuple", (config_lib.LowRankLinearConfig(materialize=True),
                                  config_lib.LowRankGradientConfig(xla_gemm=True))),
                       ("gradient only", config_lib.LowRankGradientConfig(xla_gemm=True))):
    es = evolution_strategy(0.05, optax.sgd(0.1), pop_size=8, rank=1, config=config,
                            implementation="interpret")
    state = es.init(model)
    seeds, state = es.ask(state)
    fitness = es.evaluate(model, seeds, loss, x)
    results[name] = (fitness, jax.jit(es.update)(fitness, state, model)[0])
  reference_fitness, reference_updates = results["none"]
  for name in ("tuple", "gradient only"):
    fitness, updates = results[name]
    np.testing.assert_allclose(fitness, reference_fitness, rtol=1e-5, atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 updates, reference_updates)
  with pytest.raises(TypeError, match="config must be None, a kernel config"):
    evolution_strategy(0.05, optax.sgd(0.1), pop_size=8, config=("tiles",))
  with pytest.raises(ValueError, match="two LowRankGradientConfig"):
    evolution_strategy(0.05, optax.sgd(0.1), pop_size=8,
                       config=(config_lib.LowRankGradientConfig(),
                               config_lib.LowRankGradientConfig(xla_gemm=True)))


@pytest.mark.parametrize("check_finite", [True, False])
def test_an_xla_gemm_estimate_is_left_to_xla_to_fuse_with_the_update(rng, check_finite):
  """No seal after XLA's GEMM, and a barrier only with the check.

  Without the check XLA may add SGD's step in the GEMM's epilogue (on an H200
  the step of EGGROLL's layer then has no pass of its own over the gradient
  and the weights: ``benchmarks/RESULTS.md``, session 20). With it, the
  barrier lets the optimizer, the check and the addition read the GEMM's
  output once (``benchmarks/offline_es_passes.py``, session 26). The updates
  are those of the tile kernel up to rounding.
  """
  params = {"w": jnp.asarray(rng.normal(size=(24, 40)), jnp.float32),
            "b": jnp.asarray(rng.normal(size=24), jnp.float32)}
  fitness = jnp.asarray(rng.normal(size=16), jnp.float32)
  results = {}
  for xla_gemm in (False, True):
    es = evolution_strategy(0.1, optax.sgd(0.05), pop_size=16, rank=1,
                            check_finite=check_finite, implementation="interpret",
                            config=config_lib.LowRankGradientConfig(xla_gemm=xla_gemm, tf32=False))
    state = es.init(params)
    jaxpr = str(jax.make_jaxpr(es.update)(fitness, state, params))
    updates, _ = jax.jit(es.update)(fitness, state, params)
    results[xla_gemm] = (jaxpr.count("optimization_barrier"), updates)
  (tile_barriers, tile_updates), (gemm_barriers, gemm_updates) = results[False], results[True]
  # The tiles: the shaping's, the tile kernel's operands' and the estimate's; XLA's GEMM:
  # the shaping's, and the estimate's with the check.
  assert (tile_barriers, gemm_barriers) == (3, 2 if check_finite else 1)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
               gemm_updates, tile_updates)
  assert float(jnp.abs(gemm_updates["w"]).max()) > 0
