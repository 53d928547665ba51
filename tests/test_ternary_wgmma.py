"""The packed ternary matmul's Mosaic GPU kernel (``MatmulConfig(method="wgmma")``, Hopper).

Pallas has no interpreter for Mosaic GPU kernels, so on the CPU the tests
check the kernel's index math in NumPy (:func:`mosaic_gpu_matmul.decode_model`
on fresh codes packed by SPEC's formula), lower it for CUDA at odd
batch sizes in every dtype, and check its configs and errors. The ``gpu``
tests run it on a Hopper GPU against exact products and the reference.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnoise.ops import _mosaic
from jaxnoise.ops import ternary
from jaxnoise.ops.ternary import config as config_lib
from jaxnoise.ops.ternary import mosaic_gpu_matmul
from jaxnoise.ops.ternary import pallas_triton_matmul
from jaxnoise.ops.ternary import reference
from test_ternary_ops import exact_product, random_state

MatmulConfig = config_lib.MatmulConfig


def _random_layer(rng, n_out: int, n_in: int, C: int):
  """Fresh valid codes (``int64``), packed by SPEC's formula, and a row scale."""
  codes, packed, scale, _ = random_state(rng, n_out, n_in, C)
  return codes.astype(np.int64), packed, scale


@pytest.mark.parametrize("C", [1, 2, 3, 11])
def test_decode_model_gives_each_column_its_own_code(rng, C):
  """Each thread's cuts from its row's words give A's columns the codes of x's features in
  their own order (fresh codes packed by SPEC's formula), so ``x t^T`` comes out exactly."""
  codes, packed, _ = _random_layer(rng, 16, 192, C)
  a_codes = mosaic_gpu_matmul.decode_model(np.asarray(packed))
  np.testing.assert_array_equal(a_codes, codes)
  lv = 2 * C - 1
  x = rng.integers(-4, 5, (5, 192)).astype(np.float32)
  np.testing.assert_array_equal(x @ (a_codes // lv - 1).T, x @ (codes // lv - 1).T)


@pytest.mark.parametrize("dtype,one", [(jnp.bfloat16, 0x3F80), (jnp.float16, 0x3C00)])
def test_pair_decode_gives_both_values_bits_for_every_code_pair(dtype, one):
  """The kernel's integer decode (run here on NumPy arrays): every pair of valid codes, every
  C, with random bits above the pair, against the float bits of ``code // lv - 1``."""
  rng = np.random.default_rng(0)
  for C in range(1, 12):
    lv = 2 * C - 1
    c0, c1 = np.meshgrid(np.arange(3 * lv), np.arange(3 * lv))
    above = rng.integers(0, 1 << 20, c0.shape).astype(np.uint32) << 12
    raw = (c0 | c1 << 6).astype(np.uint32) | above
    bits = lambda t: np.where(t == 0, 0, np.where(t > 0, one, one | 0x8000)).astype(np.uint32)
    np.testing.assert_array_equal(mosaic_gpu_matmul.decode_pair(raw, lv, dtype),
                                  bits(c0 // lv - 1) | bits(c1 // lv - 1) << 16)


@pytest.mark.parametrize("m_rows,n_out,n_in,dtype,out_dtype", [
    (1, 128, 64, jnp.bfloat16, jnp.bfloat16), (5, 256, 1024, jnp.float16, jnp.float32),
    (200, 384, 192, jnp.bfloat16, jnp.float16), (129, 128, 512, jnp.float32, jnp.float32),
    (16, 4096, 4096, jnp.bfloat16, jnp.bfloat16)])
@pytest.mark.parametrize("in_cluster", [True, False])
def test_kernel_lowers_for_hopper(monkeypatch, m_rows, n_out, n_in, dtype, out_dtype, in_cluster):
  """The whole Pallas-to-Mosaic translation (and its shared-memory check) at odd batches, with
  the kernel's own epilogue (one slab, or slabs summed in a cluster) and XLA's (float32 ``x``,
  or the cluster's sum switched off)."""
  monkeypatch.setattr(mosaic_gpu_matmul, "REDUCE_IN_CLUSTER", in_cluster)
  config = MatmulConfig.wgmma_config((m_rows, n_out, n_in), dtype)
  fn = jax.jit(functools.partial(mosaic_gpu_matmul.ternary_matmul, C=3, out_dtype=out_dtype,
                                 config=config))
  avals = (jax.ShapeDtypeStruct((m_rows, n_in), dtype),
           jax.ShapeDtypeStruct((n_out, 3 * n_in // 4), jnp.uint8),
           jax.ShapeDtypeStruct((n_out,), jnp.float32))
  lowered = fn.trace(*avals).lower(lowering_platforms=("cuda",))
  assert "mosaic_gpu" in lowered.as_text()


# Tiles beside the heuristic's: wgmma's widest batch tile (256) with 4 stages (no room for a
# cluster's partials: XLA sums the slabs) and with 2 (summed in the cluster), at any number of
# rows. (Two steps in flight are undefined behaviour: see mosaic_gpu_matmul.STEPS_IN_FLIGHT.)
_VARIANTS = [dict(block_m=256, num_stages=4), dict(), dict(block_m=256, num_stages=2)]


@pytest.mark.parametrize("fields", _VARIANTS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_kernel_variants_lower_for_hopper(fields, dtype):
  config = dataclasses.replace(MatmulConfig.wgmma_config((70, 512, 1024), dtype), **fields)
  fn = jax.jit(functools.partial(mosaic_gpu_matmul.ternary_matmul, C=3, out_dtype=dtype,
                                 config=config))
  avals = (jax.ShapeDtypeStruct((70, 1024), dtype),
           jax.ShapeDtypeStruct((512, 768), jnp.uint8), jax.ShapeDtypeStruct((512,), jnp.float32))
  assert "mosaic_gpu" in fn.trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("m_rows,dtype", [(5, jnp.bfloat16), (300, jnp.bfloat16),
                                          (40, jnp.float32)])
def test_two_steps_a_stage_lower_for_hopper(m_rows, dtype):
  config = dataclasses.replace(MatmulConfig.wgmma_config((m_rows, 512, 2048), dtype),
                               num_stages=2, substeps=2)
  assert mosaic_gpu_matmul.config_reason(config, 512, 2048) is None
  assert "multiple of substeps = 2" in mosaic_gpu_matmul.config_reason(
      dataclasses.replace(config, split_k=1), 512, 192)
  fn = jax.jit(functools.partial(mosaic_gpu_matmul.ternary_matmul, C=3, out_dtype=dtype,
                                 config=config))
  avals = (jax.ShapeDtypeStruct((m_rows, 2048), dtype),
           jax.ShapeDtypeStruct((512, 1536), jnp.uint8), jax.ShapeDtypeStruct((512,), jnp.float32))
  assert "mosaic_gpu" in fn.trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("m_rows,padded", [(4, False), (24, False), (13, True), (16, False)])
def test_unpadded_rows_lower_for_hopper(monkeypatch, m_rows, padded):
  """With ``TMA_PADS_ROWS`` XLA pads x only where x's 8-row tiling needs it."""
  config = MatmulConfig.wgmma_config((m_rows, 512, 1024))
  fn = jax.jit(functools.partial(mosaic_gpu_matmul.ternary_matmul, C=3, out_dtype=jnp.bfloat16,
                                 config=config))
  avals = (jax.ShapeDtypeStruct((m_rows, 1024), jnp.bfloat16),
           jax.ShapeDtypeStruct((512, 768), jnp.uint8), jax.ShapeDtypeStruct((512,), jnp.float32))
  lower = lambda: fn.trace(*avals).lower(lowering_platforms=("cuda",)).as_text()
  assert ("stablehlo.pad" in lower()) == (m_rows % config.block_m != 0)
  monkeypatch.setattr(mosaic_gpu_matmul, "TMA_PADS_ROWS", True)
  jax.clear_caches()
  text = lower()
  assert "mosaic_gpu" in text and ("stablehlo.pad" in text) == padded


def test_kernel_reduces_where_its_partials_fit(monkeypatch):
  monkeypatch.setattr(mosaic_gpu_matmul, "REDUCE_IN_CLUSTER", True)
  reduces = mosaic_gpu_matmul.reduces_in_kernel
  config = lambda m_rows, **kw: dataclasses.replace(
      MatmulConfig.wgmma_config((m_rows, 4096, 4096)), **kw)
  assert reduces(config(16), jnp.bfloat16) and config(16).split_k == 4
  assert reduces(config(1024), jnp.float16) and config(1024).split_k == 1
  assert not reduces(config(16), jnp.float32)  # three pieces: XLA sums them
  assert not reduces(config(16, split_k=16), jnp.bfloat16)  # beyond a portable cluster
  # 256-row tiles, 4 stages: 152 KiB of buffers and 128 KiB of partials do not fit.
  assert not reduces(config(256, block_m=256, num_stages=4, split_k=4), jnp.bfloat16)
  assert reduces(config(256, block_m=256, num_stages=2, split_k=4), jnp.bfloat16)
  monkeypatch.setattr(mosaic_gpu_matmul, "REDUCE_IN_CLUSTER", False)
  assert not reduces(config(16), jnp.bfloat16)
  assert reduces(config(1024), jnp.bfloat16)


def test_wgmma_configs_tile_as_documented():
  config = MatmulConfig.wgmma_config((4, 4096, 4096))  # 32 row tiles, split for 128 programs
  assert (config.method, config.block_m, config.block_n, config.split_k) == ("wgmma", 8, 128, 4)
  assert MatmulConfig.wgmma_config((4, 8192, 8192)).split_k == 2
  assert MatmulConfig.wgmma_config((1024, 8192, 8192)).split_k == 1
  # float32 x: its three bfloat16 pieces are the batch (3 * 40 rows -> a tile of 128, 3 * 50
  # -> one of 256).
  assert MatmulConfig.wgmma_config((40, 1024, 1024), jnp.float32).block_m == 128
  assert MatmulConfig.wgmma_config((50, 1024, 1024), jnp.float32).block_m == 256
  # Each slab keeps >= 8 steps of 64 inputs: in = 512 is never split.
  assert MatmulConfig.wgmma_config((1, 128, 512)).split_k == 1
  for m_rows in (1, 3, 64, 1000):
    config = MatmulConfig.wgmma_config((m_rows, 512, 2048))
    assert mosaic_gpu_matmul.config_reason(config, 512, 2048) is None
  # Two steps a buffer up to 16-row tiles (half the buffers), where a slab's steps are even.
  for m_rows, shape, substeps, stages in [(16, (4096, 4096), 2, 4), (17, (4096, 4096), 1, 4),
                                          (9, (8192, 8192), 2, 4), (2, (128, 576), 1, 8),
                                          (1024, (4096, 4096), 1, 4)]:
    config = MatmulConfig.wgmma_config((m_rows, *shape))
    assert (config.substeps, config.num_stages) == (substeps, stages), m_rows
    assert mosaic_gpu_matmul.config_reason(config, *shape) is None


@pytest.mark.parametrize("fields,match", [
    (dict(block_n=64), r"block_n in \(128,\)"), (dict(block_n=256), "block_n in"),
    (dict(block_groups=32), "block_groups=16"),
    (dict(block_m=4), r"block_m must be in \[8, 256\]"),
    (dict(block_m=512), r"block_m must be in \[8, 256\]"),
    (dict(allow_tf32=True), "does not use allow_tf32"),
    (dict(num_warps=8, interleave_lanes=True), "does not use num_warps, interleave_lanes"),
    (dict(substeps=3), r"substeps must be one of \(1, 2\)"),
    (dict(substeps=True), "substeps must be one of")])
def test_wgmma_config_rejects_other_tiles(fields, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(MatmulConfig.wgmma_config((8, 256, 256)), **fields)


def test_substeps_belong_to_wgmma():
  with pytest.raises(ValueError, match="substeps is read by method='wgmma' only"):
    MatmulConfig(method="dot", substeps=2)


def test_wgmma_config_off_hopper_says_why(rng):
  _, packed, scale = _random_layer(rng, 128, 64, 2)
  config = MatmulConfig.wgmma_config((2, 128, 64))
  with pytest.raises(ValueError, match="method='wgmma'.*needs a Hopper GPU"):
    ternary.ternary_matmul(jnp.ones((2, 64)), packed, scale, C=2, implementation="interpret",
                           config=config)


@pytest.mark.parametrize("shape,dtype,reason", [
    ((4, 100, 64), jnp.bfloat16, "out = 100 is not a multiple of 128"),
    ((4, 128, 96), jnp.bfloat16, "in = 96 is not a multiple of 64"),
    ((4, 128, 64), jnp.int8, "needs bfloat16, float16 or float32 x")])
def test_unsupported_reasons(monkeypatch, shape, dtype, reason):
  monkeypatch.setattr(_mosaic, "is_hopper", lambda: True)
  assert reason in mosaic_gpu_matmul.unsupported_reason(*shape, dtype)
  assert mosaic_gpu_matmul.unsupported_reason(4, 256, 128, jnp.float16) is None
  assert "Hopper" in mosaic_gpu_matmul.unsupported_reason(4, 256, 128, jnp.float16,
                                                          interpret=True)


def test_split_that_does_not_divide_the_steps_is_rejected(monkeypatch, rng):
  monkeypatch.setattr(_mosaic, "is_hopper", lambda: True)
  _, packed, scale = _random_layer(rng, 128, 192, 2)
  config = dataclasses.replace(MatmulConfig.wgmma_config((2, 128, 192)), split_k=2)
  with pytest.raises(ValueError, match="split_k = 2 does not divide in / 64 = 3"):
    pallas_triton_matmul.ternary_matmul(jnp.ones((2, 192), jnp.bfloat16), packed, scale, C=2,
                                        out_dtype=jnp.bfloat16, config=config)


def test_heuristic_takes_wgmma_where_it_runs_and_measured_faster(monkeypatch):
  from jaxnoise.ops.ternary.config import matmul as matmul_config  # pylint: disable=g-import-not-at-top
  heuristic = MatmulConfig.get_heuristics_config
  method = lambda m_rows, dtype, **kw: heuristic((m_rows, 4096, 4096), dtype, **kw).method
  # The measured ranges: 16-bit x at 16-1024 rows, float32 at 4-32.
  for dtype, inside, outside in [(jnp.bfloat16, (16, 32, 100, 129, 256, 1024), (1, 8, 15, 1025)),
                                 (jnp.float16, (16, 512), (8, 2048)),
                                 (jnp.float32, (4, 32), (1, 3, 33))]:
    assert all(method(m, dtype, wgmma=True) == "wgmma" for m in inside), dtype
    assert all(method(m, dtype, wgmma=True) != "wgmma" for m in outside), dtype
    assert all(method(m, dtype) != "wgmma" for m in inside), dtype
  monkeypatch.setattr(matmul_config, "WGMMA_DEFAULT_ROWS", {2: (2, 8)})
  assert method(4, jnp.bfloat16, wgmma=True) == "wgmma"
  assert method(4, jnp.float32, wgmma=True) != "wgmma"
  monkeypatch.setattr(matmul_config, "WGMMA_DEFAULT_ROWS", None)
  assert method(64, jnp.bfloat16, wgmma=True) != "wgmma"
  candidates = MatmulConfig.candidates((16, 4096, 4096), jnp.bfloat16, wgmma=True)
  assert candidates[1] == MatmulConfig.wgmma_config((16, 4096, 4096))
  assert {c.split_k for c in candidates if c.method == "wgmma"} == {4, 8, 2}


# ----------------------------------------------------------------------------
# Compiled on a Hopper GPU.


def _needs_hopper():
  if not _mosaic.is_hopper():
    pytest.skip("needs a Hopper GPU")


@pytest.mark.gpu
@pytest.mark.parametrize("m_rows,n_out,n_in,C,dtype", [
    (1, 128, 512, 3, jnp.bfloat16), (3, 384, 1024, 2, jnp.float16),
    (17, 256, 4096, 1, jnp.bfloat16), (130, 512, 768, 11, jnp.bfloat16),
    (257, 1024, 2048, 3, jnp.float16), (6, 128, 64, 5, jnp.float32),
    (70, 256, 1024, 3, jnp.float32)])
@pytest.mark.parametrize("in_cluster", [True, False])
def test_compiled_kernel_gives_exact_products(rng, monkeypatch, m_rows, n_out, n_in, C, dtype,
                                              in_cluster):
  """Integer ``x``: every sum is exact, so the kernel must give ``x t^T * scale`` bit for bit
  (float32 out, and rounded once to a 16-bit out), whatever the tiles and the split along
  ``in``, summed in a cluster or by XLA."""
  _needs_hopper()
  monkeypatch.setattr(mosaic_gpu_matmul, "REDUCE_IN_CLUSTER", in_cluster)
  codes, packed, scale = _random_layer(rng, n_out, n_in, C)
  x_int = rng.integers(-4, 5, (m_rows, n_in))
  expected = exact_product(x_int, codes, C, scale)
  base = MatmulConfig.wgmma_config((m_rows, n_out, n_in), dtype)
  splits = {base.split_k, 1} | ({2} if (n_in // 64) % 2 == 0 else set())
  for split in sorted(splits):
    config = dataclasses.replace(base, split_k=split)
    y = ternary.ternary_matmul(jnp.asarray(x_int, dtype), packed, scale, C=C,
                               out_dtype=jnp.float32, implementation="pallas", config=config)
    np.testing.assert_array_equal(np.asarray(y), expected, err_msg=f"split_k={split}")
    out_dtype = jnp.float16 if dtype == jnp.float16 else jnp.bfloat16
    y = ternary.ternary_matmul(jnp.asarray(x_int, dtype), packed, scale, C=C,
                               out_dtype=out_dtype, implementation="pallas", config=config)
    np.testing.assert_array_equal(np.asarray(y, np.float32),
                                  np.asarray(jnp.asarray(expected).astype(out_dtype), np.float32),
                                  err_msg=f"split_k={split}, out {jnp.dtype(out_dtype).name}")


@pytest.mark.gpu
@pytest.mark.parametrize("fields", _VARIANTS)
@pytest.mark.parametrize("m_rows,dtype", [(5, jnp.bfloat16), (130, jnp.float16),
                                          (300, jnp.bfloat16), (40, jnp.float32)])
def test_compiled_kernel_variants_give_exact_products(rng, fields, m_rows, dtype):
  """The tiles beyond the heuristic's, bit for bit against exact products (integer ``x``)."""
  _needs_hopper()
  codes, packed, scale = _random_layer(rng, 512, 1536, 3)
  x_int = rng.integers(-4, 5, (m_rows, 1536))
  config = dataclasses.replace(MatmulConfig.wgmma_config((m_rows, 512, 1536), dtype), **fields)
  y = ternary.ternary_matmul(jnp.asarray(x_int, dtype), packed, scale, C=3,
                             out_dtype=jnp.float32, implementation="pallas", config=config)
  np.testing.assert_array_equal(np.asarray(y), exact_product(x_int, codes, 3, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("m_rows,n_in,dtype", [(1, 512, jnp.bfloat16), (4, 4096, jnp.bfloat16),
                                               (7, 1024, jnp.float16), (24, 2048, jnp.bfloat16),
                                               (2, 1024, jnp.float32), (13, 512, jnp.bfloat16)])
def test_compiled_unpadded_rows_give_exact_products(rng, monkeypatch, m_rows, n_in, dtype):
  """``TMA_PADS_ROWS``: x's rows not padded by XLA (fewer than 8, or a multiple of 8 short of
  the batch tile; 13 rows are still padded), the last tile read past them, bit for bit."""
  _needs_hopper()
  monkeypatch.setattr(mosaic_gpu_matmul, "TMA_PADS_ROWS", True)
  codes, packed, scale = _random_layer(rng, 256, n_in, 3)
  x_int = rng.integers(-4, 5, (m_rows, n_in))
  expected = exact_product(x_int, codes, 3, scale)
  base = MatmulConfig.wgmma_config((m_rows, 256, n_in), dtype)
  for config in (base, dataclasses.replace(base, split_k=1, substeps=1)):
    for out_dtype in (jnp.float32, jnp.bfloat16):
      y = ternary.ternary_matmul(jnp.asarray(x_int, dtype), packed, scale, C=3,
                                 out_dtype=out_dtype, implementation="pallas", config=config)
      np.testing.assert_array_equal(
          np.asarray(y, np.float32),
          np.asarray(jnp.asarray(expected).astype(out_dtype), np.float32),
          err_msg=f"{config}, {jnp.dtype(out_dtype).name}")


@pytest.mark.gpu
@pytest.mark.parametrize("m_rows,dtype,block_m", [(5, jnp.bfloat16, None),
                                                  (130, jnp.float16, None),
                                                  (300, jnp.bfloat16, 256), (40, jnp.float32, None)])
def test_compiled_two_steps_a_stage_give_exact_products(rng, m_rows, dtype, block_m):
  """``substeps = 2``: A alternating between two register sets, bit for bit."""
  _needs_hopper()
  codes, packed, scale = _random_layer(rng, 512, 2048, 3)
  x_int = rng.integers(-4, 5, (m_rows, 2048))
  base = MatmulConfig.wgmma_config((m_rows, 512, 2048), dtype)
  config = dataclasses.replace(base, block_m=block_m or base.block_m, num_stages=2, substeps=2)
  y = ternary.ternary_matmul(jnp.asarray(x_int, dtype), packed, scale, C=3,
                             out_dtype=jnp.float32, implementation="pallas", config=config)
  np.testing.assert_array_equal(np.asarray(y), exact_product(x_int, codes, 3, scale))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32])
def test_compiled_wgmma_as_default_matches_reference(rng, dtype, monkeypatch):
  """Fresh normal ``x`` through the public op with the heuristic taking the wgmma kernel,
  against the reference, and its gradient (the input gradient runs the Triton kernels)."""
  _needs_hopper()
  from jaxnoise.ops.ternary.config import matmul as matmul_config  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(matmul_config, "WGMMA_DEFAULT_ROWS", {2: (1, 1 << 20), 4: (1, 1 << 20)})
  _, packed, scale = _random_layer(rng, 512, 1024, 3)
  x = jnp.asarray(rng.normal(size=(9, 1024)), dtype)
  assert ternary.MatmulConfig.get_heuristics_config((9, 512, 1024), dtype,
                                                    wgmma=True).method == "wgmma"
  y = ternary.ternary_matmul(x, packed, scale, C=3, out_dtype=jnp.float32,
                             implementation="pallas")
  expected = reference.ternary_matmul_reference(x, packed, scale, C=3, out_dtype=jnp.float32)
  rtol = 1e-5 if dtype == jnp.float32 else 1e-6
  np.testing.assert_allclose(y, expected, rtol=rtol, atol=rtol * float(jnp.abs(expected).max()))

  def loss(x, scale, implementation):
    return jnp.sum(jnp.sin(ternary.ternary_matmul(x, packed, scale, C=3, out_dtype=jnp.float32,
                                                  implementation=implementation)))

  grads = jax.grad(loss, argnums=(0, 1))(x, scale, "pallas")
  expected_grads = jax.grad(loss, argnums=(0, 1))(x, scale, "reference")
  for got, want in zip(grads, expected_grads):
    np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                               rtol=2e-2, atol=2e-2 * float(jnp.abs(want).max()))
