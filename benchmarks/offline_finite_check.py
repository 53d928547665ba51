"""How XLA fuses the ES transform's finiteness check with the parameters' addition (no GPU).

    python benchmarks/offline_finite_check.py --plugin PATH/xla_cuda_plugin.so [--form where]

Lowers, for CUDA, the second half of one ES generation on one (8192, 8192)
bf16 layer: ``EvolutionStrategy.apply_gradient`` (SGD) on a given estimate,
then ``optax.apply_updates``, parameters and state donated. The PJRT CUDA
plugin's XLA compiles it for an H200 without a device
(:mod:`compile_offline`) and the ENTRY's kernels are printed. Forms:
``library`` (the transform as it is), ``no-check`` (``check_finite=False``)
and ``whole`` (session 23's check, which dropped the whole generation for a
non-finite update entry: ``where(all_finite(updates), updates, 0)``).

Found with it (2026-12-05, jax 0.10.2 on the CPU, jax-cuda13-pjrt 0.10.2):
``whole`` takes two passes over the layer (``input_reduce_fusion`` reads the
updates for the flag, then ``loop_convert_fusion`` adds them), the per-entry
check of ``library`` one (``input_convert_reduce_fusion``: the new
parameters and the flag's row reductions as one multi-output fusion), as
``no-check`` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys
import tempfile

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import compile_offline  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
from jaxnoise.optim import es as es_lib  # noqa: E402

POP, WIDTH, SIGMA = 1024, 8192, 0.01
FORMS = ("library", "no-check", "whole")


@dataclasses.dataclass(frozen=True)
class _WholeGenerationCheck(jaxnoise.optim.EvolutionStrategy):
  """The check before session 24: any non-finite update entry drops the generation."""

  def apply_gradient(self, ascent, nonfinite_count, state, params, rescaled_count=None):
    # pylint: disable=protected-access
    param_tree = self._params(params)
    ascent = jax.lax.optimization_barrier(ascent)
    loss_gradient = jax.tree.map(self._loss_gradient, ascent, param_tree)
    updates, inner_state = self.optimizer.update(loss_gradient, state.inner_state, param_tree)
    dropped = ~(es_lib._all_finite(updates) & es_lib._all_finite(inner_state))
    updates = jax.tree.map(lambda u: es_lib._seal(jnp.where(dropped, jnp.zeros_like(u), u)),
                           updates)
    inner_state = jax.tree.map(lambda new, old: jnp.where(dropped, old, new), inner_state,
                               state.inner_state)
    return updates, state._replace(
        generation=state.generation + 1, inner_state=inner_state,
        nonfinite_count=state.nonfinite_count + nonfinite_count,
        dropped_count=state.dropped_count + dropped.astype(jnp.int32))


def lowered_step(form: str):
  """The generation's second half for ``form``, lowered for CUDA."""
  es = jaxnoise.optim.evolution_strategy(SIGMA, optax.sgd(1e-3), pop_size=POP, rank=1)
  if form == "no-check":
    es = dataclasses.replace(es, check_finite=False)
  elif form == "whole":
    es = _WholeGenerationCheck(**{f.name: getattr(es, f.name) for f in dataclasses.fields(es)})

  def step(params, es_state, ascent):
    updates, es_state = es.apply_gradient({"w": ascent}, jnp.zeros((), jnp.int32), es_state,
                                          params)
    return optax.apply_updates(params, updates), es_state

  layer = jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.bfloat16)
  state = jax.eval_shape(lambda: es.init({"w": jnp.zeros((WIDTH, WIDTH), jnp.bfloat16)},
                                         jax.random.key(0)))
  return jax.jit(step, donate_argnums=(0, 1)).trace(
      {"w": layer}, state, jax.ShapeDtypeStruct((WIDTH, WIDTH), jnp.float32)).lower(
          lowering_platforms=("cuda",))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--plugin", required=True, help="xla_cuda_plugin.so of jax-cuda13-pjrt")
  parser.add_argument("--form", choices=FORMS, action="append",
                      help="repeatable (default: all)")
  args = parser.parse_args(argv)
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  for form in args.form or FORMS:
    lowered = lowered_step(form)
    with tempfile.TemporaryDirectory() as directory:
      options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
      options.executable_build_options.debug_options.xla_dump_to = directory
      compile_offline.DevicelessCompiler(args.plugin).compile(
          lowered.as_text().encode(), options.SerializeAsString())
      (optimized,) = pathlib.Path(directory).glob("*gpu_after_optimizations.txt")
      entry = optimized.read_text().split("\nENTRY ", 1)[1]
    print(f"{form}:")
    for line in entry.splitlines()[1:]:
      match = re.match(r"\s*(?:ROOT )?%(\S+) = (.+?) fusion\(([^)]*)\)", line)
      if match:
        name, shape, operands = match.groups()
        # An output of the layer's shape, or one per row of it: the kernel reads the layer.
        layer_pass = "  <- a pass over the layer" if str(WIDTH) in shape else ""
        print(f"  {name:30s} {shape[:48]:48s}{layer_pass}")


if __name__ == "__main__":
  main()
