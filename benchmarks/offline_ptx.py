"""PTX of the Pallas kernels, without a GPU: instruction counts per element.

    pip install triton   # a CPU machine can compile for sm_90 (no GPU needed)
    python benchmarks/offline_ptx.py counter_update 8192 8192 float32
    python benchmarks/offline_ptx.py low_rank 1024 8192 8192 bfloat16 --rank 4
    python benchmarks/offline_ptx.py reduce_metric 1024 1048576 float32
    python benchmarks/offline_ptx.py matmul 4 4096 4096 bfloat16

Lowers one kernel for CUDA with this machine's jax (its Triton IR, as Pallas
hands it to XLA), compiles that IR for sm_90 with the ``triton`` package's own
pipeline (close to, not the same as, XLA's fork of it) and prints the PTX
instruction mix and the instructions per element of the program's tile (a
loop body appears once in the PTX, so a kernel's count is per loop step). It
predicts a change's effect on an issue-bound kernel before a GPU run; it does
not time anything. Files go to ``--out`` (TTIR, TTGIR, PTX; SASS with
``--sass``, which also counts the SASS instructions per element and reports the
registers per thread).

Used in session 7 (benchmarks/RESULTS.md): the counter update's rounding in
SPEC's form took the 8192^2 float32 update from 44.0 to 39.7 PTX instructions
per weight.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import pathlib
import re
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_INSTRUCTION = re.compile(r"^\s+(?:@!?%p\d+\s+)?([a-z][\w.]*)", re.MULTILINE)
_SASS = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")


def capture_ttir(fn, *shapes) -> str:
  """The Triton IR of the one ``pallas_call`` in ``fn`` lowered for CUDA."""
  from jax._src.pallas.triton import lowering  # pylint: disable=g-import-not-at-top
  from jax._src.pallas.triton import pallas_call_registration as registration  # pylint: disable=g-import-not-at-top
  captured = []
  original = lowering.lower_jaxpr_to_triton_module

  def capture(*args, **kwargs):
    result = original(*args, **kwargs)
    captured.append(result.module.operation.get_asm(enable_debug_info=False))
    return result

  registration.lowering.lower_jaxpr_to_triton_module = capture
  try:
    jax.jit(fn).trace(*shapes).lower(lowering_platforms=("cuda",))
  finally:
    registration.lowering.lower_jaxpr_to_triton_module = original
  if len(captured) != 1:
    raise RuntimeError(f"expected one pallas_call, lowered {len(captured)}")
  return captured[0]


def counter_update_case(args):
  from jaxnoise.ops.ternary import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_update  # pylint: disable=g-import-not-at-top
  if args.module:  # A frozen copy of the kernel (before/after counts in one tree).
    from benchmarks import _harness  # pylint: disable=g-import-not-at-top
    pallas_triton_update = _harness.frozen_module(args.module)
  out_features, in_features = args.dims
  dtype = jnp.dtype(args.dtype)
  config = config_lib.CounterUpdateConfig.get_heuristics_config((out_features, in_features), dtype)

  def fn(packed, scale, v, grad, hyper, seed):
    return pallas_triton_update.counter_update(packed, scale, v, grad, hyper, seed, C=11,
                                               lagged=False, config=config)

  spec = jax.ShapeDtypeStruct
  shapes = (spec((out_features, 3 * in_features // 4), jnp.uint8),
            spec((out_features,), jnp.float32), spec((out_features,), jnp.float32),
            spec((out_features, in_features), dtype), spec((4,), jnp.float32),
            spec((1,), jnp.uint32))
  # One program: block_rows whole rows (whole-row configs hold the row in registers).
  elements = config.block_rows * in_features
  return fn, shapes, config, elements


def low_rank_case(args):
  from jaxnoise import noise as noise_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import pallas_triton_low_rank  # pylint: disable=g-import-not-at-top
  pop, out_features, in_features = args.dims
  dtype = jnp.dtype(args.dtype)
  config = config_lib.low_rank_linear_heuristics(1, in_features, out_features, args.rank)

  def fn(x, weight, seeds):
    return pallas_triton_low_rank.low_rank_perturbed_linear(
        x, weight, None, seeds, jnp.float32(0.01), 0, kind=noise_lib.get_kind(args.kind),
        antithetic=True, out_dtype=dtype, rank=args.rank)

  spec = jax.ShapeDtypeStruct
  shapes = (spec((pop, 1, in_features), dtype), spec((out_features, in_features), dtype),
            spec((pop,), jnp.uint32))
  # The PTX holds each loop body once: one step of the reduce loop and one of the emit loop,
  # rank factor values per element of each (an antithetic pair shares them).
  elements = args.rank * (config.block_reduce + config.block_emit)
  return fn, shapes, config, elements


def reduce_metric_case(args):
  from jaxnoise import noise as noise_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import pallas_triton  # pylint: disable=g-import-not-at-top
  pop, n_params = args.dims
  kind = noise_lib.get_kind(args.kind)
  config = config_lib.reduce_metric_heuristics(n_params, pop // 2, kind)

  def fn(center, seeds):
    return pallas_triton.reduce_metric(center, seeds, jnp.float32(0.01), 0, kind=kind,
                                       antithetic=True, config=config)

  spec = jax.ShapeDtypeStruct
  shapes = (spec((n_params,), jnp.dtype(args.dtype)), spec((pop,), jnp.uint32))
  # The PTX holds the loop body once: one tile of hashed values (an antithetic pair shares
  # each value; both signs are accumulated).
  elements = config.individuals_per_program * config.block_params
  return fn, shapes, config, elements


def matmul_case(args):
  from jaxnoise.ops.ternary import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul  # pylint: disable=g-import-not-at-top
  m_rows, out_features, in_features = args.dims
  dtype = jnp.dtype(args.dtype)
  config = config_lib.MatmulConfig.get_heuristics_config((m_rows, out_features, in_features),
                                                         dtype)
  config = dataclasses.replace(config, **parse_overrides(args.set))

  def fn(x, packed, scale):
    return pallas_triton_matmul.ternary_matmul(x, packed, scale, C=11, out_dtype=dtype,
                                               config=config)

  spec = jax.ShapeDtypeStruct
  shapes = (spec((m_rows, in_features), dtype),
            spec((out_features, 3 * in_features // 4), jnp.uint8),
            spec((out_features,), jnp.float32))
  # The PTX holds the reduction's step once: block_n output units x the step's inputs.
  elements = config.block_n * 4 * config.block_groups
  return fn, shapes, config, elements


def matmul_input_grad_case(args):
  from jaxnoise.ops.ternary import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul  # pylint: disable=g-import-not-at-top
  m_rows, out_features, in_features = args.dims
  dtype = jnp.dtype(args.dtype)
  config = config_lib.MatmulConfig.get_input_grad_heuristics_config(
      (m_rows, in_features, out_features), dtype)

  def fn(grad_y, packed, scale):
    return pallas_triton_matmul.ternary_matmul_input_grad(grad_y, packed, scale, C=11,
                                                          out_dtype=dtype, config=config)

  spec = jax.ShapeDtypeStruct
  shapes = (spec((m_rows, out_features), dtype),
            spec((out_features, 3 * in_features // 4), jnp.uint8),
            spec((out_features,), jnp.float32))
  # One step: block_n output rows x 4 * block_groups inputs.
  return fn, shapes, config, config.block_n * 4 * config.block_groups


def decode_case(args):
  from jaxnoise.ops.ternary import pallas_triton  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import config as config_lib  # pylint: disable=g-import-not-at-top
  out_features, in_features = args.dims
  dtype = jnp.dtype(args.dtype)
  config = config_lib.ElementwiseConfig.get_heuristics_config((out_features, in_features), dtype)

  def fn(packed, scale):
    return pallas_triton.ternary_decode(packed, scale, C=11, dtype=dtype, config=config)

  spec = jax.ShapeDtypeStruct
  shapes = (spec((out_features, 3 * in_features // 4), jnp.uint8),
            spec((out_features,), jnp.float32))
  return fn, shapes, config, config.block_rows * 4 * config.block_groups


def operands_case(args):
  """The fused Mosaic forward's first kernel (``x_i B_i`` and the pair's keys), EGGROLL's layer."""
  from jaxnoise import noise as noise_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank as fused  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import pallas_triton_low_rank  # pylint: disable=g-import-not-at-top
  pop, out_features, in_features = args.dims
  kind = noise_lib.get_kind(args.kind)
  config = config_lib.low_rank_linear_heuristics(1, in_features, out_features, args.rank,
                                                 kind.name)
  _, b_layout = pallas_triton_low_rank._factor_layouts(  # pylint: disable=protected-access
      kind, 0, out_features, in_features, args.rank)

  def fn(x, seeds):
    return pallas_triton_low_rank.fused_gemm_operands(
        x, seeds, jnp.float32(0.01), reduce_layout=b_layout, rank=args.rank,
        word_hi=fused.word_hi(kind, 0), config=config)

  spec = jax.ShapeDtypeStruct
  shapes = (spec((pop, 1, in_features), jnp.dtype(args.dtype)), spec((pop,), jnp.uint32))
  # The loop body once: one step's factor values (the pair shares them), rank per feature.
  block = getattr(pallas_triton_low_rank, "operand_block", lambda c, r: c.block_reduce)(
      config, args.rank)
  return fn, shapes, config, args.rank * block


def parse_overrides(pairs) -> dict:
  """``["block_n=64", "interleave_lanes=True"]`` -> ``{"block_n": 64, ...}`` (Python literals)."""
  out = {}
  for pair in pairs or ():
    name, _, value = pair.partition("=")
    out[name.strip()] = ast.literal_eval(value.strip())
  return out


CASES = {"counter_update": counter_update_case, "decode": decode_case,
         "low_rank": low_rank_case, "matmul": matmul_case, "operands": operands_case,
         "matmul_input_grad": matmul_input_grad_case, "reduce_metric": reduce_metric_case}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("case", choices=sorted(CASES))
  parser.add_argument("dims", type=int, nargs="+",
                      help="counter_update, decode: out in; low_rank, operands: pop out in; "
                           "matmul, matmul_input_grad: M out in; reduce_metric: pop params")
  parser.add_argument("dtype")
  parser.add_argument("--rank", type=int, default=1)
  parser.add_argument("--kind", default="binomial")
  parser.add_argument("--out", default="benchmarks/out/offline_ptx")
  parser.add_argument("--module", default=None,
                      help="counter_update: count the kernel of the module at this path (a frozen "
                           "copy of pallas_triton_update.py)")
  parser.add_argument("--set", action="append", metavar="FIELD=VALUE",
                      help="matmul: replace a field of the heuristic config (repeatable), "
                           "e.g. --set block_n=64 --set interleave_lanes=True")
  parser.add_argument("--sass", action="store_true",
                      help="also count SASS (the bundled ptxas and nvdisasm)")
  args = parser.parse_args(argv)
  import triton  # pylint: disable=g-import-not-at-top
  from triton.backends.compiler import GPUTarget  # pylint: disable=g-import-not-at-top
  fn, shapes, config, elements = CASES[args.case](args)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = f"{args.case}_{'x'.join(map(str, args.dims))}_{args.dtype}_r{args.rank}"
  ttir = out / f"{stem}.ttir"
  ttir.write_text(capture_ttir(fn, *shapes))
  compiled = triton.compile(str(ttir), target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=config.num_warps,
                                         num_stages=config.num_stages))
  for name in ("ttgir", "ptx"):
    (out / f"{stem}.{name}").write_text(compiled.asm[name])
  counts = collections.Counter(_INSTRUCTION.findall(compiled.asm["ptx"]))
  total = sum(counts.values())
  threads = 32 * config.num_warps
  print(f"{args.case} {args.dims} {args.dtype}: {config}")
  print(f"{total} PTX instructions per thread; {elements} elements per program over "
        f"{threads} threads: {total * threads / elements:.1f} instructions per element")
  for name, count in counts.most_common(25):
    print(f"  {count:6d}  {name}")
  if args.sass:
    print_sass(compiled, out / f"{stem}.sass", threads, elements)


def print_sass(compiled, path, threads, elements):
  """SASS of the cubin (ptxas as bundled with ``triton``), disassembled by its ``nvdisasm``.

  SASS is what Nsight Compute counts: ptxas fuses logic ops into ``LOP3`` and
  shift-adds into ``LEA``, so it can differ from the PTX count either way. The
  registers per thread come from the bundled ``cuobjdump`` (they bound occupancy).
  """
  import subprocess  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  import triton  # pylint: disable=g-import-not-at-top
  nvdisasm = pathlib.Path(triton.__file__).parent / "backends/nvidia/bin/nvdisasm"
  with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
    cubin.write(compiled.asm["cubin"])
    cubin.flush()
    sass = subprocess.run([str(nvdisasm), "-c", cubin.name], capture_output=True, text=True,
                          check=True).stdout
    usage = subprocess.run([str(nvdisasm.parent / "cuobjdump"), "--dump-resource-usage",
                            cubin.name], capture_output=True, text=True, check=True).stdout
  path.write_text(sass)
  ops = [op.split(".")[0] for op in _SASS.findall(sass)]
  counts = collections.Counter(op for op in ops if op != "NOP")
  total = sum(counts.values())
  registers = re.search(r"REG:(\d+)", usage)
  print(f"{total} SASS instructions per thread (NOPs left out): "
        f"{total * threads / elements:.1f} per element; "
        f"{registers.group(1) if registers else '?'} registers per thread")
  for name, count in counts.most_common(25):
    print(f"  {count:6d}  {name}")


if __name__ == "__main__":
  main()
