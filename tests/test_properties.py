"""Property-based sweep of the public API (hypothesis): a named error or the reference's result.

Every example draws random shapes (including 0 and 1), dtypes, kinds, offsets near 2**32 and
2**64, and sometimes a bad argument. The property: the call raises ``ValueError`` /
``TypeError`` whose message names one of the arguments that were made bad, or it returns a
result equal to the reference (``implementation="interpret"`` runs the Pallas kernel through
the interpreter on tiny shapes). A valid input never raises.

Budget: about a minute on one CPU core. Run with ``--hypothesis-show-statistics`` for the case
counts; ``HYPOTHESIS_PROFILE=thorough`` multiplies the examples by 10.
"""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import jaxnoise

settings.register_profile("default", max_examples=20, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow,
                                                 HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

FLOATS = [jnp.float32, jnp.bfloat16, jnp.float16]
KINDS = sorted(jaxnoise.KINDS)
TOLERANCE = {jnp.dtype(jnp.float32): 1e-5, jnp.dtype(jnp.bfloat16): 2e-2,
             jnp.dtype(jnp.float16): 2e-3}


def _offset_strategy(size_hint: int = 64):
  """Offsets at 0, near 2**32 and near 2**64 (some of which run past 2**64)."""
  return st.one_of(st.integers(0, 100),
                   st.integers(2**32 - size_hint, 2**32 + size_hint),
                   st.integers(2**64 - 2 * size_hint, 2**64 - 1))


class Bad:
  """Collects the names of the arguments an example made invalid."""

  def __init__(self):
    self.names = set()

  def __repr__(self):
    return f"Bad({sorted(self.names)})"

  def pick(self, draw, name, good, bad):
    """Draw ``bad`` about one time in ten (recording ``name``), else ``good``."""
    if draw(st.integers(0, 9)) == 0:
      self.names.add(name)
      return draw(bad)
    return draw(good)


def _check(call, bad: Bad, compare):
  """Run ``call``; a named error when something was bad, else ``compare(result)``."""
  try:
    result = call()
  except (ValueError, TypeError) as error:
    message = str(error)
    assert bad.names, f"a valid input raised {type(error).__name__}: {message}"
    assert any(name in message for name in bad.names), (
        f"{type(error).__name__} does not name any of {sorted(bad.names)}: {message}")
    event(f"named {type(error).__name__}")
    return
  event("result" if not bad.names else "bad input accepted by policy")
  compare(result)


def _allclose(actual, expected, dtype=jnp.float32):
  assert actual.shape == expected.shape and actual.dtype == expected.dtype
  tol = TOLERANCE[jnp.dtype(dtype)]
  np.testing.assert_allclose(np.asarray(actual, np.float32), np.asarray(expected, np.float32),
                             rtol=tol, atol=tol)


def _bad_sigma():
  return st.sampled_from([0.0, -0.1, float("nan"), float("inf"), 1, True, "0.1",
                          np.ones(2, np.float32), np.int32(1)])


def _bad_dtype():
  return st.sampled_from([jnp.int32, jnp.uint8, bool, jnp.int8, "nope"])


def _seeds(draw, bad: Bad, pop, antithetic):
  good = st.just(np.arange(pop, dtype=np.uint32) * 7919 + 1)
  return bad.pick(draw, "seeds", good, st.sampled_from([
      np.zeros(0, np.uint32), np.ones(pop, np.float32), np.ones((pop, 1), np.uint32),
      [1.5] * pop, np.ones(pop, bool)]))


# ----------------------------------------------------------------------------
# Virtual-noise ops.


@st.composite
def linear_case(draw):
  bad = Bad()
  antithetic = draw(st.booleans())
  pop = draw(st.sampled_from([2, 4] if antithetic else [1, 2, 3]))
  batch, out_f, in_f = (draw(st.integers(0, 3)), draw(st.integers(0, 3)),
                        draw(st.integers(0, 3)))
  x_dtype, w_dtype = draw(st.sampled_from(FLOATS)), draw(st.sampled_from(FLOATS[:2]))
  per_individual = draw(st.booleans())
  x_shape = (pop, batch, in_f) if per_individual else (batch, in_f)
  x_shape = bad.pick(draw, "x", st.just(x_shape), st.sampled_from(
      [(batch, in_f + 1), (pop + 1, batch, in_f) if per_individual else (batch,)]))
  w_shape = (out_f, in_f)
  use_bias = draw(st.booleans())
  bias_shape = bad.pick(draw, "bias", st.just((out_f,)), st.just((out_f + 1,)))
  n_block = out_f * in_f + (out_f if use_bias else 0)
  offset = draw(_offset_strategy(n_block + 1))
  if offset + n_block > 2**64:
    bad.names.add("offset")
  offset = bad.pick(draw, "offset", st.just(offset),
                    st.sampled_from([-1, 2**64, 1.5, True, np.float32(3)]))
  sigma = bad.pick(draw, "sigma", st.floats(0.01, 2.0), _bad_sigma())
  out_dtype = bad.pick(draw, "out_dtype", st.sampled_from(FLOATS), _bad_dtype())
  kind = bad.pick(draw, "kind", st.sampled_from(KINDS), st.sampled_from(["gauss", 3]))
  seeds = _seeds(draw, bad, pop, antithetic)
  if antithetic and isinstance(seeds, np.ndarray) and seeds.ndim == 1 and seeds.size % 2:
    bad.names.add("antithetic")
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  x = jnp.asarray(rng.normal(size=x_shape), x_dtype)
  w = jnp.asarray(rng.normal(size=w_shape), w_dtype)
  b = jnp.asarray(rng.normal(size=bias_shape), w_dtype) if use_bias else None
  if not use_bias:
    bad.names.discard("bias")
  kwargs = dict(kind=kind, antithetic=antithetic, out_dtype=out_dtype)
  return bad, (x, w, b, seeds, sigma, offset), kwargs


@given(linear_case())
def test_perturbed_linear(case):
  bad, args, kwargs = case

  def compare(result):
    expected = jaxnoise.virtual_perturbed_linear(*args, **kwargs, implementation="reference")
    _allclose(result, expected, kwargs["out_dtype"])

  _check(lambda: jaxnoise.virtual_perturbed_linear(*args, **kwargs, implementation="interpret"),
         bad, compare)


@st.composite
def gradient_case(draw):
  bad = Bad()
  antithetic = draw(st.booleans())
  pop = draw(st.sampled_from([2, 4] if antithetic else [1, 2, 3]))
  is_weight = draw(st.booleans())
  shape = ((draw(st.integers(0, 3)), draw(st.integers(0, 3))) if is_weight
           else (draw(st.integers(0, 4)),))
  name = "weight_shape" if is_weight else "bias_shape"
  shape = bad.pick(draw, name, st.just(shape), st.sampled_from(
      [(-1, 2), (2.5, 2), (True, 2), (1, 2, 3)] if is_weight else [(-2,), (1.5,), (1, 1)]))
  offset = draw(_offset_strategy(16))
  if isinstance(shape[0], int) and not isinstance(shape[0], bool) and all(
      isinstance(d, int) and d >= 0 for d in shape) and offset + math.prod(shape) > 2**64:
    bad.names.add("offset")
  fitness = np.random.default_rng(draw(st.integers(0, 99))).normal(size=pop)
  fitness = bad.pick(draw, "fitness", st.just(fitness.astype(np.float32)), st.sampled_from([
      np.full(pop, np.nan, np.float32), np.ones(pop + 1, np.float32), np.ones(pop, np.int32),
      np.ones((pop, 1), np.float32)]))
  pop_size = bad.pick(draw, "pop_size", st.sampled_from([None, pop, 2 * pop]),
                      st.sampled_from([0, -3, 2.5]))
  sigma = bad.pick(draw, "sigma", st.floats(0.01, 2.0), _bad_sigma())
  kind = draw(st.sampled_from(KINDS))
  seeds = _seeds(draw, bad, pop, antithetic)
  if antithetic and isinstance(seeds, np.ndarray) and seeds.ndim == 1 and seeds.size % 2:
    bad.names.add("antithetic")
  op = jaxnoise.virtual_weight_gradient if is_weight else jaxnoise.virtual_bias_gradient
  return bad, op, (fitness, seeds, shape, sigma, pop_size, offset), dict(
      kind=kind, antithetic=antithetic)


@given(gradient_case())
def test_gradients(case):
  bad, op, args, kwargs = case

  def compare(result):
    _allclose(result, op(*args, **kwargs, implementation="reference"))

  _check(lambda: op(*args, **kwargs, implementation="interpret"), bad, compare)


@st.composite
def metric_case(draw):
  bad = Bad()
  pop = draw(st.integers(1, 3))
  n = bad.pick(draw, "center", st.integers(1, 9), st.just(0))
  offset = draw(_offset_strategy(16))
  if n and offset + n > 2**64:
    bad.names.add("offset")
  center = jnp.asarray(np.random.default_rng(draw(st.integers(0, 99))).normal(size=n),
                       draw(st.sampled_from(FLOATS)))
  sigma = bad.pick(draw, "sigma", st.floats(0.01, 2.0), _bad_sigma())
  n_params = bad.pick(draw, "n_params", st.sampled_from([None, n]), st.just(n + 1))
  seeds = _seeds(draw, bad, pop, False)
  return bad, (center, seeds, sigma, n_params, offset), dict(kind=draw(st.sampled_from(KINDS)))


@given(metric_case())
def test_reduce_metric(case):
  bad, args, kwargs = case

  def compare(result):
    _allclose(result, jaxnoise.virtual_reduce_metric(*args, **kwargs,
                                                     implementation="reference"))

  _check(lambda: jaxnoise.virtual_reduce_metric(*args, **kwargs, implementation="interpret"),
         bad, compare)


@st.composite
def noise_case(draw):
  bad = Bad()
  shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
  shape = bad.pick(draw, "shape", st.just(shape), st.sampled_from(
      [(2.7, 3), (-1, 3), (True,), "ab", 2.0, None]))
  offset = draw(_offset_strategy(32))
  if isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape) \
      and offset + math.prod(shape) > 2**64:
    bad.names.add("offset")
  pop = draw(st.integers(1, 3))
  return bad, (_seeds(draw, bad, pop, False), shape, offset), draw(st.sampled_from(KINDS))


@given(noise_case())
def test_virtual_noise_and_layout(case):
  """Named error, or every row equals the flat block and the per-individual noise."""
  bad, (seeds, shape, offset), kind = case

  def compare(result):
    n = math.prod(shape)
    flat = jaxnoise.virtual_noise(seeds, (n,), offset, kind=kind)
    assert result.shape == (len(seeds),) + shape and result.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(result).reshape(len(seeds), n), np.asarray(flat))
    one = jaxnoise.batching.individual_noise(int(seeds[-1]), shape, offset, kind=kind)
    np.testing.assert_array_equal(np.asarray(one), np.asarray(result[-1]))

  _check(lambda: jaxnoise.virtual_noise(seeds, shape, offset, kind=kind), bad, compare)


@given(st.lists(st.one_of(st.integers(0, 2**40), st.tuples(st.integers(0, 2**21),
                                                           st.integers(0, 2**21)),
                          st.sampled_from([(2.5, 3), (-1,), (True, 2), "x"])), max_size=4))
def test_compute_offsets(shapes):
  bad = Bad()
  valid = []
  for shape in shapes:
    dims = (shape,) if isinstance(shape, int) else shape
    if isinstance(dims, str) or any(type(d) is not int or d < 0 for d in dims):
      bad.names.add("param_shapes")
    else:
      valid.append(math.prod(dims))

  def compare(offsets):
    assert offsets == [sum(valid[:i]) for i in range(len(valid))]

  _check(lambda: jaxnoise.compute_offsets(shapes), bad, compare)


@given(st.one_of(st.integers(-2, 6), st.sampled_from([4.0, True, "4", None, np.int64(4)])),
       st.booleans())
def test_draw_seeds(pop_size, antithetic):
  bad = Bad()
  if type(pop_size) not in (int, np.int64):
    bad.names.add("pop_size")
  elif pop_size <= 0:
    bad.names.add("pop_size")
  elif antithetic and pop_size % 2:
    bad.names.add("pop_size")

  def compare(seeds):
    assert seeds.shape == (int(pop_size),) and seeds.dtype == jnp.uint32
    if antithetic:
      np.testing.assert_array_equal(np.asarray(seeds[0::2]), np.asarray(seeds[1::2]))

  _check(lambda: jaxnoise.draw_seeds(jax.random.key(0), pop_size, antithetic=antithetic), bad,
         compare)


# ----------------------------------------------------------------------------
# Ternary ops.


@st.composite
def ternary_case(draw):
  bad = Bad()
  C = bad.pick(draw, "C", st.integers(1, 11), st.sampled_from([0, 12, 2.0, True]))
  valid_c = C if type(C) is int and 1 <= C <= 11 else 11
  out_f, in_f = draw(st.integers(1, 3)), draw(st.sampled_from([4, 8]))
  limit = 3 * (2 * valid_c - 1)
  rng = np.random.default_rng(draw(st.integers(0, 2**16)))
  codes = rng.integers(0, limit, size=(out_f, in_f))
  if draw(st.integers(0, 5)) == 0:
    codes[0, 0] = draw(st.integers(limit, 63))
    bad.names.add("packed")
  packed = jaxnoise.pack_codes(codes.astype(np.uint8))
  scale = rng.uniform(0.1, 2.0, size=out_f).astype(np.float32)
  scale = bad.pick(draw, "scale", st.just(scale), st.sampled_from(
      [np.zeros(out_f, np.float32), np.full(out_f, np.nan, np.float32),
       np.ones(out_f + 1, np.float32), np.ones(out_f, np.int32)]))
  v = rng.uniform(0.0, 1.0, size=out_f).astype(np.float32)
  v = bad.pick(draw, "v", st.just(v), st.sampled_from(
      [-np.ones(out_f, np.float32), np.full(out_f, np.inf, np.float32)]))
  batch = draw(st.integers(0, 2))
  x = jnp.asarray(rng.normal(size=(batch, in_f)), draw(st.sampled_from(FLOATS)))
  out_dtype = bad.pick(draw, "out_dtype", st.sampled_from([None] + FLOATS), _bad_dtype())
  grad = rng.normal(size=(out_f, in_f)).astype(np.float32)
  grad = bad.pick(draw, "grad_w", st.just(grad), st.just(grad[:, :-1]))
  op = draw(st.sampled_from(["decode", "matmul", "update"]))
  return bad, op, dict(C=C, packed=packed, scale=scale, v=v, x=x, out_dtype=out_dtype,
                       grad=grad, seed=draw(st.integers(0, 2**32 - 1)))


@given(ternary_case())
def test_ternary_ops(case):
  bad, op, a = case
  if op == "decode":
    bad.names -= {"v", "grad_w", "out_dtype"}
    scale = a["scale"]
    if isinstance(scale, np.ndarray) and scale.dtype == np.float32 and scale.shape == \
        (a["packed"].shape[0],):
      bad.names.discard("scale")  # decode multiplies by any float scale (no state to protect)

    def call(implementation):
      return jaxnoise.ternary_decode(a["packed"], a["scale"], C=a["C"],
                                     implementation=implementation)
  elif op == "matmul":
    bad.names -= {"v", "grad_w"}
    if isinstance(a["scale"], np.ndarray) and a["scale"].dtype == np.float32 and \
        a["scale"].shape == (a["packed"].shape[0],):
      bad.names.discard("scale")

    def call(implementation):
      return jaxnoise.ternary_matmul(a["x"], a["packed"], a["scale"], C=a["C"],
                                     out_dtype=a["out_dtype"], implementation=implementation)
  else:
    bad.names -= {"out_dtype"}

    def call(implementation):
      return jaxnoise.counter_update(a["packed"], a["scale"], a["v"], a["grad"], C=a["C"],
                                     lr=0.3, lr_scale=0.01, rms_beta=0.9, rms_eps=1e-8,
                                     seed=a["seed"], donate=False,
                                     implementation=implementation)

  def compare(result):
    expected = call("reference")
    for got, want in zip(jax.tree.leaves(result), jax.tree.leaves(expected)):
      if jnp.issubdtype(got.dtype, jnp.integer):
        assert got.dtype == want.dtype
        # Counter updates may differ by one code where float order crosses a boundary.
        assert int(jnp.sum(got != want)) <= 1
      else:
        _allclose(got, want, got.dtype)

  _check(lambda: call("interpret"), bad, compare)


# ----------------------------------------------------------------------------
# The ES transform: finite updates for any finite (or non-finite) fitness.

_ES_STEPS = {}


def _es_step(shaping, nonfinite):
  key = (shaping, nonfinite)
  if key not in _ES_STEPS:
    es = jaxnoise.optim.evolution_strategy(0.05, optax.adam(0.1), pop_size=6,
                                           fitness_shaping=shaping, nonfinite=nonfinite,
                                           implementation="reference")
    _ES_STEPS[key] = (es, jax.jit(es.update))
  return _ES_STEPS[key]


@settings(max_examples=60)
@given(st.sampled_from(["centered_rank", "z_score", "raw"]), st.sampled_from(["worst", "skip"]),
       st.lists(st.lists(st.one_of(st.floats(width=32, allow_nan=True, allow_infinity=True),
                                   st.sampled_from([3.4e38, -3.4e38, 1e19, -1e-45])),
                          min_size=6, max_size=6), min_size=1, max_size=3))
def test_es_update_is_finite_for_any_fitness(shaping, nonfinite, generations):
  es, update = _es_step(shaping, nonfinite)
  params = {"w": jnp.ones((3, 2)), "b": jnp.zeros(3)}
  state = es.init(params)
  nonfinite_seen = 0
  for fitness in generations:
    fitness = np.asarray(fitness, np.float32)
    nonfinite_seen += int(np.sum(~np.isfinite(fitness)))
    updates, state = update(jnp.asarray(fitness), state, params)
    params = optax.apply_updates(params, updates)
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(params))
  assert int(state.nonfinite_count) == nonfinite_seen
  assert int(state.dropped_count) == 0
  assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(state.inner_state))
  event(f"rescaled generations: {int(state.rescaled_count)}")


if __name__ == "__main__":
  pytest.main([__file__, "-q", "--hypothesis-show-statistics"])
