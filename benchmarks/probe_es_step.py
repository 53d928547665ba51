"""Where one ES step of EGGROLL's layer spends its device time, kernel by kernel.

    XLA_FLAGS=--xla_dump_to=$OUT/xla python3 benchmarks/probe_es_step.py --out $OUT

The step of ``bench_low_rank.py`` (1024 members, one row each, an (8192, 8192)
layer, rank 1, binomial, antithetic, centered ranks, the gradient estimate on
bf16 operands through XLA's GEMM, SGD), in bf16 and f32, and beside it the
same step without centered ranks and without donating the weight, so that a
kernel or copy that one of them adds shows up as a difference. Session 4
found a constant 0.038 ms "Memcpy DtoD" in every step that no kernel of the
step's HLO explained; with ``--xla_dump_to`` XLA's thunk sequences name every
copy the executable makes. Prints each variant's device time per kernel.

Found with it (session 8, ``benchmarks/RESULTS.md``): the copy and 0.06 ms
more came from ``centered_rank``'s two ``searchsorted`` while loops.

``--skip-forms`` measures only the library's transform, with each way of
dropping a non-finite generation: its default (element-wise selects),
``check_finite=False`` (no check) and ``lax.cond`` over the inner state
(session 9); ``--default-tiles`` forms the estimate there by the library's
default fixed-order tiles instead of XLA's GEMM, ``--rank 4`` at rank 4.
``--floor`` also times batch inference of the layer and prints each step
against twice it (inference plus one GEMM of the layer's size: issue 9's
target is at most 1.3x), with the step's kernel count.
``--update-tiles 128x256x64/8/3,...`` adds the hand-written step with the
estimate and SGD's step in one kernel (``virtual_weight_update``), per tiles.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402
from jaxnoise.optim import es as es_lib  # noqa: E402

POP, WIDTH, SIGMA = 1024, 8192, 0.01


def raw_fitness(x, weight, seeds, dtype, rank):
  """The generation's forward and loss, the same in every variant."""
  y = jaxnoise.virtual_perturbed_linear(x, weight, None, seeds, SIGMA, 0, antithetic=True,
                                        rank=rank, out_dtype=dtype)
  return jnp.mean(jnp.square(y.astype(jnp.float32) - 0.5), axis=(1, 2))


def update_config(tiles: str) -> config_lib.LowRankGradientConfig:
  """``"BMxBNxBK/W/S"`` -> bf16-operand tiles of that shape, ``W`` warps, ``S`` stages."""
  shape, warps, stages = tiles.split("/")
  block_rows, block_cols, block_k = (int(d) for d in shape.split("x"))
  return config_lib.LowRankGradientConfig(
      operand_dtype="bfloat16", block_rows=block_rows, block_cols=block_cols, block_k=block_k,
      num_warps=int(warps), num_stages=int(stages))


def make_step(dtype, *, ranks: bool, rank: int = 1, fused_tiles: str | None = None):
  """The ES step of ``bench_low_rank._step_case`` with SGD and XLA's gradient GEMM.

  ``fused_tiles``: the estimate and SGD's step in one kernel instead
  (``virtual_weight_update``, the tile kernel with the update in its epilogue).
  """
  optimizer = optax.sgd(1e-3)
  gradient_config = config_lib.LowRankGradientConfig(operand_dtype="bfloat16", xla_gemm=True)

  def step(weight, x, seeds):
    fitness = raw_fitness(x, weight, seeds, dtype, rank)
    if ranks:
      fitness = jaxnoise.optim.centered_rank(fitness)
    if fused_tiles is not None:
      return jaxnoise.virtual_weight_update(
          weight, fitness, seeds, SIGMA, -1e-3, None, 0, antithetic=True, rank=rank,
          config=update_config(fused_tiles))
    gradient = jaxnoise.virtual_weight_gradient(
        fitness, seeds, weight.shape, SIGMA, None, 0, antithetic=True, rank=rank,
        config=gradient_config)
    updates, _ = optimizer.update(gradient.astype(weight.dtype), optimizer.init(weight), weight)
    return optax.apply_updates(weight, updates)

  return step


def _whole_generation_apply(es, ascent, nonfinite_count, state, params, keep_state):
  """``apply_gradient`` with the check before session 24: a NaN or inf anywhere in the
  updates or the new optimizer state drops the whole generation (updates zero);
  ``keep_state(dropped, old, new)`` chooses the optimizer state."""
  # pylint: disable=protected-access
  param_tree = es._params(params)
  ascent = jax.lax.optimization_barrier(ascent)
  loss_gradient = jax.tree.map(es._loss_gradient, ascent, param_tree)
  updates, inner_state = es.optimizer.update(loss_gradient, state.inner_state, param_tree)
  dropped = ~(es_lib._all_finite(updates) & es_lib._all_finite(inner_state))
  updates = jax.tree.map(lambda u: es_lib._seal(jnp.where(dropped, jnp.zeros_like(u), u)),
                         updates)
  return updates, state._replace(
      generation=state.generation + 1,
      inner_state=keep_state(dropped, state.inner_state, inner_state),
      nonfinite_count=state.nonfinite_count + nonfinite_count,
      dropped_count=state.dropped_count + dropped.astype(jnp.int32))


@dataclasses.dataclass(frozen=True)
class _CondSkip(jaxnoise.optim.EvolutionStrategy):
  """The transform with the inner state chosen by ``lax.cond`` instead of ``where``.

  Measured in session 9 and not adopted: XLA copies the chosen state into the
  output buffer (``memcpy128``), which costs more than the select pass.
  """

  def apply_gradient(self, ascent, nonfinite_count, state, params, rescaled_count=None):
    return _whole_generation_apply(
        self, ascent, nonfinite_count, state, params,
        lambda dropped, old, new: jax.lax.cond(dropped, lambda o, n: o, lambda o, n: n,
                                               old, new))


@dataclasses.dataclass(frozen=True)
class WholeGenerationCheck(jaxnoise.optim.EvolutionStrategy):
  """The transform with the check before session 24, the inner state chosen by ``where``
  (``benchmarks/offline_finite_check.py`` compiles it beside the per-entry check)."""

  def apply_gradient(self, ascent, nonfinite_count, state, params, rescaled_count=None):
    return _whole_generation_apply(
        self, ascent, nonfinite_count, state, params,
        lambda dropped, old, new: jax.tree.map(lambda o, n: jnp.where(dropped, o, n), old, new))


def with_apply(cls, es):
  """``es`` (an ``EvolutionStrategy``) as the subclass ``cls``, every field kept."""
  return cls(**{field.name: getattr(es, field.name) for field in dataclasses.fields(es)})


def make_es_step(dtype, optimizer_name: str, rank: int = 1, skip_form: str = "where",
                 default_tiles: bool = False):
  """The same generation through the library's ES transform (``evolution_strategy``).

  Its ``update`` adds what the hand-written step leaves out: the shaping's
  barriers, weight-decay-free loss gradient, the inner optimizer, the check
  that updates and optimizer state are finite and the skip policy. The
  estimate is XLA's GEMM on bf16 operands, or with ``default_tiles`` the
  library's default (the fixed-order tile kernel and its heuristics).
  """
  optimizer = optax.sgd(1e-3) if optimizer_name == "sgd" else optax.adam(1e-3)
  config = (None if default_tiles
            else config_lib.LowRankGradientConfig(operand_dtype="bfloat16", xla_gemm=True))
  es = jaxnoise.optim.evolution_strategy(SIGMA, optimizer, pop_size=POP, rank=rank,
                                         config=config)
  if skip_form == "no check":
    es = dataclasses.replace(es, check_finite=False)
  elif skip_form == "cond state":
    es = with_apply(_CondSkip, es)

  def step(params, es_state, x):
    seeds, _ = es.ask(es_state)
    fitness = raw_fitness(x, params["w"], seeds, dtype, rank)
    updates, es_state = es.update(fitness, es_state, params)
    return optax.apply_updates(params, updates), es_state

  return es, step


def measure(dtype, *, ranks: bool, donate: bool, es_optimizer: str | None = None,
            skip_form: str = "where", donate_state: bool = True,
            fused_tiles: str | None = None, default_tiles: bool = False,
            rank: int = 1) -> dict:
  key = jax.random.key(0)
  weight = (jax.random.normal(key, (WIDTH, WIDTH), jnp.float32) / WIDTH ** 0.5).astype(dtype)
  x = jax.random.normal(jax.random.key(1), (POP, 1, WIDTH), dtype)
  seeds = jaxnoise.draw_seeds(jax.random.key(2), POP, antithetic=True)
  if es_optimizer is not None:
    es, es_step = make_es_step(dtype, es_optimizer, rank=rank, skip_form=skip_form,
                               default_tiles=default_tiles)
    step = jax.jit(es_step, donate_argnums=(0, 1) if donate_state else (0,))
    state = {"carry": ({"w": weight}, es.init({"w": weight}))}

    def run(x, seeds):
      del seeds  # the ES state draws them
      state["carry"] = step(*state["carry"], x)
      return state["carry"]
  else:
    step = jax.jit(make_step(dtype, ranks=ranks, fused_tiles=fused_tiles),
                   donate_argnums=(0,) if donate else ())
    state = {"weight": weight}

    def run(x, seeds):
      state["weight"] = step(state["weight"], x, seeds)
      return state["weight"]

  busy = _harness.device_busy(run, x, seeds, calls=10)
  if busy is None:
    return {}
  kernels = dict(sorted(busy["kernels"].items(), key=lambda kv: -kv[1]))
  return {"busy_ms": busy["busy_ms"], "kernels_ms": kernels}


def inference_busy_ms(dtype) -> float | None:
  """The floor's half: batch inference of the layer, the fastest of three forms (device ms).

  As ``bench_low_rank.py``'s inference case; issue 9's step target is at most
  1.3x of inference plus one GEMM of the layer's size (twice this).
  """
  weight = (jax.random.normal(jax.random.key(0), (WIDTH, WIDTH), jnp.float32)
            / WIDTH ** 0.5).astype(dtype)
  x = jax.random.normal(jax.random.key(1), (POP, 1, WIDTH), dtype)
  forms = [jax.jit(lambda x, w: jnp.dot(x[:, 0], w.T)),
           jax.jit(lambda x, w: jax.lax.dot_general(x[:, 0], w, (((1,), (1,)), ((), ())))),
           jax.jit(lambda x, w: jnp.einsum("pbk,ok->pbo", x, w))]
  busy = [_harness.device_busy(form, x, weight, calls=10) for form in forms]
  busy = [b["busy_ms"] for b in busy if b]
  return min(busy) if busy else None


def _finite_forms(args):
  """The transform's SGD step with ``es._all_finite`` replaced by each form (session 15)."""
  import probe_finite_check  # pylint: disable=g-import-not-at-top
  library_form = es_lib._all_finite  # pylint: disable=protected-access
  results = {}
  for form_name, form in probe_finite_check.FORMS.items():
    def all_finite(tree, form=form):
      flags = [form(leaf) if leaf.size % 8192 == 0 else jnp.all(jnp.isfinite(leaf))
               for leaf in jax.tree.leaves(tree)
               if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)]
      return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)
    es_lib._all_finite = all_finite  # pylint: disable=protected-access
    try:
      for dtype in (jnp.bfloat16, jnp.float32):
        name = f"{jnp.dtype(dtype).name} evolution_strategy sgd, check: {form_name}"
        if args.only and not re.search(args.only, name):
          continue
        results[name] = row = measure(dtype, ranks=True, donate=True, es_optimizer="sgd")
        print(f"{name}: {row.get('busy_ms', float('nan')):.3f} ms", flush=True)
        for kernel, ms in list(row.get("kernels_ms", {}).items())[:5]:
          print(f"    {ms:.4f}  {kernel}")
    finally:
      es_lib._all_finite = library_form  # pylint: disable=protected-access
  _harness.write_json(str(pathlib.Path(args.out) / "probe_es_step_finite_forms.json"),
                      {**_harness.device_facts(), "results": results})


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--only", default="", help="regular expression over the variants' names")
  parser.add_argument("--skip-forms", action="store_true",
                      help="only the transform, with each way of dropping a generation")
  parser.add_argument("--finite-forms", action="store_true",
                      help="only the transform with SGD, its finiteness check written in each "
                           "form of probe_finite_check.FORMS")
  parser.add_argument("--floor", action="store_true",
                      help="also time batch inference; print each step against twice it")
  parser.add_argument("--default-tiles", action="store_true",
                      help="--skip-forms with the estimate by the default fixed-order tiles "
                           "(not XLA's GEMM)")
  parser.add_argument("--rank", type=int, default=1,
                      help="--skip-forms at this noise rank (4: the estimate in two chunks)")
  parser.add_argument("--update-tiles", default="",
                      help="comma-separated BMxBNxBK/warps/stages: the hand-written step with "
                           "the estimate and SGD's step fused (virtual_weight_update) per tiles")
  args = parser.parse_args(argv)
  if (args.default_tiles or args.rank != 1) and not args.skip_forms:
    parser.error("--default-tiles and --rank apply to --skip-forms")
  results = {}
  if args.finite_forms:
    _finite_forms(args)
    return
  for dtype in (jnp.bfloat16, jnp.float32):
    floor_ms = None
    # (Only the dtypes that --only can select: a pattern starting with a dtype's name.)
    if args.floor and (not args.only.startswith(("bfloat16", "float32"))
                       or args.only.startswith(jnp.dtype(dtype).name)):
      inference = inference_busy_ms(dtype)
      floor_ms = None if inference is None else 2 * inference
      results[f"{jnp.dtype(dtype).name} inference"] = {"busy_ms": inference}
      print(f"{jnp.dtype(dtype).name} inference: {inference} ms (floor: twice that)", flush=True)
    variants = [(f"{'ranks' if ranks else 'raw fitness'} {'donated' if donate else 'not donated'}",
                 dict(ranks=ranks, donate=donate))
                for ranks, donate in ((True, True), (False, True), (True, False))]
    variants += [(f"evolution_strategy {name}", dict(ranks=True, donate=True, es_optimizer=name))
                 for name in ("sgd", "adam")]
    variants += [(f"ranks donated fused update {tiles}",
                  dict(ranks=True, donate=True, fused_tiles=tiles))
                 for tiles in filter(None, args.update_tiles.split(","))]
    if args.skip_forms:
      tiles = " default tiles" if args.default_tiles else ""
      rank = f" r{args.rank}" if args.rank != 1 else ""
      variants = [(f"evolution_strategy{tiles}{rank} {name} {form}"
                   f"{'' if donate else ' state not donated'}",
                   dict(ranks=True, donate=True, es_optimizer=name, skip_form=form,
                        donate_state=donate, default_tiles=args.default_tiles,
                        rank=args.rank))
                  for name in ("sgd", "adam")
                  for form, donate in (("where", True), ("no check", True),
                                       ("cond state", True), ("cond state", False))]
    for label, kwargs in variants:
      name = f"{jnp.dtype(dtype).name} {label}"
      if args.only and not re.search(args.only, name):
        continue
      results[name] = row = measure(dtype, **kwargs)
      ratio = ""
      if floor_ms and row.get("busy_ms"):
        row["ratio_to_inference_plus_gemm"] = row["busy_ms"] / floor_ms
        ratio = f" = {row['ratio_to_inference_plus_gemm']:.3f}x (inference + one GEMM)"
      print(f"{name}: {row.get('busy_ms', float('nan')):.3f} ms{ratio}, "
            f"{len(row.get('kernels_ms', {}))} kernels", flush=True)
      for kernel, ms in list(row.get("kernels_ms", {}).items())[:10]:
        print(f"    {ms:.4f}  {kernel}")
  _harness.write_json(str(pathlib.Path(args.out) / "probe_es_step.json"),  # makes the folder
                      {**_harness.device_facts(), "results": results})


if __name__ == "__main__":
  main()
