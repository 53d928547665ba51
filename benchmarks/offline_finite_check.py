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

That did not carry over to the GPU's jax 0.11.2 (session 25, RESULTS.md):
its XLA keeps ``input_reduce_fusion.1`` (the flag's row reductions over the
GEMM's bf16 output) apart from ``loop_add_fusion`` (the select and the
addition), two passes as before, and the step took as long as with the
whole-generation check (H200 0.454 against 0.455 ms, H100 0.508 against
0.509). A deviceless compile with one XLA version does not predict another's
fusion decisions.
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
import compile_offline  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
import probe_es_step  # noqa: E402  pylint: disable=g-import-not-at-top

POP, WIDTH, SIGMA = 1024, 8192, 0.01
FORMS = ("library", "no-check", "whole")


def lowered_step(form: str):
  """The generation's second half for ``form``, lowered for CUDA."""
  es = jaxnoise.optim.evolution_strategy(SIGMA, optax.sgd(1e-3), pop_size=POP, rank=1)
  if form == "no-check":
    es = dataclasses.replace(es, check_finite=False)
  elif form == "whole":
    es = probe_es_step.with_apply(probe_es_step.WholeGenerationCheck, es)

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
  for form in args.form or FORMS:
    entry = compile_offline.optimized_entry(args.plugin, lowered_step(form))
    print(f"{form}:")
    for line in entry.splitlines()[1:]:
      match = re.match(r"\s*(?:ROOT )?%(\S+) = (.+?) fusion\(", line)
      if match:
        name, shape = match.groups()
        # An output of the layer's shape, or one per row of it: the kernel reads the layer.
        layer_pass = "  <- a pass over the layer" if str(WIDTH) in shape else ""
        print(f"  {name:30s} {shape[:48]:48s}{layer_pass}")


if __name__ == "__main__":
  main()
