"""Train an MLP on scikit-learn's digits with evolution strategies and virtual noise.

No backprop: each generation evaluates a population of perturbed networks
``W + sigma * N_i`` and moves the weights along the fitness-weighted noise
(OpenES: antithetic pairs, centered-rank fitness shaping, Adam). The noise
``N_i`` is never stored: :meth:`EvolutionStrategy.evaluate` runs every
``nnx.Linear`` of the population as one fused op that regenerates it from
``(seed_i, element index)``, and :meth:`EvolutionStrategy.update` regenerates
the same noise for the gradient estimate. On a CPU the ops run their pure-JAX
reference; on a GPU, the Pallas kernels.

The digits dataset (1797 8x8 images) ships inside scikit-learn: no download.

A run keeps its state in ``--out`` (default ``runs/es_digits``):

* ``checkpoints/``: orbax checkpoints of the model parameters, the ES state
  (a NamedTuple of arrays) and the history. Running again with the same
  ``--out`` resumes from the last one (``resumed at generation N``) and ends
  bit for bit where an uninterrupted run ends: everything random in a
  generation derives from ``(--seed, generation)``.
* ``curve.png``: test accuracy and loss against generation.

The last line printed is ``test_accuracy=<v> generations=<n> seconds=<s>``;
``seconds`` is this invocation's training time, after compilation (the
compile time is printed before the progress bar starts).

    python examples/es_digits.py                  # ~0.96 test accuracy, < 1 min on 2 cores
    python examples/es_digits.py --generations 800   # continues the default run to 800
    python examples/es_digits.py --kind rademacher --pop 1024 --out runs/rademacher
    python examples/es_digits.py --quick          # a short smoke run (tests)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import jaxnoise

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _cli  # noqa: E402  pylint: disable=g-import-not-at-top

IMPLEMENTATIONS = ("auto", "pallas", "interpret", "reference")
# Settings that change the trajectory: a checkpoint only resumes a run that had the same.
RUN_SETTINGS = ("pop", "sigma", "lr", "batch", "hidden", "seed", "kind")


def load_digits_split(seed: int):
  """Digits scaled to [0, 1], split 80/20 (stratified) into train and test."""
  from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
  from sklearn.model_selection import train_test_split  # pylint: disable=g-import-not-at-top

  images, labels = load_digits(return_X_y=True)
  images = (images / 16.0).astype(np.float32)
  x_train, x_test, y_train, y_test = train_test_split(
      images, labels.astype(np.int32), test_size=0.2, stratify=labels, random_state=seed)
  return (jnp.asarray(x_train), jnp.asarray(y_train)), (jnp.asarray(x_test), jnp.asarray(y_test))


def make_model(hidden: int, seed: int) -> nnx.Module:
  """A 64-hidden-10 ReLU MLP."""
  rngs = nnx.Rngs(seed)
  return nnx.Sequential(nnx.Linear(64, hidden, rngs=rngs), nnx.relu,
                        nnx.Linear(hidden, 10, rngs=rngs))


def log_likelihood(model, x, y):
  """Fitness of one individual: mean log-probability of the labels (to maximise)."""
  return -optax.softmax_cross_entropy_with_integer_labels(model(x), y).mean()


def make_step(es, graphdef, rest, x_train, y_train, *, batch: int, data_key: jax.Array):
  """One generation: a minibatch, the population's fitness, the ES update.

  The minibatch depends only on ``(data_key, generation)`` and the seeds only
  on the ES state, so a resumed run draws what the uninterrupted one drew.
  """

  @jax.jit
  def step(params, es_state):
    model = nnx.merge(graphdef, params, rest)
    batch_key = jax.random.fold_in(data_key, es_state.generation)
    rows = jax.random.choice(batch_key, x_train.shape[0], (batch,), replace=False)
    seeds, es_state = es.ask(es_state)
    fitness = es.evaluate(model, seeds, log_likelihood, x_train[rows], y_train[rows])
    updates, es_state = es.update(fitness, es_state, model)
    return optax.apply_updates(params, updates), es_state, -jnp.mean(fitness)

  return step


def make_evaluate(graphdef, rest, x_test, y_test):
  @jax.jit
  def evaluate(params):
    logits = nnx.merge(graphdef, params, rest)(x_test)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y_test).mean()
    return jnp.mean(jnp.argmax(logits, -1) == y_test), loss

  return evaluate


# ----------------------------------------------------------------------------
# Checkpoints (orbax) and the curve (matplotlib).


class Checkpoints:
  """Orbax checkpoints in ``out/checkpoints``: ``{"params", "es"}`` arrays + a JSON history."""

  def __init__(self, out: pathlib.Path):
    import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top

    self._ocp = ocp
    self.manager = ocp.CheckpointManager(
        out.resolve() / "checkpoints", options=ocp.CheckpointManagerOptions(max_to_keep=2),
        item_names=("state", "history"))

  def latest(self) -> int | None:
    return self.manager.latest_step()

  def save(self, generation: int, params, es_state, history: dict) -> None:
    self.manager.save(generation, args=self._ocp.args.Composite(
        state=self._ocp.args.StandardSave({"params": params, "es": es_state}),
        history=self._ocp.args.JsonSave(history)))

  def restore(self, generation: int, params, es_state):
    """``(params, es_state, history)``; ``params``/``es_state`` give the structure."""
    restored = self.manager.restore(generation, args=self._ocp.args.Composite(
        state=self._ocp.args.StandardRestore({"params": params, "es": es_state}),
        history=self._ocp.args.JsonRestore()))
    return restored.state["params"], restored.state["es"], dict(restored.history)

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def plot_curve(history: dict, path: pathlib.Path, title: str) -> None:
  """Test accuracy (left axis) and train / test loss (right axis) against generation."""
  import matplotlib  # pylint: disable=g-import-not-at-top

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top

  fig, accuracy_axis = plt.subplots(figsize=(6.4, 4.0), dpi=120)
  loss_axis = accuracy_axis.twinx()
  generations = np.arange(1, len(history["train_loss"]) + 1)  # the loss of generation g's step
  loss_axis.plot(generations, history["train_loss"], color="tab:orange", alpha=0.35, lw=0.8,
                 label="train loss (population mean, minibatch)")
  loss_axis.plot(history["eval_generation"], history["test_loss"], color="tab:red",
                 label="test loss")
  accuracy_axis.plot(history["eval_generation"], history["test_accuracy"], color="tab:blue",
                     marker=".", label="test accuracy")
  accuracy_axis.set_xlabel("generation")
  accuracy_axis.set_ylabel("test accuracy", color="tab:blue")
  accuracy_axis.set_ylim(0, 1)
  loss_axis.set_ylabel("cross-entropy", color="tab:red")
  loss_axis.set_ylim(bottom=0)
  lines = accuracy_axis.get_legend_handles_labels()
  more = loss_axis.get_legend_handles_labels()
  accuracy_axis.legend(lines[0] + more[0], lines[1] + more[1], loc="center right", fontsize=8)
  accuracy_axis.set_title(title, fontsize=9)
  fig.tight_layout()
  fig.savefig(path)
  plt.close(fig)


# ----------------------------------------------------------------------------
# Command line.


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--generations", type=int, default=400,
                      help="train until this generation (counted from the start of the run, "
                           "also when resuming)")
  parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs/es_digits"),
                      help="run directory: checkpoints and curve.png; an existing run resumes")
  parser.add_argument("--fresh", action="store_true",
                      help="ignore (and replace) the checkpoints already in --out")
  parser.add_argument("--pop", type=int, default=512, help="population (even: antithetic pairs)")
  parser.add_argument("--sigma", type=float, default=0.05, help="perturbation std")
  parser.add_argument("--lr", type=float, default=0.03, help="Adam learning rate")
  parser.add_argument("--batch", type=int, default=256, help="training images per generation")
  parser.add_argument("--hidden", type=int, default=64, help="hidden units")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of the data split, the initial weights, the ES noise and the "
                           "minibatches")
  parser.add_argument("--kind", default=jaxnoise.DEFAULT_KIND, choices=sorted(jaxnoise.KINDS),
                      help="noise kind")
  parser.add_argument("--implementation", default="auto", choices=IMPLEMENTATIONS,
                      help="op implementation (auto: Pallas kernels on a GPU, the pure-JAX "
                           "reference elsewhere)")
  parser.add_argument("--eval-every", type=int, default=20,
                      help="generations between test evaluations (points of the curve)")
  parser.add_argument("--checkpoint-every", type=int, default=100,
                      help="generations between checkpoints (and one at the end)")
  parser.add_argument("--quick", action="store_true",
                      help="a short smoke run for CI: 100 generations, pop 128, eval and "
                           "checkpoint every 50, unless those options are given")
  args = parser.parse_args(argv)
  _cli.apply_quick_defaults(args, argv, {"--generations": 100, "--pop": 128, "--eval-every": 50,
                                         "--checkpoint-every": 50})
  _cli.check_population_and_counts(
      parser, args, ("generations", "eval_every", "checkpoint_every", "batch", "hidden"))
  return args


def main(argv: Sequence[str] | None = None) -> dict:
  args = parse_args(argv)
  tqdm = _cli.optional_tqdm()

  (x_train, y_train), (x_test, y_test) = load_digits_split(args.seed)
  model = make_model(args.hidden, args.seed)
  es = jaxnoise.optim.evolution_strategy(
      args.sigma, optax.adam(args.lr), pop_size=args.pop, kind=args.kind,
      implementation=args.implementation, seed=args.seed)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  es_state = es.init(model)
  settings = {name: getattr(args, name) for name in RUN_SETTINGS}
  history = {"settings": settings, "train_loss": [], "eval_generation": [],
             "test_accuracy": [], "test_loss": []}

  args.out.mkdir(parents=True, exist_ok=True)
  checkpoints = Checkpoints(args.out)
  start = checkpoints.latest()
  if start is not None and args.fresh:
    for step in checkpoints.manager.all_steps():
      checkpoints.manager.delete(step)
    start = None
  if start is not None:
    params, es_state, history = checkpoints.restore(start, params, es_state)
    if history["settings"] != settings:
      checkpoints.close()
      sys.exit(f"{args.out} holds a run with settings {history['settings']}, not {settings}: "
               "pass another --out, or --fresh to start over")
    print(f"resumed at generation {start} from {args.out / 'checkpoints'}")
  start = start or 0

  n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
  print(f"jaxnoise ES on digits: {n_params} parameters, pop {args.pop} (antithetic), "
        f"sigma {args.sigma}, kind {args.kind!r}, {args.generations} generations, "
        f"backend {jax.default_backend()}, implementation {args.implementation!r}")

  step = make_step(es, graphdef, rest, x_train, y_train, batch=min(args.batch, len(x_train)),
                   data_key=jax.random.key(args.seed + 1))
  evaluate = make_evaluate(graphdef, rest, x_test, y_test)
  # Compile before the clock and the progress bar start, so that rates and ETAs are honest.
  compile_start = time.perf_counter()
  step = step.lower(params, es_state).compile()
  jax.block_until_ready(evaluate(params))
  print(f"compiled in {time.perf_counter() - compile_start:.1f} s")

  def record_evaluation(generation, params):
    test_accuracy, test_loss = map(float, evaluate(params))
    history["eval_generation"].append(generation)
    history["test_accuracy"].append(test_accuracy)
    history["test_loss"].append(test_loss)
    return test_accuracy, test_loss

  if start == 0:
    record_evaluation(0, params)  # the curve starts at the initial model
  train_start = time.perf_counter()
  bar = None
  if tqdm is not None and start < args.generations:
    bar = tqdm(total=args.generations, initial=start, desc="ES", unit="gen", mininterval=0.5)
  pending_losses = []  # device scalars; read at evaluations, so the host rarely waits
  for generation in range(start + 1, args.generations + 1):
    params, es_state, train_loss = step(params, es_state)
    pending_losses.append(train_loss)
    last = generation == args.generations
    if generation % args.eval_every == 0 or generation % args.checkpoint_every == 0 or last:
      history["train_loss"] += [float(loss) for loss in pending_losses]
      pending_losses.clear()
      if generation % args.eval_every == 0 or last:
        test_accuracy, test_loss = record_evaluation(generation, params)
        if bar is not None:
          bar.set_postfix(train_loss=f"{history['train_loss'][-1]:.3f}",
                          test_loss=f"{test_loss:.3f}", test_acc=f"{test_accuracy:.3f}")
        else:
          print(f"generation {generation}: train loss {history['train_loss'][-1]:.3f}, "
                f"test loss {test_loss:.3f}, test accuracy {test_accuracy:.3f}")
      if generation % args.checkpoint_every == 0 or last:
        checkpoints.save(generation, params, es_state, history)
    if bar is not None:
      bar.update(1)
  if bar is not None:
    bar.close()
  seconds = time.perf_counter() - train_start
  checkpoints.close()

  generations = max(start, args.generations)
  test_accuracy = float(evaluate(params)[0])
  if history["train_loss"]:
    plot_curve(history, args.out / "curve.png",
               f"jaxnoise ES on digits: MLP 64-{args.hidden}-10, pop {args.pop}, "
               f"sigma {args.sigma}, Adam {args.lr}, kind {args.kind}")
    print(f"curve: {args.out / 'curve.png'}")
  print(f"test_accuracy={test_accuracy:.4f} generations={generations} seconds={seconds:.1f}")
  return {"test_accuracy": test_accuracy, "generations": generations, "seconds": seconds,
          "params": params, "es_state": es_state, "history": history}


if __name__ == "__main__":
  main()
