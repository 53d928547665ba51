"""The packed matmul's Mosaic GPU kernel compiled for an H100/H200 without a GPU: registers,
register hand-over and the instructions of one pipeline step.

    python benchmarks/offline_wgmma_ternary_sass.py --plugin PATH/xla_cuda_plugin.so \\
        --nvdisasm PATH/nvdisasm 16x4096x4096 16x4096x4096:block_n=256,split_k=8

Each case ``MxOUTxIN[:field=value,...]`` lowers
:func:`jaxnoise.ops.ternary.mosaic_gpu_matmul.ternary_matmul` (bfloat16 ``x``,
``MatmulConfig.wgmma_config``'s tiles with the overrides (config fields, ``substeps``
among them); ``in_flight=2`` sets ``STEPS_IN_FLIGHT`` and ``tma_pads_rows=1``
``TMA_PADS_ROWS``; tiles the config check refuses,
such as ``block_n=256``, are let through) for CUDA on this machine and compiles it with a
PJRT CUDA plugin's XLA (:func:`offline_mosaic_ptxas.compile_deviceless`; ``ptxas`` from
``PATH``). It prints ptxas's registers and spills, the kernel's ``.maxntid`` and its
``setmaxnreg`` values from the PTX, and, with ``--nvdisasm`` (the
``nvidia-cuda-nvdisasm`` wheel), the opcodes of the compute warpgroups' main loop: the
SASS block that ends with the ``HGMMA`` instructions and branches back (``--show-loop``:
its instructions).

Found with it (session 34, ptxas 13.5, jax 0.10.2 lowering, the XLA of
``jax-cuda13-pjrt`` 0.11.2): two compute warpgroups run at 168 registers
(``.maxntid 384``; ``setmaxnreg`` 40 / 232), four at 96 (``.maxntid 640``;
40 / 112); one pipeline step is 212 instructions a thread at 16 rows. Session 36: with
two steps in flight, ptxas reuses the last ``HGMMA``'s A registers for the next step's
loads (undefined behaviour in PTX; ``--show-loop`` at ``256x4096x4096:in_flight=2``).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def lower(case: str) -> str:
  """The lowered text (for CUDA) of ``case``, ``MxOUTxIN[:field=value,...]``."""
  sys.path.insert(0, os.path.dirname(HERE))
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from jaxnoise.ops.ternary import mosaic_gpu_matmul  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary.config import matmul as matmul_config  # pylint: disable=g-import-not-at-top

  dims, _, fields = case.partition(":")
  m_rows, n_out, n_in = (int(d) for d in dims.split("x"))
  overrides = {name: int(value) for name, _, value in
               (field.partition("=") for field in filter(None, fields.split(",")))}
  saved = (mosaic_gpu_matmul.STEPS_IN_FLIGHT, matmul_config.WGMMA_BLOCK_NS,
           mosaic_gpu_matmul.TMA_PADS_ROWS)
  try:  # the tiles the config check refuses are let through while this case lowers
    mosaic_gpu_matmul.STEPS_IN_FLIGHT = overrides.pop("in_flight", saved[0])
    mosaic_gpu_matmul.TMA_PADS_ROWS = bool(overrides.pop("tma_pads_rows", saved[2]))
    matmul_config.WGMMA_BLOCK_NS = (128, 256)
    config = dataclasses.replace(
        matmul_config.MatmulConfig.wgmma_config((m_rows, n_out, n_in)), **overrides)
    fn = jax.jit(functools.partial(mosaic_gpu_matmul.ternary_matmul, C=11,
                                   out_dtype=jnp.bfloat16, config=config))
    avals = (jax.ShapeDtypeStruct((m_rows, n_in), jnp.bfloat16),
             jax.ShapeDtypeStruct((n_out, 3 * n_in // 4), jnp.uint8),
             jax.ShapeDtypeStruct((n_out,), jnp.float32))
    return fn.trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  finally:
    (mosaic_gpu_matmul.STEPS_IN_FLIGHT, matmul_config.WGMMA_BLOCK_NS,
     mosaic_gpu_matmul.TMA_PADS_ROWS) = saved


def main_loop(sass: str) -> list[str]:
  """The SASS lines of the loop whose body holds the ``HGMMA``s (its label to its branch)."""
  lines = sass.splitlines()
  last = max(i for i, line in enumerate(lines) if "HGMMA" in line)
  branch = next(i for i in range(last, len(lines)) if re.search(r"\bBRA\b", lines[i]))
  label = re.search(r"`\((\.L_x_\d+)\)", lines[branch]).group(1)
  start = next(i for i, line in enumerate(lines) if line.startswith(label + ":"))
  return lines[start:branch + 1]


def main_loop_opcodes(sass: str) -> collections.Counter:
  """Opcodes of :func:`main_loop`."""
  counts = collections.Counter()
  for line in main_loop(sass):
    match = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
    if match:
      counts[match.group(2).split(".")[0]] += 1
  return counts


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--plugin", required=True, help="xla_cuda_plugin.so of jax-cuda13-pjrt")
  parser.add_argument("--nvdisasm", help="nvdisasm, for the main loop's opcodes")
  parser.add_argument("--show-loop", action="store_true", help="print the main loop's SASS")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("cases", nargs="*", default=["16x4096x4096"])
  args = parser.parse_args(argv)
  if args.child:
    sys.path.insert(0, HERE)
    from offline_mosaic_ptxas import compile_deviceless  # pylint: disable=g-import-not-at-top
    compile_deviceless(args.plugin, lower(args.child))
    return
  for case in args.cases:
    with tempfile.TemporaryDirectory() as dump:
      env = {**os.environ, "MOSAIC_GPU_DUMP_PTXAS": "1", "MOSAIC_GPU_DUMP_PTX": "1",
             "MOSAIC_GPU_DUMP_TO": dump}
      subprocess.run([sys.executable, os.path.abspath(__file__), "--plugin", args.plugin,
                      "--child", case], env=env, capture_output=True, timeout=600, check=False)
      ptxas = "".join(open(f, encoding="utf-8").read() for f in glob.glob(f"{dump}/*.ptxas"))
      ptx_files = sorted(glob.glob(f"{dump}/*.ptx"))
      if not ptx_files:
        print(f"{case}: no PTX (the lowering or the compile failed)")
        continue
      ptx = open(ptx_files[0], encoding="utf-8").read()
      registers = re.search(r"Used (\d+) registers", ptxas)
      spills = re.search(r"(\d+) bytes spill stores", ptxas)
      threads = re.search(r"\.maxntid (\d+)", ptx).group(1)
      handover = re.findall(r"setmaxnreg\.(\w+)\.sync\.aligned\.u32\s+(\d+)", ptx)
      line = (f"{case}: registers {registers.group(1) if registers else '?'}, spill bytes "
              f"{spills.group(1) if spills else '?'}, maxntid {threads}, setmaxnreg {handover}")
      if args.nvdisasm:
        cubin = os.path.join(dump, "kernel.cubin")
        subprocess.run(["ptxas", "-arch=sm_90a", "-O3", ptx_files[0], "-o", cubin], check=True)
        sass = subprocess.run([args.nvdisasm, "-c", cubin], check=True, capture_output=True,
                              text=True).stdout
        counts = main_loop_opcodes(sass)
        line += f"\n  main loop: {sum(counts.values())} instructions {dict(counts.most_common())}"
        if args.show_loop:
          line += "\n" + "\n".join(main_loop(sass))
      print(line, flush=True)


if __name__ == "__main__":
  main()
