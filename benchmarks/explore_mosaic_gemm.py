"""Can a Mosaic GPU GEMM carry the low-rank term in its epilogue at XLA's speed? (GPU probe)

EGGROLL's benchmark shape (1024 members x one row, an (8192, 8192) bf16
layer, antithetic pairs, rank 1, binomial): session 4 found the library's
path (XLA's GEMM, then a pass that adds ``s_i (x_i B_i) A_i^T``) capped near
94% of the GEMM alone by that pass's memory traffic, and a Pallas *Triton*
GEMM capped at 93% of XLA's. This probe asks the same of Pallas' Mosaic GPU
backend (wgmma, TMA, warp specialisation), timed in device time against the
floor in one process:

* ``xla``: the floor, ``x @ W.T`` in bf16;
* ``jax hopper``: ``jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu`` on
  a materialised ``W.T`` (JAX's own Hopper GEMM), a few tilings;
* ``mosaic``: a persistent warp-specialised GEMM (the library's fused forward,
  :mod:`jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank`, grew out of it) reading ``W`` as stored
  (``(out, in)``, K-major) through a transposed shared-memory view, with and
  without the epilogue that hashes ``A_i`` per output element and adds
  ``coef_i * q(A_i)``; ``coef_i = s_i sigma scale^2 (x_i . B_i)`` comes from
  XLA here (per-row multipliers and increments of the hash, too), so the
  epilogue's cost is what is measured. The epilogue's output is checked
  against the library's own factors (:func:`jaxnoise.noise.low_rank_factors`).

    python benchmarks/explore_mosaic_gemm.py --out $OUT [--quick]

Lowering alone runs on any machine: ``--lower-only`` lowers every variant for
CUDA without a GPU (the Pallas-to-Mosaic step; the PTX compile is the GPU's).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops import _mosaic  # noqa: E402
from jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank import popcount  # noqa: E402

_U32 = jnp.uint32


@dataclasses.dataclass(frozen=True)
class GemmTiles:
  tile_m: int = 128
  tile_n: int = 128     # per compute warpgroup; a CTA covers 2 * tile_n outputs
  tile_k: int = 64
  stages: int = 4
  epi_n: int = 64       # epilogue store tile: 64 rows x epi_n
  grid_tile_width: int = 4


def _gemm_kernel(x_gmem, w_gmem, mult_gmem, inc_gmem, coef_gmem, out_gmem, *,
                 tiles: GemmTiles, epilogue: bool, col_base: int):
  m, k = x_gmem.shape
  n = w_gmem.shape[0]
  tm, tn, tk = tiles.tile_m, tiles.tile_n, tiles.tile_k
  cta_n = 2 * tn
  swizzle = plgpu.find_swizzle(tk * 2 * 8)
  transforms = (plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle))
  out_swizzle = plgpu.find_swizzle(tiles.epi_n * 2 * 8)
  out_transforms = (plgpu.TilingTransform((8, out_swizzle // 2)),
                    plgpu.SwizzleTransform(out_swizzle))
  m_iters, n_iters, k_iters = m // tm, n // cta_n, k // tk

  def pipeline(body, context):
    return plgpu.emit_pipeline_warp_specialized(
        body, grid=(k_iters,), memory_registers=40,
        in_specs=[
            plgpu.BlockSpec((tm, tk), lambda kk: (0, kk), transforms=transforms,
                            memory_space=plgpu.SMEM),
            plgpu.BlockSpec((cta_n, tk), lambda kk: (0, kk), transforms=transforms,
                            memory_space=plgpu.SMEM),
        ],
        wg_axis="wg", num_compute_wgs=2, max_concurrent_steps=tiles.stages,
        compute_context=context)

  ignore = lambda *_, **__: None

  @functools.partial(
      pl.run_scoped,
      allocs=pipeline(ignore, ignore).get_allocations(x_gmem, w_gmem),
      out_smem=plgpu.SMEM((2, 2, 64, tiles.epi_n), out_gmem.dtype, transforms=out_transforms),
      collective_axes="wg")
  def _scope(allocs, out_smem):
    wg = lax.axis_index("wg")

    @plgpu.nd_loop((m_iters * n_iters,), collective_axes="sm")
    def _tiles(info):
      (linear,) = info.index
      m_idx, n_idx = plgpu.planar_snake(linear, (m_iters, n_iters), 1, tiles.grid_tile_width)
      m0 = m_idx * tm
      n0 = n_idx * cta_n + wg * tn

      def context(eval_pipeline):
        @functools.partial(pl.run_scoped, acc_ref=plgpu.ACC((tm, tn), jnp.float32))
        def _acc(acc_ref):
          eval_pipeline(acc_ref)
          acc = acc_ref[...]
          if epilogue:
            rows = pl.ds(m0, tm)
            mult = _mosaic.load_rows(mult_gmem.at[rows])
            inc = _mosaic.load_rows(inc_gmem.at[rows])
            coef = _mosaic.load_rows(coef_gmem.at[rows])
            cols = plgpu.broadcasted_iota(jnp.int32, (tm, tn), 1, layout=plgpu.Layout.WGMMA)
            word = lax.bitcast_convert_type(cols + n0, _U32) + _U32(col_base)
            h = noise_lib.hash_word(lax.broadcast_in_dim(mult, (tm, tn), [0]),
                                    lax.broadcast_in_dim(inc, (tm, tn), [0]), word)
            ones = lax.bitcast_convert_type(popcount(h) | _U32(0x4B000000), jnp.float32)
            q = ones - jnp.float32(8388624.0)
            acc = acc + lax.broadcast_in_dim(coef, (tm, tn), [0]) * q
          out = acc.astype(out_gmem.dtype)
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)
          epi_n = tiles.epi_n
          for e, (em, en) in enumerate((em, en) for em in range(tm // 64)
                                       for en in range(tn // epi_n)):
            slot = e % 2
            plgpu.wait_smem_to_gmem(1, wait_read_only=True)
            out_smem[wg, slot] = out[em * 64:(em + 1) * 64, en * epi_n:(en + 1) * epi_n]
            plgpu.commit_smem()
            plgpu.copy_smem_to_gmem(
                out_smem.at[wg, slot],
                out_gmem.at[pl.ds(m0 + em * 64, 64), pl.ds(n0 + en * epi_n, epi_n)])

      def mma(_, x_smem, w_smem, acc_ref):
        w_tile = w_smem.at[pl.ds(wg * tn, tn)].transpose((1, 0))
        plgpu.wgmma(acc_ref, x_smem, w_tile)
        plgpu.wgmma_wait(0)
        return acc_ref

      pipeline(mma, context)(x_gmem.at[pl.ds(m0, tm), :],
                             w_gmem.at[pl.ds(n_idx * cta_n, cta_n), :], allocations=allocs)

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def mosaic_gemm(x, w, mult, inc, coef, *, tiles: GemmTiles, epilogue: bool, col_base: int = 0,
                num_sms: int = 132, interpret: bool = False):
  m = x.shape[0]
  n = w.shape[0]
  kernel = plgpu.kernel(
      functools.partial(_gemm_kernel, tiles=tiles, epilogue=epilogue, col_base=col_base),
      out_type=jax.ShapeDtypeStruct((m, n), x.dtype),
      grid=(num_sms,), grid_names=("sm",), num_threads=3, thread_name="wg",
      interpret=interpret or None)
  return kernel(x, w, mult, inc, coef)


def _problem(pop, d, dtype, seed=0):
  kx, kw, ks = jax.random.split(jax.random.key(seed), 3)
  x = jax.random.normal(kx, (pop, d), jnp.float32).astype(dtype)
  w = (jax.random.normal(kw, (d, d), jnp.float32) / np.sqrt(d)).astype(dtype)
  seeds = noise_lib.draw_seeds(ks, pop, antithetic=True)
  return x, w, seeds


def _row_vectors(x, seeds, d, sigma, offset):
  """Per row: the hash keys of A's stream and coef = s_i sigma scale^2 (x_i . b_i)."""
  kind = noise_lib.get_kind("binomial")
  pop = x.shape[0]
  a, b = noise_lib.low_rank_factors(seeds, (d, d), offset, rank=1, kind=kind, antithetic=True)
  # a, b: (pop, d, 1) scaled factors (signs folded into a) -- see low_rank_factors.
  xb = jnp.einsum("pk,pk->p", x.astype(jnp.float32), b[..., 0])
  hi, lo = noise_lib.split_u64(offset)
  word_hi = jnp.full((pop,), hi, _U32)
  mult, inc = noise_lib.stream_keys(noise_lib.pair_seeds(seeds, True), word_hi)
  return a, b, xb, mult, inc, lo


def _variants(quick: bool):
  mosaic = [GemmTiles(128, 128, 64, 4), GemmTiles(128, 128, 64, 3), GemmTiles(128, 64, 64, 6),
            GemmTiles(128, 128, 64, 4, grid_tile_width=8), GemmTiles(128, 128, 128, 2)]
  if quick:
    mosaic = mosaic[:1]
  return mosaic


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--pop", type=int, default=1024)
  parser.add_argument("--d", type=int, default=8192)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--lower-only", action="store_true")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  pop, d, sigma, offset = args.pop, args.d, 0.01, 0
  dtype = jnp.bfloat16
  results = []

  if args.lower_only:
    xs = jax.ShapeDtypeStruct((pop, d), dtype)
    ws = jax.ShapeDtypeStruct((d, d), dtype)
    vu = jax.ShapeDtypeStruct((pop,), _U32)
    vf = jax.ShapeDtypeStruct((pop,), jnp.float32)
    for tiles in _variants(args.quick):
      for epilogue in (False, True):
        f = jax.jit(functools.partial(mosaic_gemm, tiles=tiles, epilogue=epilogue))
        try:
          text = f.trace(xs, ws, vu, vu, vf).lower(lowering_platforms=("cuda",)).as_text()
          print("lowered", tiles, epilogue, len(text))
        except Exception:  # pylint: disable=broad-except
          print("FAILED", tiles, epilogue)
          traceback.print_exc()
    return

  import _harness  # pylint: disable=g-import-not-at-top
  x, w, seeds = _problem(pop, d, dtype)
  a, b, xb, mult, inc, lo = _row_vectors(x, seeds, d, sigma, offset)
  signs = noise_lib.antithetic_signs(pop, True)
  scale = noise_lib.get_kind("binomial").scale
  coef = (sigma * xb * signs * scale).astype(jnp.float32)
  floor_fn = jax.jit(lambda x, w: jnp.dot(x, w.T, preferred_element_type=jnp.float32).astype(dtype))
  exact = jnp.dot(x, w.T, preferred_element_type=jnp.float32)
  want_plain = exact.astype(dtype).astype(jnp.float32)
  want_term = (exact + sigma * xb[:, None] * a[..., 0]).astype(dtype).astype(jnp.float32)

  def record(name, fn, *fargs, want=None):
    entry = {"name": name}
    try:
      got = jax.block_until_ready(fn(*fargs))
      if want is not None:
        diff = jnp.abs(got.astype(jnp.float32) - want)
        entry["max_abs_err"] = float(jnp.max(diff))
        entry["max_rel_err"] = float(jnp.max(diff) / jnp.max(jnp.abs(want)))
      busy = _harness.device_busy(fn, *fargs, calls=20)
      entry["device_ms"] = None if busy is None else busy["busy_ms"]
      entry["kernels"] = None if busy is None else busy["kernels"]
    except Exception as e:  # pylint: disable=broad-except
      entry["error"] = f"{type(e).__name__}: {str(e)[:1500]}"
    results.append(entry)
    print(json.dumps({k: v for k, v in entry.items() if k != "kernels"}), flush=True)

  record("xla floor", floor_fn, x, w, want=want_plain)
  try:
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hopper  # pylint: disable=g-import-not-at-top
    wt = jnp.asarray(w.T)
    for tm, tn, width, dim in [(128, 128, 4, "N"), (128, 256, 8, "N"), (128, 128, 8, "M"),
                               (256, 128, 4, "M")][: 1 if args.quick else 4]:
      config = hopper.TuningConfig(tile_m=tm, tile_n=tn, tile_k=64, max_concurrent_steps=4,
                                   grid_tile_width=width,
                                   wg_dimension=getattr(hopper.MatmulDimension, dim))
      record(f"jax hopper {tm}x{tn} width {width} wg {dim}",
             jax.jit(functools.partial(hopper.matmul, c=None, config=config)), x, wt,
             want=want_plain)
  except Exception as e:  # pylint: disable=broad-except
    results.append({"name": "jax hopper", "error": repr(e)[:500]})
    print("jax hopper failed:", repr(e)[:500])
  for tiles in _variants(args.quick):
    for epilogue in (False, True):
      fn = jax.jit(functools.partial(mosaic_gemm, tiles=tiles, epilogue=epilogue, col_base=lo,
                                     interpret=jax.default_backend() == "cpu",
                                     num_sms=132 if jax.default_backend() != "cpu" else 2))
      record(f"mosaic {tiles} epilogue={epilogue}", fn, x, w, mult, inc, coef,
             want=want_term if epilogue else want_plain)
  _harness.write_json(os.path.join(args.out, "explore_mosaic_gemm.json"),
                      {"facts": _harness.device_facts(), "results": results})


if __name__ == "__main__":
  main()
