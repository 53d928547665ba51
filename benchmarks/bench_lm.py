"""One ES step of a byte-level transformer LM at populations of 16,384 to 262,144.

The model is :class:`lm_model.TransformerLM` (default 4 layers, d_model 512,
8 heads, MLP 4x, context 64: 12.9M parameters, every matmul an
``nnx.Linear``). One generation, all under one ``jax.jit``:

* ``es.ask``: the generation's seeds;
* the fused population forward (``es.evaluate``), in chunks of members
  (``lax.map``, ``--tokens-per-chunk``) so the live activations are a chunk's;
  fitness is minus the mean next-byte cross-entropy on a minibatch of
  ``--batch`` sequences shared by the whole population;
* ``es.update`` (the gradient estimate regenerates the noise) and Adam.

Each population runs with rank-1 and rank-4 noise on every linear kernel and
with full-rank noise (``rank=None``), and first as plain batch inference (the
floor, as in EGGROLL's benchmark): the unperturbed model's loss on ``pop``
distinct minibatches of the same size, chunked the same way, so each ES step
is also reported as a fraction of inference throughput at its population.
Full rank regenerates ``pop x params``
noise values twice per step, so it is skipped where the step time measured
at a smaller population predicts more than ``--case-budget`` seconds, and a
case that fails (out of memory) is recorded, not raised, so the table always
prints. Reported: generations/s, tokens/s (``pop * batch * context`` tokens
evaluated per second), the fraction of inference (inference time / step
time), the compiled executable's memory and the device's peak.

    python benchmarks/bench_lm.py --out benchmarks/out     # GPU, about 3 min
    python benchmarks/bench_lm.py --quick                  # CPU check (interpret)

Writes ``<out>/lm_step.json`` and ``<out>/lm_step.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
import lm_model  # noqa: E402

GIB = float(1 << 30)


def _rank_name(rank: int | None) -> str:
  return "full" if rank is None else str(rank)


def _parse_ranks(text: str) -> list[int | None]:
  return [None if item.strip() == "full" else int(item) for item in text.split(",")]


def _parse_ints(text: str) -> list[int]:
  return [int(item) for item in text.split(",")]


def _peak_device_bytes() -> int | None:
  stats = jax.devices()[0].memory_stats() or {}
  return stats.get("peak_bytes_in_use")


def es_step_setup(config: lm_model.LMConfig, pop: int, rank: int | None, batch: int,
                  tokens_per_chunk: int, implementation: str = "auto", donate: bool = True):
  """One ES generation of a fresh model, jitted, and its arguments.

  Returns:
    ``(step, args, chunk, model)``: ``step(*args)`` returns ``(params,
    es_state, mean_loss)`` (:func:`lm_model.make_es_step`), donating the
    parameters and the ES state when ``donate``.
  """
  model = lm_model.TransformerLM(config, rngs=nnx.Rngs(0))
  es = jaxnoise.optim.evolution_strategy(
      sigma=0.01, optimizer=optax.adam(1e-3), pop_size=pop, rank=rank,
      implementation=implementation)
  es_state = es.init(model)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  chunk = lm_model.chunk_members(pop, batch * config.context, tokens_per_chunk)
  step = jax.jit(lm_model.make_es_step(es, graphdef, chunk=chunk),
                 donate_argnums=(0, 2) if donate else ())
  sequences = jax.random.randint(jax.random.key(1), (batch, config.context + 1), 0,
                                 config.vocab_size, jnp.int32)
  return step, (params, rest, es_state, sequences), chunk, model


def inference_setup(config: lm_model.LMConfig, pop: int, batch: int, tokens_per_chunk: int):
  """The floor, jitted, and its arguments: the unperturbed model's loss on ``pop`` minibatches.

  The same tokens per member and the same chunks as :func:`es_step_setup`,
  one ``vmap`` over a chunk's members (XLA folds it into the matmuls' rows),
  each member its own random sequences; no noise, no update.

  Returns:
    ``(population_loss, args, chunk)``: ``population_loss(*args)`` is the mean loss.
  """
  graphdef, state = nnx.split(lm_model.TransformerLM(config, rngs=nnx.Rngs(0)))
  chunk = lm_model.chunk_members(pop, batch * config.context, tokens_per_chunk)
  sequences = jax.random.randint(jax.random.key(2),
                                 (pop // chunk, chunk, batch, config.context + 1), 0,
                                 config.vocab_size, jnp.int32)

  @jax.jit
  def population_loss(state, sequences):
    member = nnx.merge(graphdef, state)
    losses = jax.lax.map(jax.vmap(functools.partial(lm_model.next_byte_loss, member)),
                         sequences)
    return jnp.mean(losses)

  return population_loss, (state, sequences), chunk


def step_case(config: lm_model.LMConfig, pop: int, rank: int | None, batch: int,
              tokens_per_chunk: int, implementation: str, repeats: int,
              case_seconds: float) -> dict:
  """Compile and time one ES generation; returns the case's record."""
  step, (params, rest, es_state, sequences), chunk, model = es_step_setup(
      config, pop, rank, batch, tokens_per_chunk, implementation)

  start = time.perf_counter()
  compiled = step.lower(params, rest, es_state, sequences).compile()
  compile_seconds = time.perf_counter() - start
  memory = compiled.memory_analysis()

  # The first call is not timed (allocation, autotuning caches).
  params, es_state, loss = compiled(params, rest, es_state, sequences)
  jax.block_until_ready(loss)
  times = []
  deadline = time.perf_counter() + case_seconds
  while len(times) < repeats and (not times or time.perf_counter() < deadline):
    start = time.perf_counter()
    params, es_state, loss = compiled(params, rest, es_state, sequences)
    jax.block_until_ready(loss)
    times.append(time.perf_counter() - start)
  seconds = statistics.median(times)
  tokens = pop * batch * config.context
  record = {
      "pop": pop, "rank": _rank_name(rank), "chunk": chunk, "batch": batch,
      "context": config.context, "n_params": lm_model.count_params(model),
      "step_ms": 1e3 * seconds, "timed_steps": len(times),
      "generations_per_s": 1.0 / seconds, "tokens_per_s": tokens / seconds,
      "compile_s": compile_seconds, "mean_loss": float(loss),
  }
  if memory is not None:
    record["temp_gib"] = memory.temp_size_in_bytes / GIB
    record["argument_gib"] = memory.argument_size_in_bytes / GIB
  peak = _peak_device_bytes()
  if peak is not None:
    record["device_peak_gib"] = peak / GIB  # process-wide peak so far
  return record


def inference_case(config: lm_model.LMConfig, pop: int, batch: int, tokens_per_chunk: int,
                   repeats: int, case_seconds: float) -> dict:
  """Compile and time the floor (:func:`inference_setup`); returns the case's record."""
  population_loss, args, chunk = inference_setup(config, pop, batch, tokens_per_chunk)
  start = time.perf_counter()
  compiled = population_loss.lower(*args).compile()
  compile_seconds = time.perf_counter() - start
  jax.block_until_ready(compiled(*args))
  times = []
  deadline = time.perf_counter() + case_seconds
  while len(times) < repeats and (not times or time.perf_counter() < deadline):
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - start)
  seconds = statistics.median(times)
  return {"pop": pop, "rank": "inference", "chunk": chunk, "batch": batch,
          "context": config.context, "step_ms": 1e3 * seconds, "timed_steps": len(times),
          "tokens_per_s": pop * batch * config.context / seconds,
          "compile_s": compile_seconds}


def add_fractions(results: list[dict]) -> None:
  """``of_inference`` (inference ms / step ms at the same population) on every ES record."""
  floor = {r["pop"]: r["step_ms"] for r in results
           if r.get("rank") == "inference" and "step_ms" in r}
  for record in results:
    if record.get("rank") != "inference" and "step_ms" in record and record.get("pop") in floor:
      record["of_inference"] = floor[record["pop"]] / record["step_ms"]


def plot(results: list[dict], path: str) -> None:
  """Tokens/s against population, one line per rank."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  figure, axis = plt.subplots(figsize=(6, 4))
  for rank in sorted({r["rank"] for r in results if "tokens_per_s" in r}):
    rows = sorted((r for r in results if r.get("rank") == rank and "tokens_per_s" in r),
                  key=lambda r: r["pop"])
    axis.plot([r["pop"] for r in rows], [r["tokens_per_s"] for r in rows], "o-",
              label="batch inference" if rank == "inference" else f"ES step, rank {rank}")
  axis.set_xscale("log", base=2)
  axis.set_yscale("log")
  axis.set_xlabel("population")
  axis.set_ylabel("tokens evaluated / s")
  axis.set_title("ES step of a byte-level transformer LM")
  axis.legend()
  figure.tight_layout()
  figure.savefig(path, dpi=120)
  plt.close(figure)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true",
                      help="tiny model, pop 8, interpret implementation (CPU check)")
  parser.add_argument("--out", default="benchmarks/out", help="output folder")
  parser.add_argument("--pops", default="16384,65536,262144", help="comma-separated populations")
  parser.add_argument("--ranks", default="1,full,4",
                      help="comma-separated ranks, run in this order; full = rank None")
  parser.add_argument("--no-inference", action="store_true",
                      help="skip the batch-inference floor at each population")
  parser.add_argument("--batch", type=int, default=1, help="sequences per member (shared)")
  parser.add_argument("--context", type=int, default=64, help="tokens per sequence")
  parser.add_argument("--d-model", type=int, default=512)
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                      help="compute dtype of the layers (parameters stay float32)")
  parser.add_argument("--tokens-per-chunk", type=int, default=1 << 20,
                      help="members x batch x context tokens evaluated at a time")
  parser.add_argument("--implementation", default="auto",
                      choices=["auto", "pallas", "interpret", "reference"])
  parser.add_argument("--repeats", type=int, default=2, help="timed steps per case")
  parser.add_argument("--case-budget", type=float, default=20.0,
                      help="seconds of timed steps per case; also the skip threshold")
  parser.add_argument("--budget", type=float, default=170.0,
                      help="total seconds; later cases are skipped once spent")
  lm_model.add_route_arguments(parser)
  args = parser.parse_args(argv)
  lm_model.route_from_arguments(args)
  if args.quick:
    config = lm_model.LMConfig(context=8, d_model=16, num_layers=1, num_heads=2,
                               dtype=args.dtype)
    pops, ranks, implementation = [8], [1, None], "interpret"
    args.tokens_per_chunk = 32  # two chunks of four members: exercises lax.map
    args.repeats = 1
  else:
    config = lm_model.LMConfig(context=args.context, d_model=args.d_model,
                               num_layers=args.layers, num_heads=args.heads, dtype=args.dtype)
    pops, ranks, implementation = (_parse_ints(args.pops), _parse_ranks(args.ranks),
                                   args.implementation)

  facts = _harness.device_facts()
  print(facts, flush=True)
  budget = _harness.Budget(args.budget)
  results: list[dict] = []
  seconds_per_member: dict[str, float] = {}  # per rank, from its last measured case
  failed: set[str] = set()
  if not args.no_inference:
    for pop in pops:
      _harness.run_case(
          results, f"lm inference pop={pop}",
          functools.partial(inference_case, config, pop, args.batch, args.tokens_per_chunk,
                            args.repeats, args.case_budget), budget)
  # Rank-outer: a rank's smaller populations predict its larger ones (see the skip below),
  # and the low-rank cases at every population run before the time budget runs out.
  for rank in ranks:
    for pop in pops:
      name = f"lm ES step pop={pop} rank={_rank_name(rank)}"
      rank_key = _rank_name(rank)
      if rank_key in failed:
        results.append({"case": name, "pop": pop, "rank": rank_key,
                        "skipped": "failed at a smaller population"})
        print(f"[skip] {name}: failed at a smaller population", flush=True)
        continue
      if rank_key in seconds_per_member:
        predicted = seconds_per_member[rank_key] * pop
        if predicted * (args.repeats + 1) > min(args.case_budget, budget.left()):
          results.append({"case": name, "pop": pop, "rank": rank_key,
                          "skipped": f"predicted {predicted:.1f} s per step"})
          print(f"[skip] {name}: predicted {predicted:.1f} s per step", flush=True)
          continue
      record = _harness.run_case(
          results, name,
          functools.partial(step_case, config, pop, rank, args.batch, args.tokens_per_chunk,
                            implementation, args.repeats, args.case_budget), budget)
      if record is None:
        continue
      if "error" in record:
        record.update(pop=pop, rank=rank_key)
        failed.add(rank_key)
      elif "step_ms" in record:
        seconds_per_member[rank_key] = record["step_ms"] / 1e3 / pop

  add_fractions(results)
  os.makedirs(args.out, exist_ok=True)
  _harness.write_json(os.path.join(args.out, "lm_step.json"),
                      {"facts": facts, "config": dataclasses.asdict(config),
                       "results": results})
  plot(results, os.path.join(args.out, "lm_step.png"))
  print(_harness.table(results, ["case", "chunk", "step_ms", "generations_per_s",
                                 "tokens_per_s", "of_inference", "compile_s", "temp_gib",
                                 "device_peak_gib", "skipped", "error"]))


if __name__ == "__main__":
  main()
