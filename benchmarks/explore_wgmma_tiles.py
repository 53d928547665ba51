"""The packed matmul's Mosaic GPU kernel beyond the heuristic's tiles (Hopper only).

Session 34's question: where does ``MatmulConfig(method="wgmma")`` lose time?
Each ``(M, out, in)`` case times, in device time (CUPTI) and side by side:

* a dense matmul in ``x``'s dtype (the target's reference) and the heuristic
  among the Triton paths alone (what the library ran before the kernel);
* the kernel at :meth:`MatmulConfig.wgmma_config`'s tiles with the default
  steps in flight (``base``);
* from 129 rows, ``bm128`` (or ``bm256``): the other of the two widest batch
  tiles at the same number of programs (the heuristic takes 256 since
  session 35: each program's codes decoded once for 256 rows, not twice);
* the split along ``in`` halved and doubled;
* ``substeps2`` (or ``substeps1``): the other number of 64-deep steps a pipeline buffer
  (``MatmulConfig.substeps``) at the same steps in buffers (the same shared memory): with
  two, A alternates between two register sets (the heuristic's choice up to 16-row tiles
  since session 37). Two steps in flight on one register set (session 35's
  ``STEPS_IN_FLIGHT = 2``) are undefined behaviour in PTX and no longer a variant;
* ``tma_rows``: where x's rows are short of the batch tile (and fewer than 8 or a
  multiple of 8), the other way of padding them (``mosaic_gpu_matmul.TMA_PADS_ROWS``:
  XLA's pad, or the TMA reading past the last row);
* where the heuristic splits ``in``, the other way of summing the slabs
  (``mosaic_gpu_matmul.REDUCE_IN_CLUSTER``, session 36): ``cluster_sum`` (in the
  kernel, through a cluster's shared memory) or ``xla_sum``; where the partials do not
  fit beside the stages, ``stages2``: 2 stages, summed in a cluster.

Every variant is screened against the reference first. ``--variants`` keeps only the
labels named (``dense`` and ``triton`` are the references). Example::

  PYTHONPATH=. python3 benchmarks/explore_wgmma_tiles.py --cases 16x4096x4096,256x8192x8192 \
      --variants dense,triton,base,substeps1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

import jax
import jax.numpy as jnp

from benchmarks import _harness
from benchmarks.bench_ternary import C, L2_BYTES, make_state
from jaxnoise.ops.ternary import mosaic_gpu_matmul
from jaxnoise.ops.ternary import pallas_triton_matmul
from jaxnoise.ops.ternary import reference
from jaxnoise.ops.ternary.config import MatmulConfig


def _with_programs(config: MatmulConfig, shape, dtype, programs: int = 128) -> MatmulConfig:
  """``config`` with its split along ``in`` doubled until ``programs`` programs (as the
  heuristic's rule, for other tiles)."""
  m_rows, n_out, n_in = shape
  rows = 3 * m_rows if jnp.dtype(dtype).itemsize == 4 else m_rows
  steps = n_in // 64
  tiles = n_out // config.block_n * -(-rows // config.block_m)
  split = 1
  while tiles * split < programs and steps % (2 * split) == 0 and steps // (2 * split) >= 4:
    split *= 2
  return dataclasses.replace(config, split_k=split,
                             num_stages=max(1, min(config.num_stages, steps // split)))


def variants(shape, dtype) -> list[tuple[str, MatmulConfig]]:
  """``(label, config)`` of one case, the heuristic's tiles first (labels ``xla_sum`` /
  ``cluster_sum*`` run with the cluster's sum off / on)."""
  base = MatmulConfig.wgmma_config(shape, dtype)
  rows = 3 * shape[0] if jnp.dtype(dtype).itemsize == 4 else shape[0]
  steps = shape[2] // 64
  out = [("base", base)]
  if rows > 128:  # the other of the two widest batch tiles, at the same number of programs
    other = 128 if base.block_m == 256 else 256
    tiles = _with_programs(dataclasses.replace(base, block_m=other, num_stages=4), shape, dtype)
    if steps // tiles.split_k % base.substeps == 0:
      out.append((f"bm{other}", tiles))
  for split in (base.split_k // 2, base.split_k * 2):
    slab = steps // split if split else 0
    if split and steps % split == 0 and slab >= 2 and slab % base.substeps == 0:
      stages = max(1, min(base.num_stages, slab // base.substeps))
      out.append((f"split{split}", dataclasses.replace(base, split_k=split, num_stages=stages)))
  other = 3 - base.substeps
  if steps // base.split_k % other == 0:
    out.append((f"substeps{other}", base.with_substeps(other)))
  if rows % base.block_m and mosaic_gpu_matmul.tma_can_pad(rows):
    out.append(("tma_rows", base))  # x unpadded (TMA_PADS_ROWS flipped)
  if base.split_k > 1 and jnp.dtype(dtype).itemsize == 2:
    if mosaic_gpu_matmul.REDUCE_IN_CLUSTER:
      out.append(("xla_sum", base))
    elif mosaic_gpu_matmul.cluster_partials_fit(base):
      out.append(("cluster_sum", base))
    else:
      out.append(("cluster_sum_stages2", dataclasses.replace(base, num_stages=2)))
  return out


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--cases", default="16x4096x4096,256x4096x4096,1x4096x4096,"
                      "1024x4096x4096,16x8192x8192,256x8192x8192,4x4096x4096,128x4096x4096",
                      help="MxOUTxIN, in the order run")
  parser.add_argument("--x-dtype", default="bfloat16")
  parser.add_argument("--inner", type=int, default=3, help="calls per timed group")
  parser.add_argument("--budget", type=float, default=300.0, help="seconds; skips the rest")
  parser.add_argument("--out", default=None, help="JSON file")
  parser.add_argument("--variants", default=None,
                      help="comma-separated labels to run (dense, triton, base, ...); all if "
                           "unset")
  args = parser.parse_args(argv)
  if mosaic_gpu_matmul.unsupported_reason(1, 128, 64, jnp.bfloat16) is not None:
    raise SystemExit("needs a Hopper GPU")
  explore(args)


def explore(args) -> None:
  """Times every case's variants (``main``'s arguments)."""
  dtype = jnp.dtype(args.x_dtype)
  default_in_cluster = mosaic_gpu_matmul.REDUCE_IN_CLUSTER
  default_tma_rows = mosaic_gpu_matmul.TMA_PADS_ROWS
  wanted = None if args.variants is None else set(args.variants.split(","))
  cases = [tuple(int(d) for d in case.split("x")) for case in args.cases.split(",")]
  start = time.time()
  results = {"facts": _harness.device_facts(), "rows": []}

  def record(row):
    results["rows"].append(row)
    kernel_us = {k[:60]: round(v * 1e3 / args.inner, 2) for k, v in row.pop("kernels", {}).items()}
    print(f"M={row['M']:<5} {row['shape']:<10} {row['label']:<16} "
          f"{row.get('device_us', float('nan')):8.1f} us  {row.get('note', '')}  {kernel_us}",
          flush=True)
    row["kernels_us"] = kernel_us

  weights_by_shape = {}
  for full in cases:
    m_rows, shape = full[0], full[1:]
    if shape not in weights_by_shape:
      copies = max(args.inner, min(8, -(-2 * L2_BYTES // (shape[0] * shape[1] * 3 // 4))))
      weights_by_shape = {shape: [make_state(jax.random.key(10 + i), *shape)[:2]
                                  for i in range(copies)]}
    weights = weights_by_shape[shape]
    xs = [jax.random.normal(jax.random.key(100 + i), (m_rows, shape[1]), dtype)
          for i in range(args.inner)]
    y_ref = reference.ternary_matmul_reference(xs[0], *weights[0], C=C, out_dtype=jnp.float32)

    def timed(label, call, operands, screen=True, **extra):
      if time.time() - start > args.budget:
        return
      if wanted is not None and label.split("_")[0] not in wanted and label not in wanted:
        return
      row = {"M": m_rows, "shape": f"{shape[0]}x{shape[1]}", "label": label, **extra}
      jitted = jax.jit(lambda xs, ws: [call(x, *ws[i % len(ws)]) for i, x in enumerate(xs)])
      try:
        if screen:
          y = jitted(xs, operands)[0].astype(jnp.float32)
          err = float(jnp.abs(y - y_ref).max() / jnp.abs(y_ref).max())
          row["relative_error"] = err
          if not err < 1e-2:
            row["note"] = f"EXCLUDED error {err:.2e}"
            record(row)
            return
        busy = _harness.device_busy(jitted, xs, operands, calls=3)
        row["device_us"] = busy["busy_ms"] * 1e3 / args.inner
        row["kernels"] = busy["kernels"]
      except Exception as e:  # pylint: disable=broad-except
        row["note"] = f"{type(e).__name__}: {str(e)[:200]}"
      record(row)

    dense = [(reference.ternary_decode_reference(p, s, C, dtype),) for p, s in weights]
    timed("dense", lambda x, w: jnp.dot(x, w.T, preferred_element_type=jnp.float32
                                         ).astype(dtype), dense, screen=False)
    del dense
    triton = MatmulConfig.get_heuristics_config(full, dtype, wgmma=False)  # Triton paths only
    timed(f"triton_{triton.method}", lambda x, p, s: pallas_triton_matmul.ternary_matmul(
        x, p, s, C=C, out_dtype=dtype, config=triton), weights)
    for label, config in variants(full, dtype):
      if label.startswith(("xla_sum", "cluster_sum")):
        mosaic_gpu_matmul.REDUCE_IN_CLUSTER = label.startswith("cluster_sum")
      if label == "tma_rows":
        mosaic_gpu_matmul.TMA_PADS_ROWS = not default_tma_rows
      timed(label, lambda x, p, s, config=config: pallas_triton_matmul.ternary_matmul(
          x, p, s, C=C, out_dtype=dtype, config=config), weights,
          config=dict(block_m=config.block_m, block_n=config.block_n,
                      split_k=config.split_k, num_stages=config.num_stages,
                      substeps=config.substeps,
                      in_kernel_sum=mosaic_gpu_matmul.reduces_in_kernel(config, dtype)))
      mosaic_gpu_matmul.REDUCE_IN_CLUSTER = default_in_cluster
      mosaic_gpu_matmul.TMA_PADS_ROWS = default_tma_rows
  if args.out:
    pathlib.Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
  main()
