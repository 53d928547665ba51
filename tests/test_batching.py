"""Per-individual functions under vmap / jit / grad (jaxnoise.batching)."""

import functools

import jax
import jax.extend.core as jex
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnoise import batching
from jaxnoise.noise import DEFAULT_KIND, virtual_noise
from jaxnoise.ops.virtual_noise.api import virtual_perturbed_linear, virtual_reduce_metric

HIGHEST = jax.lax.Precision.HIGHEST


# ----------------------------------------------------------------------------
# Helpers.


def _sub_jaxprs(eqn):
  for value in eqn.params.values():
    for item in value if isinstance(value, (list, tuple)) else (value,):
      if isinstance(item, jex.ClosedJaxpr):
        yield item.jaxpr
      elif isinstance(item, jex.Jaxpr):
        yield item


def equations(jaxpr, predicate):
  """All equations (recursively, through every sub-jaxpr) satisfying ``predicate``."""
  found = []
  for eqn in jaxpr.eqns:
    if predicate(eqn):
      found.append(eqn)
    for sub in _sub_jaxprs(eqn):
      found.extend(equations(sub, predicate))
  return found


def is_op(name):
  """Predicate: a call of the public op ``name`` (its custom_vjp equation)."""
  def predicate(eqn):
    return eqn.primitive.name == "custom_vjp_call" and f"{name}_bwd" in str(eqn.params.get("bwd"))
  return predicate


def op_calls(fn, *args):
  """``(x shape, seeds shape)`` of every ``virtual_perturbed_linear`` call in ``fn``'s jaxpr."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  calls = []
  for eqn in equations(jaxpr, is_op("_perturbed_linear")):
    (seeds,) = [v.aval.shape for v in eqn.invars if v.aval.dtype == jnp.uint32]
    calls.append((eqn.invars[0].aval.shape, seeds))
  return calls


def random_problem(rng, pop=6, batch=3, in_features=5, out_features=4):
  x = jnp.asarray(rng.normal(size=(batch, in_features)), jnp.float32)
  weight = jnp.asarray(rng.normal(size=(out_features, in_features)), jnp.float32)
  bias = jnp.asarray(rng.normal(size=(out_features,)), jnp.float32)
  seeds = jnp.asarray(rng.integers(0, 2**32, size=pop, dtype=np.uint32))
  offset = int(rng.integers(0, 10_000))
  return x, weight, bias, seeds, offset


@functools.partial(jax.jit, static_argnums=(5, 6))
def explicit_linear(x, weight, bias, seed, sigma, offset, kind=DEFAULT_KIND, sign=1.0):
  """Materialised math for one individual: x @ (W + s sigma N)^T + b + s sigma nb."""
  out_features, in_features = weight.shape
  noise = virtual_noise(jnp.atleast_1d(seed), (out_features, in_features), offset, kind=kind)[0]
  y = jnp.einsum("...k,ok->...o", x, weight + sign * sigma * noise, precision=HIGHEST)
  if bias is not None:
    bias_noise = virtual_noise(jnp.atleast_1d(seed), (out_features,),
                               offset + out_features * in_features, kind=kind)[0]
    y = y + bias + sign * sigma * bias_noise
  return y


def assert_close(actual, expected, tol=1e-5):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------
# vmap over seeds: one batched op call.


@pytest.mark.parametrize("kind", ["uniform", "rademacher", "normal"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_vmap_over_seeds_equals_batched_op(rng, kind, with_bias):
  x, weight, bias, seeds, offset = random_problem(rng)
  bias = bias if with_bias else None
  fn = lambda s: batching.perturbed_linear(x, weight, bias, s, 0.3, offset, kind=kind)
  expected = virtual_perturbed_linear(x, weight, bias, seeds, 0.3, offset, kind=kind)
  assert_close(jax.vmap(fn)(seeds), expected, 1e-6)
  # One op call for the whole population, with x shared (2-D).
  calls = op_calls(jax.vmap(fn), seeds)
  assert len(calls) == 1
  assert calls[0] == (x.shape, seeds.shape)


def test_offset_above_2_32(rng):
  x, weight, bias, seeds, _ = random_problem(rng)
  offset = 2**32 + int(rng.integers(0, 1000))
  fn = jax.jit(lambda s: batching.perturbed_linear(x, weight, bias, s, 0.2, offset))
  assert_close(jax.vmap(fn)(seeds), virtual_perturbed_linear(x, weight, bias, seeds, 0.2, offset))
  assert_close(fn(seeds[0]), explicit_linear(x, weight, bias, seeds[0], 0.2, offset))


def test_unbatched_call_is_one_individual(rng):
  x, weight, bias, seeds, offset = random_problem(rng)
  one = jax.jit(lambda x, s: batching.perturbed_linear(x, weight, bias, s, 0.1, offset))
  assert_close(one(x, seeds[2]), explicit_linear(x, weight, bias, seeds[2], 0.1, offset))
  # 1-D x and several leading dims.
  assert_close(one(x[0], seeds[2]), explicit_linear(x[0], weight, bias, seeds[2], 0.1, offset))
  x3 = jnp.stack([x, 2 * x])
  assert_close(one(x3, seeds[2]), explicit_linear(x3, weight, bias, seeds[2], 0.1, offset))


def test_per_individual_x_is_one_call(rng):
  _, weight, bias, seeds, offset = random_problem(rng)
  xs = jnp.asarray(rng.normal(size=(seeds.shape[0], 3, weight.shape[1])), jnp.float32)
  fn = jax.vmap(lambda xi, s: batching.perturbed_linear(xi, weight, bias, s, 0.2, offset))
  assert_close(fn(xs, seeds), virtual_perturbed_linear(xs, weight, bias, seeds, 0.2, offset))
  calls = op_calls(fn, xs, seeds)
  assert len(calls) == 1 and calls[0][0] == xs.shape


def test_jit_and_vmap_in_both_orders(rng):
  x, weight, bias, seeds, offset = random_problem(rng)
  fn = lambda s: batching.perturbed_linear(x, weight, bias, s, 0.2, offset)
  expected = virtual_perturbed_linear(x, weight, bias, seeds, 0.2, offset)
  assert_close(jax.jit(jax.vmap(fn))(seeds), expected, 1e-6)
  assert_close(jax.vmap(jax.jit(fn))(seeds), expected, 1e-6)
  assert len(op_calls(jax.vmap(jax.jit(fn)), seeds)) == 1


def test_nested_vmap_over_rows_inside_and_outside(rng):
  x, weight, bias, seeds, offset = random_problem(rng)
  expected = virtual_perturbed_linear(x, weight, bias, seeds, 0.2, offset)
  one = lambda xr, s: batching.perturbed_linear(xr, weight, bias, s, 0.2, offset)
  rows_inside = jax.vmap(lambda s: jax.vmap(lambda xr: one(xr, s))(x))
  rows_outside = jax.vmap(lambda xr: jax.vmap(lambda s: one(xr, s))(seeds))
  assert_close(rows_inside(seeds), expected, 1e-6)
  assert_close(jnp.swapaxes(rows_outside(x), 0, 1), expected, 1e-6)
  # Both collapse to one op call whose x is the whole (batch, in) block.
  for fn, arg in ((rows_inside, seeds), (rows_outside, x)):
    calls = op_calls(fn, arg)
    assert len(calls) == 1 and calls[0][0] == x.shape, calls


def test_vmap_of_vmap_over_seeds_is_one_population(rng):
  x, weight, bias, seeds, offset = random_problem(rng, pop=6)
  grid = seeds.reshape(2, 3)
  fn = jax.vmap(jax.vmap(lambda s: batching.perturbed_linear(x, weight, bias, s, 0.2, offset)))
  expected = virtual_perturbed_linear(x, weight, bias, seeds, 0.2, offset)
  assert_close(fn(grid).reshape(expected.shape), expected, 1e-6)
  calls = op_calls(fn, grid)
  assert calls == [(x.shape, (6,))]
  # Outer axis batches x too: one per-individual op call.
  xs = jnp.asarray(rng.normal(size=(2,) + x.shape), jnp.float32)
  fn2 = jax.vmap(lambda xo, row: jax.vmap(
      lambda s: batching.perturbed_linear(xo, weight, bias, s, 0.2, offset))(row))
  out = fn2(xs, grid)
  for outer in range(2):
    for inner in range(3):
      assert_close(out[outer, inner],
                   explicit_linear(xs[outer], weight, bias, grid[outer, inner], 0.2, offset))
  assert len(op_calls(fn2, xs, grid)) == 1


@pytest.mark.parametrize("pattern", ["weight", "bias", "sigma", "weight_and_seed", "x_only",
                                     "x_and_sigma"])
def test_other_in_batched_patterns_fall_back_correctly(rng, pattern):
  x, weight, bias, seeds, offset = random_problem(rng, pop=4)
  n = 4
  weights = jnp.asarray(rng.normal(size=(n,) + weight.shape), jnp.float32)
  biases = jnp.asarray(rng.normal(size=(n,) + bias.shape), jnp.float32)
  sigmas = jnp.asarray(rng.uniform(0.05, 0.5, size=n), jnp.float32)
  xs = jnp.asarray(rng.normal(size=(n,) + x.shape), jnp.float32)
  seed = seeds[0]
  f = functools.partial(batching.perturbed_linear, offset=offset)
  cases = {
      "weight": (lambda w: f(x, w, bias, seed, 0.2), (weights,),
                 lambda i: explicit_linear(x, weights[i], bias, seed, 0.2, offset)),
      "bias": (lambda b: f(x, weight, b, seed, 0.2), (biases,),
               lambda i: explicit_linear(x, weight, biases[i], seed, 0.2, offset)),
      "sigma": (lambda sg: f(x, weight, bias, seed, sg), (sigmas,),
                lambda i: explicit_linear(x, weight, bias, seed, sigmas[i], offset)),
      "weight_and_seed": (lambda w, s: f(x, w, bias, s, 0.2), (weights, seeds),
                          lambda i: explicit_linear(x, weights[i], bias, seeds[i], 0.2, offset)),
      "x_only": (lambda xi: f(xi, weight, bias, seed, 0.2), (xs,),
                 lambda i: explicit_linear(xs[i], weight, bias, seed, 0.2, offset)),
      "x_and_sigma": (lambda xi, sg: f(xi, weight, bias, seed, sg), (xs, sigmas),
                      lambda i: explicit_linear(xs[i], weight, bias, seed, sigmas[i], offset)),
  }
  fn, args, expected = cases[pattern]
  out = jax.jit(jax.vmap(fn))(*args)
  assert out.shape == (n,) + x.shape[:-1] + (weight.shape[0],)
  for i in range(n):
    assert_close(out[i], expected(i))


# ----------------------------------------------------------------------------
# Gradients (custom_vjp outside custom_vmap).


def test_grad_through_per_individual_function(rng):
  x, weight, bias, seeds, offset = random_problem(rng)
  target = jnp.asarray(rng.normal(size=(seeds.shape[0],) + x.shape[:-1] + (weight.shape[0],)),
                       jnp.float32)

  def loss(x, weight, bias, sigma):
    y = jax.vmap(lambda s: batching.perturbed_linear(x, weight, bias, s, sigma, offset))(seeds)
    return jnp.sum((y - target) ** 2)

  def explicit_loss(x, weight, bias, sigma):
    y = jnp.stack([explicit_linear(x, weight, bias, s, sigma, offset) for s in seeds])
    return jnp.sum((y - target) ** 2)

  args = (x, weight, bias, jnp.float32(0.3))
  grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(*args)
  expected = jax.grad(explicit_loss, argnums=(0, 1, 2, 3))(*args)
  for got, want in zip(grads, expected):
    assert_close(got, want, 2e-4)


def test_vmap_of_grad_per_individual(rng):
  x, weight, bias, seeds, offset = random_problem(rng)

  def individual_loss(weight, seed):
    return jnp.sum(batching.perturbed_linear(x, weight, bias, seed, 0.2, offset) ** 2)

  def explicit_loss(weight, seed):
    return jnp.sum(explicit_linear(x, weight, bias, seed, 0.2, offset) ** 2)

  grads = jax.vmap(jax.grad(individual_loss), in_axes=(None, 0))(weight, seeds)
  for i, seed in enumerate(seeds):
    assert_close(grads[i], jax.grad(explicit_loss)(weight, seed), 2e-4)


# ----------------------------------------------------------------------------
# Antithetic pairs.


def test_pair_vmap_equals_antithetic_op(rng):
  x, weight, bias, seeds, offset = random_problem(rng, pop=4)
  pair_fn = lambda s: batching.perturbed_linear_pair(x, weight, bias, s, 0.25, offset)
  out = jax.vmap(pair_fn)(seeds)  # (4 pairs, 2, batch, out)
  expected = virtual_perturbed_linear(x, weight, bias, jnp.repeat(seeds, 2), 0.25, offset,
                                      antithetic=True)
  assert_close(out.reshape(expected.shape), expected, 1e-6)
  assert_close(out[1, 0], explicit_linear(x, weight, bias, seeds[1], 0.25, offset))
  assert_close(out[1, 1], explicit_linear(x, weight, bias, seeds[1], 0.25, offset, sign=-1.0))
  assert op_calls(jax.vmap(pair_fn), seeds) == [(x.shape, (8,))]


def test_pair_with_per_member_x(rng):
  x, weight, bias, seeds, offset = random_problem(rng, pop=3)
  members = jnp.asarray(rng.normal(size=(3, 2) + x.shape), jnp.float32)
  fn = jax.vmap(lambda xm, s: batching.perturbed_linear_pair(xm, weight, bias, s, 0.25, offset,
                                                             per_member_x=True))
  out = fn(members, seeds)
  for p in range(3):
    for member, sign in ((0, 1.0), (1, -1.0)):
      assert_close(out[p, member],
                   explicit_linear(members[p, member], weight, bias, seeds[p], 0.25, offset,
                                   sign=sign))
  assert len(op_calls(fn, members, seeds)) == 1


def test_antithetic_member_under_population_vmap(rng):
  x, weight, bias, seeds, offset = random_problem(rng, pop=6)
  pair_seeds = jnp.repeat(seeds[::2], 2)
  signs = jnp.array([1.0, -1.0] * 3, jnp.float32)
  fn = jax.vmap(lambda s, g: batching.antithetic_member_linear(x, weight, bias, s, g, 0.2,
                                                               offset))
  expected = virtual_perturbed_linear(x, weight, bias, pair_seeds, 0.2, offset, antithetic=True)
  assert_close(fn(pair_seeds, signs), expected, 1e-6)
  assert len(op_calls(fn, pair_seeds, signs)) == 1
  # Unbatched meaning: the member with the given sign.
  assert_close(batching.antithetic_member_linear(x, weight, bias, seeds[0], -1.0, 0.2, offset),
               explicit_linear(x, weight, bias, seeds[0], 0.2, offset, sign=-1.0))


# ----------------------------------------------------------------------------
# Other per-individual functions.


def test_reduce_metric_vmap_is_one_call(rng):
  center = jnp.asarray(rng.normal(size=37), jnp.float32)
  seeds = jnp.asarray(rng.integers(0, 2**32, size=5, dtype=np.uint32))
  fn = jax.vmap(lambda s: batching.reduce_metric(center, s, 0.4, 3))
  assert_close(jax.jit(fn)(seeds), virtual_reduce_metric(center, seeds, 0.4, None, 3), 1e-6)
  explicit = jnp.mean(jnp.abs(center + 0.4 * virtual_noise(seeds[1:2], 37, 3)[0]))
  assert_close(jax.jit(batching.reduce_metric, static_argnums=3)(center, seeds[1], 0.4, 3),
               explicit, 1e-6)
  # One population-level call whose seeds are the whole population.
  calls = equations(jax.make_jaxpr(fn)(seeds).jaxpr,
                    lambda e: e.primitive.name == "custom_vmap_call")
  assert [[v.aval.shape for v in e.invars if v.aval.dtype == jnp.uint32] for e in calls] == [
      [(5,)]]
  grid = jax.jit(jax.vmap(jax.vmap(lambda s: batching.reduce_metric(center, s, 0.4, 3))))(
      seeds[:4].reshape(2, 2))
  assert_close(grid.reshape(4), virtual_reduce_metric(center, seeds[:4], 0.4, None, 3), 1e-6)


def test_perturb_and_individual_noise_match_virtual_noise(rng):
  seeds = jnp.asarray(rng.integers(0, 2**32, size=4, dtype=np.uint32))
  value = jnp.asarray(rng.normal(size=(3, 2, 5)), jnp.float32)
  offset = int(rng.integers(0, 2**40))
  noise = virtual_noise(seeds, value.shape, offset, kind="normal")
  assert_close(jax.jit(jax.vmap(lambda s: batching.individual_noise(s, value.shape, offset,
                                                                    kind="normal")))(seeds),
               noise, 0)
  perturbed = jax.jit(jax.vmap(lambda s, g: batching.perturb(value, s, 0.1, offset, sign=g,
                                                             kind="normal")))(
                                                                 seeds, jnp.array([1., -1.] * 2))
  signs = jnp.array([1., -1.] * 2)[:, None, None, None]
  assert_close(perturbed, value + 0.1 * signs * noise, 1e-6)


# ----------------------------------------------------------------------------
# Validation.


def test_validation_errors(rng):
  x, weight, bias, seeds, _ = random_problem(rng)
  with pytest.raises(TypeError, match="seed"):
    batching.perturbed_linear(x, weight, bias, 1.5, 0.1)
  with pytest.raises(ValueError, match="scalar"):
    batching.perturbed_linear(x, weight, bias, seeds, 0.1)
  with pytest.raises(ValueError, match="in_features"):
    batching.perturbed_linear(x[:, :-1], weight, bias, seeds[0], 0.1)
  with pytest.raises(ValueError, match="bias"):
    batching.perturbed_linear(x, weight, bias[:-1], seeds[0], 0.1)
  with pytest.raises(ValueError, match="sigma"):
    batching.perturbed_linear(x, weight, bias, seeds[0], -0.1)
  with pytest.raises(ValueError, match="per_member_x"):
    batching.perturbed_linear_pair(x, weight, bias, seeds[0], 0.1, per_member_x=True)
  assert int(batching.as_seed(np.int64(-1))) == 2**32 - 1


# ----------------------------------------------------------------------------
# The Pallas kernel: exactly one pallas_call (runs once the kernels exist).


def _kernels_available():
  try:
    virtual_perturbed_linear(jnp.ones((1, 4)), jnp.ones((2, 4)), None,
                             jnp.zeros(2, jnp.uint32), 0.1, implementation="interpret")
  except (ImportError, NotImplementedError, AttributeError) as error:
    return False, f"Pallas kernels not available yet: {type(error).__name__}: {error}"
  return True, ""


def pallas_calls(fn, *args):
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  return len(equations(jaxpr, lambda e: e.primitive.name == "pallas_call"))


def test_vmap_is_exactly_one_pallas_call_interpret(rng):
  """Runs the lead's Pallas kernel through the interpreter; skips if it is not there."""
  available, reason = _kernels_available()
  if not available:
    pytest.skip(reason)
  x, weight, bias, seeds, offset = random_problem(rng)
  weight2 = jnp.asarray(rng.normal(size=(3, weight.shape[0])), jnp.float32)
  kw = dict(implementation="interpret")
  layer = lambda s: batching.perturbed_linear(x, weight, bias, s, 0.2, offset, **kw)
  assert pallas_calls(jax.vmap(layer), seeds) == 1
  assert_close(jax.vmap(layer)(seeds),
               virtual_perturbed_linear(x, weight, bias, seeds, 0.2, offset), 1e-5)
  # Two layers (shared x, then per-individual x): one pallas_call each.
  two_layers = lambda s: batching.perturbed_linear(jnp.tanh(layer(s)), weight2, None, s, 0.2,
                                                   offset + 100, **kw)
  assert pallas_calls(jax.vmap(two_layers), seeds) == 2
  hidden = jnp.tanh(virtual_perturbed_linear(x, weight, bias, seeds, 0.2, offset))
  assert_close(jax.vmap(two_layers)(seeds),
               virtual_perturbed_linear(hidden, weight2, None, seeds, 0.2, offset + 100), 1e-5)
  # Nested vmap (rows inside seeds) and vmap of vmap: still one.
  rows = jax.vmap(lambda s: jax.vmap(
      lambda xr: batching.perturbed_linear(xr, weight, bias, s, 0.2, offset, **kw))(x))
  assert pallas_calls(rows, seeds) == 1
  assert pallas_calls(jax.vmap(jax.vmap(layer)), seeds.reshape(2, 3)) == 1
  center = jnp.asarray(rng.normal(size=37), jnp.float32)
  metric = jax.vmap(lambda s: batching.reduce_metric(center, s, 0.4, 3, **kw))
  assert pallas_calls(metric, seeds) == 1
  assert_close(metric(seeds), virtual_reduce_metric(center, seeds, 0.4, None, 3), 1e-5)
