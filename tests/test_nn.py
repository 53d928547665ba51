"""VirtualLinear, population evaluation of nnx models, and the matching ES gradient."""

import functools

import jax
from jaxpr_walk import equations
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxnoise.nn.linear import VirtualLinear
from jaxnoise.nn.population import (fitness_gradient, parameter_layout, perturb_params,
                                    population_apply)
from jaxnoise.noise import DEFAULT_KIND, virtual_noise
from jaxnoise.ops.virtual_noise.api import virtual_perturbed_linear

HIGHEST = jax.lax.Precision.HIGHEST
SIGMA = 0.1


def assert_close(actual, expected, tol=1e-5):
  np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=tol, atol=tol)


def linear_op_inputs(fn, *args):
  """x shape of every virtual_perturbed_linear call in ``fn``'s jaxpr."""
  jaxpr = jax.make_jaxpr(fn)(*args).jaxpr
  calls = equations(jaxpr, lambda e: e.primitive.name == "custom_vjp_call" and
                    "_perturbed_linear_bwd" in str(e.params.get("bwd")))
  return [e.invars[0].aval.shape for e in calls]


def random_seeds(rng, pop, antithetic=False):
  seeds = jnp.asarray(rng.integers(0, 2**32, size=pop, dtype=np.uint32))
  return jnp.repeat(seeds[::2], 2) if antithetic else seeds


def signs_of(pop, antithetic):
  return [(-1.0 if antithetic and i % 2 else 1.0) for i in range(pop)]


class Net(nnx.Module):
  """Every kind of leaf: embedding, linears (with and without bias), LayerNorm, a free
  Param, an integer Param (never perturbed)."""

  def __init__(self, rngs):
    self.embed = nnx.Embed(10, 5, rngs=rngs)
    self.inp = nnx.Linear(5, 7, rngs=rngs)
    self.norm = nnx.LayerNorm(7, rngs=rngs)
    self.hidden = VirtualLinear(7, 6, bias_init=nnx.initializers.normal(1.0), rngs=rngs)
    self.out = nnx.Linear(6, 3, use_bias=False, rngs=rngs)
    self.scale = nnx.Param(jnp.linspace(0.5, 1.5, 3))
    self.steps = nnx.Param(jnp.arange(3, dtype=jnp.int32))

  def __call__(self, tokens):
    h = jnp.tanh(self.norm(self.inp(self.embed(tokens))))
    h = jax.nn.relu(self.hidden(h))
    return self.out(h) * self.scale[...] + self.steps[...]


@functools.lru_cache(maxsize=None)
def net():
  """One Net per test session (tests never mutate it; inputs and seeds are fresh)."""
  return Net(nnx.Rngs(0))


# The documented order: sorted paths; a linear's bias right after its (out, in) kernel.
NET_BLOCKS = {  # path: (offset, noise shape, transposed)
    ("embed", "embedding"): (0, (10, 5), False),
    ("hidden", "kernel"): (50, (6, 7), True),
    ("hidden", "bias"): (92, (6,), False),
    ("inp", "kernel"): (98, (7, 5), True),
    ("inp", "bias"): (133, (7,), False),
    ("norm", "bias"): (140, (7,), False),
    ("norm", "scale"): (147, (7,), False),
    ("out", "kernel"): (154, (3, 6), True),
    ("scale",): (172, (3,), False),
}


def _get(tree, path):
  for key in path:
    tree = tree[key]
  return tree


@functools.partial(jax.jit, static_argnames=("kind",))
def explicit_perturbation(seed, sign, kind=DEFAULT_KIND):
  """{path: sigma * sign * noise} for Net, built from the documented offsets by hand."""
  result = {}
  for path, (offset, shape, transposed) in NET_BLOCKS.items():
    noise = virtual_noise(jnp.atleast_1d(seed), shape, offset, kind=kind)[0]
    result[path] = SIGMA * sign * (noise.T if transposed else noise)
  return result


def explicit_population(model, seeds, signs, fn, kind=DEFAULT_KIND):
  """A Python loop over individuals: perturb every leaf by hand, call the plain model."""
  graphdef, state = nnx.split(model)

  @jax.jit
  def one_individual(state, seed, sign):
    perturbed = jax.tree.map(lambda v: v, state)
    for path, delta in explicit_perturbation(seed, sign, kind).items():
      _get(perturbed, path)[...] = _get(state, path)[...] + delta
    return fn(nnx.merge(graphdef, perturbed))

  return jnp.stack([one_individual(state, seed, jnp.float32(sign))
                    for seed, sign in zip(seeds, signs)])


def apply_jit(model, seeds, fn, *args, **kwargs):
  """population_apply under jit (eager vmapped code is slow on CPU)."""
  return jax.jit(lambda s, *a: population_apply(model, s, SIGMA, fn, *a, **kwargs))(seeds, *args)


# ----------------------------------------------------------------------------
# VirtualLinear.


def test_virtual_linear_is_a_drop_in_nnx_linear(rng):
  layer = VirtualLinear(6, 4, rngs=nnx.Rngs(3))
  plain = nnx.Linear(6, 4, rngs=nnx.Rngs(3))
  assert isinstance(layer, nnx.Linear)
  assert layer.kernel.shape == (6, 4) and layer.bias.shape == (4,)
  x = jnp.asarray(rng.normal(size=(2, 3, 6)), jnp.float32)
  np.testing.assert_array_equal(layer(x), plain(x))
  no_bias = VirtualLinear(6, 4, use_bias=False, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  assert no_bias.bias is None and no_bias.kernel.dtype == jnp.bfloat16
  assert jax.jit(lambda m, x: m(x))(no_bias, x).shape == (2, 3, 4)


def _explicit_layer(x, kernel, bias, seeds, sigma, offset):
  in_features, out_features = kernel.shape
  noise = virtual_noise(seeds, (out_features, in_features), offset)
  bias_noise = virtual_noise(seeds, (out_features,), offset + in_features * out_features)
  kernels = kernel[None] + sigma * jnp.swapaxes(noise, 1, 2)
  return jnp.einsum("...k,pko->p...o", x, kernels, precision=HIGHEST) + \
      (bias + sigma * bias_noise)[:, None]


def test_virtual_linear_population_and_grad_match_materialised_math(rng):
  layer = VirtualLinear(5, 4, bias_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(1))
  x = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  seeds = random_seeds(rng, 6)
  offset = int(rng.integers(0, 1000))
  out = jax.jit(lambda x: layer.population(x, seeds, 0.2, offset))(x)
  assert_close(out, _explicit_layer(x, layer.kernel[...], layer.bias[...], seeds, 0.2, offset))
  individuals = jax.jit(jax.vmap(lambda s: layer.individual(x, s, 0.2, offset)))(seeds)
  assert_close(individuals, out)

  graphdef, state = nnx.split(layer)

  def loss(state, x):
    return jnp.sum(jnp.sin(nnx.merge(graphdef, state).population(x, seeds, 0.2, offset)))

  def individual_loss(state, x):
    member = nnx.merge(graphdef, state)
    return jnp.sum(jnp.sin(jax.vmap(lambda s: member.individual(x, s, 0.2, offset))(seeds)))

  def explicit_loss(kernel, bias, x):
    return jnp.sum(jnp.sin(_explicit_layer(x, kernel, bias, seeds, 0.2, offset)))

  expected = jax.grad(explicit_loss, argnums=(0, 1, 2))(layer.kernel[...], layer.bias[...], x)
  for fn in (loss, individual_loss):
    grad_state, grad_x = jax.jit(jax.grad(fn, argnums=(0, 1)))(state, x)
    for got, want in zip((grad_state["kernel"][...], grad_state["bias"][...], grad_x), expected):
      assert_close(got, want, 1e-4)


# ----------------------------------------------------------------------------
# Layout.


def test_parameter_layout_follows_the_documented_order():
  model = net()
  layout = parameter_layout(model)
  for path, (offset, shape, transposed) in NET_BLOCKS.items():
    assert layout.offset(path) == offset, path
    block = [b for b in layout.blocks if b.path == path][0]
    assert block.noise_shape == shape and block.transposed == transposed
  assert layout.size == 175
  steps = [b for b in layout.blocks if b.path == ("steps",)][0]
  assert steps.offset is None  # integer leaves are never perturbed
  assert {l.module_path for l in layout.linears if l.fusable} == {("hidden",), ("inp",),
                                                                  ("out",)}
  assert "hidden/kernel" in str(layout) and layout.offset("inp/bias") == 133
  with pytest.raises(KeyError, match="no parameter"):
    layout.offset("nope")


def test_plain_pytree_layout_is_sorted_row_major():
  params = {"w": jnp.zeros((3, 4)), "b": jnp.zeros(3), "conv": jnp.zeros((2, 3, 4)),
            "layers": [jnp.zeros(2)] * 11, "s": jnp.zeros(())}
  layout = parameter_layout(params)
  assert layout.offset("b") == 0 and layout.offset("conv") == 3
  # Sequence indices sort numerically (2 before 10).
  assert layout.offset(("layers", 2)) == 27 + 4 and layout.offset(("layers", 10)) == 27 + 20
  assert layout.offset("s") == 27 + 22 and layout.offset("w") == 27 + 23
  assert not any(b.transposed for b in layout.blocks)


# ----------------------------------------------------------------------------
# Population evaluation.


@pytest.mark.parametrize("kind, antithetic", [("uniform", False), ("normal", True)])
def test_population_apply_equals_explicit_loop(rng, antithetic, kind):
  model = net()
  tokens = jnp.asarray(rng.integers(0, 10, size=4))
  seeds = random_seeds(rng, 6, antithetic)
  out = apply_jit(model, seeds, lambda m, t: m(t), tokens, kind=kind, antithetic=antithetic)
  expected = explicit_population(model, seeds, signs_of(6, antithetic), lambda m: m(tokens),
                                 kind)
  assert out.shape == (6, 4, 3)
  assert_close(out, expected, 2e-5)
  unfused = apply_jit(model, seeds, lambda m, t: m(t), tokens, kind=kind,
                      antithetic=antithetic, fuse_linear=False)
  assert_close(unfused, expected, 2e-5)


@functools.lru_cache(maxsize=None)
def mlp(seed=0):
  return nnx.Sequential(nnx.Linear(5, 8, rngs=nnx.Rngs(seed)), nnx.relu,
                        VirtualLinear(8, 8, rngs=nnx.Rngs(seed + 1)), nnx.relu,
                        nnx.Linear(8, 3, rngs=nnx.Rngs(seed + 2)))


@pytest.mark.parametrize("antithetic", [False, True])
def test_population_apply_is_one_op_call_per_linear(rng, antithetic):
  model = mlp()
  x = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
  seeds = random_seeds(rng, 6, antithetic)
  fn = lambda s: population_apply(model, s, SIGMA, lambda m: m(x), antithetic=antithetic)
  # The first layer reads the shared input once; later layers take per-individual input.
  assert linear_op_inputs(fn, seeds) == [(4, 5), (6, 4, 8), (6, 4, 8)]
  expected = apply_jit(model, seeds, lambda m: m(x), antithetic=antithetic, fuse_linear=False)
  assert_close(jax.jit(fn)(seeds), expected, 1e-5)


@pytest.mark.parametrize("antithetic", [False, True])
def test_grad_through_population_apply_matches_unfused(rng, antithetic):
  """Backprop through the fused population (custom_vjp around the custom_vmap)."""
  model = mlp()
  graphdef, state = nnx.split(model)
  x = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  seeds = random_seeds(rng, 4, antithetic)

  def loss(state, x, fuse_linear):
    out = population_apply(nnx.merge(graphdef, state), seeds, SIGMA, lambda m: m(x),
                           antithetic=antithetic, fuse_linear=fuse_linear)
    return jnp.sum(jnp.sin(out))

  grad = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
  for got, want in zip(jax.tree.leaves(grad(state, x, True)),
                       jax.tree.leaves(grad(state, x, False))):
    assert_close(got, want, 1e-4)


def test_population_apply_survives_split_merge_inside_fn(rng):
  """Fusion marks live in the graphdef: nnx.remat / nnx.jit inside fn keep the noise."""
  model = mlp()
  x = jnp.asarray(rng.normal(size=(2, 5)), jnp.float32)
  seeds = random_seeds(rng, 4)

  def with_remat(m):
    return nnx.remat(lambda module, x: module(x))(m, x)

  expected = apply_jit(model, seeds, lambda m: m(x), fuse_linear=False)
  assert_close(apply_jit(model, seeds, with_remat), expected, 1e-5)
  jitted = nnx.jit(lambda m: population_apply(m, seeds, SIGMA, with_remat))
  assert_close(jitted(model), expected, 1e-5)
  # The model itself is untouched (plain nnx.Linear, no fusion mark).
  assert type(model.layers[0]) is nnx.Linear  # pylint: disable=unidiomatic-typecheck
  assert not hasattr(model.layers[0], "_jaxnoise_fused_key")


def test_linear_subclass_with_its_own_call_is_perturbed_in_plain_jax(rng):
  class Doubled(nnx.Linear):

    def __call__(self, x):
      return 2.0 * super().__call__(x)

  model = nnx.Sequential(Doubled(4, 3, rngs=nnx.Rngs(0)))
  layout = parameter_layout(model)
  assert not layout.linears[0].fusable and layout.blocks[1].transposed
  x = jnp.asarray(rng.normal(size=(2, 4)), jnp.float32)
  seeds = random_seeds(rng, 3)
  out = apply_jit(model, seeds, lambda m: m(x))
  kernel, bias = model.layers[0].kernel[...], model.layers[0].bias[...]
  expected = 2.0 * _explicit_layer(x, kernel, bias, seeds, SIGMA, 0)
  assert_close(out, expected, 1e-5)


def test_population_apply_validation(rng):
  model = mlp()
  with pytest.raises(TypeError, match="nnx.Module"):
    population_apply({"w": jnp.zeros(3)}, jnp.arange(2), SIGMA, lambda m: m)
  with pytest.raises(ValueError, match="even"):
    population_apply(model, jnp.arange(3), SIGMA, lambda m: m(jnp.ones((1, 5))),
                     antithetic=True)
  with pytest.raises(TypeError, match="seeds"):
    population_apply(model, jnp.ones(4), SIGMA, lambda m: m(jnp.ones((1, 5))))
  with pytest.raises(ValueError, match="does not match the layout"):
    fitness_gradient({"w": jnp.zeros((2, 2))}, jnp.ones(2), jnp.arange(2), SIGMA,
                     layout=parameter_layout({"w": jnp.zeros((2, 3))}))


# ----------------------------------------------------------------------------
# Gradient, consistent with the evaluation.


@pytest.mark.parametrize("antithetic", [False, True])
def test_one_hot_fitness_gradient_recovers_the_evaluated_perturbation(rng, antithetic):
  model = net()
  pop = 6
  seeds = random_seeds(rng, pop, antithetic)
  individual = int(rng.integers(0, pop // 2)) * 2  # a "+" member when antithetic
  fitness = jnp.zeros(pop).at[individual].set(1.0)
  grad = nnx.jit(lambda m, f, s: fitness_gradient(m, f, s, SIGMA, antithetic=antithetic))(
      model, fitness, seeds)
  # grad = s_i noise_i / (pop * sigma), so pop * sigma**2 * grad is the perturbation.
  expected = explicit_perturbation(seeds[individual], jnp.float32(1.0))
  for path, delta in expected.items():
    assert_close(pop * SIGMA**2 * _get(grad, path)[...], delta, 1e-6)
  np.testing.assert_array_equal(_get(grad, ("steps",))[...], 0)
  # ...and it is the perturbation population_apply evaluated (state seen by fn, unfused).
  states = apply_jit(model, seeds, lambda m: nnx.state(m, nnx.Param), antithetic=antithetic,
                     fuse_linear=False)
  params = nnx.state(model, nnx.Param)
  for path in NET_BLOCKS:
    assert_close(_get(states, path)[...][individual] - _get(params, path)[...],
                 pop * SIGMA**2 * _get(grad, path)[...], 1e-6)


def test_fitness_gradient_matches_materialised_estimate(rng):
  model = net()
  pop = 8
  seeds = random_seeds(rng, pop, antithetic=True)
  fitness = jnp.asarray(rng.normal(size=pop), jnp.float32)
  grad = nnx.jit(lambda m, f, s: fitness_gradient(m, f, s, SIGMA, antithetic=True))(
      model, fitness, seeds)
  perturbations = [explicit_perturbation(s, jnp.float32(g))
                   for s, g in zip(seeds, signs_of(pop, True))]
  for path in NET_BLOCKS:
    estimate = sum(f * p[path] for f, p in zip(fitness, perturbations)) / (pop * SIGMA**2)
    assert_close(_get(grad, path)[...], estimate, 1e-5)


def test_plain_pytree_gradient_recovers_perturb_params(rng):
  params = {"w": jnp.asarray(rng.normal(size=(3, 4)), jnp.float32),
            "b": jnp.zeros(3, jnp.bfloat16), "conv": jnp.ones((2, 3, 4)), "s": jnp.float32(2.0),
            "count": jnp.int32(4)}
  seeds = random_seeds(rng, 4)
  fitness = jnp.zeros(4).at[1].set(1.0)
  grad = jax.jit(lambda p, f, s: fitness_gradient(p, f, s, SIGMA))(params, fitness, seeds)
  perturbed = jax.jit(lambda p, s: perturb_params(p, s, SIGMA))(params, seeds[1])
  assert grad["b"].dtype == jnp.bfloat16 and grad["count"].dtype == jnp.int32
  for name in ("w", "conv", "s"):
    assert_close(4 * SIGMA**2 * grad[name], perturbed[name] - params[name], 1e-6)
  assert_close(4 * SIGMA**2 * grad["b"].astype(jnp.float32),
               perturbed["b"].astype(jnp.float32), 2e-2)
  assert int(perturbed["count"]) == 4


def test_bfloat16_model(rng):
  model = nnx.Sequential(nnx.Linear(4, 6, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)),
                         nnx.LayerNorm(6, param_dtype=jnp.bfloat16, rngs=nnx.Rngs(0)))
  x = jnp.asarray(rng.normal(size=(3, 4)), jnp.bfloat16)
  seeds = random_seeds(rng, 4)
  out = apply_jit(model, seeds, lambda m: m(x))
  expected = apply_jit(model, seeds, lambda m: m(x), fuse_linear=False)
  assert out.dtype == jnp.bfloat16
  assert_close(out.astype(jnp.float32), expected.astype(jnp.float32), 5e-2)
  grad = nnx.jit(lambda m, s: fitness_gradient(m, jnp.ones(4), s, SIGMA))(model, seeds)
  assert jax.tree.leaves(grad)[0].dtype == jnp.bfloat16


# ----------------------------------------------------------------------------
# With the Pallas kernel (interpret mode; skips until the kernels exist).


def test_population_apply_with_pallas_interpret(rng):
  try:
    virtual_perturbed_linear(jnp.ones((1, 4)), jnp.ones((2, 4)), None, jnp.zeros(2, jnp.uint32),
                             0.1, implementation="interpret")
  except (ImportError, NotImplementedError, AttributeError) as error:
    pytest.skip(f"Pallas kernels not available yet: {error}")
  model = mlp()
  x = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  seeds = random_seeds(rng, 4, antithetic=True)
  fn = lambda s: population_apply(model, s, SIGMA, lambda m: m(x), antithetic=True,
                                  implementation="interpret")
  jaxpr = jax.make_jaxpr(fn)(seeds).jaxpr
  assert len(equations(jaxpr, lambda e: e.primitive.name == "pallas_call")) == 3
  expected = apply_jit(model, seeds, lambda m: m(x), antithetic=True,
                       implementation="reference")
  assert_close(jax.jit(fn)(seeds), expected, 1e-4)
  fitness = jnp.asarray(rng.normal(size=4), jnp.float32)
  grads = [nnx.jit(lambda m, f, s, impl=impl: fitness_gradient(
      m, f, s, SIGMA, antithetic=True, implementation=impl))(model, fitness, seeds)
           for impl in ("interpret", "reference")]
  for got, want in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    assert_close(got, want, 1e-4)
