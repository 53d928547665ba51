"""Issue 13 regressions: every bad input gets a named error or a documented, tested policy.

One test (or a small group) per class of the issue; each failed on the code before the fix
(silent wrong result or cryptic error). The property-based sweep is tests/test_properties.py.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import jaxnoise
from jaxnoise.optim.es import EvolutionStrategyState

SEEDS = jnp.arange(4, dtype=jnp.uint32)
UPDATE = dict(lr=0.1, lr_scale=0.0, rms_beta=0.9, rms_eps=1e-8, seed=0, donate=False,
              implementation="reference")


# ----------------------------------------------------------------------------
# Class 1: optimizer state poisoned by finite but huge fitness.


@pytest.mark.parametrize("magnitude", [1e19, 1e38, 3.4e38])
def test_es_raw_huge_fitness_keeps_adam_alive_and_is_counted(magnitude):
  # Continuous noise: "binomial" values are exactly 0 one time in seven, so with
  # 4 pairs a coordinate's estimate can be 0 by chance, which is no overflow.
  es = jaxnoise.optim.evolution_strategy(0.1, optax.adam(0.01), pop_size=8, kind="uniform",
                                         fitness_shaping="raw", implementation="reference")
  params = {"x": jnp.ones(36)}
  state = es.init(params)
  for _ in range(3):
    fitness = jnp.linspace(-magnitude, magnitude, 8, dtype=jnp.float32)
    updates, state = es.update(fitness, state, params)
    params = optax.apply_updates(params, updates)
    assert bool(jnp.all(jnp.isfinite(params["x"])))
    assert int(jnp.sum(updates["x"] == 0)) == 0, "Adam's state overflowed: zero updates"
  assert jax.tree.all(jax.tree.map(lambda a: bool(jnp.all(jnp.isfinite(a))), state.inner_state))
  assert int(state.rescaled_count) == 3 and int(state.dropped_count) == 0
  assert int(state.nonfinite_count) == 0


def test_es_raw_small_fitness_is_untouched():
  es = jaxnoise.optim.evolution_strategy(0.1, optax.sgd(1.0), pop_size=4, antithetic=False,
                                         fitness_shaping="raw", implementation="reference")
  params = {"x": jnp.zeros(5)}
  fitness = jnp.array([1.0, -2.0, 3.0, 0.5])
  updates, state = es.update(fitness, es.init(params), params)
  expected = es.gradient(fitness, es.seeds(es.init(params)), params)
  np.testing.assert_array_equal(np.asarray(updates["x"]), np.asarray(expected["x"]))
  assert int(state.rescaled_count) == 0


def test_es_z_score_near_float32_max_is_finite():
  es = jaxnoise.optim.evolution_strategy(0.1, optax.adam(0.01), pop_size=8,
                                         fitness_shaping="z_score", implementation="reference")
  params = {"x": jnp.ones(6)}
  updates, _ = es.update(jnp.linspace(-3e38, 3e38, 8), es.init(params), params)
  assert bool(jnp.all(jnp.isfinite(updates["x"]))) and bool(jnp.any(updates["x"] != 0))


def test_es_drops_and_counts_a_non_finite_optimizer_state():
  es = jaxnoise.optim.evolution_strategy(0.1, optax.adam(0.01), pop_size=4,
                                         implementation="reference")
  params = {"x": jnp.ones(3)}
  state = es.init(params)
  adam, rest = state.inner_state[0], state.inner_state[1:]
  poisoned = state._replace(inner_state=(adam._replace(nu={"x": jnp.full(3, jnp.inf)}),) + rest)
  updates, new = es.update(jnp.arange(4.0), poisoned, params)
  assert int(new.dropped_count) == 1
  np.testing.assert_array_equal(np.asarray(updates["x"]), 0.0)
  assert new.generation == 1


@pytest.mark.parametrize("jit", [False, True])
def test_es_zeroes_and_counts_non_finite_update_entries(jit):
  """Non-finite update entries with a finite optimizer state (a weight decay overflowing on
  huge parameters, SGD): those entries are zero, every other entry is the unchecked
  update's, and the generation is counted once. With momentum the same overflow reaches
  the optimizer state, and the whole generation is dropped (and counted)."""
  make = functools.partial(jaxnoise.optim.evolution_strategy, 0.1, pop_size=4,
                           weight_decay=10.0, implementation="reference")
  params = {"x": jnp.array([1.0, 3e38, -2.0, -3e38, 0.5]), "y": jnp.ones((2, 3))}
  fitness = jnp.array([0.3, -1.0, 2.0, 0.1])
  huge = np.array([False, True, False, True, False])
  checked, unchecked = make(optax.sgd(0.5)), make(optax.sgd(0.5), check_finite=False)
  state = checked.init(params)
  updates, new = (jax.jit(checked.update) if jit else checked.update)(fitness, state, params)
  want, _ = unchecked.update(fitness, state, params)
  assert not np.isfinite(np.asarray(want["x"])[huge]).any()
  np.testing.assert_array_equal(np.asarray(updates["x"])[huge], 0.0)
  np.testing.assert_allclose(np.asarray(updates["x"])[~huge], np.asarray(want["x"])[~huge],
                             rtol=1e-6)
  np.testing.assert_allclose(updates["y"], want["y"], rtol=1e-6)
  assert np.any(np.asarray(updates["x"])[~huge] != 0)
  assert int(new.dropped_count) == 1 and int(new.generation) == 1

  momentum = make(optax.sgd(0.5, momentum=0.9))
  state = momentum.init(params)
  updates, new = (jax.jit(momentum.update) if jit else momentum.update)(fitness, state, params)
  jax.tree.map(lambda u: np.testing.assert_array_equal(u, 0.0), updates)
  jax.tree.map(np.testing.assert_array_equal, new.inner_state, state.inner_state)
  assert int(new.dropped_count) == 1


def test_es_accepts_a_state_without_the_new_counters():
  """Checkpoint compatibility: a 4-field state (rescaled_count/dropped_count None) updates."""
  es = jaxnoise.optim.evolution_strategy(0.1, optax.sgd(0.1), pop_size=4,
                                         implementation="reference")
  params = {"x": jnp.ones(3)}
  full = es.init(params)
  old = EvolutionStrategyState(full.generation, full.key_data, full.inner_state,
                               full.nonfinite_count)
  assert len(jax.tree.leaves(old)) == len(jax.tree.leaves(full)) - 2
  updates_old, new_old = jax.jit(es.update)(jnp.arange(4.0), old, params)
  updates_new, _ = jax.jit(es.update)(jnp.arange(4.0), full, params)
  np.testing.assert_array_equal(np.asarray(updates_old["x"]), np.asarray(updates_new["x"]))
  assert int(new_old.rescaled_count) == 0 and int(new_old.dropped_count) == 0


# ----------------------------------------------------------------------------
# Class 2: ternary state that contradicts its own C.


def _bad_codes():
  return jaxnoise.pack_codes(jnp.full((2, 4), 63, jnp.uint8))  # 63 is invalid for every C


@pytest.mark.parametrize("implementation", ["reference", "interpret"])
@pytest.mark.parametrize("op", ["decode", "matmul", "update", "update_from_io", "unpack"])
def test_codes_outside_C_raise_in_every_op(op, implementation):
  packed, scale, v = _bad_codes(), jnp.ones(2), jnp.zeros(2)
  calls = {
      "decode": lambda: jaxnoise.ternary_decode(packed, scale, C=1,
                                                implementation=implementation),
      "matmul": lambda: jaxnoise.ternary_matmul(jnp.ones((1, 4)), packed, scale, C=1,
                                                implementation=implementation),
      "update": lambda: jaxnoise.counter_update(packed, scale, v, jnp.ones((2, 4)), C=1,
                                                **{**UPDATE, "implementation": implementation}),
      "update_from_io": lambda: jaxnoise.counter_update_from_io(
          packed, scale, v, jnp.ones((3, 4)), jnp.ones((3, 2)), C=1,
          **{**UPDATE, "implementation": implementation}),
      "unpack": lambda: jaxnoise.unpack_codes(packed, C=1, implementation=implementation),
  }
  with pytest.raises(ValueError, match=r"packed holds 8 codes outside \[0, 3\).*C=1"):
    calls[op]()


def test_ternary_init_rejects_non_finite_weights_and_zeroes_them_when_traced():
  weight = jnp.array([[jnp.nan, 1.0, -1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
  with pytest.raises(ValueError, match=r"weight must be finite, got 1 NaN/inf"):
    jaxnoise.ternary_init(weight, C=2)
  packed, scale = jax.jit(lambda w: jaxnoise.ternary_init(w, C=2))(weight)
  assert bool(jnp.all(jnp.isfinite(scale)))
  expected = jaxnoise.ternary_init(jnp.nan_to_num(weight, nan=0.0), C=2)
  np.testing.assert_array_equal(np.asarray(packed), np.asarray(expected[0]))


@pytest.mark.parametrize("name,scale,v", [
    ("v", [1.0, 1.0], [-1.0, 0.0]), ("v", [1.0, 1.0], [jnp.nan, 0.0]),
    ("scale", [0.0, 1.0], [0.0, 0.0]), ("scale", [jnp.nan, 1.0], [0.0, 0.0]),
    ("scale", [-1.0, 1.0], [0.0, 0.0])])
def test_invalid_rms_state_raises_and_traced_rows_are_skipped(name, scale, v):
  packed, _ = jaxnoise.ternary_init(jnp.ones((2, 4)), C=2)
  scale, v = jnp.asarray(scale, jnp.float32), jnp.asarray(v, jnp.float32)
  with pytest.raises(ValueError, match=rf"{name} must be finite and .*1 rows are not"):
    jaxnoise.counter_update(packed, scale, v, jnp.ones((2, 4)), C=2, **UPDATE)
  for implementation in ["reference", "interpret"]:
    kwargs = {**UPDATE, "implementation": implementation}
    result = jax.jit(lambda p, s, r, kw=kwargs: jaxnoise.counter_update(
        p, s, r, jnp.ones((2, 4)), C=2, **kw))(packed, scale, v)
    assert int(result.skipped_rows) == 1
    np.testing.assert_array_equal(np.asarray(result.packed[0]), np.asarray(packed[0]))


# ----------------------------------------------------------------------------
# Class 3: malformed arguments.


@pytest.mark.parametrize("dtype", [jnp.int32, jnp.uint8, bool, "float64x"])
def test_non_float_out_dtype_raises(dtype):
  x, w = jnp.ones((2, 4)), jnp.ones((3, 4))
  with pytest.raises(TypeError, match="out_dtype"):
    jaxnoise.virtual_perturbed_linear(x, w, None, SEEDS, 0.1, out_dtype=dtype)
  with pytest.raises(TypeError, match="out_dtype"):
    jaxnoise.batching.perturbed_linear(x, w, None, 3, 0.1, out_dtype=dtype)
  packed, scale = jaxnoise.ternary_init(w[:, :4], C=2)
  with pytest.raises(TypeError, match="out_dtype"):
    jaxnoise.ternary_matmul(x, packed, scale, C=2, out_dtype=dtype)


def test_non_integer_dims_raise():
  with pytest.raises(TypeError, match=r"param_shapes\[0\].*2\.5"):
    jaxnoise.compute_offsets([(2.5, 3)])
  with pytest.raises(TypeError, match=r"shape.*2\.7"):
    jaxnoise.virtual_noise(SEEDS, (2.7, 3))
  with pytest.raises(TypeError, match="shape"):
    jaxnoise.virtual_noise(SEEDS, (True, 3))


def test_blocks_past_2_64_raise():
  end = 1 << 64
  match = r"offset \+ size must be <= 2\*\*64"
  with pytest.raises(ValueError, match=match):
    jaxnoise.virtual_noise(SEEDS, (10,), end - 5)
  jaxnoise.virtual_noise(SEEDS, (5,), end - 5)  # the last index is 2**64 - 1: fine
  with pytest.raises(ValueError, match=match):
    jaxnoise.virtual_perturbed_linear(jnp.ones((2, 4)), jnp.ones((3, 4)), jnp.ones(3), SEEDS,
                                      0.1, end - 14)
  with pytest.raises(ValueError, match=match):
    jaxnoise.virtual_weight_gradient(jnp.ones(4), SEEDS, (3, 4), 0.1, None, end - 11)
  with pytest.raises(ValueError, match=match):
    jaxnoise.virtual_bias_gradient(jnp.ones(4), SEEDS, 3, 0.1, None, end - 2)
  with pytest.raises(ValueError, match=match):
    jaxnoise.virtual_reduce_metric(jnp.ones(8), SEEDS, 0.1, None, end - 7)
  with pytest.raises(ValueError, match=r"param_shapes\[:2\]"):
    jaxnoise.compute_offsets([(1 << 63,), (1 << 63, 2)])


# ----------------------------------------------------------------------------
# Class 4: traced values.


def _linear(sigma):
  return jaxnoise.virtual_perturbed_linear(jnp.ones((2, 4)), jnp.ones((3, 4)), None, SEEDS,
                                           sigma, implementation="reference")


@pytest.mark.parametrize("sigma", [jnp.nan, -0.5, 0.0, jnp.inf])
def test_checkify_catches_a_bad_traced_sigma(sigma):
  error, _ = jax.jit(jaxnoise.checks.checkify(_linear))(jnp.float32(sigma))
  assert error.get() is not None and "sigma must be positive and finite" in error.get()
  error, _ = jax.jit(jaxnoise.checks.checkify(jax.grad(lambda s: _linear(s).sum())))(jnp.float32(sigma))
  assert "sigma must be positive and finite" in error.get()
  error, _ = jax.jit(jaxnoise.checks.checkify(_linear))(jnp.float32(0.1))
  assert error.get() is None


def test_traced_sigma_policy_without_checks():
  """Documented default: a NaN traced sigma gives NaN, a negative one mirrors the noise."""
  assert bool(jnp.all(jnp.isnan(jax.jit(_linear)(jnp.float32(jnp.nan)))))
  plus = jax.jit(_linear)(jnp.float32(0.5))
  minus = jax.jit(_linear)(jnp.float32(-0.5))
  np.testing.assert_allclose(np.asarray(plus + minus), 2 * np.asarray(_linear(1e-30)),
                             rtol=1e-5)


@pytest.mark.parametrize("op", ["weight", "bias"])
def test_non_finite_fitness_in_the_gradient_ops(op):
  def gradient(fitness):
    if op == "weight":
      return jaxnoise.virtual_weight_gradient(fitness, SEEDS, (2, 3), 0.1)
    return jaxnoise.virtual_bias_gradient(fitness, SEEDS, 3, 0.1)

  fitness = jnp.array([1.0, jnp.nan, 2.0, 3.0])
  with pytest.raises(ValueError, match="fitness must be finite, got 1 NaN/inf"):
    gradient(fitness)
  error, _ = jax.jit(jaxnoise.checks.checkify(gradient))(fitness)
  assert "fitness holds 1 non-finite values" in error.get()
  error, _ = jax.jit(jaxnoise.checks.checkify(gradient))(jnp.ones(4))
  assert error.get() is None


def test_checkify_catches_traced_ternary_state():
  packed, scale = jaxnoise.ternary_init(jnp.ones((2, 4)), C=2)

  def update(p, s, v):
    return jaxnoise.counter_update(p, s, v, jnp.ones((2, 4)), C=2, **UPDATE)

  error, _ = jax.jit(jaxnoise.checks.checkify(update))(_bad_codes(), scale, jnp.zeros(2))
  assert "codes >= 9 (invalid for C=2)" in error.get()
  error, _ = jax.jit(jaxnoise.checks.checkify(update))(packed, scale, jnp.array([-1.0, 0.0]))
  assert "v must be finite and non-negative" in error.get()
  error, _ = jax.jit(jaxnoise.checks.checkify(update))(packed, scale, jnp.zeros(2))
  assert error.get() is None


def test_checkify_under_vmap_of_per_individual_functions():
  def one(seed, sigma):
    return jaxnoise.batching.perturbed_linear(jnp.ones((2, 4)), jnp.ones((3, 4)), None, seed,
                                              sigma, implementation="reference")

  error, _ = jax.jit(jaxnoise.checks.checkify(jax.vmap(one, in_axes=(0, None))))(SEEDS, jnp.float32(-1))
  assert "sigma must be positive and finite" in error.get()
  error, out = jax.jit(jaxnoise.checks.checkify(jax.vmap(one, in_axes=(0, None))))(SEEDS, 0.1)
  assert error.get() is None and out.shape == (4, 2, 3)


# ----------------------------------------------------------------------------
# Class 5: cryptic errors and empty inputs.


@pytest.mark.parametrize("implementation", ["reference", "interpret"])
@pytest.mark.parametrize("x_shape,w_shape", [((0, 4), (3, 4)), ((2, 4), (0, 4)),
                                             ((2, 0), (3, 0)), ((4, 0, 4), (3, 4))])
def test_empty_linear_is_the_reference_result(implementation, x_shape, w_shape):
  x, w = jnp.ones(x_shape), jnp.ones(w_shape)
  b = jnp.arange(w_shape[0], dtype=jnp.float32)
  got = jaxnoise.virtual_perturbed_linear(x, w, b, SEEDS, 0.1, implementation=implementation)
  noise = jaxnoise.virtual_noise(SEEDS, w_shape)
  bias_noise = jaxnoise.virtual_noise(SEEDS, (w_shape[0],), w_shape[0] * w_shape[1])
  x_b = x if x.ndim == 3 else jnp.broadcast_to(x, (4,) + x.shape)
  expected = (jnp.einsum("pbi,poi->pbo", x_b, w + 0.1 * noise)
              + (b + 0.1 * bias_noise)[:, None, :])
  assert got.shape == expected.shape
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("implementation", ["reference", "interpret"])
def test_empty_center_and_negative_dims_are_named(implementation):
  with pytest.raises(ValueError, match="center must not be empty"):
    jaxnoise.virtual_reduce_metric(jnp.ones(0), SEEDS, 0.1, implementation=implementation)
  with pytest.raises(ValueError, match=r"shape must have non-negative dimensions.*-1"):
    jaxnoise.virtual_noise(SEEDS, (-1, 3))


def test_virtual_linear_names_a_wrong_feature_count():
  layer = jaxnoise.nn.VirtualLinear(8, 4, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r"inputs' last dimension must be in_features=8.*\(3, 5\)"):
    layer(jnp.ones((3, 5)))


@pytest.mark.parametrize("pop_size,exc", [(4.0, TypeError), (True, TypeError), ("4", TypeError),
                                          (0, ValueError)])
def test_draw_seeds_names_pop_size(pop_size, exc):
  with pytest.raises(exc, match="pop_size"):
    jaxnoise.draw_seeds(jax.random.key(0), pop_size)


def test_draw_seeds_names_key():
  with pytest.raises(TypeError, match="key must be a jax.random key"):
    jaxnoise.draw_seeds(0, 4)
