"""ES quality of every noise kind against evosax's Open_ES, on problems jaxnoise did not write.

Problems (all from other projects; jaxnoise only supplies the noise and the update):

* evosax 0.3.2's BBOB functions (``evosax.problems.BBOBProblem``'s evaluation,
  one problem instance per seed: random optimum, rotations, offset), at
  d=100 and d=1000, started from zeros. Metric: the centre's regret
  ``f(centre) - f_opt`` after the last generation (lower is better).
* gymnax CartPole-v1 and Acrobot-v1 through ``evosax.problems.GymnaxProblem``
  (evosax's MLP policy, observation normalisation). Metric: generations until
  the centre's mean return over 16 episodes reaches the task's threshold
  (CartPole 475, Acrobot -100; lower is better).
* scikit-learn's digits: a 64-32-10 MLP trained on 1500 images with the
  negative cross-entropy of a 256-image minibatch as fitness. Metric: test
  accuracy on the other 297 after the last generation.

Both sides use the same settings: population, antithetic pairs, centred ranks,
sigma, ``optax.adam`` at the same learning rate, the same start point and the
same problem instance per seed. jaxnoise runs
``jaxnoise.optim.evolution_strategy`` (``es.perturb`` + the problem's evaluation +
``es.update``; the digits MLP through ``es.evaluate``, the fused path), evosax
runs ``Open_ES`` (Gaussian noise from ``jax.random.normal``, materialised).

    nice python benchmarks/es_quality.py --out benchmarks/out/es_quality      # full, CPU
    python benchmarks/es_quality.py --quick --out /tmp/esq                     # < 60 s check
    python benchmarks/es_quality.py --ranks 1 4 ...   # also low-rank noise (where supported)

Writes ``<out>/es_quality.json``, ``<out>/es_quality.md`` and ``<out>/es_quality.png``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import statistics
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)

BBOB_FUNCTIONS = ("sphere", "ellipsoidal", "rastrigin", "rosenbrock", "discus",
                  "rastrigin_rotated", "different_powers")
RL_TASKS = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0}
EVOSAX = "evosax"
_RATIO_CAP = 2.5  # the BBOB panel's y limit; larger ratios are printed on their bars


# ----------------------------------------------------------------------------
# Methods: jaxnoise (kind, rank) or evosax Open_ES.


def rank_supported() -> bool:
  return "rank" in inspect.signature(jaxnoise.optim.evolution_strategy).parameters


def method_name(kind: str, rank: int | None) -> str:
  return kind if rank is None else f"{kind} r{rank}"


def make_jaxnoise_es(settings, kind, rank, seed, maximize):
  kwargs = dict(pop_size=settings["pop"], antithetic=True, fitness_shaping="centered_rank",
                maximize=maximize, kind=kind, seed=seed)
  if rank is not None:
    kwargs["rank"] = rank
  return jaxnoise.optim.evolution_strategy(settings["sigma"], optax.adam(settings["lr"]),
                                           **kwargs)


def make_open_es(settings, solution):
  from evosax.algorithms import Open_ES  # pylint: disable=g-import-not-at-top
  return Open_ES(population_size=settings["pop"], solution=solution,
                 use_antithetic_sampling=True, optimizer=optax.adam(settings["lr"]),
                 std_schedule=optax.constant_schedule(settings["sigma"]))


# ----------------------------------------------------------------------------
# BBOB: one compiled run per (function, dimension, method), problem params as arguments.


def bbob_case(fn_name, dim, methods, settings, seeds):
  from evosax.problems import BBOBProblem  # pylint: disable=g-import-not-at-top
  problems = [BBOBProblem(fn_name, dim, seed=seed) for seed in seeds]
  meta = problems[0].meta_problem  # the same evaluation for every instance; params differ
  generations = settings["generations"]
  x0 = jnp.zeros((dim,), jnp.float32)

  def evaluate(solutions, problem_params):
    state = meta.init(jax.random.key(0), problem_params)
    fitness, _, _ = meta.eval(jax.random.key(0), solutions, state, problem_params)
    return fitness  # noiseless: the key is unused

  def regret(centre, problem_params):
    return evaluate(centre[None], problem_params)[0] - problem_params.f_opt

  def jaxnoise_run(kind, rank, seed):
    es = make_jaxnoise_es(settings, kind, rank, seed, maximize=False)

    @jax.jit
    def run(problem_params):
      def step(carry, _):
        params, state = carry
        seeds, state = es.ask(state)
        population = jax.vmap(es.perturb, in_axes=(None, 0, 0))(params, *es.individuals(seeds))
        updates, state = es.update(evaluate(population, problem_params), state, params)
        params = optax.apply_updates(params, updates)
        return (params, state), regret(params, problem_params)
      (_, _), curve = jax.lax.scan(step, (x0, es.init(x0)), None, length=generations)
      return curve
    return run

  def evosax_run(seed):
    algo = make_open_es(settings, x0)

    @jax.jit
    def run(problem_params):
      state = algo.init(jax.random.key(seed), x0, algo.default_params)

      def step(state, key):
        population, state = algo.ask(key, state, algo.default_params)
        fitness = evaluate(population, problem_params)
        state, _ = algo.tell(key, population, fitness, state, algo.default_params)
        return state, regret(state.mean, problem_params)
      _, curve = jax.lax.scan(step, state, jax.random.split(jax.random.key(seed + 1000),
                                                            generations))
      return curve
    return run

  records = []
  for method in methods:
    name = EVOSAX if method == EVOSAX else method_name(*method)
    finals, curves, start = [], [], time.perf_counter()
    try:
      for seed, problem in zip(seeds, problems):
        run = evosax_run(seed) if method == EVOSAX else jaxnoise_run(*method, seed)
        curve = np.asarray(run(problem._params))  # pylint: disable=protected-access
        finals.append(float(curve[-1]))
        curves.append(curve[::max(1, generations // 50)].tolist())
      start_regret = float(regret(x0, problems[0]._params))  # pylint: disable=protected-access
      record = {"task": f"bbob {fn_name} d={dim}", "family": "bbob", "function": fn_name,
                "dim": dim, "method": name, "metric": "centre regret", "values": finals,
                "mean": statistics.fmean(finals), "start_regret_seed0": start_regret,
                "curves": curves}
    except Exception as error:  # pylint: disable=broad-except
      record = {"task": f"bbob {fn_name} d={dim}", "family": "bbob", "method": name,
                "error": f"{type(error).__name__}: {error}"[:500]}
    record["wall_s"] = round(time.perf_counter() - start, 1)
    _print(record)
    records.append(record)
  return records


# ----------------------------------------------------------------------------
# gymnax through evosax's GymnaxProblem.


def rl_case(env_name, threshold, methods, settings, seeds):
  from evosax.problems import GymnaxProblem  # pylint: disable=g-import-not-at-top
  from evosax.problems.networks import MLP  # pylint: disable=g-import-not-at-top
  import gymnax  # pylint: disable=g-import-not-at-top
  env, _ = gymnax.make(env_name)
  policy = MLP(layer_sizes=(16, 16, env.num_actions))
  kw = dict(episode_length=settings.get("episode_length"), use_normalize_obs=True)
  problem = GymnaxProblem(env_name, policy, num_rollouts=1, **kw)
  judge = GymnaxProblem(env_name, policy, num_rollouts=settings["eval_episodes"], **kw)
  max_generations = settings["generations"]

  def centre_return(params, problem_state, key):
    fitness, _, _ = judge.eval(key, jax.tree.map(lambda p: p[None], params), problem_state)
    return fitness[0]

  def init_params(seed):
    key = jax.random.key(seed)
    obs, _ = problem.env.reset(key, problem.env_params)
    return policy.init(key, obs, key)

  def jaxnoise_step_fn(kind, rank, seed):
    es = make_jaxnoise_es(settings, kind, rank, seed, maximize=True)

    @jax.jit
    def step(params, state, problem_state, key):
      key_eval, key_centre = jax.random.split(key)
      seeds, state = es.ask(state)
      population = jax.vmap(es.perturb, in_axes=(None, 0, 0))(params, *es.individuals(seeds))
      fitness, problem_state, _ = problem.eval(key_eval, population, problem_state)
      updates, state = es.update(fitness, state, params)
      params = optax.apply_updates(params, updates)
      return params, state, problem_state, centre_return(params, problem_state, key_centre)
    return es.init, step

  def evosax_step_fn(solution):
    algo = make_open_es(settings, solution)

    @jax.jit
    def step(state, problem_state, key):
      key_ask, key_eval, key_tell, key_centre = jax.random.split(key, 4)
      population, state = algo.ask(key_ask, state, algo.default_params)
      fitness, problem_state, _ = problem.eval(key_eval, population, problem_state)
      state, _ = algo.tell(key_tell, population, -fitness, state, algo.default_params)  # minimises
      mean = algo.get_mean(state)
      return state, problem_state, centre_return(mean, problem_state, key_centre)
    return algo, step

  records = []
  for method in methods:
    name = EVOSAX if method == EVOSAX else method_name(*method)
    solved_at, returns, start = [], [], time.perf_counter()
    try:
      compiled = None
      for seed in seeds:
        params = init_params(seed)
        problem_state = problem.init(jax.random.key(seed))
        key = jax.random.key(seed + 1000)
        if method == EVOSAX:
          if compiled is None:
            compiled = evosax_step_fn(params)
          algo, step = compiled
          state = algo.init(jax.random.key(seed), params, algo.default_params)
        else:
          init, step = jaxnoise_step_fn(*method, seed)  # the seed lives in the ES: one compile each
          state = init(params)
        history, solved = [], None
        for generation in range(1, max_generations + 1):
          key, sub = jax.random.split(key)
          if method == EVOSAX:
            state, problem_state, value = step(state, problem_state, sub)
          else:
            params, state, problem_state, value = step(params, state, problem_state, sub)
          history.append(float(value))
          if history[-1] >= threshold:
            solved = generation
            break
        solved_at.append(solved)
        returns.append(history)
      counted = [g if g is not None else max_generations + 1 for g in solved_at]
      record = {"task": env_name, "family": "rl", "method": name,
                "metric": f"generations to centre return >= {threshold:g}",
                "values": solved_at, "mean": statistics.fmean(counted),
                "unsolved": sum(g is None for g in solved_at), "curves": returns}
    except Exception as error:  # pylint: disable=broad-except
      record = {"task": env_name, "family": "rl", "method": name,
                "error": f"{type(error).__name__}: {error}"[:500]}
    record["wall_s"] = round(time.perf_counter() - start, 1)
    _print(record)
    records.append(record)
  return records


# ----------------------------------------------------------------------------
# Digits (scikit-learn), the nnx model through es.evaluate.


def digits_case(methods, settings, seeds):
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  images, labels = load_digits(return_X_y=True)
  x, y = jnp.asarray(images / 16.0, jnp.float32), jnp.asarray(labels)
  x_train, y_train, x_test, y_test = x[:1500], y[:1500], x[1500:], y[1500:]
  generations = settings["generations"]

  def make_model(seed):
    return nnx.Sequential(nnx.Linear(64, 32, rngs=nnx.Rngs(seed)), nnx.relu,
                          nnx.Linear(32, 10, rngs=nnx.Rngs(seed + 1)))

  def fitness(model, xb, yb):
    return -optax.softmax_cross_entropy_with_integer_labels(model(xb), yb).mean()

  def batch_of(generation, seed):
    return jax.random.choice(jax.random.fold_in(jax.random.key(seed), generation), 1500,
                             (settings["batch"],))

  def accuracy(model):
    return jnp.mean(jnp.argmax(model(x_test), -1) == y_test)

  def jaxnoise_run(kind, rank, seed):
    model = make_model(seed)
    es = make_jaxnoise_es(settings, kind, rank, seed, maximize=True)
    state = es.init(model)

    @nnx.jit
    def step(model, state):
      batch = batch_of(state.generation, seed)
      seeds, state = es.ask(state)
      fitnesses = es.evaluate(model, seeds, fitness, x_train[batch], y_train[batch])
      updates, state = es.update(fitnesses, state, model)
      nnx.update(model, optax.apply_updates(nnx.state(model, nnx.Param), updates))
      return state

    for _ in range(generations):
      state = step(model, state)
    return float(accuracy(model))

  def evosax_run(seed):
    graphdef, params = nnx.split(make_model(seed), nnx.Param)
    algo = make_open_es(settings, params)

    def one(p, xb, yb):
      return -fitness(nnx.merge(graphdef, p), xb, yb)  # evosax minimises

    @jax.jit
    def run(key):
      state = algo.init(jax.random.key(seed), params, algo.default_params)

      def step(state, inputs):
        generation, key = inputs
        batch = batch_of(generation, seed)
        population, state = algo.ask(key, state, algo.default_params)
        losses = jax.vmap(one, in_axes=(0, None, None))(population, x_train[batch],
                                                         y_train[batch])
        state, _ = algo.tell(key, population, losses, state, algo.default_params)
        return state, None
      state, _ = jax.lax.scan(step, state, (jnp.arange(generations),
                                            jax.random.split(key, generations)))
      return accuracy(nnx.merge(graphdef, algo.get_mean(state)))
    return float(run(jax.random.key(seed + 1000)))

  records = []
  for method in methods:
    name = EVOSAX if method == EVOSAX else method_name(*method)
    start = time.perf_counter()
    try:
      values = [evosax_run(s) if method == EVOSAX else jaxnoise_run(*method, s) for s in seeds]
      record = {"task": "digits", "family": "digits", "method": name,
                "metric": "test accuracy", "values": values, "mean": statistics.fmean(values)}
    except Exception as error:  # pylint: disable=broad-except
      record = {"task": "digits", "family": "digits", "method": name,
                "error": f"{type(error).__name__}: {error}"[:500]}
    record["wall_s"] = round(time.perf_counter() - start, 1)
    _print(record)
    records.append(record)
  return records


# ----------------------------------------------------------------------------
# Report.


def _print(record):
  shown = {k: v for k, v in record.items() if k != "curves"}
  print(shown, flush=True)


def _fmt(value):
  if value is None:
    return "-"
  if isinstance(value, float):
    if abs(value) >= 1e4:
      return f"{value:.4g}"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
  return str(value)


def markdown(records, methods) -> str:
  names = [EVOSAX if m == EVOSAX else method_name(*m) for m in methods]
  jaxnoise_names = [n for n in names if n != EVOSAX]
  by_task = {}
  for r in records:
    by_task.setdefault(r["task"], {})[r["method"]] = r
  lines = []
  for family, title, note in (
      ("bbob", "BBOB: centre regret after the last generation (mean over seeds; lower is "
               "better)", "ratio = mean / evosax's mean"),
      ("rl", "gymnax: generations until the centre's mean return reaches the threshold "
             "(per seed; '-' = not within the limit, counted as limit + 1 in the mean)", ""),
      ("digits", "digits: test accuracy (mean over seeds; per seed in brackets)", "")):
    tasks = [t for t, rs in by_task.items() if next(iter(rs.values()))["family"] == family]
    if not tasks:
      continue
    lines += [f"**{title}**", ""]
    header = ["task", *names] + ([f"{n} / evosax" for n in jaxnoise_names]
                                 if family == "bbob" else [])
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for task in tasks:
      row = [task]
      for name in names:
        r = by_task[task].get(name)
        if r is None or "error" in r:
          row.append("error" if r else "")
        elif family == "bbob":
          row.append(_fmt(r["mean"]))
        elif family == "rl":
          row.append(f"{_fmt(r['mean'])} ({', '.join(_fmt(v) for v in r['values'])})")
        else:
          row.append(f"{r['mean']:.3f} ({', '.join(f'{v:.3f}' for v in r['values'])})")
      if family == "bbob":
        base = by_task[task].get(EVOSAX)
        for name in jaxnoise_names:
          r = by_task[task].get(name)
          ok = base and r and "error" not in r and "error" not in base and base["mean"]
          row.append(f"{r['mean'] / base['mean']:.3f}" if ok else "")
      lines.append("| " + " | ".join(row) + " |")
    if note:
      lines += ["", note]
    lines.append("")
  errors = [r for r in records if "error" in r]
  for r in errors:
    lines.append(f"- error: {r['task']} {r['method']}: {r['error']}")
  return "\n".join(lines)


def plot(records, methods, path):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  names = [EVOSAX if m == EVOSAX else method_name(*m) for m in methods]
  jaxnoise_names = [n for n in names if n != EVOSAX]
  ok = [r for r in records if "error" not in r]
  base = {r["task"]: r["mean"] for r in ok if r["method"] == EVOSAX}
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.8), gridspec_kw={"width_ratios": [3, 1.2, 1]})
  bbob_tasks = [t for t in dict.fromkeys(r["task"] for r in ok if r["family"] == "bbob")
                if t in base]
  width = 0.8 / max(1, len(jaxnoise_names))
  for i, name in enumerate(jaxnoise_names):
    ratios = []
    for task in bbob_tasks:
      r = next((r for r in ok if r["task"] == task and r["method"] == name), None)
      ratios.append(r["mean"] / base[task] if r and base[task] else np.nan)
    positions = np.arange(len(bbob_tasks)) + i * width
    axes[0].bar(positions, np.minimum(ratios, _RATIO_CAP), width, label=name)
    for x, ratio in zip(positions, ratios):
      if ratio > _RATIO_CAP:  # clipped: print the value on the bar
        axes[0].text(x, _RATIO_CAP, f"{ratio:.3g}", rotation=90, ha="center", va="top",
                     fontsize=6)
  axes[0].axhline(1.0, color="k", lw=1)
  axes[0].axhline(1.05, color="k", lw=1, ls="--", label="1.05x evosax")
  axes[0].set_xticks(np.arange(len(bbob_tasks)) + 0.4 - width / 2)
  axes[0].set_xticklabels([t.replace("bbob ", "") for t in bbob_tasks], rotation=60,
                          ha="right", fontsize=7)
  axes[0].set_ylabel("centre regret / evosax Open_ES's")
  axes[0].set_title("BBOB (mean over seeds)")
  axes[0].legend(fontsize=7)
  lo = [r["mean"] / base[r["task"]] for r in ok if r["family"] == "bbob" and r["task"] in base
        and base[r["task"]] and r["method"] != EVOSAX]
  if lo:
    axes[0].set_ylim(max(0.0, min(lo) - 0.1), min(max(lo) + 0.1, _RATIO_CAP))
  rl_tasks = list(dict.fromkeys(r["task"] for r in ok if r["family"] == "rl"))
  width = 0.8 / max(1, len(names))
  for i, name in enumerate(names):
    means = [next((r["mean"] for r in ok if r["task"] == t and r["method"] == name), np.nan)
             for t in rl_tasks]
    axes[1].bar(np.arange(len(rl_tasks)) + i * width, means, width, label=name)
  axes[1].set_xticks(np.arange(len(rl_tasks)) + 0.4 - width / 2)
  axes[1].set_xticklabels(rl_tasks, fontsize=8)
  axes[1].set_ylabel("generations to solve (mean)")
  axes[1].set_title("gymnax (lower is better)")
  axes[1].legend(fontsize=7)
  digits = [(n, next((r for r in ok if r["task"] == "digits" and r["method"] == n), None))
            for n in names]
  digits = [(n, r) for n, r in digits if r]
  for i, (name, r) in enumerate(digits):
    axes[2].scatter([i] * len(r["values"]), r["values"], s=12, color="gray")
    axes[2].bar(i, r["mean"], 0.6, alpha=0.6)
  axes[2].set_xticks(range(len(digits)))
  axes[2].set_xticklabels([n for n, _ in digits], rotation=60, ha="right", fontsize=8)
  if digits:
    values = [v for _, r in digits for v in r["values"]]
    axes[2].set_ylim(min(values) - 0.02, min(1.0, max(values) + 0.02))
  axes[2].set_title("digits test accuracy")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def merge(paths, out):
  """Tables and plot of several runs (e.g. one per family) in one report."""
  records, settings = [], []
  for path in paths:
    with open(path) as f:
      payload = json.load(f)
    records += payload["results"]
    settings.append(payload["settings"])
  names = list(dict.fromkeys(r["method"] for r in records))
  methods = [m for m in names if m != EVOSAX] + ([EVOSAX] if EVOSAX in names else [])
  methods = [m if m == EVOSAX else _parse_name(m) for m in methods]
  write_report(records, methods, {"merged_from": paths, "settings": settings}, out)


def _parse_name(name):
  kind, _, rank = name.partition(" r")
  return kind, int(rank) if rank else None


def write_report(records, methods, settings, out):
  os.makedirs(out, exist_ok=True)
  payload = {"facts": _harness.device_facts(), "settings": settings, "results": records}
  _harness.write_json(os.path.join(out, "es_quality.json"), payload)
  table = markdown(records, methods)
  with open(os.path.join(out, "es_quality.md"), "w") as f:
    f.write(table + "\n")
  plot(records, methods, os.path.join(out, "es_quality.png"))
  print(table)


# ----------------------------------------------------------------------------


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--out", default="benchmarks/out/es_quality")
  parser.add_argument("--quick", action="store_true", help="tiny problems, < 60 s on CPU")
  parser.add_argument("--kinds", nargs="*", default=sorted(jaxnoise.KINDS),
                      choices=sorted(jaxnoise.KINDS))
  parser.add_argument("--ranks", nargs="*", type=int, default=[],
                      help="also run these low ranks (digits only: the other problems' "
                           "parameters are vectors or linen trees, which stay full rank)")
  parser.add_argument("--families", nargs="+", default=["bbob", "rl", "digits"],
                      choices=["bbob", "rl", "digits"])
  parser.add_argument("--functions", nargs="+", default=list(BBOB_FUNCTIONS))
  parser.add_argument("--dims", nargs="+", type=int, default=[100, 1000])
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--rl-seeds", type=int, default=4)
  parser.add_argument("--rl-tasks", nargs="+", default=list(RL_TASKS), choices=list(RL_TASKS))
  parser.add_argument("--no-evosax", action="store_true")
  parser.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                      help="only re-render tables and plot from earlier runs' JSON files")
  args = parser.parse_args()
  if args.merge:
    merge(args.merge, args.out)
    return

  bbob = dict(pop=256, sigma=0.1, lr=0.05, generations=300)
  rl = dict(pop=256, sigma=0.1, lr=0.05, generations=150, eval_episodes=16)
  digits = dict(pop=256, sigma=0.05, lr=0.03, generations=300, batch=256)
  functions, dims = args.functions, args.dims
  seeds, rl_seeds = list(range(args.seeds)), list(range(args.rl_seeds))
  if args.quick:
    bbob.update(pop=32, generations=20)
    rl.update(pop=16, generations=2, eval_episodes=2, episode_length=20)
    digits.update(pop=16, generations=3, batch=64)
    functions, dims, seeds, rl_seeds = ["sphere"], [20], [0], [0]
    args.rl_tasks = ["CartPole-v1"]

  methods = [(kind, None) for kind in args.kinds]
  ranked = []
  if args.ranks:
    if rank_supported():
      ranked = [(kind, r) for r in args.ranks for kind in args.kinds]
    else:
      print("[skip] --ranks: jaxnoise.optim.evolution_strategy takes no rank= yet", flush=True)
  if not args.no_evosax:
    methods.append(EVOSAX)

  records = []
  if "bbob" in args.families:
    for dim in dims:
      for fn_name in functions:
        records += bbob_case(fn_name, dim, methods, bbob, seeds)
  if "rl" in args.families:
    for env_name in args.rl_tasks:
      records += rl_case(env_name, RL_TASKS[env_name], methods, rl, rl_seeds)
  if "digits" in args.families:
    records += digits_case(methods + ranked, digits, seeds)
  all_methods = methods + ranked

  settings = {"bbob": bbob, "rl": rl, "digits": digits, "seeds": seeds, "rl_seeds": rl_seeds,
              "quick": args.quick, "rank_supported": rank_supported()}
  write_report(records, all_methods, settings, args.out)


if __name__ == "__main__":
  main()
