"""Tests of TernaryLinear (flax nnx), ternary_value_and_grad, the ternary optimizer and
the digits example."""

from __future__ import annotations

import importlib.util
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from jaxnoise.nn.ternary import (
    TernaryCodes,
    TernaryLinear,
    TernaryRMS,
    TernaryScale,
    TernaryState,
    get_ternary_params,
    set_ternary_params,
    ternary_value_and_grad,
)
from jaxnoise.ops import ternary as ternary_ops
from jaxnoise.optim.ternary import (
    TernaryCounterState,
    TernaryGrad,
    TernaryParams,
    step_seed,
    ternary_counter,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]


class TwoLayer(nnx.Module):
  def __init__(self, rngs, *, implementation="reference", C=7):
    self.first = TernaryLinear(12, 20, C=C, implementation=implementation, rngs=rngs)
    self.second = TernaryLinear(20, 5, C=C, use_bias=False, implementation=implementation,
                                rngs=rngs)
    self.head = nnx.Linear(5, 3, rngs=rngs)

  def __call__(self, x):
    return self.head(jax.nn.relu(self.second(jax.nn.relu(self.first(x)))))


def loss_fn(model, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def codes_of(packed):
  return np.asarray(ternary_ops.unpack_codes(packed, implementation="reference")).astype(int)


# ----------------------------------------------------------------------------
# TernaryLinear.


def test_ternary_linear_state_is_filterable(rng):
  model = TwoLayer(nnx.Rngs(int(rng.integers(1 << 30))))
  codes = nnx.state(model, TernaryCodes)
  assert set(codes.keys()) == {"first", "second"}
  assert codes["first"]["codes"].get_value().shape == (20, 9)
  assert codes["first"]["codes"].get_value().dtype == jnp.uint8
  assert isinstance(model.first.codes, nnx.Variable)
  scales = nnx.state(model, TernaryScale)
  assert scales["second"]["scale"].get_value().shape == (5,)
  rms = nnx.state(model, TernaryRMS)
  np.testing.assert_array_equal(np.asarray(rms["first"]["rms"].get_value()), np.zeros(20))
  every = jax.tree.leaves(nnx.state(model, TernaryState))
  assert len(every) == 6
  params = nnx.state(model, nnx.Param)
  assert set(params["first"].keys()) == {"bias"} and "second" not in params
  # Ternary state is not an nnx.Param: float optimizers never touch it.
  assert not any(isinstance(v, nnx.Param) for v in jax.tree.leaves(
      nnx.state(model, TernaryState), is_leaf=lambda n: isinstance(n, nnx.Variable)))


@pytest.mark.parametrize("implementation", ["reference", "interpret"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ternary_linear_forward(rng, implementation, dtype):
  layer = TernaryLinear(16, 7, C=5, implementation=implementation,
                        rngs=nnx.Rngs(int(rng.integers(1 << 30))))
  layer.bias.set_value(jnp.asarray(rng.normal(size=7), jnp.float32))
  x = jnp.asarray(rng.normal(size=(2, 3, 16)), dtype)
  y = layer(x)
  assert y.shape == (2, 3, 7) and y.dtype == dtype
  expected = np.asarray(x, np.float32) @ np.asarray(layer.weight()).T + np.asarray(layer.bias[...])
  tolerance = 1e-5 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(np.asarray(y, np.float32), expected, rtol=tolerance,
                             atol=tolerance)
  # The weights are ternary multiples of the row scale.
  weight = np.asarray(layer.weight())
  ratio = weight / np.asarray(layer.scale[...])[:, None]
  assert set(np.unique(ratio)) <= {-1.0, 0.0, 1.0}


def test_ternary_linear_validation():
  with pytest.raises(ValueError, match="in_features must be a multiple of 4"):
    TernaryLinear(10, 3, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="C must be in"):
    TernaryLinear(8, 3, C=12, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="out_features must be positive"):
    TernaryLinear(8, 0, rngs=nnx.Rngs(0))


# ----------------------------------------------------------------------------
# Gradients.


def dense_weight_grads(model, x, y):
  """Autodiff of the same network with the decoded dense weights."""
  weights = {"first": model.first.weight(), "second": model.second.weight()}

  def dense_loss(weights):
    h = jax.nn.relu(x @ weights["first"].T + model.first.bias[...])
    h = jax.nn.relu(h @ weights["second"].T)
    logits = model.head(h)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  return jax.grad(dense_loss)(weights)


def test_value_and_grad_captures_layer_io(rng):
  model = TwoLayer(nnx.Rngs(int(rng.integers(1 << 30))))
  x = jnp.asarray(rng.normal(size=(9, 12)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 3, 9))
  loss, (param_grads, ternary_grads) = ternary_value_and_grad(loss_fn)(model, x, y)
  np.testing.assert_allclose(float(loss), float(loss_fn(model, x, y)), rtol=1e-6)
  expected = dense_weight_grads(model, x, y)
  for key in ("first", "second"):
    grad = ternary_grads[key]
    assert isinstance(grad, TernaryGrad)
    dense = np.asarray(grad.grad_out).T @ np.asarray(grad.x)
    np.testing.assert_allclose(dense, np.asarray(expected[key]), rtol=1e-4, atol=1e-6)
  assert float(jnp.abs(expected["first"]).max()) > 0
  # Float parameters get their ordinary gradients.
  reference_grads = nnx.grad(loss_fn)(model, x, y)
  np.testing.assert_allclose(np.asarray(param_grads["head"]["kernel"][...]),
                             np.asarray(reference_grads["head"]["kernel"][...]), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(param_grads["first"]["bias"][...]),
                             np.asarray(reference_grads["first"]["bias"][...]), rtol=1e-5)


def test_value_and_grad_repeated_and_unused_layers(rng):
  class Shared(nnx.Module):
    def __init__(self, rngs):
      self.layer = TernaryLinear(8, 8, rngs=rngs, implementation="reference")
      self.unused = TernaryLinear(8, 4, rngs=rngs, implementation="reference")

    def __call__(self, x):
      return self.layer(jnp.tanh(self.layer(x)))

  model = Shared(nnx.Rngs(int(rng.integers(1 << 30))))
  x = jnp.asarray(rng.normal(size=(3, 2, 8)), jnp.float32)

  def loss(model, x):
    return jnp.sum(model(x) ** 2), 7

  (value, aux), (_, ternary_grads) = ternary_value_and_grad(loss, has_aux=True)(model, x)
  assert aux == 7 and ternary_grads["unused"] is None
  grad = ternary_grads["layer"]
  assert grad.x.shape == (12, 8) and grad.grad_out.shape == (12, 8)
  weight = model.layer.weight()

  def dense(weight):
    h = jnp.tanh(x @ weight.T + model.layer.bias[...])
    return jnp.sum((h @ weight.T + model.layer.bias[...]) ** 2)

  np.testing.assert_allclose(np.asarray(grad.grad_out.T @ grad.x),
                             np.asarray(jax.grad(dense)(weight)), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(float(value), float(dense(weight)), rtol=1e-6)


# ----------------------------------------------------------------------------
# Optimizer.


def make_params(rng, shapes=((6, 8), (5, 12)), C=4):
  params = {}
  for index, shape in enumerate(shapes):
    packed, scale = ternary_ops.ternary_init(jnp.asarray(rng.normal(size=shape), jnp.float32), C)
    params[f"layer{index}"] = TernaryParams(packed, scale, jnp.zeros(shape[0]), C=C)
  return params


def dense_grads(rng, params):
  return {key: jnp.asarray(rng.normal(size=(p.out_features, p.in_features)), jnp.float32)
          for key, p in params.items()}


def test_optimizer_matches_counter_update(rng):
  params = make_params(rng)
  grads = dense_grads(rng, params)
  optimizer = ternary_counter(0.2, lr_scale=0.01, rms_beta=0.9, seed=11,
                              implementation="reference")
  state = optimizer.init(params)
  assert isinstance(state, TernaryCounterState) and int(state.count) == 0
  new_params, state = jax.jit(optimizer.update)(grads, state, params)
  assert int(state.count) == 1 and int(state.skipped_rows) == 0
  for index, key in enumerate(params):
    p = params[key]
    expected = ternary_ops.counter_update(
        p.packed, p.scale, p.v, grads[key], C=p.C, lr=0.2, lr_scale=0.01, rms_beta=0.9,
        rms_eps=1e-8, seed=step_seed(11, jnp.int32(0), index), implementation="reference",
        donate=False)
    np.testing.assert_array_equal(np.asarray(new_params[key].packed), np.asarray(expected.packed))
    np.testing.assert_array_equal(np.asarray(new_params[key].scale), np.asarray(expected.scale))
    np.testing.assert_array_equal(np.asarray(new_params[key].v), np.asarray(expected.v))
    assert new_params[key].C == p.C


def test_optimizer_seed_changes_every_step(rng):
  params = make_params(rng, shapes=((16, 64),))
  grads = dense_grads(rng, params)
  optimizer = ternary_counter(0.05, implementation="reference")
  state = optimizer.init(params)
  first, _ = optimizer.update(grads, state, params)
  second, _ = optimizer.update(grads, state._replace(count=jnp.int32(1)), params)
  differ = (codes_of(first["layer0"].packed) != codes_of(second["layer0"].packed)).mean()
  assert differ > 0.02, "the step count must change the rounding draws"
  assert step_seed(0, jnp.int32(0), 0) != step_seed(0, jnp.int32(0), 1)


def test_optimizer_io_and_dense_agree(rng):
  params = make_params(rng)
  grads = {key: TernaryGrad(jnp.asarray(rng.normal(size=(7, p.in_features)), jnp.float32),
                            jnp.asarray(rng.normal(size=(7, p.out_features)), jnp.float32))
           for key, p in params.items()}
  outputs = []
  for gradient, implementation in [("dense", "reference"), ("io", "reference"),
                                   ("io", "interpret")]:
    optimizer = ternary_counter(0.3, gradient=gradient, implementation=implementation)
    new_params, _ = optimizer.update(grads, optimizer.init(params), params)
    outputs.append(new_params)
  for other in outputs[1:]:
    for key in params:
      a, b = codes_of(outputs[0][key].packed), codes_of(other[key].packed)
      assert (a != b).sum() <= math.ceil(1e-4 * a.size) and np.abs(a - b).max() <= 1
  with pytest.raises(ValueError, match="gradient must be one of"):
    ternary_counter(0.1, gradient="sparse")


def test_optimizer_none_grads_nonfinite_and_schedule(rng):
  params = make_params(rng)
  grads = dense_grads(rng, params)
  grads["layer0"] = grads["layer0"].at[2, 3].set(jnp.nan)
  grads["layer1"] = None
  optimizer = ternary_counter(optax.linear_schedule(0.3, 0.0, 4), implementation="reference")
  state = optimizer.init(params)
  new_params, state = optimizer.update(grads, state, params)
  assert int(state.skipped_rows) == 1
  np.testing.assert_array_equal(np.asarray(new_params["layer1"].packed),
                                np.asarray(params["layer1"].packed))
  np.testing.assert_array_equal(codes_of(new_params["layer0"].packed)[2],
                                codes_of(params["layer0"].packed)[2])
  # At the end of the schedule lr = 0: with lr_scale = 0 nothing moves.
  frozen = ternary_counter(optax.linear_schedule(0.3, 0.0, 4), lr_scale=0.0,
                           implementation="reference")
  late, _ = frozen.update(dense_grads(rng, params), state._replace(count=jnp.int32(4)), params)
  for key in params:
    np.testing.assert_array_equal(np.asarray(late[key].packed), np.asarray(params[key].packed))
  with pytest.raises(TypeError, match="TernaryParams"):
    optimizer.init({"w": jnp.ones(3)})


def test_checkpoint_resume_is_bit_exact(rng, tmp_path):
  """Two steps, save (NumPy files), restore, two more steps == four steps straight."""
  model = TwoLayer(nnx.Rngs(int(rng.integers(1 << 30))))
  x = jnp.asarray(rng.normal(size=(4, 6, 12)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 3, (4, 6)))
  optimizer = ternary_counter(0.1, seed=int(rng.integers(1 << 30)), implementation="reference")

  def train(model, state, steps):
    for i in steps:
      _, (_, ternary_grads) = ternary_value_and_grad(loss_fn)(model, x[i], y[i])
      params, state = optimizer.update(ternary_grads, state, get_ternary_params(model))
      set_ternary_params(model, params)
    return state

  straight = nnx.clone(model)
  straight_state = train(straight, optimizer.init(get_ternary_params(straight)), range(4))

  resumed = nnx.clone(model)
  state = train(resumed, optimizer.init(get_ternary_params(resumed)), range(2))
  flat, treedef = jax.tree.flatten((nnx.state(resumed), state))
  np.savez(tmp_path / "ckpt.npz", *[np.asarray(leaf) for leaf in flat])
  loaded = np.load(tmp_path / "ckpt.npz")
  restored_state, restored_counter = jax.tree.unflatten(
      treedef, [jnp.asarray(loaded[f"arr_{i}"]) for i in range(len(flat))])
  fresh = TwoLayer(nnx.Rngs(0))
  nnx.update(fresh, restored_state)
  resumed_state = train(fresh, restored_counter, range(2, 4))

  assert int(resumed_state.count) == int(straight_state.count) == 4
  for a, b in zip(jax.tree.leaves(nnx.state(straight)), jax.tree.leaves(nnx.state(fresh))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  moved = codes_of(straight.first.codes[...]) != codes_of(model.first.codes[...])
  assert moved.mean() > 0.01


def test_interpret_kernels_in_a_train_step(rng):
  """The nn layer, the gradient capture and the optimizer run the kernels end to end."""
  seed = int(rng.integers(1 << 30))
  x = jnp.asarray(rng.normal(size=(10, 12)), jnp.float32)
  y = jnp.asarray(rng.integers(0, 3, 10))
  results = []
  for implementation in ("reference", "interpret"):
    model = TwoLayer(nnx.Rngs(seed), implementation=implementation)
    optimizer = ternary_counter(0.2, gradient="io", implementation=implementation)
    loss, (_, ternary_grads) = ternary_value_and_grad(loss_fn)(model, x, y)
    params, _ = optimizer.update(ternary_grads, optimizer.init(get_ternary_params(model)),
                                 get_ternary_params(model))
    results.append((float(loss), params))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5)
  for key in results[0][1]:
    a, b = codes_of(results[0][1][key].packed), codes_of(results[1][1][key].packed)
    assert (a != b).sum() <= math.ceil(1e-4 * a.size)


# ----------------------------------------------------------------------------
# The example.


def load_example():
  spec = importlib.util.spec_from_file_location("ternary_digits",
                                                ROOT / "examples" / "ternary_digits.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_digits_example_matches_float_adam():
  """A shortened run of examples/ternary_digits.py: within 3 points of float32 + Adam."""
  example = load_example()
  data = example.load_data(0)
  steps, batch_size = 300, 64
  float_accuracy = example.train_float(data, steps, batch_size, seed=0)
  ternary_accuracy, bytes_per_weight, skipped = example.train_ternary(data, steps, batch_size,
                                                                      seed=0)
  assert float_accuracy > 0.93
  assert ternary_accuracy >= float_accuracy - 0.03, (ternary_accuracy, float_accuracy)
  n_weights = 64 * 256 + 256 * 256 + 256 * 10
  assert bytes_per_weight == pytest.approx((0.75 * n_weights + 8 * (256 + 256 + 10)) / n_weights)
  assert skipped == 0
