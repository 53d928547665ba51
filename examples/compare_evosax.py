"""jaxnoise ES against evosax's Open_ES on digits and CartPole-v1, same everything else.

Both libraries run OpenES with the same model and initial weights, population,
sigma, antithetic pairs, centered-rank fitness shaping, Adam and number of
generations, and every generation sees the same minibatch (digits) or the same
episodes (CartPole). The differences are the ES machinery itself:

* jaxnoise: the population is never materialised. ``es.evaluate`` runs each
  ``nnx.Linear`` as one fused op that regenerates the noise from the seeds
  (noise kind ``--kind``, unit variance), and ``es.update`` regenerates it
  for the gradient.
* evosax 0.3.2 ``Open_ES``: ``ask`` draws ``(pop, n_params)`` normal noise and
  materialises the population's parameters; the fitness is a ``jax.vmap``
  over them; ``tell`` contracts the fitness with the stored noise.

Measured per task and library:

* the task metric (digits: test accuracy; CartPole: mean return of the
  unperturbed policy over 20 fixed episodes) against generation and against
  wall time (evaluation time excluded);
* the median time per generation (one jitted step, ``block_until_ready``);
* memory: XLA's ``memory_analysis()`` of the compiled generation step,
  arguments + outputs + temporaries (the step's peak footprint as XLA plans
  it; the same method on every backend, so the two libraries are compared
  alike). On CPU the jaxnoise ops run their pure-JAX reference, which
  materialises noise in blocks; the Pallas kernels on a GPU never do.

It writes one figure (``--out``, default ``examples/figures/compare_evosax.png``)
and the numbers beside it (``.json``). The last line printed is
``digits_jaxnoise=<acc> digits_evosax=<acc> cartpole_jaxnoise=<return>
cartpole_evosax=<return> seconds=<s>``.

    python examples/compare_evosax.py            # a few minutes on 2 CPU cores
    python examples/compare_evosax.py --quick --out /tmp/compare.png
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _cli  # pylint: disable=g-import-not-at-top,wrong-import-position
import es_cartpole  # pylint: disable=g-import-not-at-top,wrong-import-position
import es_digits  # pylint: disable=g-import-not-at-top,wrong-import-position

import jaxnoise  # pylint: disable=wrong-import-position

LIBRARIES = ("jaxnoise", "evosax")


def step_memory_bytes(compiled) -> int | None:
  """Arguments + outputs + temporaries of a compiled step (XLA's plan), or None."""
  try:
    analysis = compiled.memory_analysis()
  except Exception:  # pylint: disable=broad-except
    return None
  if analysis is None:
    return None
  return int(analysis.argument_size_in_bytes + analysis.output_size_in_bytes
             + analysis.temp_size_in_bytes - analysis.alias_size_in_bytes)


def jaxnoise_step(es, graphdef, rest, fitness: Callable, batch_fn: Callable):
  """``step(params, state)``: ``fitness(model, *batch_fn(generation))`` for the population."""

  @jax.jit
  def step(params, es_state):
    model = nnx.merge(graphdef, params, rest)
    seeds, es_state = es.ask(es_state)
    values = es.evaluate(model, seeds, fitness, *batch_fn(es_state.generation))
    updates, es_state = es.update(values, es_state, model)
    return optax.apply_updates(params, updates), es_state

  return step


def evosax_step(strategy, strategy_params, graphdef, rest, fitness: Callable,
                batch_fn: Callable, key: jax.Array):
  """The same generation with evosax: ask (materialised population), vmap, tell."""

  @jax.jit
  def step(state):
    generation = state.generation_counter
    ask_key, tell_key = jax.random.split(jax.random.fold_in(key, generation))
    population, state = strategy.ask(ask_key, state, strategy_params)
    batch = batch_fn(generation)
    values = jax.vmap(lambda p: fitness(nnx.merge(graphdef, p, rest), *batch))(population)
    state, _ = strategy.tell(tell_key, population, -values, state, strategy_params)  # minimises
    return state

  return step


def run(library: str, task: dict, args) -> dict:
  """Train one library on one task; the metric curve, times and memory."""
  from evosax.algorithms import Open_ES  # pylint: disable=g-import-not-at-top
  from evosax.core.fitness_shaping import centered_rank_fitness_shaping_fn  # pylint: disable=g-import-not-at-top

  model = task["model"]()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  optimizer = optax.adam(task["lr"])
  if library == "jaxnoise":
    es = jaxnoise.optim.evolution_strategy(
        task["sigma"], optimizer, pop_size=task["pop"], kind=args.kind,
        implementation=args.implementation, seed=args.seed)
    state = (params, es.init(model))
    step = jaxnoise_step(es, graphdef, rest, task["fitness"], task["batch"])
    compiled = step.lower(*state).compile()
    advance = lambda state: compiled(*state)  # noqa: E731
    current_params = lambda state: state[0]  # noqa: E731
  else:
    strategy = Open_ES(task["pop"], params, use_antithetic_sampling=True, optimizer=optimizer,
                       std_schedule=optax.constant_schedule(task["sigma"]),
                       fitness_shaping_fn=centered_rank_fitness_shaping_fn)
    strategy_params = strategy.default_params
    state = strategy.init(jax.random.key(args.seed), params, strategy_params)
    step = evosax_step(strategy, strategy_params, graphdef, rest, task["fitness"],
                       task["batch"], jax.random.key(args.seed + 2))
    compiled = step.lower(state).compile()
    advance = compiled
    current_params = strategy.get_mean

  metric = task["metric"]
  jax.block_until_ready(metric(current_params(state)))  # compile the evaluation
  curve = {"generation": [0], "seconds": [0.0],
           "metric": [float(metric(current_params(state)))]}
  step_seconds = []
  for generation in range(1, task["generations"] + 1):
    start = time.perf_counter()
    state = jax.block_until_ready(advance(state))
    step_seconds.append(time.perf_counter() - start)
    if generation % task["eval_every"] == 0 or generation == task["generations"]:
      curve["generation"].append(generation)
      curve["seconds"].append(float(np.sum(step_seconds)))
      curve["metric"].append(float(metric(current_params(state))))
  return {"curve": curve, "final": curve["metric"][-1],
          "median_step_ms": 1e3 * float(np.median(step_seconds)),
          "step_memory_bytes": step_memory_bytes(compiled),
          "n_params": int(sum(leaf.size for leaf in jax.tree.leaves(params)))}


def digits_task(args) -> dict:
  (x_train, y_train), (x_test, y_test) = es_digits.load_digits_split(args.seed)
  data_key = jax.random.key(args.seed + 1)

  def batch(generation):
    rows = jax.random.choice(jax.random.fold_in(data_key, generation), x_train.shape[0],
                             (256,), replace=False)
    return x_train[rows], y_train[rows]

  evaluate = None

  def metric(params):
    nonlocal evaluate
    if evaluate is None:
      graphdef, _, rest = nnx.split(es_digits.make_model(args.hidden, args.seed), nnx.Param, ...)
      evaluate = es_digits.make_evaluate(graphdef, rest, x_test, y_test)
    return evaluate(params)[0]

  return {"name": "digits", "label": f"digits, MLP 64-{args.hidden}-10", "metric_name":
          "test accuracy", "model": lambda: es_digits.make_model(args.hidden, args.seed),
          "fitness": es_digits.log_likelihood, "batch": batch, "metric": metric,
          "pop": args.digits_pop, "sigma": 0.05, "lr": 0.03,
          "generations": args.digits_generations, "eval_every": max(1,
                                                                    args.digits_generations // 20)}


def cartpole_task(args) -> dict:
  task = es_cartpole.TASKS["cartpole"]
  env, env_params = es_cartpole.make_env(task)
  episode_return = es_cartpole.make_episode_return(env, env_params)
  rollout_key = jax.random.key(args.seed + 3)
  make_model = lambda: es_cartpole.make_policy(env, env_params, 32, args.seed)  # noqa: E731

  def fitness(policy, key):
    return episode_return(policy, key)

  graphdef, _, rest = nnx.split(make_model(), nnx.Param, ...)
  evaluate = es_cartpole.make_evaluate(graphdef, rest, episode_return, 20)
  return {"name": "cartpole", "label": "CartPole-v1, MLP 4-32-2", "metric_name":
          "mean return (20 episodes)", "model": make_model, "fitness": fitness,
          "batch": lambda generation: (jax.random.fold_in(rollout_key, generation),),
          "metric": lambda params: evaluate(params, jax.random.key(12345)),
          "pop": args.cartpole_pop, "sigma": 0.3, "lr": 0.05,
          "generations": args.cartpole_generations, "eval_every": 2}


def plot(results: dict, tasks: list[dict], path: pathlib.Path, subtitle: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  colors = {"jaxnoise": "tab:blue", "evosax": "tab:orange"}
  fig, axes = plt.subplots(len(tasks), 3, figsize=(13, 3.6 * len(tasks)), dpi=100,
                           squeeze=False)
  for row, task in zip(axes, tasks):
    for library in LIBRARIES:
      result = results[task["name"]][library]
      curve = result["curve"]
      row[0].plot(curve["generation"], curve["metric"], color=colors[library], label=library)
      row[1].plot(curve["seconds"], curve["metric"], color=colors[library], label=library)
    row[0].set_xlabel("generation")
    row[1].set_xlabel("training seconds (evaluation excluded)")
    for axis in row[:2]:
      axis.set_ylabel(task["metric_name"])
      axis.set_title(f"{task['label']}, pop {task['pop']}", fontsize=9)
      axis.legend(fontsize=8)
    step_ms = [results[task["name"]][library]["median_step_ms"] for library in LIBRARIES]
    memory = [(results[task["name"]][library]["step_memory_bytes"] or 0) / 2**20
              for library in LIBRARIES]
    positions = np.arange(len(LIBRARIES))
    bars = row[2].bar(positions - 0.2, step_ms, 0.4, color="tab:gray", label="ms / generation")
    row[2].bar_label(bars, fmt="%.1f", fontsize=8)
    memory_axis = row[2].twinx()
    bars = memory_axis.bar(positions + 0.2, memory, 0.4, color="tab:green",
                           label="step memory, MiB")
    memory_axis.bar_label(bars, fmt="%.1f", fontsize=8)
    row[2].set_xticks(positions, LIBRARIES)
    row[2].set_ylabel("median ms per generation")
    memory_axis.set_ylabel("compiled step memory (MiB)", color="tab:green")
    row[2].set_title("time per generation (gray), XLA step memory (green)", fontsize=9)
  fig.suptitle(f"jaxnoise vs evosax Open_ES: same model, population, sigma, Adam, data. "
               f"{subtitle}", fontsize=10)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--out", type=pathlib.Path,
                      default=pathlib.Path(__file__).resolve().parent / "figures" /
                      "compare_evosax.png",
                      help="the figure; the numbers go beside it as .json")
  parser.add_argument("--digits-generations", type=int, default=200, help="digits generations")
  parser.add_argument("--digits-pop", type=int, default=512, help="digits population")
  parser.add_argument("--hidden", type=int, default=64, help="digits MLP hidden units")
  parser.add_argument("--cartpole-generations", type=int, default=30,
                      help="CartPole generations")
  parser.add_argument("--cartpole-pop", type=int, default=256, help="CartPole population")
  parser.add_argument("--seed", type=int, default=0, help="seed of weights, data, noise")
  parser.add_argument("--kind", default=jaxnoise.DEFAULT_KIND, choices=sorted(jaxnoise.KINDS),
                      help="jaxnoise noise kind (evosax draws normal noise)")
  parser.add_argument("--implementation", default="auto",
                      choices=("auto", "pallas", "interpret", "reference"),
                      help="jaxnoise op implementation")
  parser.add_argument("--quick", action="store_true",
                      help="a short smoke run for CI: 20 digits generations with pop 64, 4 "
                           "CartPole generations with pop 32, unless those options are given")
  args = parser.parse_args(argv)
  _cli.apply_quick_defaults(args, argv, {"--digits-generations": 20, "--digits-pop": 64,
                                         "--cartpole-generations": 4, "--cartpole-pop": 32})
  for option in ("digits_pop", "cartpole_pop"):
    value = getattr(args, option)
    if value < 2 or value % 2:
      parser.error(f"--{option.replace('_', '-')} must be even and >= 2, got {value}")
  return args


def main(argv: Sequence[str] | None = None) -> dict:
  args = parse_args(argv)
  start = time.perf_counter()
  tasks = [digits_task(args), cartpole_task(args)]
  results = {}
  print(f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), jax "
        f"{jax.__version__}; jaxnoise kind {args.kind!r}, implementation "
        f"{args.implementation!r}")
  print(f"{'task':<10}{'library':<10}{'params':>8}{'pop':>6}{'gens':>6}{'final metric':>14}"
        f"{'ms/gen':>9}{'step MiB':>10}")
  for task in tasks:
    results[task["name"]] = {}
    for library in LIBRARIES:
      result = run(library, task, args)
      results[task["name"]][library] = result
      memory = result["step_memory_bytes"]
      print(f"{task['name']:<10}{library:<10}{result['n_params']:>8}{task['pop']:>6}"
            f"{task['generations']:>6}{result['final']:>14.4f}{result['median_step_ms']:>9.2f}"
            f"{'n/a' if memory is None else f'{memory / 2**20:.2f}':>10}", flush=True)
  seconds = time.perf_counter() - start

  args.out.parent.mkdir(parents=True, exist_ok=True)
  subtitle = f"{jax.default_backend()}, jax {jax.__version__}"
  plot(results, tasks, args.out, subtitle)
  summary = {"backend": jax.default_backend(), "jax": jax.__version__, "kind": args.kind,
             "settings": {task["name"]: {k: task[k] for k in ("pop", "sigma", "lr",
                                                              "generations")}
                          for task in tasks},
             "memory_method": "compiled.memory_analysis(): argument + output + temp - alias "
                              "bytes of the jitted generation step",
             "results": results}
  args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
  print(f"figure: {args.out}")
  finals = " ".join(f"{task['name']}_{library}={results[task['name']][library]['final']:.4f}"
                    for task in tasks for library in LIBRARIES)
  print(f"{finals} seconds={seconds:.1f}")
  return results


if __name__ == "__main__":
  main()
