"""Bytes each kernel of an ES generation's update moves over the layer, compiled offline.

    python benchmarks/offline_es_passes.py --plugin PATH/xla_cuda_plugin.so \
        [--optimizer sgd --optimizer adam ...] [--config xla_gemm] [--dtype bfloat16] [--json F]

Lowers, for CUDA, the update half of one ES generation on EGGROLL's layer
(one (8192, 8192) matrix, 1024 members, rank 1): ``EvolutionStrategy.update``
on given fitness (shaping, the low-rank estimate, the inner optimizer, the
finiteness check), then ``optax.apply_updates``, parameters and state donated
(the forward is left out: it is the same kernels in every form). The XLA of a
PJRT CUDA plugin compiles it for an H200 without a device
(:mod:`compile_offline`); for each kernel of the optimised ENTRY this prints
the bytes of the arrays of at least 2**20 entries it reads and writes, and
their sum. At these sizes the update is memory-bound, so the sum predicts its
time: on an H200 (session 25) XLA's ``loop_add_fusion`` moved its 384 MiB in
92 us (4.4 MB/us) and the check's row reduction its 128 MiB in 39 us (3.4).

Every optimizer is run with the check (the default) and without it
(``check_finite=False``), for the estimate by XLA's GEMM on bf16 operands
(``LowRankGradientConfig(operand_dtype="bfloat16", xla_gemm=True)``, what
``probe_es_step.py`` times) and by the library's fixed-order kernel (the
default config). Use the plugin of the GPU's jax (``pip download --no-deps
jax-cuda13-pjrt==0.11.2``): session 24's prediction with 0.10.2's XLA did not
carry over (``offline_finite_check.py``).

The Pallas kernels are lowered as on a GPU
(:func:`compile_offline.traced_as_on_a_gpu`).

Found with it (2026-12-05, jax 0.10.2 lowering, jax-cuda13-pjrt 0.11.2's XLA;
``benchmarks/RESULTS.md``, session 26; it reproduces the kernels of session
25's HLO dumped on the GPU):

- with the check and XLA's GEMM, XLA put SGD's step in the GEMM's epilogue, so
  the check's row reduction and the parameters' addition each read the GEMM's
  output (672 MiB in bf16). A barrier after the estimate makes the optimizer,
  the check and the addition one multi-output fusion (544 MiB); it moved less
  or the same for every optimizer here. The check's zeroing alone (no count,
  written with ``isfinite`` or with ``abs(u) <= max``) was not fused into the
  GEMM's epilogue either (a probe, not kept; perhaps because the select reads
  the product twice).
- the default tiles wrote the float32 gradient and a pass converted it to
  bf16 (1088 MiB for SGD); rounded in the tiles' epilogue, 576 MiB.
"""

from __future__ import annotations

import argparse
import json
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
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402

POP, WIDTH, SIGMA = 1024, 8192, 0.01
# An array of at least this many entries is the layer (or a large piece of it).
LARGE = 1 << 20
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4}

OPTIMIZERS = {
    "sgd": (lambda: optax.sgd(1e-3), 0.0),
    "sgd+decay": (lambda: optax.sgd(1e-3), 1e-4),
    "clip+sgd": (lambda: optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(1e-3)), 0.0),
    "momentum": (lambda: optax.sgd(1e-3, momentum=0.9), 0.0),
    "adam": (lambda: optax.adam(1e-3), 0.0),
    "lion": (lambda: optax.lion(1e-4), 0.0),
}
CONFIGS = {
    "xla_gemm": config_lib.LowRankGradientConfig(operand_dtype="bfloat16", xla_gemm=True),
    "default": None,
}


def lowered_update(optimizer: str, config: str, dtype, check_finite: bool, rank: int = 1):
  """``update`` + ``apply_updates`` of one generation, lowered for CUDA."""
  make, weight_decay = OPTIMIZERS[optimizer]
  es = jaxnoise.optim.evolution_strategy(SIGMA, make(), pop_size=POP, rank=rank,
                                         weight_decay=weight_decay, check_finite=check_finite,
                                         config=CONFIGS[config])

  def step(params, es_state, fitness):
    updates, es_state = es.update(fitness, es_state, params)
    return optax.apply_updates(params, updates), es_state

  layer = jax.ShapeDtypeStruct((WIDTH, WIDTH), dtype)
  state = jax.eval_shape(lambda: es.init({"w": jnp.zeros((WIDTH, WIDTH), dtype)},
                                         jax.random.key(0)))
  with compile_offline.traced_as_on_a_gpu():
    return jax.jit(step, donate_argnums=(0, 1)).trace(
        {"w": layer}, state, jax.ShapeDtypeStruct((POP,), jnp.float32)).lower(
            lowering_platforms=("cuda",))


def large_bytes(shapes: str) -> int:
  """Bytes of the arrays of at least :data:`LARGE` entries in an HLO shape (or tuple)."""
  total = 0
  for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes):
    count = 1
    for dim in filter(None, dims.split(",")):
      count *= int(dim)
    if count >= LARGE:
      total += count * _BYTES.get(dtype, 4)
  return total


def _computations(module: str) -> dict[str, list[str]]:
  """Each computation's instruction lines by name (the ENTRY's as ``"ENTRY"``; a text of
  one computation without an ENTRY header is taken as the ENTRY)."""
  computations, lines = {}, None
  for line in module.splitlines():
    header = re.match(r"(ENTRY )?%(\S+) \(.*\{\s*$", line)
    if header:
      lines = computations.setdefault("ENTRY" if header.group(1) else header.group(2), [])
    elif line.startswith("}"):
      lines = None
    elif lines is not None:
      lines.append(line)
  if "ENTRY" not in computations and computations:
    computations["ENTRY"] = next(iter(computations.values()))
  return computations


def layer_traffic(module: str, computation: str = "ENTRY", _computed=None
                  ) -> list[tuple[str, int]]:
  """``(kernel, bytes read and written of large arrays)`` for each kernel of a computation.

  A ``while`` loop's body is counted as its kernels times the loop's known trip count
  (``"while.1/fusion.3 x2"``); the loop itself moves nothing.
  """
  computations = _computations(module) if _computed is None else _computed
  shapes, kernels = {}, []
  for line in computations.get(computation, []):
    match = re.match(r"\s*(?:ROOT )?%(\S+) = (.+?) ([\w-]+)\((.*?)\)", line)
    if not match:
      continue
    name, shape, op, operands = match.groups()
    shapes[name] = shape
    if op == "while":
      body = re.search(r"body=%([\w.\-]+)", line).group(1)
      trips = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', line)
      count = int(trips.group(1)) if trips else 1
      for kernel, moved in layer_traffic(module, body, computations):
        kernels.append((f"{name}/{kernel} x{count}{'' if trips else '?'}", moved * count))
    elif op in ("fusion", "custom-call", "copy"):
      read = sum(large_bytes(shapes.get(o.strip().lstrip("%"), "")) for o in operands.split(","))
      moved = read + large_bytes(shape)
      if moved:
        kernels.append((name, moved))
  return kernels


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--plugin", required=True, help="xla_cuda_plugin.so of jax-cuda13-pjrt")
  parser.add_argument("--optimizer", choices=OPTIMIZERS, action="append",
                      help="repeatable (default: all)")
  parser.add_argument("--config", choices=CONFIGS, action="append", help="repeatable")
  parser.add_argument("--dtype", choices=("bfloat16", "float32"), action="append",
                      help="repeatable")
  parser.add_argument("--rank", type=int, default=1,
                      help="noise rank (4: the default tiles contract two chunks)")
  parser.add_argument("--debug-field", action="append", default=[], metavar="N[=0]",
                      help="set DebugOptions boolean field N of the plugin's XLA to true "
                           "(N=0: false); repeatable (compile_offline.debug_option_bytes)")
  parser.add_argument("--json", help="write the rows here")
  args = parser.parse_args(argv)
  debug_fields = {}
  for field in args.debug_field:
    number, _, value = field.partition("=")
    if not number.isdigit() or int(number) < 1 or value not in ("", "0", "1"):
      parser.error(f"--debug-field takes N, N=0 or N=1 with N a positive field number, "
                   f"got {field!r}")
    debug_fields[int(number)] = value != "0"
  rows = []
  for config in args.config or CONFIGS:
    for dtype in args.dtype or ("bfloat16", "float32"):
      for optimizer in args.optimizer or OPTIMIZERS:
        for check in (True, False):
          module = compile_offline.optimized_module(
              args.plugin, lowered_update(optimizer, config, jnp.dtype(dtype), check, args.rank),
              debug_fields)
          kernels = layer_traffic(module)
          total = sum(moved for _, moved in kernels)
          rows.append({"rank": args.rank, "config": config, "dtype": dtype,
                       "optimizer": optimizer,
                       "check_finite": check, "mib": total >> 20,
                       "kernels": {name: moved >> 20 for name, moved in kernels}})
          detail = " ".join(f"{name}:{moved >> 20}" for name, moved in kernels)
          print(f"r{args.rank} {config:8s} {dtype:8s} {optimizer:9s} check={check!s:5s} "
                f"{total >> 20:5d} MiB  {detail}", flush=True)
  if args.json:
    pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
  main()
