"""End-to-end ES step: a population evaluating an nnx MLP, the estimate, the update.

SPEC section 5's end-to-end target is population 65,536 of a 1M-parameter
MLP on one GPU. The step is, all under one ``nnx.jit``:

* ``ask``: the generation's seeds;
* the fused population forward, with shared x for layer 1 and per-individual x after;
* the fitness (negative cross-entropy on a minibatch);
* ``fitness_gradient``, which regenerates the noise per layer;
* an Adam update.

Beside it, an OpenES step written the evosax way materialises the
``(pop, n_params)`` noise; it runs only where that fits (``--materialised-limit-gb``).

    python benchmarks/bench_es_step.py --out benchmarks/out          # GPU
    python benchmarks/bench_es_step.py --quick                       # CPU check

Writes ``<out>/es_step.json``.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys

import jax
from jax.flatten_util import ravel_pytree
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402


def make_model(sizes, seed=0):
  layers = []
  for index, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
    layers.append(nnx.Linear(n_in, n_out, rngs=nnx.Rngs(seed + index)))
    if index < len(sizes) - 2:
      layers.append(nnx.relu)
  return nnx.Sequential(*layers)


def fitness_fn(model, x, y):
  return -optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def virtual_step_case(sizes, pop, batch, antithetic):
  model = make_model(sizes)
  n_params = sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
  es = jaxnoise.optim.evolution_strategy(sigma=0.02, optimizer=optax.adam(1e-3), pop_size=pop,
                                         antithetic=antithetic)
  state = es.init(model)
  x = jax.random.normal(jax.random.key(1), (batch, sizes[0]), jnp.float32)
  y = jax.random.randint(jax.random.key(2), (batch,), 0, sizes[-1])

  @nnx.jit
  def step(model, state, x, y):
    seeds, state = es.ask(state)
    fitness = es.evaluate(model, seeds, fitness_fn, x, y)
    updates, state = es.update(fitness, state, model)
    nnx.update(model, optax.apply_updates(nnx.state(model, nnx.Param), updates))
    return state, fitness.mean()

  def run(state):
    return step(model, state, x, y)

  seconds = _harness.median_time(lambda: run(state), repeats=10, inner=1)
  return {"pop": pop, "n_params": n_params, "batch": batch, "antithetic": antithetic,
          "step_ms": 1e3 * seconds,
          "individual_evaluations_per_s": pop / seconds,
          "noise_values_per_s": pop * n_params / seconds}


def materialised_step_case(sizes, pop, batch, limit_gb):
  """OpenES as evosax writes it: ``(pop, n_params)`` noise in memory."""
  model = make_model(sizes)
  graphdef, params = nnx.split(model, nnx.Param)
  flat, unravel = ravel_pytree(params)
  n_params = flat.shape[0]
  if pop * n_params * 4 > limit_gb * (1 << 30):
    return {"pop": pop, "n_params": n_params,
            "skipped": f"(pop, n_params) float32 noise needs {pop * n_params * 4 / 2**30:.0f} GiB"}
  optimizer = optax.adam(1e-3)
  opt_state = optimizer.init(flat)
  x = jax.random.normal(jax.random.key(1), (batch, sizes[0]), jnp.float32)
  y = jax.random.randint(jax.random.key(2), (batch,), 0, sizes[-1])

  @jax.jit
  def step(flat, opt_state, key):
    noise = jax.random.normal(key, (pop, n_params), jnp.float32)
    population = flat[None] + 0.02 * noise

    def evaluate(vector):
      return fitness_fn(nnx.merge(graphdef, unravel(vector)), x, y)

    fitness = jax.vmap(evaluate)(population)
    shaped = jaxnoise.optim.centered_rank(fitness)
    grad = -(noise.T @ shaped) / (pop * 0.02)
    updates, opt_state = optimizer.update(grad, opt_state, flat)
    return optax.apply_updates(flat, updates), opt_state

  seconds = _harness.median_time(step, flat, opt_state, jax.random.key(3), repeats=10, inner=1)
  return {"pop": pop, "n_params": n_params, "batch": batch, "step_ms": 1e3 * seconds,
          "individual_evaluations_per_s": pop / seconds}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny sizes (CPU)")
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--budget", type=float, default=300.0)
  parser.add_argument("--materialised-limit-gb", type=float, default=64.0)
  args = parser.parse_args(argv)
  if args.quick:
    sizes, pops, batch = (64, 32, 10), (64, 256), 16
  else:
    sizes, pops, batch = (784, 1024, 256, 10), (4096, 16384, 65536), 32  # 1.07M parameters
  budget = _harness.Budget(args.budget)
  results = []
  facts = _harness.device_facts()
  print(facts, flush=True)
  for pop in pops:
    for antithetic in (False, True):
      _harness.run_case(results, f"virtual ES step pop={pop} anti={antithetic}",
                        functools.partial(virtual_step_case, sizes, pop, batch, antithetic),
                        budget)
    _harness.run_case(results, f"materialised OpenES step pop={pop}",
                      functools.partial(materialised_step_case, sizes, pop, batch,
                                        args.materialised_limit_gb), budget)
  _harness.write_json(os.path.join(args.out, "es_step.json"), {"facts": facts,
                                                                "results": results})
  print(_harness.table(results, ["case", "step_ms", "individual_evaluations_per_s",
                                 "noise_values_per_s", "skipped", "error"]))


if __name__ == "__main__":
  main()
