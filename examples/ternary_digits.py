"""Ternary counter training on scikit-learn's digits, against a float32 + Adam MLP.

A 64-256-256-10 MLP is trained twice on the same mini-batches:

* float32 weights with Adam (``nnx.Linear``);
* ternary weights stored as packed 6-bit counters (``TernaryLinear``): back-
  propagation gives each layer's input and output gradient, and the counter
  update (RMS-normalised, stochastically rounded, per-row scale) moves the
  counters; only the small float biases use Adam.

It prints both test accuracies and the training-state bytes per weight:
0.75 byte of codes plus the per-row scale and RMS state (8 bytes per row,
amortised over ``in``), against 12 bytes for BitNet-style training (float32
latent weight + Adam's two moments).

Run: ``python examples/ternary_digits.py`` (about half a minute on two CPU
cores; ``--steps`` shortens it). The digits data ships with scikit-learn.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from jaxnoise.nn.ternary import (
    TernaryLinear,
    get_ternary_params,
    set_ternary_params,
    ternary_value_and_grad,
)
from jaxnoise.optim.ternary import ternary_counter

HIDDEN = 256


def load_data(seed: int = 0):
  """Standardised digits, 75/25 stratified split."""
  digits = load_digits()
  x = digits.data.astype(np.float32)
  x_train, x_test, y_train, y_test = train_test_split(
      x, digits.target, test_size=0.25, random_state=seed, stratify=digits.target)
  mean, std = x_train.mean(0), x_train.std(0) + 1.0
  return ((x_train - mean) / std, y_train.astype(np.int32),
          (x_test - mean) / std, y_test.astype(np.int32))


class FloatMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs):
    self.layers = nnx.List([nnx.Linear(64, HIDDEN, rngs=rngs),
                            nnx.Linear(HIDDEN, HIDDEN, rngs=rngs),
                            nnx.Linear(HIDDEN, 10, rngs=rngs)])

  def __call__(self, x):
    for layer in self.layers[:-1]:
      x = jax.nn.relu(layer(x))
    return self.layers[-1](x)


class TernaryMLP(nnx.Module):
  def __init__(self, rngs: nnx.Rngs, C: int, implementation: str = "auto"):
    sizes = [(64, HIDDEN), (HIDDEN, HIDDEN), (HIDDEN, 10)]
    self.layers = nnx.List([
        TernaryLinear(n_in, n_out, C=C, implementation=implementation, rngs=rngs)
        for n_in, n_out in sizes])

  def __call__(self, x):
    for layer in self.layers[:-1]:
      x = jax.nn.relu(layer(x))
    return self.layers[-1](x)


def cross_entropy(model, x, y):
  logits = model(x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def accuracy(model, x, y) -> float:
  return float((jnp.argmax(model(x), -1) == y).mean())


def batch_indices(n_train: int, steps: int, batch_size: int, seed: int) -> np.ndarray:
  """``(steps, batch_size)`` shuffled mini-batch indices (epochs without replacement)."""
  rng = np.random.default_rng(seed)
  epochs = -(-steps * batch_size // n_train)
  order = np.concatenate([rng.permutation(n_train) for _ in range(epochs)])
  return order[:steps * batch_size].reshape(steps, batch_size)


def _scan_training(step_fn, graph_nodes, carry_extra, x_train, y_train, indices):
  """Run ``step_fn(*nodes, extra, x, y) -> extra`` over all batches in one jitted scan."""
  graphdef, state = nnx.split(graph_nodes)

  @jax.jit
  def run(state, extra, x_train, y_train, indices):
    def body(carry, index):
      state, extra = carry
      nodes = nnx.merge(graphdef, state)
      extra = step_fn(*nodes, extra, x_train[index], y_train[index])
      return (nnx.split(nodes)[1], extra), None

    (state, extra), _ = jax.lax.scan(body, (state, extra), indices)
    return state, extra

  state, extra = run(state, carry_extra, jnp.asarray(x_train), jnp.asarray(y_train),
                     jnp.asarray(indices))
  nnx.update(graph_nodes, state)
  return extra


def train_float(data, steps: int, batch_size: int, seed: int, lr: float = 1e-3) -> float:
  """Float32 MLP with Adam; returns the test accuracy."""
  x_train, y_train, x_test, y_test = data
  model = FloatMLP(nnx.Rngs(seed))
  optimizer = nnx.Optimizer(model, optax.adam(lr), wrt=nnx.Param)

  def step(model, optimizer, extra, x, y):
    grads = nnx.grad(cross_entropy)(model, x, y)
    optimizer.update(model, grads)
    return extra

  indices = batch_indices(len(x_train), steps, batch_size, seed)
  _scan_training(step, (model, optimizer), jnp.zeros(()), x_train, y_train, indices)
  return accuracy(model, x_test, y_test)


def train_ternary(data, steps: int, batch_size: int, seed: int, *, C: int = 11, lr: float = 0.02,
                  lr_scale: float = 1e-3, gradient: str = "dense",
                  implementation: str = "auto"):
  """Counter training; returns ``(test accuracy, bytes per weight, skipped rows)``."""
  x_train, y_train, x_test, y_test = data
  model = TernaryMLP(nnx.Rngs(seed), C, implementation)
  bias_optimizer = nnx.Optimizer(model, optax.adam(1e-3), wrt=nnx.Param)
  counter = ternary_counter(optax.cosine_decay_schedule(lr, steps, alpha=0.05),
                            lr_scale=lr_scale, rms_beta=0.99, rms_eps=1e-8, seed=seed,
                            gradient=gradient, implementation=implementation)

  def step(model, bias_optimizer, counter_state, x, y):
    _, (param_grads, ternary_grads) = ternary_value_and_grad(cross_entropy)(model, x, y)
    bias_optimizer.update(model, param_grads)
    params, counter_state = counter.update(ternary_grads, counter_state,
                                           get_ternary_params(model))
    set_ternary_params(model, params)
    return counter_state

  indices = batch_indices(len(x_train), steps, batch_size, seed)
  counter_state = _scan_training(step, (model, bias_optimizer),
                                 counter.init(get_ternary_params(model)), x_train, y_train,
                                 indices)
  n_weights = sum(layer.in_features * layer.out_features for layer in model.layers)
  state_bytes = sum(layer.codes[...].nbytes + layer.scale[...].nbytes + layer.rms[...].nbytes
                    for layer in model.layers)
  return (accuracy(model, x_test, y_test), state_bytes / n_weights,
          int(counter_state.skipped_rows))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--steps", type=int, default=3000,
                      help="training steps of each model (same mini-batches for both)")
  parser.add_argument("--batch-size", type=int, default=64, help="images per mini-batch")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of the data split, the initial weights, the mini-batch order "
                           "and the stochastic rounding")
  parser.add_argument("--C", type=int, default=11,
                      help="counter half-width in 1..11: 2C - 1 counter steps per ternary value "
                           "(11 uses all 63 codes of 6 bits)")
  parser.add_argument("--lr", type=float, default=0.02,
                      help="peak counter learning rate (cosine decay to 5%%)")
  parser.add_argument("--gradient", choices=("dense", "io"), default="dense",
                      help="dense: the update reads the weight gradient; io: the kernel forms "
                           "grad_out^T x itself and the dense gradient never exists")
  args = parser.parse_args(argv)
  data = load_data(args.seed)
  start = time.perf_counter()
  float_accuracy = train_float(data, args.steps, args.batch_size, args.seed)
  float_time = time.perf_counter() - start
  start = time.perf_counter()
  ternary_accuracy, bytes_per_weight, skipped = train_ternary(
      data, args.steps, args.batch_size, args.seed, C=args.C, lr=args.lr,
      gradient=args.gradient)
  ternary_time = time.perf_counter() - start
  print(f"digits, MLP 64-{HIDDEN}-{HIDDEN}-10, {args.steps} steps of batch {args.batch_size}, "
        f"backend {jax.default_backend()}")
  print(f"{'model':<34}{'test acc':>9}{'train-state B/weight':>22}{'time s':>8}")
  print(f"{'float32 + Adam':<34}{float_accuracy:>9.4f}{12.0:>22.3f}{float_time:>8.1f}")
  print(f"{'ternary counters (C=' + str(args.C) + ')':<34}{ternary_accuracy:>9.4f}"
        f"{bytes_per_weight:>22.3f}{ternary_time:>8.1f}")
  print(f"accuracy gap {100 * (float_accuracy - ternary_accuracy):+.2f} points; "
        f"state {12.0 / bytes_per_weight:.1f}x smaller than latent fp32 + Adam "
        f"(12 B/weight: weight 4 + two moments 8); rows skipped for non-finite "
        f"gradients: {skipped}")
  return float_accuracy, ternary_accuracy


if __name__ == "__main__":
  main()
