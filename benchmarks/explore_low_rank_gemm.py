"""Where the low-rank forward's last 10% goes: variants timed side by side (GPU).

EGGROLL's benchmark (1024 members x one row, an (8192, 8192) layer, antithetic
pairs), with every variant interleaved round by round against the floor (the
XLA GEMM ``x W^T``), so clock drift cancels in the ratios:

* ``kernel split=s``: the library's path (XLA GEMM, then the low-rank kernel
  reading the GEMM output) with ``emit_split`` programs per pair;
* ``unfused``: the kernel writes the noise term and XLA adds it (does XLA
  fold the add into the GEMM as ``beta = 1``? the optimized HLO is saved);
* ``pallas gemm``: a Pallas (Triton) GEMM alone, several tilings: can it
  match XLA's GEMM at all?
* ``pallas gemm+epilogue``: that GEMM adding ``s_i (x_i B_i) A_i^T`` in its
  epilogue (``x_i B_i`` from an XLA reduction; ``A_i`` hashed per tile).

    python benchmarks/explore_low_rank_gemm.py --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxnoise  # noqa: E402
from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops import _pallas  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402

_F32 = jnp.float32
_U32 = jnp.uint32


def _gemm_kernel(x_ref, w_ref, xb_ref, seed_ref, o_ref, *, block_k, n_k, tf32, rank, kind,
                 offset, out_features, in_features):
  precision = None if (tf32 or x_ref.dtype != _F32) else jax.lax.Precision.HIGHEST

  def body(k, acc):
    a = x_ref[:, pl.ds(k * block_k, block_k)]
    b = w_ref[:, pl.ds(k * block_k, block_k)]
    return acc + jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                                     preferred_element_type=_F32, precision=precision)

  bm, bn = o_ref.shape
  acc = jax.lax.fori_loop(0, n_k, body, jnp.zeros((bm, bn), _F32))
  if rank:
    cols = (pl.program_id(1) * bn + jax.lax.broadcasted_iota(jnp.int32, (1, bn), 1)).astype(_U32)
    seeds = seed_ref[...][:, None]
    for c in range(rank):
      lo = cols + _U32(offset + c * (out_features + in_features))
      q = noise_lib.unscaled_noise(seeds, jnp.zeros_like(lo), lo, kind, high_word=False)
      acc = acc + xb_ref[c][:, None] * q
  o_ref[...] = acc.astype(o_ref.dtype)


def pallas_gemm(x, w, xb=None, row_seeds=None, *, bm, bn, bk, warps, stages, rank=0,
                kind="binomial", offset=0, tf32=True):
  m, k = x.shape
  n = w.shape[0]
  kind = noise_lib.get_kind(kind)
  if xb is None:
    xb = jnp.zeros((1, m), _F32)
    row_seeds = jnp.zeros((m,), _U32)
  kernel = functools.partial(_gemm_kernel, block_k=bk, n_k=k // bk, tf32=tf32, rank=rank,
                             kind=kind, offset=offset, out_features=n, in_features=k)
  return _pallas.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
      grid=(m // bm, n // bn),
      in_specs=[pl.BlockSpec((bm, k), lambda i, j: (i, 0)),
                pl.BlockSpec((bn, k), lambda i, j: (j, 0)),
                pl.BlockSpec((xb.shape[0], bm), lambda i, j: (0, i)),
                pl.BlockSpec((bm,), lambda i, j: (i,))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
      compiler_params=_pallas.compiler_params(warps, stages),
      interpret=jax.default_backend() != "gpu",
      name="explore_gemm",
  )(x, w, xb, row_seeds)


def scaled_xb(x, seeds, sigma, rank, kind, offset, out_features, in_features):
  """``s_i * sigma * scale^2 / sqrt(r) * (x_i . b_c)`` of every row, ``(pop, r)`` (batch 1)."""
  kind_ = noise_lib.get_kind(kind)
  pairs = seeds[::2]
  factors = noise_lib.factor_block_noise(pairs, offset, (out_features, in_features), rank, kind_)
  b = factors[:, :, out_features:] / _F32(kind_.scale)  # unscaled q (pairs, r, in)
  b = jnp.repeat(b, 2, axis=0)
  xb = jnp.sum(x.astype(_F32)[:, None, :] * b, axis=-1)
  signs = jnp.tile(jnp.array([1.0, -1.0], _F32), x.shape[0] // 2)
  factor = sigma * kind_.scale * kind_.scale / rank ** 0.5
  xb = xb * (signs * factor)[:, None]
  r_pad = 1 << (rank - 1).bit_length()
  return jnp.pad(xb.T, ((0, r_pad - rank), (0, 0))), jnp.repeat(pairs, 2)


def _xb_kernel(x_ref, seeds_ref, sigma_ref, out_ref, *, layout, rank, n_reduce, block):
  """Row ``c`` of ``out``: ``s_i * factor * (x_i . b_c)`` of both members of pair ``p``."""
  from jaxnoise.ops.virtual_noise import pallas_triton as pt  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import pallas_triton_low_rank as lr  # pylint: disable=g-import-not-at-top
  first = pl.program_id(0) * 2
  seed = seeds_ref[first]
  starts = [pt._row_start(layout, jnp.full((1, 1), c, _U32)) for c in range(rank)]
  keys = [pt._stream_keys(layout, seed, st) for st in starts]

  def body(step, accs):
    col0 = step * block
    tiles = [x_ref[pl.ds(first + m, 1), pl.ds(col0, block)].astype(_F32) for m in range(2)]
    new = list(accs)
    for c in range(rank):
      q = lr._factor_run(layout, keys[c], starts[c], col0, block)
      for m in range(2):
        new[m * rank + c] += jnp.sum(tiles[m] * q, axis=1, keepdims=True)
    return tuple(new)

  accs = jax.lax.fori_loop(0, n_reduce // block, body,
                           tuple(jnp.zeros((1, 1), _F32) for _ in range(2 * rank)))
  factor = sigma_ref[0] * _F32(layout.kind.scale * layout.kind.scale / rank ** 0.5)
  for m in range(2):
    for c in range(rank):
      out_ref[pl.ds(c, 1), pl.ds(first + m, 1)] = (1.0 - 2.0 * m) * factor * accs[m * rank + c]


def xb_kernel(x, seeds, sigma, *, rank, kind, offset, out_features, in_features, block=None,
              warps=4):
  """The ``(r_pad, pop)`` scaled ``x_i B_i`` by a Pallas kernel (batch 1, antithetic)."""
  from jaxnoise.ops.virtual_noise import pallas_triton_low_rank as lr  # pylint: disable=g-import-not-at-top
  kind_ = noise_lib.get_kind(kind)
  _, b_layout = lr._factor_layouts(kind_, offset, out_features, in_features, rank)
  pop = x.shape[0]
  r_pad = 1 << (rank - 1).bit_length()
  block = block or min(2048, in_features)
  kernel = functools.partial(_xb_kernel, layout=b_layout, rank=rank, n_reduce=in_features,
                             block=block)
  out = _pallas.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((r_pad, pop), _F32), grid=(pop // 2,),
      compiler_params=_pallas.compiler_params(warps, 1),
      interpret=jax.default_backend() != "gpu", name="explore_xb",
  )(x, seeds, jnp.reshape(sigma, (1,)).astype(_F32))
  return out, jnp.repeat(seeds[::2], 2)


def interleaved(cases: dict, rounds: int, inner: int) -> dict:
  """Median seconds per call of each case, timed round-robin."""
  for fn, args in cases.values():
    jax.block_until_ready(fn(*args))
    jax.block_until_ready(fn(*args))
  times = {name: [] for name in cases}
  for _ in range(rounds):
    for name, (fn, args) in cases.items():
      t0 = time.perf_counter()
      for _ in range(inner):
        out = fn(*args)
      jax.block_until_ready(out)
      times[name].append((time.perf_counter() - t0) / inner)
  return {name: statistics.median(v) for name, v in times.items()}


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  pop, d = (64, 256) if args.quick else (1024, 8192)
  kind, offset, sigma = "binomial", 0, 0.01
  results = {"device": jax.devices()[0].device_kind, "jax": jax.__version__, "cases": {}}
  key = jax.random.key(0)
  for dtype in (jnp.bfloat16, jnp.float32):
    name_d = jnp.dtype(dtype).name
    kx, kw, key = jax.random.split(key, 3)
    x3 = jax.random.normal(kx, (pop, 1, d), dtype)
    x = x3[:, 0]
    w = (jax.random.normal(kw, (d, d), _F32) / d ** 0.5).astype(dtype)
    seeds = jnp.arange(pop, dtype=_U32) * 7 + 3
    floor = jax.jit(lambda x3, w: jnp.einsum("pbk,ok->pbo", x3, w))
    cases = {"floor": (floor, (x3, w))}
    for rank in (1, 4):
      base = config_lib.low_rank_linear_heuristics(1, d, d, rank)
      for fuse_base in (True, False):
        cfg = dataclasses_replace(base, fuse_base=fuse_base)
        fn = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, antithetic=True,
                                       rank=rank, kind=kind, config=cfg, out_dtype=dtype))
        cases[f"kernel r{rank} fuse_base={fuse_base}"] = (fn, (x3, w, None, seeds, sigma))
    tilings = ([(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 256, 128, 8, 2),
                (128, 256, 64, 4, 3), (256, 128, 64, 8, 4)]
               if dtype == jnp.bfloat16 else [])
    if args.quick:
      tilings = [(32, 64, 32, 4, 2)]
    for rank in (1, 4) if tilings else ():
      xb_args = dict(rank=rank, kind=kind, offset=offset, out_features=d, in_features=d)
      xb, row_seeds = jax.jit(functools.partial(xb_kernel, **xb_args))(x, seeds, sigma)
      xb_ref, _ = jax.jit(functools.partial(scaled_xb, **xb_args))(x, seeds, sigma)
      results["cases"][f"{name_d} check xb kernel r{rank}"] = float(
          jnp.max(jnp.abs(xb - xb_ref)) / jnp.max(jnp.abs(xb_ref)))
      reference = jaxnoise.virtual_perturbed_linear(
          x3.astype(_F32), w.astype(_F32), None, seeds, sigma, antithetic=True, rank=rank,
          kind=kind, implementation="reference")[:, 0]
      for (bm, bn, bk, warps, stages) in tilings:
        tag = f"bm={bm} bn={bn} bk={bk} w={warps} s={stages}"
        try:
          gemm = functools.partial(pallas_gemm, bm=bm, bn=bn, bk=bk, warps=warps,
                                   stages=stages, rank=rank, kind=kind, offset=offset)

          def full(x, w, seeds, sigma, gemm=gemm):
            xb, row_seeds = xb_kernel(x, seeds, sigma, **xb_args)
            return gemm(x, w, xb, row_seeds)

          full = jax.jit(full)
          out = full(x, w, seeds, sigma)
          err = float(jnp.max(jnp.abs(out.astype(_F32) - reference))
                      / jnp.max(jnp.abs(reference)))
          results["cases"][f"{name_d} check pallas path r{rank} {tag}"] = err
          print(f"check pallas path r{rank} {tag}: {err:.2e}", flush=True)
          cases[f"pallas path r{rank} {tag}"] = (full, (x, w, seeds, sigma))
          cases[f"pallas gemm+epilogue r{rank} {tag}"] = (jax.jit(gemm), (x, w, xb, row_seeds))
          if rank == 1:
            plain = jax.jit(functools.partial(pallas_gemm, bm=bm, bn=bn, bk=bk, warps=warps,
                                              stages=stages))
            cases[f"pallas gemm {tag}"] = (plain, (x, w))
        except Exception as e:  # noqa: BLE001
          results["cases"][f"{name_d} error {tag} r{rank}"] = repr(e)[:400]
          print("error", tag, repr(e)[:400], flush=True)
      cases[f"xb kernel r{rank}"] = (jax.jit(functools.partial(xb_kernel, **xb_args)),
                                     (x, seeds, sigma))
    medians = interleaved(cases, rounds=5 if args.quick else 25, inner=10)
    floor_s = medians["floor"]
    for name, seconds in sorted(medians.items(), key=lambda kv: kv[1]):
      results["cases"][f"{name_d} {name}"] = {"ms": seconds * 1e3,
                                              "fraction": floor_s / seconds}
      print(f"{name_d:9s} {name:55s} {seconds * 1e3:8.4f} ms  {floor_s / seconds:6.1%}",
            flush=True)
  with open(os.path.join(args.out, "explore_low_rank_gemm.json"), "w") as f:
    json.dump(results, f, indent=1)


def dataclasses_replace(config, **changes):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(config, **changes)


if __name__ == "__main__":
  main()
