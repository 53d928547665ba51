"""ptxas's report on the fused Mosaic GPU GEMM, without a GPU: registers, spills, wgmma serialisation.

    python benchmarks/offline_mosaic_ptxas.py --plugin PATH/xla_cuda_plugin.so \\
        bf16:1 bf16:4 f32:1 [--field gemm_stages=3 ...] [--offset 4294967301] [--rows 64]

Each case ``DTYPE:RANK`` lowers :func:`mosaic_gpu_low_rank.fused_forward` for
EGGROLL's layer (1024 members x one row, (8192, 8192), antithetic, no bias;
``LowRankLinearConfig()`` with the ``--field`` overrides; ``--rows R``: members
of ``R`` rows instead, ``1024 / R`` of them, with a bias, the GEMM forming
``x B`` itself unless ``--field gemm_member_dots=False``) for CUDA on this
machine, and compiles it for an H200 with the XLA of a PJRT CUDA plugin
(:class:`compile_offline.DevicelessCompiler`; ``jax-cuda13-pjrt`` 0.11.2 is the
GPU machine's). The plugin compiles the Mosaic GPU module itself (LLVM, then
``ptxas`` from ``PATH``) and prints ptxas's verbose report when
``MOSAIC_GPU_DUMP_PTXAS`` is set; it then fails to link the host launcher
(``Symbols not found: mosaic_gpu_launch_kernel``), which needs a device, and
that error is ignored. Per case one line: registers, spill bytes, ptxas's own
compile time and the whole compile's (lowering excluded), and the codes of
ptxas's performance notes, e.g. ``C7515`` ("wgmma.mma_async instructions
are serialized due to non wgmma instructions defining accumulator registers
of a wgmma between start and end of the pipeline stage").

``--sass DIR`` also keeps each case's PTX (``MOSAIC_GPU_DUMP_PTX``) and, where
the ``triton`` wheel's ``nvdisasm`` is installed, assembles it with ``ptxas``
(``PATH``) and disassembles it: ``DIR/CASE.sass``, with a count of its
``HGMMA``, ``BAR.SYNC`` and ``WARPGROUP.DEPBAR`` instructions (session 28 read
the codes-ahead main loop this way).

Found with it (session 27, ``benchmarks/RESULTS.md``): adding a rank
component's noise to the accumulators inside the main loop (commit
``449a9db``'s ``mainloop_noise``, removed) gets C7515 and 212-2448 bytes of
spills, where the epilogue schedule has no note and 8-16 bytes; session 14's per-step noise
(2.5-10 µs slower on an H200) most likely met the same.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DTYPES = {"bf16": "bfloat16", "f32": "float32"}


def lower_case(case: str, fields: dict, offset: int = 0, rows: int = 1,
               members: int | None = None):
  """``jax.stages.Lowered`` (for CUDA) of the fused forward of EGGROLL's layer for ``case``."""
  sys.path.insert(0, os.path.dirname(HERE))
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from jaxnoise import noise as noise_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank as fused  # pylint: disable=g-import-not-at-top

  dtype_name, rank = case.split(":")
  dtype, rank = jnp.dtype(DTYPES[dtype_name]), int(rank)
  pop, width = members or 1024 // rows, 8192
  n_rows = pop // 2 * rows  # the per-row operands' length
  config = dataclasses.replace(config_lib.LowRankLinearConfig(fused_gemm=True), **fields)

  binomial = noise_lib.get_kind("binomial")
  common = dict(kind=binomial, rank=rank, out_dtype=dtype, config=config, num_sms=132)
  if config.gemm_member_dots and fused.member_dots_supported(binomial, rank, rows):
    # As the library dispatches: the GEMM forms x B itself from the pairs' factor rows.
    def forward(x, weight, bias, seeds, sigma):
      operands = fused.member_dot_operands(seeds, sigma, kind=binomial, offset=offset,
                                           weight_shape=weight.shape, rank=rank, dtype=x.dtype)
      return fused.fused_forward(x, weight, bias, offset, operands, **common)

    operand_avals = [((pop,), jnp.uint32), ((), jnp.float32)]
  else:
    def forward(x, weight, bias, keys, coef, bias_coef):
      return fused.fused_forward(x, weight, bias if rows > 1 else None, offset,
                                 (keys, coef, bias_coef), **common)

    operand_avals = [((2, n_rows), jnp.uint32), ((rank, 2, n_rows), jnp.float32),
                     ((2, n_rows), jnp.float32)]
  avals = [jax.ShapeDtypeStruct(shape, kind) for shape, kind in [
      ((pop, rows, width), dtype), ((width, width), dtype), ((width,), jnp.float32),
      *operand_avals]]
  return jax.jit(forward).trace(*avals).lower(lowering_platforms=("cuda",))


def _compile_one(plugin: str, case: str, fields: dict, offset: int, rows: int,
                 members: int | None = None) -> None:
  """In a subprocess: lower one case and compile it deviceless (ptxas prints to stderr)."""
  compile_deviceless(plugin, lower_case(case, fields, offset, rows, members).as_text())


def compile_deviceless(plugin: str, lowered_text: str) -> None:
  """Compile a module lowered for CUDA with the plugin's XLA, no device; print the seconds.

  The Mosaic GPU module is compiled (ptxas included, its report on stderr when
  ``MOSAIC_GPU_DUMP_PTXAS`` is set) before the host launcher fails to link, which
  needs a device: that error is ignored.
  """
  sys.path.insert(0, HERE)
  from jax._src import compiler  # pylint: disable=g-import-not-at-top

  import compile_offline  # pylint: disable=g-import-not-at-top

  options = compiler.get_compile_options(num_replicas=1, num_partitions=1)
  start = time.perf_counter()
  try:
    compile_offline.DevicelessCompiler(plugin).compile(lowered_text.encode(),
                                                       options.SerializeAsString())
  except RuntimeError as error:  # the host launcher needs a device; ptxas has run by then
    if "mosaic_gpu" not in str(error):
      raise
  print(f"compile seconds {time.perf_counter() - start:.2f}", flush=True)


def parse_field(text: str) -> tuple[str, object]:
  """``"gemm_stages=3"`` -> ``("gemm_stages", 3)`` (ints, ``True`` / ``False``)."""
  name, _, value = text.partition("=")
  if value in ("True", "False"):
    return name, value == "True"
  return name, int(value)


def summary(report: str) -> dict:
  """Registers, spill bytes, compile seconds (ptxas's, the whole compile's) and
  performance-note codes from ptxas's verbose output and :func:`_compile_one`'s line."""
  registers = re.search(r"Used (\d+) registers", report)
  spills = re.search(r"(\d+) bytes spill stores", report)
  ptxas_ms = re.search(r"Compile time = ([\d.]+) ms", report)
  whole = re.search(r"compile seconds ([\d.]+)", report)
  return {"registers": int(registers.group(1)) if registers else None,
          "spill_bytes": int(spills.group(1)) if spills else 0,
          "ptxas_s": round(float(ptxas_ms.group(1)) / 1e3, 2) if ptxas_ms else None,
          "compile_s": float(whole.group(1)) if whole else None,
          "notes": sorted(set(re.findall(r"\((C\d+)\) Potential Performance Loss", report)))}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--plugin", required=True, help="xla_cuda_plugin.so of jax-cuda13-pjrt")
  parser.add_argument("--field", action="append", default=[],
                      help="LowRankLinearConfig override, e.g. gemm_stages=3")
  parser.add_argument("--offset", type=int, default=0, help="the layer's first noise index")
  parser.add_argument("--rows", type=int, default=1,
                      help="rows per member (1, or a multiple of 64)")
  parser.add_argument("--sass", metavar="DIR",
                      help="keep the PTX and write the SASS of each case here")
  parser.add_argument("--members", type=int, default=None,
                      help="members (default 1024 / rows); more tiles than two per "
                           "multiprocessor let gemm_pipelined_tiles=True take effect")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("cases", nargs="*", default=["bf16:1", "bf16:4", "f32:1", "f32:4"])
  args = parser.parse_args(argv)
  fields = dict(parse_field(text) for text in args.field)
  if args.child:
    _compile_one(args.plugin, args.child, fields, args.offset, args.rows, args.members)
    return
  for case in args.cases:
    command = [sys.executable, os.path.abspath(__file__), "--plugin", args.plugin,
               "--offset", str(args.offset), "--rows", str(args.rows), "--child", case] + (
                   ["--members", str(args.members)] if args.members else []) + [
                   f"--field={text}" for text in args.field]
    env = {**os.environ, "MOSAIC_GPU_DUMP_PTXAS": "1"}
    dump = None
    if args.sass:
      dump = os.path.join(os.path.abspath(args.sass), case.replace(":", "_"))
      os.makedirs(dump, exist_ok=True)
      env.update(MOSAIC_GPU_DUMP_PTX="1", MOSAIC_GPU_DUMP_TO=dump)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False,
                            env=env)
    output = result.stdout + result.stderr
    if dump:  # Mosaic writes ptxas's report to the dump folder then
      output += "".join(open(os.path.join(dump, name), encoding="utf-8").read()
                        for name in sorted(os.listdir(dump)) if name.endswith(".ptxas"))
    report = "\n".join(line for line in output.splitlines()
                       if line.startswith(("ptxas", "compile seconds")))
    if not report:
      print(f"{case}: no ptxas report (exit {result.returncode})\n{result.stderr[-2000:]}")
      continue
    print(f"{case} offset={args.offset} rows={args.rows} {' '.join(args.field)}: "
          f"{summary(report)}", flush=True)
    if dump:
      print(f"  {disassemble(dump)}", flush=True)


def disassemble(dump: str) -> str:
  """SASS of the PTX that Mosaic dumped in ``dump`` (``ptxas`` on ``PATH``, the triton
  wheel's ``nvdisasm``), written beside it; a line naming the file and some counts."""
  ptx = sorted(name for name in os.listdir(dump) if name.endswith(".ptx"))
  if not ptx:
    return f"no PTX in {dump}"
  try:
    import triton  # pylint: disable=g-import-not-at-top
  except ImportError:
    return f"PTX in {dump} (pip install triton for its nvdisasm to read the SASS)"
  nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/nvdisasm")
  stem = os.path.join(dump, ptx[0][:-4])
  try:
    subprocess.run(["ptxas", "-arch=sm_90a", "-O3", stem + ".ptx", "-o", stem + ".cubin"],
                   check=True, capture_output=True)
    sass = subprocess.run([nvdisasm, "-c", stem + ".cubin"], check=True, capture_output=True,
                          text=True).stdout
  except (OSError, subprocess.CalledProcessError) as error:
    return f"PTX in {dump}; no SASS ({error})"
  with open(stem + ".sass", "w", encoding="utf-8") as f:
    f.write(sass)
  counts = {op: len(re.findall(rf"\b{re.escape(op)}\b", sass))
            for op in ("HGMMA", "BAR.SYNC", "WARPGROUP.DEPBAR")}
  return f"{stem}.sass: {counts}"


if __name__ == "__main__":
  main()
