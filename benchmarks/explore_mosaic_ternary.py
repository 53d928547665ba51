"""The packed ternary matmul as a Mosaic GPU GEMM with ``W`` decoded in registers (issue 14).

An exploration, not a library path: it lowers and compiles without a GPU, and
its arithmetic (which code goes where) is checked in NumPy; the kernel itself has
not run on a GPU yet.

``y = x (scale * t)^T`` with ``t`` the ternary values of the packed 6-bit codes
(``pack_codes``' layout: 4 codes in 3 bytes along ``in``). The kernel computes
``y^T = T x^T`` with ``wgmma``: ``A`` is a warpgroup's 64 rows of ``T``, built in
registers from the packed bytes, and ``B`` is ``x^T`` from shared memory.

* **Which codes a thread decodes.** In the WGMMA register layout each thread
  holds, per 16-deep chunk ``j`` of ``A``, columns ``2c, 2c+1`` (register tile
  ``2j``) and ``2c+8, 2c+9`` (tile ``2j+1``) of two rows, ``c = lane % 4``. A
  64-deep step of a row is 48 packed bytes, a 384-bit little-endian string of
  6-bit codes (code ``i`` at bit ``6 i``). Thread ``c`` reads the 12 bytes
  ``12c .. 12c+11`` (codes ``16c .. 16c+15``) and gives chunk ``j`` its codes
  ``16c + 4j + (0, 1)`` and ``16c + 4j + (2, 3)``: no shuffle, three aligned
  32-bit loads a row.
* **``x`` permuted to match.** Column ``p`` of ``A``'s step holds the code of
  feature ``PERMUTATION[p]``, so ``x``'s columns are gathered the same way inside
  each 64-wide block (:func:`permute_features`), a small XLA gather at the batch
  sizes this is for.
* **Tiles.** A program is 2 compute warpgroups of 64 rows of ``W`` each, and a
  ``K`` split (``splits``) so that enough programs stream ``W``; the batch is
  ``wgmma``'s N (padded to a multiple of 8 by TMA's zero fill). The splits'
  float32 partial products are summed by XLA, which also scales the rows.

    python benchmarks/explore_mosaic_ternary.py --check      # the index math (NumPy)
    python benchmarks/explore_mosaic_ternary.py --lower      # lowers for CUDA on the CPU
    python benchmarks/explore_mosaic_ternary.py --plugin PATH/xla_cuda_plugin.so  # ptxas, no GPU
    python benchmarks/explore_mosaic_ternary.py --gpu-check --bench --out $OUT   # a Hopper GPU
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STEP = 64  # features per pipeline step (a row's 48 packed bytes)
ROWS = 64  # rows of W per compute warpgroup
WARPGROUPS = 2


def _permutation() -> np.ndarray:
  """``PERMUTATION[p]``: the feature (in a 64-wide block) whose code is ``A``'s column ``p``."""
  perm = np.empty(STEP, np.int64)
  for c in range(4):
    for j in range(4):
      for e in range(2):
        perm[16 * j + 2 * c + e] = 16 * c + 4 * j + e          # register tile 2j
        perm[16 * j + 8 + 2 * c + e] = 16 * c + 4 * j + 2 + e  # register tile 2j + 1
  assert sorted(perm) == list(range(STEP))
  return perm


PERMUTATION = _permutation()


def permute_features(x: jax.Array) -> jax.Array:
  """``x`` ``(..., in)`` with each 64-wide block's columns in ``A``'s order."""
  *lead, n_in = x.shape
  blocks = x.reshape(*lead, n_in // STEP, STEP)
  return blocks[..., PERMUTATION].reshape(*lead, n_in)


def thread_codes(packed_row_step: np.ndarray, c: int) -> dict[tuple[int, int], tuple[int, int]]:
  """NumPy model of one thread's decode: ``(chunk j, tile half) -> (code, code)`` from the
  row's 48 bytes of one step, reading only bytes ``12c .. 12c+11`` as three words."""
  words = packed_row_step[12 * c:12 * c + 12].view("<u4").astype(np.uint64)
  bits = int(words[0]) | int(words[1]) << 32 | int(words[2]) << 64
  code = lambda i: (bits >> (6 * i)) & 63
  return {(j, half): (code(4 * j + 2 * half), code(4 * j + 2 * half + 1))
          for j in range(4) for half in range(2)}


def a_step_from_threads(packed_step: np.ndarray) -> np.ndarray:
  """The ``(rows, 64)`` codes of ``A`` for one step, assembled from every thread's decode in
  the WGMMA layout's places (column ``8 t + 2 c + e`` of register tile ``t``)."""
  rows = packed_step.shape[0]
  a = np.full((rows, STEP), -1, np.int64)
  for r in range(rows):
    for c in range(4):
      for (j, half), pair in thread_codes(packed_step[r], c).items():
        tile = 2 * j + half
        for e in range(2):
          a[r, 8 * tile + 2 * c + e] = pair[e]
  return a


def check(seed: int = 0) -> None:
  """The decode model and the permutation give ``x T^T`` exactly (NumPy, fresh codes)."""
  rng = np.random.default_rng(seed)
  C, n_out, n_in, batch = 3, 8, 192, 5
  lv = 2 * C - 1
  codes, packed, _ = _random_layer(rng, n_out, n_in, C)
  packed = np.asarray(packed)
  ternary = codes // lv - 1
  x = rng.integers(-4, 5, size=(batch, n_in)).astype(np.float32)
  per_step = packed.reshape(n_out, n_in // STEP, 48)
  a_codes = np.concatenate([a_step_from_threads(per_step[:, s]) for s in range(n_in // STEP)],
                           axis=1)
  assert (a_codes >= 0).all(), "a column of A was never written"
  a_ternary = a_codes // lv - 1
  x_perm = np.asarray(permute_features(jnp.asarray(x)))
  np.testing.assert_array_equal(x_perm @ a_ternary.T, x @ ternary.T)
  np.testing.assert_array_equal(np.sort(a_codes, axis=1), np.sort(codes, axis=1))
  print("check: the per-thread decode and the permutation give x T^T exactly")


def _decode_mgpu(lv: int):
  """The inline Mosaic GPU decode of a warpgroup's ``(64, 48)`` packed bytes to its
  ``(64, 64)`` bf16 ternary ``A`` in the WGMMA register layout."""
  from jax._src.lib.mlir import ir  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import arith, memref, vector  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic import gpu as mgpu  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic.gpu import fragmented_array as fa  # pylint: disable=g-import-not-at-top
  from jax.experimental.mosaic.gpu import utils as mgpu_utils  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                     return_type=plgpu.ShapeDtypeStruct((ROWS, STEP), jnp.bfloat16,
                                                        layout=plgpu.Layout.WGMMA))
  def decode(_, packed_smem):
    i32 = ir.IntegerType.get_signless(32)
    i8 = ir.IntegerType.get_signless(8)
    index = ir.IndexType.get()
    bf16, f32 = ir.BF16Type.get(), ir.F32Type.get()
    const = lambda v: arith.constant(i32, v)
    tid = mgpu_utils.thread_idx()
    lane = arith.remui(tid, const(32))
    warp = arith.remui(arith.divui(tid, const(32)), const(4))
    c = arith.remui(lane, const(4))
    first_row = arith.addi(arith.muli(warp, const(16)), arith.divui(lane, const(4)))
    byte0 = arith.muli(c, const(12))
    lo, hi = const(2 * lv - 1), const(lv - 1)  # code > lv - 1, code > 2 lv - 1
    regs = np.empty(fa.WGMMA_LAYOUT.registers_shape((ROWS, STEP)), dtype=object)
    word_type = ir.VectorType.get((4,), i8)
    one_word = ir.VectorType.get((1,), i32)
    for half in range(2):
      row = arith.index_castui(index, arith.addi(first_row, const(8 * half)))
      words = []
      for w in range(3):
        col = arith.index_castui(index, arith.addi(byte0, const(4 * w)))
        raw = vector.load(word_type, packed_smem, [row, col])
        words.append(vector.extract(vector.bitcast(one_word, raw), dynamic_position=[],
                                    static_position=[0]))

      def code(i):
        start, shift = divmod(6 * i, 32)
        value = arith.shrui(words[start], const(shift)) if shift else words[start]
        if shift > 26:  # the code spans two words
          value = arith.ori(value, arith.shli(words[start + 1], const(32 - shift)))
        return arith.andi(value, const(63))

      def ternary(i):
        value = code(i)
        above = lambda bound: arith.extui(i32, arith.cmpi(arith.CmpIPredicate.ugt, value,
                                                          bound))
        t = arith.subi(arith.addi(above(hi), above(lo)), const(1))
        return arith.truncf(bf16, arith.sitofp(f32, t))

      pair_type = ir.VectorType.get((2,), bf16)
      for j in range(4):
        for tile_half in range(2):
          first = 4 * j + 2 * tile_half
          regs[(0, 2 * j + tile_half, 0, 0, half, 0, 0, 0, 0)] = vector.from_elements(
              pair_type, [ternary(first), ternary(first + 1)])
    return mgpu.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

  return decode


def _kernel(packed_gmem, x_gmem, out_gmem, *, lv: int, splits: int, stages: int,
            batch_tile: int):
  """One program: 128 rows of ``W`` (two warpgroups), ``batch_tile`` rows of ``x``, one
  split of ``K``."""
  from jax import lax  # pylint: disable=g-import-not-at-top
  from jax.experimental import pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  batch, n_in = x_gmem.shape
  steps = n_in // STEP // splits
  batch_tiles = batch // batch_tile
  program = lax.axis_index("program")
  row_tile, rest = program // (splits * batch_tiles), program % (splits * batch_tiles)
  batch_index, split = rest // splits, rest % splits
  swizzle = plgpu.find_swizzle(STEP * 2 * 8)
  x_transforms = (plgpu.TilingTransform((8, swizzle // 2)), plgpu.SwizzleTransform(swizzle))
  decode = _decode_mgpu(lv)
  rows = pl.ds(row_tile * WARPGROUPS * ROWS, WARPGROUPS * ROWS)
  cols = pl.ds(batch_index * batch_tile, batch_tile)

  def body(_, packed_smem, x_smem, acc):
    wg = lax.axis_index("wg")
    a = decode(packed_smem.at[pl.ds(wg * ROWS, ROWS)])
    plgpu.wgmma(acc, a, x_smem.transpose((1, 0)))
    plgpu.wgmma_wait(0)
    return acc

  def context(run):
    """The warpgroup's ``(64, batch_tile)`` float32 partial product to ``out[split]``."""

    @functools.partial(pl.run_scoped, acc=plgpu.ACC((ROWS, batch_tile), jnp.float32))
    def _scope(acc):
      run(acc)
      wg = lax.axis_index("wg")
      out_gmem.at[split, rows, cols].at[pl.ds(wg * ROWS, ROWS)][...] = acc[...]

  pipeline = plgpu.emit_pipeline_warp_specialized(
      body, grid=(steps,), memory_registers=40,
      in_specs=[plgpu.BlockSpec((WARPGROUPS * ROWS, 48), lambda k: (0, k),
                                memory_space=plgpu.SMEM),
                plgpu.BlockSpec((batch_tile, STEP), lambda k: (0, k), transforms=x_transforms,
                                memory_space=plgpu.SMEM)],
      wg_axis="wg", num_compute_wgs=WARPGROUPS, max_concurrent_steps=min(stages, steps),
      compute_context=context)
  k_bytes = pl.ds(split * steps * 48, steps * 48)
  k_feats = pl.ds(split * steps * STEP, steps * STEP)
  pipeline(packed_gmem.at[rows, k_bytes], x_gmem.at[cols, k_feats])


def plan(batch: int, n_out: int, n_in: int, num_sms: int = 132) -> dict:
  """Tiles for a call: ``x``'s rows padded to a multiple of 8 and split in tiles of up to
  128, and the fewest ``K`` splits that give about two programs a multiprocessor (each
  split keeping 8 steps or more).

  Example:
    >>> plan(4, 4096, 4096)
    {'padded': 8, 'batch_tile': 8, 'splits': 8, 'stages': 8}
    >>> plan(256, 8192, 8192)
    {'padded': 256, 'batch_tile': 128, 'splits': 4, 'stages': 4}
  """
  padded = -(-batch // 8) * 8
  batch_tile = min(padded, 128)
  padded = -(-padded // batch_tile) * batch_tile
  tiles = n_out // (WARPGROUPS * ROWS) * (padded // batch_tile)
  steps = n_in // STEP
  splits = 1
  while tiles * splits < 2 * num_sms and steps % (2 * splits) == 0 and steps // (2 * splits) >= 8:
    splits *= 2
  return dict(padded=padded, batch_tile=batch_tile, splits=splits,
              stages=8 if batch_tile <= 16 else 4)


def ternary_matmul_mosaic(x, packed, scale, *, C: int, num_sms: int = 132):
  """``y = x (scale * t)^T`` for ``x`` ``(batch, in)`` (cast to bf16), float32 out."""
  from jaxnoise.ops import _mosaic  # pylint: disable=g-import-not-at-top
  batch, n_in = x.shape
  n_out = packed.shape[0]
  if n_out % (WARPGROUPS * ROWS) or n_in % STEP:
    raise ValueError(f"out must divide by {WARPGROUPS * ROWS} and in by {STEP}, got "
                     f"packed {packed.shape} for x {x.shape}")
  tiles = plan(batch, n_out, n_in, num_sms)
  body = functools.partial(_kernel, lv=2 * C - 1, splits=tiles["splits"],
                           stages=tiles["stages"], batch_tile=tiles["batch_tile"])
  programs = (n_out // (WARPGROUPS * ROWS) * (tiles["padded"] // tiles["batch_tile"])
              * tiles["splits"])
  call = _mosaic.kernel(body, out_type=jax.ShapeDtypeStruct(
      (tiles["splits"], n_out, tiles["padded"]), jnp.float32),
                        grid=(programs,), grid_names=("program",),
                        num_threads=WARPGROUPS + 1, thread_name="wg")
  x_rows = jnp.pad(x.astype(jnp.bfloat16), ((0, tiles["padded"] - batch), (0, 0)))
  partial = call(packed, permute_features(x_rows))
  return (partial.sum(0) * scale[:, None]).T[:batch]


def lower(batch: int = 16, n: int = 4096, C: int = 3) -> str:
  """The kernel lowered for CUDA on this machine (no GPU): its text."""
  avals = (jax.ShapeDtypeStruct((batch, n), jnp.bfloat16),
           jax.ShapeDtypeStruct((n, n * 3 // 4), jnp.uint8),
           jax.ShapeDtypeStruct((n,), jnp.float32))
  fn = jax.jit(functools.partial(ternary_matmul_mosaic, C=C))
  return fn.trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


def _compile_child(plugin: str, batch: int) -> None:
  """Compile the lowered kernel for an H200 with a PJRT CUDA plugin's XLA, no GPU."""
  import offline_mosaic_ptxas  # pylint: disable=g-import-not-at-top
  offline_mosaic_ptxas.compile_deviceless(plugin, lower(batch))


def compile_report(plugin: str, batch: int) -> dict:
  """ptxas's registers, spills and notes for the kernel (a subprocess, as
  ``offline_mosaic_ptxas.py`` does)."""
  import subprocess  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import offline_mosaic_ptxas  # pylint: disable=g-import-not-at-top
  env = dict(os.environ, MOSAIC_GPU_DUMP_PTXAS="1", JAX_PLATFORMS="cpu")
  result = subprocess.run([sys.executable, os.path.abspath(__file__), "--compile-child", plugin,
                           "--batch", str(batch)], capture_output=True, text=True, env=env,
                          check=False)
  report = result.stdout + result.stderr
  if result.returncode:
    raise RuntimeError(report[-3000:])
  return offline_mosaic_ptxas.summary(report)


def _random_layer(rng, n_out: int, n_in: int, C: int):
  """Fresh codes (NumPy), packed as ``pack_codes`` packs them, and a row scale."""
  from jaxnoise.ops.ternary import packing  # pylint: disable=g-import-not-at-top
  codes = rng.integers(0, 3 * (2 * C - 1), size=(n_out, n_in), dtype=np.int32)
  packed = packing.pack_codes(jnp.asarray(codes), C=C, implementation="reference")
  scale = jnp.asarray(rng.uniform(0.5, 1.5, size=(n_out,)), jnp.float32)
  return codes, packed, scale


def gpu_check(seed: int = 0) -> list[dict]:
  """On a Hopper GPU: the kernel against ``ternary_decode`` and a float32 matmul, fresh
  codes, odd batch sizes, several ``K`` splits."""
  from jaxnoise.ops.ternary import packing  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  records = []
  for batch, n_out, n_in, C in [(1, 256, 512, 3), (5, 384, 1024, 2), (16, 4096, 4096, 3),
                                (200, 512, 768, 11), (256, 1024, 2048, 1)]:
    _, packed, scale = _random_layer(rng, n_out, n_in, C)
    x = jnp.asarray(rng.normal(size=(batch, n_in)), jnp.bfloat16)
    y = jax.jit(functools.partial(ternary_matmul_mosaic, C=C))(x, packed, scale)
    weight = packing.ternary_decode(packed, scale, C=C, implementation="reference")
    expected = jnp.matmul(x.astype(jnp.float32), weight.T, precision="highest")
    error = float(jnp.abs(y - expected).max() / jnp.abs(expected).max())
    records.append(dict(batch=batch, out=n_out, inp=n_in, C=C, max_rel_error=error,
                        ok=bool(error < 1e-5)))
    print(records[-1], flush=True)
  return records


def bench(batches=(1, 4, 16, 256, 1024), sizes=(4096, 8192)) -> list[dict]:
  """Device ms (CUPTI) of the kernel, the library's ``ternary_matmul`` and a bf16 matmul."""
  import _harness  # pylint: disable=g-import-not-at-top
  import jaxnoise  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import packing  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  records = []
  for n in sizes:
    _, packed, scale = _random_layer(rng, n, n, 3)
    dense = packing.ternary_decode(packed, scale, C=3, dtype=jnp.bfloat16,
                                   implementation="reference")
    for batch in batches:
      x = jnp.asarray(rng.normal(size=(batch, n)), jnp.bfloat16)
      fns = {"bf16_matmul": jax.jit(lambda x, w: x @ w.T),
             "library": jax.jit(lambda x, p, s: jaxnoise.ternary_matmul(x, p, s, C=3)),
             "mosaic": jax.jit(lambda x, p, s: ternary_matmul_mosaic(x, p, s, C=3))}
      record = dict(n=n, batch=batch, **plan(batch, n, n))
      for name, fn in fns.items():
        args = (x, dense) if name == "bf16_matmul" else (x, packed, scale)
        try:
          busy = _harness.device_busy(fn, *args)
          record[f"{name}_ms"] = None if busy is None else busy["busy_ms"]
        except Exception as error:  # pylint: disable=broad-except
          record[f"{name}_error"] = f"{type(error).__name__}: {error}"[:200]
      if record.get("mosaic_ms") and record.get("bf16_matmul_ms"):
        record["mosaic_speedup"] = record["bf16_matmul_ms"] / record["mosaic_ms"]
      if record.get("library_ms") and record.get("bf16_matmul_ms"):
        record["library_speedup"] = record["bf16_matmul_ms"] / record["library_ms"]
      print(record, flush=True)
      records.append(record)
  return records


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--check", action="store_true", help="the index math in NumPy")
  parser.add_argument("--lower", action="store_true", help="lower for CUDA on the CPU")
  parser.add_argument("--plugin", help="xla_cuda_plugin.so: compile offline, print ptxas's report")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--gpu-check", action="store_true", help="against the reference (GPU)")
  parser.add_argument("--bench", action="store_true", help="device time (GPU)")
  parser.add_argument("--out", default="", help="folder for explore_mosaic_ternary.json")
  parser.add_argument("--compile-child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.compile_child:
    _compile_child(args.compile_child, args.batch)
    return 0
  if args.check or not (args.lower or args.plugin or args.gpu_check or args.bench):
    check()
  results = {}
  if args.gpu_check:
    results["check"] = gpu_check()
  if args.bench:
    results["bench"] = bench()
  if args.out and results:
    import _harness  # pylint: disable=g-import-not-at-top
    os.makedirs(args.out, exist_ok=True)
    _harness.write_json(os.path.join(args.out, "explore_mosaic_ternary.json"),
                        dict(facts=_harness.device_facts(), **results))
  if args.lower:
    text = lower(args.batch)
    print(f"lowered: {len(text)} characters, mosaic_gpu in it: {'mosaic_gpu' in text}")
  if args.plugin:
    print(f"batch {args.batch}: {compile_report(args.plugin, args.batch)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
