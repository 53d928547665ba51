"""Tests of the ternary counter ops: reference math, kernels (interpret mode), validation.

Kernels run through the Pallas interpreter on CPU (``implementation="interpret"``),
on fresh random inputs of odd shapes, and are compared with the pure-JAX
reference. The ``gpu`` tests compile the same kernels on a GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxnoise.ops import ternary
from jaxnoise.ops.ternary import config as config_lib
from jaxnoise.ops.ternary import reference

KERNEL_IMPLS = ["interpret"] + (["pallas"] if jax.default_backend() == "gpu" else [])
DTYPES = [jnp.float32, jnp.bfloat16, jnp.float16]


# ----------------------------------------------------------------------------
# Helpers.


def np_pack(codes: np.ndarray) -> np.ndarray:
  """SPEC's packing formula, written independently in NumPy."""
  c = codes.astype(np.int64).reshape(codes.shape[0], -1, 4)
  b0 = (c[..., 0] | (c[..., 1] << 6)) & 0xFF
  b1 = ((c[..., 1] >> 2) | (c[..., 2] << 4)) & 0xFF
  b2 = ((c[..., 2] >> 4) | (c[..., 3] << 2)) & 0xFF
  return np.stack([b0, b1, b2], -1).reshape(codes.shape[0], -1).astype(np.uint8)


def random_state(rng, out_features, in_features, C, *, scale_range=(0.05, 2.0)):
  """Random valid codes (packed), scale and v."""
  codes = rng.integers(0, reference.n_codes(C), (out_features, in_features)).astype(np.uint8)
  scale = rng.uniform(*scale_range, out_features).astype(np.float32)
  v = rng.uniform(0.0, 2.0, out_features).astype(np.float32)
  return codes, jnp.asarray(np_pack(codes)), jnp.asarray(scale), jnp.asarray(v)


def exact_product(x_int: np.ndarray, codes: np.ndarray, C: int, scale) -> np.ndarray:
  """``(x @ t^T) * scale`` for integer ``x``: the sums exact, then one float32 product."""
  t = np.asarray(reference.ternary_of(jnp.asarray(codes), C), np.float64)
  return (x_int.astype(np.float64) @ t.T).astype(np.float32) * np.asarray(scale)[None, :]


def codes_of(packed) -> np.ndarray:
  return np.asarray(reference.unpack_codes_reference(jnp.asarray(packed))).astype(np.int64)


def assert_codes_close(actual_packed, expected_packed, what=""):
  """Codes equal except at most ceil(1e-4 n) of them, each off by one (float reduction order)."""
  actual, expected = codes_of(actual_packed), codes_of(expected_packed)
  diff = np.abs(actual - expected)
  n_diff = int((diff != 0).sum())
  allowed = math.ceil(1e-4 * actual.size)
  assert diff.max(initial=0) <= 1, f"{what}: a code moved by {diff.max()} (> 1)"
  assert n_diff <= allowed, f"{what}: {n_diff} of {actual.size} codes differ (allowed {allowed})"
  return n_diff


def hyper_kwargs(rng, C):
  # lr * lv (the step in code units per normalised gradient) in [0.5, 2]: most codes move.
  lr = float(rng.uniform(0.5, 2.0)) / reference.levels(C)
  return dict(C=C, lr=lr, lr_scale=float(rng.uniform(0.0, 0.05)),
              rms_beta=float(rng.uniform(0.5, 0.99)), rms_eps=1e-8,
              seed=int(rng.integers(0, 2**32)))


class TwoPassUpdateConfig(config_lib.CounterUpdateConfig):
  """A counter-update config that takes the two-pass loop from 8 groups up (for tests)."""

  MAX_RESIDENT_GROUPS = 4


def cast(array, dtype):
  return jnp.asarray(array).astype(dtype)


# ----------------------------------------------------------------------------
# Packing.


@pytest.mark.parametrize("implementation", ["reference"] + KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int32])
def test_pack_unpack_round_trip(rng, implementation, dtype):
  out_features, in_features = int(rng.integers(1, 40)) | 1, 4 * (int(rng.integers(1, 30)) | 1)
  C = int(rng.integers(1, 12))
  codes = rng.integers(0, reference.n_codes(C), (out_features, in_features)).astype(dtype)
  packed = ternary.pack_codes(codes, C=C, implementation=implementation)
  assert packed.dtype == jnp.uint8 and packed.shape == (out_features, 3 * in_features // 4)
  np.testing.assert_array_equal(np.asarray(packed), np_pack(codes))
  unpacked = ternary.unpack_codes(packed, C=C, implementation=implementation)
  assert unpacked.dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(unpacked), codes.astype(np.uint8))


def test_pack_uses_all_six_bits(rng):
  codes = rng.integers(0, 64, (3, 64)).astype(np.uint8)
  packed = ternary.pack_codes(codes, implementation="reference")
  np.testing.assert_array_equal(np.asarray(ternary.unpack_codes(packed)), codes)


@pytest.mark.parametrize("implementation", ["reference"] + KERNEL_IMPLS)
def test_init_and_decode(rng, implementation):
  out_features, in_features = int(rng.integers(2, 30)) | 1, 4 * (int(rng.integers(2, 40)) | 1)
  C = int(rng.integers(1, 12))
  weight = rng.normal(size=(out_features, in_features)).astype(np.float32)
  weight[0] = 0.0  # absmean 0 -> clipped scale 1e-5, codes of t = 0
  packed, scale = ternary.ternary_init(weight, C, implementation=implementation)
  expected_scale = np.clip(np.abs(weight).mean(1), 1e-5, 10)
  np.testing.assert_allclose(np.asarray(scale), expected_scale, rtol=1e-5)
  t = reference.ternary_of(jnp.asarray(codes_of(packed)), C)
  # BitNet b1.58: t = clip(round(w / scale), -1, 1) away from the rounding ties.
  ratio = weight / expected_scale[:, None]
  away = np.abs(np.abs(ratio) - 0.5) > 1e-4
  np.testing.assert_array_equal(np.asarray(t)[away], np.clip(np.round(ratio), -1, 1)[away])
  ref_packed, _ = ternary.ternary_init(weight, C, implementation="reference")
  assert_codes_close(packed, ref_packed, "init")
  for dtype in (jnp.float32, jnp.bfloat16):
    decoded = ternary.ternary_decode(packed, scale, C=C, dtype=dtype,
                                     implementation=implementation)
    expected = np.asarray(t, np.float32) * np.asarray(scale)[:, None]
    assert decoded.dtype == dtype
    np.testing.assert_allclose(np.asarray(decoded, np.float32), expected, rtol=1e-2)


def test_elementwise_kernels_chunked(rng):
  """Rows longer than one chunk (the loop path) and several rows per program."""
  config = config_lib.ElementwiseConfig(block_rows=2, block_groups=4, num_warps=1)
  weight = rng.normal(size=(5, 4 * 11)).astype(np.float32)
  packed, scale = ternary.ternary_init(weight, 7, implementation="interpret", config=config)
  ref_packed, ref_scale = ternary.ternary_init(weight, 7, implementation="reference")
  np.testing.assert_allclose(np.asarray(scale), np.asarray(ref_scale), rtol=1e-6)
  assert_codes_close(packed, ref_packed, "init chunked")
  codes = np.asarray(ternary.unpack_codes(packed, implementation="interpret", config=config))
  np.testing.assert_array_equal(codes, codes_of(packed))
  np.testing.assert_array_equal(
      np.asarray(ternary.pack_codes(codes, implementation="interpret", config=config)),
      np.asarray(packed))
  np.testing.assert_array_equal(
      np.asarray(ternary.ternary_decode(packed, scale, C=7, implementation="interpret",
                                        config=config)),
      np.asarray(ternary.ternary_decode(packed, scale, C=7, implementation="reference")))


def test_out_of_range_codes_saturate():
  """Hand-made codes >= 3lv raise when concrete; traced, they decode to +1 everywhere."""
  packed = jnp.asarray(np_pack(np.array([[62, 63, 9, 10]])))  # C=2: 9 valid codes
  for implementation in ["reference"] + KERNEL_IMPLS:
    with pytest.raises(ValueError, match=r"packed holds 4 codes outside \[0, 9\)"):
      ternary.ternary_decode(packed, jnp.ones(1), C=2, implementation=implementation)
    decode = jax.jit(lambda p, impl=implementation: ternary.ternary_decode(
        p, jnp.ones(1), C=2, implementation=impl))
    np.testing.assert_array_equal(np.asarray(decode(packed)), [[1.0, 1.0, 1.0, 1.0]])


# ----------------------------------------------------------------------------
# Update math.


@pytest.mark.parametrize("implementation", ["reference"] + KERNEL_IMPLS)
@pytest.mark.parametrize("lagged", [False, True])
def test_zero_gradient_keeps_every_code(rng, implementation, lagged):
  out_features, in_features = 23, 4 * 19
  C = int(rng.integers(1, 12))
  codes, packed, scale, v = random_state(rng, out_features, in_features, C)
  beta = float(rng.uniform(0.1, 0.99))
  for seed in rng.integers(0, 2**32, 3):
    result = ternary.counter_update(
        packed, scale, v, jnp.zeros((out_features, in_features)), C=C, lr=0.7,
        lr_scale=0.3, rms_beta=beta, rms_eps=1e-8, seed=int(seed), lagged=lagged,
        implementation=implementation, donate=False)
    np.testing.assert_array_equal(codes_of(result.packed), codes)
    np.testing.assert_array_equal(np.asarray(result.scale), np.asarray(scale))
    np.testing.assert_allclose(np.asarray(result.v), beta * np.asarray(v), rtol=1e-6)
    assert int(result.skipped_rows) == 0


def test_zero_gradient_keeps_codes_over_a_million_draws(rng):
  """u within a float32 ulp of 1 must not round a code up (the literal formula would)."""
  out_features, in_features, n_seeds = 64, 64, 256
  for C in (3, 11):
    codes, packed, scale, v = random_state(rng, out_features, in_features, C)
    hyper = jnp.asarray([0.5, 0.5, 0.9, 1e-8], jnp.float32)
    update = jax.jit(jax.vmap(lambda seed: reference.counter_update_reference(
        packed, scale, v, jnp.zeros((out_features, in_features)), hyper, seed, C=C,
        lagged=False)[0]))
    seeds = jnp.asarray(rng.integers(0, 2**32, n_seeds), jnp.uint32)
    changed = (update(seeds) != packed[None]).sum()
    assert int(changed) == 0, f"C={C}: {int(changed)} bytes changed under a zero gradient"


def spec_target(codes, scale, v, grad, *, C, lr, lr_scale, rms_beta, rms_eps, lagged):
  """SPEC section 3 written literally in float64: the real-valued code before rounding."""
  lv = 2 * C - 1
  codes, grad = codes.astype(np.float64), grad.astype(np.float64)
  n = grad.shape[1]
  t = np.floor(codes / lv) - 1
  p = (codes + 0.5) / lv - 1.5
  v_new = rms_beta * v + (1 - rms_beta) * np.mean(grad**2, axis=1)
  d = np.maximum(np.sqrt(v if lagged else v_new), rms_eps)
  grad_s = np.sum(grad * t, axis=1) / np.sqrt(n)
  s_new = np.clip(scale - lr_scale * grad_s, 1e-5, 10)
  p_new = p * (scale / s_new)[:, None] - lr * grad / d[:, None]
  return (p_new + 1.5) * lv - 0.5, s_new, v_new


@pytest.mark.parametrize("lagged", [False, True])
def test_rounding_is_unbiased(rng, lagged):
  """The mean of many seeded updates is the exact real-valued target of SPEC section 3."""
  out_features, in_features, C, n_seeds = 6, 20, 6, 4096
  lv = 2 * C - 1
  codes = rng.integers(lv // 2 + 3, 3 * lv - lv // 2 - 3, (out_features, in_features))
  scale = rng.uniform(0.5, 1.5, out_features).astype(np.float32)
  v = rng.uniform(0.5, 1.5, out_features).astype(np.float32)
  grad = rng.normal(size=(out_features, in_features)).astype(np.float32)
  kwargs = dict(C=C, lr=0.05, lr_scale=0.05, rms_beta=0.9, rms_eps=1e-8, lagged=lagged)
  target, s_new, v_new = spec_target(codes, scale.astype(np.float64), v.astype(np.float64),
                                     grad, **kwargs)
  assert np.all((target > 1) & (target < 3 * lv - 2)), "test setup: keep targets off the clip"
  hyper = jnp.asarray([0.05, 0.05, 0.9, 1e-8], jnp.float32)
  update = jax.jit(jax.vmap(
      lambda seed: codes_unpacked(reference.counter_update_reference(
          jnp.asarray(np_pack(codes)), jnp.asarray(scale), jnp.asarray(v), jnp.asarray(grad),
          hyper, seed, C=C, lagged=lagged)[0])))
  seeds = jnp.asarray(rng.integers(0, 2**32, n_seeds), jnp.uint32)
  samples = np.asarray(update(seeds)).astype(np.float64)
  # Each sample is floor(target) or floor(target) + 1.
  assert np.all(np.abs(samples - target[None]) < 1.0 + 1e-4)
  standard_error = np.sqrt(np.maximum(samples.var(0), 1e-3) / n_seeds)
  z = (samples.mean(0) - target) / standard_error
  assert np.abs(z).max() < 5.5, f"biased rounding: max |z| = {np.abs(z).max():.2f}"
  # Aggregate bias over all codes: far below one code step.
  assert abs((samples.mean(0) - target).mean()) < 4 * 0.5 / math.sqrt(n_seeds * target.size)
  result = reference.counter_update_reference(
      jnp.asarray(np_pack(codes)), jnp.asarray(scale), jnp.asarray(v), jnp.asarray(grad), hyper,
      jnp.uint32(1), C=C, lagged=lagged)
  np.testing.assert_allclose(np.asarray(result[1]), s_new, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(result[2]), v_new, rtol=1e-5)


@pytest.mark.parametrize("C", [1, 4, 11])
def test_codes_are_spec_rounding_of_the_target_also_at_the_clip(rng, C):
  """Codes equal SPEC's clip(floor(target + u)) with the shared draw, gradients far past the clip.

  The update clips the rounded value before its floor; large gradients of both
  signs push many targets far outside ``[0, 3lv)`` (saturation) and leave
  others inside. Float32 evaluation of the target may move a value across an
  integer: at most 1e-3 of codes, each by one.
  """
  out_features, in_features = 7, 4 * 30
  lv = 2 * C - 1
  codes = rng.integers(0, 3 * lv, (out_features, in_features))
  scale = rng.uniform(0.5, 1.5, out_features).astype(np.float32)
  v = rng.uniform(0.5, 1.5, out_features).astype(np.float32)
  grad = (rng.normal(size=(out_features, in_features))
          * rng.choice([0.1, 3.0, 1e4], (out_features, in_features))).astype(np.float32)
  kwargs = dict(C=C, lr=0.3, lr_scale=0.02, rms_beta=0.9, rms_eps=1e-8, lagged=False)
  target, _, _ = spec_target(codes, scale.astype(np.float64), v.astype(np.float64), grad,
                             **kwargs)
  seed = jnp.uint32(int(rng.integers(0, 2**32)))
  u = np.asarray(reference.rounding_draw(
      seed, jnp.arange(out_features, dtype=jnp.uint32)[:, None],
      jnp.arange(in_features, dtype=jnp.uint32)[None, :], in_features, high_word=False),
      np.float64)
  expected = np.clip(np.floor(target + u), 0, 3 * lv - 1)
  assert np.mean(expected == 0) > 0.05 and np.mean(expected == 3 * lv - 1) > 0.05
  hyper = jnp.asarray([0.3, 0.02, 0.9, 1e-8], jnp.float32)
  result = reference.counter_update_reference(
      jnp.asarray(np_pack(codes)), jnp.asarray(scale), jnp.asarray(v), jnp.asarray(grad),
      hyper, seed, C=C, lagged=False)
  got = np.asarray(codes_unpacked(result[0]), np.float64)
  assert not np.any(np.asarray(result[3]))
  assert np.abs(got - expected).max() <= 1
  assert np.mean(got != expected) <= 1e-3


def codes_unpacked(packed):
  return reference.unpack_codes_reference(packed).astype(jnp.int32)


def test_rounding_draw_is_the_shared_hash(rng):
  """u at (row, col) is noise.uniform01 at index row * in + col; the 64-bit path agrees."""
  from jaxnoise import noise  # pylint: disable=g-import-not-at-top
  rows = jnp.arange(5, dtype=jnp.uint32)[:, None]
  cols = jnp.arange(12, dtype=jnp.uint32)[None, :]
  seed = jnp.uint32(int(rng.integers(0, 2**32)))
  low = reference.rounding_draw(seed, rows, cols, 12, high_word=False)
  high = reference.rounding_draw(seed, rows, cols, 12, high_word=True)
  direct = noise.uniform01(seed, jnp.uint32(0), (rows * 12 + cols).astype(jnp.uint32))
  np.testing.assert_array_equal(np.asarray(low), np.asarray(direct))
  np.testing.assert_array_equal(np.asarray(high), np.asarray(direct))
  hi, lo = reference.element_index(jnp.uint32([70000])[:, None], jnp.uint32([5])[None, :],
                                   65536, high_word=True)
  assert (int(hi[0, 0]) << 32) + int(lo[0, 0]) == 70000 * 65536 + 5


# ----------------------------------------------------------------------------
# Kernels against the reference.


@pytest.mark.parametrize("implementation", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype,lagged,alternative", [
    (jnp.float32, False, 0), (jnp.float32, True, 1), (jnp.bfloat16, False, 2),
    (jnp.float16, True, 1)])
def test_counter_update_kernel_matches_reference(rng, implementation, dtype, lagged,
                                                  alternative):
  """The heuristic config and one alternative tiling (each case a different one)."""
  # Rows of 4 * odd inputs (byte units) or 16 * odd (word units), odd row counts.
  out_features = int(rng.integers(8, 40)) | 1
  in_features = int(rng.choice([4, 16])) * (int(rng.integers(3, 20)) | 1)
  C = int(rng.integers(1, 12))
  _, packed, scale, v = random_state(rng, out_features, in_features, C)
  grad = cast(rng.normal(size=(out_features, in_features)) * rng.uniform(0.1, 3), dtype)
  kwargs = hyper_kwargs(rng, C)
  expected = ternary.counter_update(packed, scale, v, grad, lagged=lagged,
                                    implementation="reference", donate=False, **kwargs)
  alternatives = [
      # Two-pass loop (rows past MAX_RESIDENT_GROUPS take it; forced here), bytes, strided.
      TwoPassUpdateConfig(block_rows=4, block_groups=4, tail_groups=4, num_warps=1,
                          num_stages=2, word_loads=False, vector_loads=False),
      # Chunked resident rows: a power-of-2 chunk and masked tails, words where in % 16 == 0.
      config_lib.CounterUpdateConfig(block_rows=2, block_groups=16, tail_groups=4),
      config_lib.CounterUpdateConfig(block_rows=1, block_groups=64, tail_groups=64,
                                     word_loads=False),
  ]
  for config in [None, alternatives[alternative]]:
    result = ternary.counter_update(packed, scale, v, grad, lagged=lagged,
                                    implementation=implementation, config=config,
                                    donate=False, **kwargs)
    assert_codes_close(result.packed, expected.packed, f"counter_update {config}")
    np.testing.assert_allclose(np.asarray(result.scale), np.asarray(expected.scale), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(result.v), np.asarray(expected.v), rtol=1e-5)
    assert int(result.skipped_rows) == int(expected.skipped_rows) == 0
  # The update moved a sizeable share of the codes (the comparison is not vacuous).
  assert (codes_of(expected.packed) != codes_of(packed)).mean() > 0.05


@pytest.mark.parametrize("implementation", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype,lagged,first_case", [(jnp.float32, False, 0),
                                                     (jnp.bfloat16, True, 1)])
def test_counter_update_from_io_kernel_matches_reference(rng, implementation, dtype, lagged,
                                                          first_case):
  """Fused and two-kernel paths in byte and word units (two of the four per case)."""
  out_features, m_rows = int(rng.integers(17, 40)) | 1, int(rng.integers(5, 40)) | 1
  C = int(rng.integers(1, 12))
  kwargs = hyper_kwargs(rng, C)
  cases = [
      # One tile per row (the fused kernel): byte units, then word units.
      (4 * (int(rng.integers(3, 30)) | 1), None),
      (16 * (int(rng.integers(2, 6)) | 1), None),
      # Statistics + update kernels: byte units, then word units (2 per tile).
      (4 * 37, config_lib.FromIOConfig(block_rows=16, block_groups=16, block_m=16,
                                       num_warps=2, num_stages=2)),
      (16 * 7, config_lib.FromIOConfig(block_rows=16, block_groups=8, block_m=16)),
  ]
  # Case 0 runs fused bytes + two-kernel words, case 1 fused words + two-kernel bytes.
  for in_features, config in (cases[first_case], cases[3 - first_case]):
    _, packed, scale, v = random_state(rng, out_features, in_features, C)
    x = cast(rng.normal(size=(m_rows, in_features)), dtype)
    grad_out = cast(rng.normal(size=(m_rows, out_features)), dtype)
    expected = ternary.counter_update_from_io(packed, scale, v, x, grad_out, lagged=lagged,
                                              implementation="reference", donate=False,
                                              **kwargs)
    result = ternary.counter_update_from_io(packed, scale, v, x, grad_out, lagged=lagged,
                                            implementation=implementation, config=config,
                                            donate=False, **kwargs)
    assert_codes_close(result.packed, expected.packed, f"from_io {in_features} {config}")
    np.testing.assert_allclose(np.asarray(result.scale), np.asarray(expected.scale),
                               rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(result.v), np.asarray(expected.v), rtol=1e-4)
    assert (codes_of(expected.packed) != codes_of(packed)).mean() > 0.05
    # The dense-gradient update of grad_out^T x is the same update.
    dense = ternary.counter_update(
        packed, scale, v, jnp.einsum("mo,mi->oi", grad_out.astype(jnp.float32),
                                     x.astype(jnp.float32), precision="highest"),
        lagged=lagged, implementation="reference", donate=False, **kwargs)
    assert_codes_close(dense.packed, expected.packed, "dense vs from_io")


@pytest.mark.parametrize("implementation", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype,lagged", [(jnp.float32, False), (jnp.bfloat16, True)])
def test_from_io_by_xla_gemm_row_blocks_is_the_dense_update(rng, implementation, dtype, lagged):
  """``FromIOConfig(xla_gemm_rows=...)``: row blocks updated with the layer's draws.

  Integer ``x`` and ``grad_out`` make ``grad_out^T x`` and the row statistics
  exact in any summation order, so the blocks (a ragged last one included)
  must give the dense-gradient update of the whole gradient: the same codes;
  a block drawing its local rows' bits would not.
  """
  from jaxnoise.ops.ternary import pallas_triton_update as kernels  # pylint: disable=g-import-not-at-top
  out_features, in_features, m_rows = int(rng.integers(20, 45)), 4 * int(rng.integers(5, 30)), 13
  C = int(rng.integers(2, 12))
  kwargs = hyper_kwargs(rng, C)
  _, packed, scale, v = random_state(rng, out_features, in_features, C)
  x = cast(rng.integers(-3, 4, size=(m_rows, in_features)), dtype)
  grad_out = cast(rng.integers(-3, 4, size=(m_rows, out_features)), dtype)
  dense = ternary.counter_update(
      packed, scale, v, reference.io_weight_gradient(x, grad_out), lagged=lagged,
      implementation=implementation, donate=False, **kwargs)
  for rows in (7, out_features // 2, out_features, 4 * out_features):
    config = config_lib.FromIOConfig(xla_gemm_rows=rows)
    result = ternary.counter_update_from_io(packed, scale, v, x, grad_out, lagged=lagged,
                                            implementation=implementation, config=config,
                                            donate=False, **kwargs)
    assert_same_update(result, dense, f"{rows=}")
  assert (codes_of(dense.packed) != codes_of(packed)).mean() > 0.05
  # With a 64-bit rounding index (forced here), the blocks draw the layer's bits too.
  hyper = jnp.asarray([kwargs["lr"], kwargs["lr_scale"], kwargs["rms_beta"], kwargs["rms_eps"]],
                      jnp.float32)
  seed = jnp.asarray([kwargs["seed"]], jnp.uint32)
  interpret = implementation == "interpret"
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(reference, "needs_high_word", lambda out_features, in_features: True)
    blocks = kernels.counter_update_from_io(
        packed, scale, v, x, grad_out, hyper, seed, C=C, lagged=lagged,
        config=config_lib.FromIOConfig(xla_gemm_rows=7), interpret=interpret)
    whole = kernels.counter_update(packed, scale, v, reference.io_weight_gradient(x, grad_out),
                                   hyper, seed, C=C, lagged=lagged, interpret=interpret)
  assert_same_update(blocks, whole, "high word")


def assert_same_update(actual, expected, what: str) -> None:
  """Codes and skipped rows equal; ``scale`` and ``v`` within an ulp or two (separate
  programs may contract ``beta * v + (1 - beta) * mean`` into a multiply-add or not)."""
  for name, a, b in zip(("packed", "scale", "v", "skipped"), actual, expected):
    if name in ("scale", "v"):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=3e-7, err_msg=f"{name} {what}")
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=f"{name} {what}")


@pytest.mark.parametrize("high_word", [False, True])
def test_update_kernel_row_block_updates_the_layer_rows(rng, monkeypatch, high_word):
  """The dense kernel given rows ``[r0, r1)`` of the gradient and ``row_block`` starting at
  ``r0`` updates those rows of the whole state as the whole update does, and keeps the others."""
  from jaxnoise.ops.ternary import pallas_triton_update as kernels  # pylint: disable=g-import-not-at-top
  if high_word:
    monkeypatch.setattr(reference, "needs_high_word", lambda out_features, in_features: True)
  out_features, in_features, C = 23, 4 * int(rng.integers(5, 14)), 6
  _, packed, scale, v = random_state(rng, out_features, in_features, C)
  grad = jnp.asarray(rng.normal(size=(out_features, in_features)), jnp.float32)
  grad = grad.at[11].set(jnp.nan)  # A skipped row inside the block.
  hyper = jnp.asarray([0.3, 0.01, 0.9, 1e-8], jnp.float32)
  seed = jnp.asarray([int(rng.integers(0, 2**32))], jnp.uint32)
  run = functools.partial(kernels.counter_update, hyper=hyper, seed=seed, C=C, lagged=False,
                          interpret=True)
  whole = run(packed, scale, v, grad)
  r0, r1 = 9, 20
  flags = jnp.full((out_features,), 7, jnp.int32)
  part = run(packed, scale, v, grad[r0:r1], row_block=(jnp.int32(3), 3, flags))
  for name, a, b, old in zip(("packed", "scale", "v", "skipped"), whole, part,
                             (packed, scale, v, flags)):
    a, b, old = np.asarray(a), np.asarray(b), np.asarray(old)
    np.testing.assert_array_equal(b[r0:r1], a[r0:r1], err_msg=name)
    np.testing.assert_array_equal(np.delete(b, np.s_[r0:r1], axis=0),
                                  np.delete(old, np.s_[r0:r1], axis=0), err_msg=name)
  assert np.asarray(whole[3])[11] and np.asarray(whole[3]).sum() == 1
  assert (codes_of(whole[0])[r0:r1] != codes_of(packed)[r0:r1]).mean() > 0.05


def test_64_bit_index_path_gives_the_same_bits(rng, monkeypatch):
  """Forcing the (hi, lo) index path (used above 2**32 weights) changes no bit."""
  from jaxnoise.ops.ternary import pallas_triton_update as kernels  # pylint: disable=g-import-not-at-top
  out_features, in_features, C = 9, 4 * 7, 5
  _, packed, scale, v = random_state(rng, out_features, in_features, C)
  grad = jnp.asarray(rng.normal(size=(out_features, in_features)), jnp.float32)
  x = jnp.asarray(rng.normal(size=(13, in_features)), jnp.float32)
  grad_out = jnp.asarray(rng.normal(size=(13, out_features)), jnp.float32)
  hyper = jnp.asarray([0.3, 0.01, 0.9, 1e-8], jnp.float32)
  seed = jnp.asarray([int(rng.integers(0, 2**32))], jnp.uint32)

  def run_all():
    # Fresh jits, so the patched index path is traced anew.
    return [
        jax.jit(functools.partial(kernels.counter_update, C=C, lagged=False, interpret=True))(
            packed, scale, v, grad, hyper, seed)[0],
        jax.jit(functools.partial(kernels.counter_update_from_io, C=C, lagged=False,
                                  interpret=True))(packed, scale, v, x, grad_out, hyper,
                                                   seed)[0],
        jax.jit(functools.partial(reference.counter_update_reference, C=C, lagged=False))(
            packed, scale, v, grad, hyper, seed[0])[0],
    ]

  low = run_all()
  monkeypatch.setattr(reference, "needs_high_word", lambda out_features, in_features: True)
  high = run_all()
  for a, b in zip(low, high):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert (codes_of(low[0]) != codes_of(packed)).mean() > 0.05


@pytest.mark.parametrize("implementation", ["reference"] + KERNEL_IMPLS)
def test_non_finite_gradient_rows_are_skipped(rng, implementation):
  out_features, in_features, C = 11, 4 * 9, 4
  codes, packed, scale, v = random_state(rng, out_features, in_features, C)
  grad = rng.normal(size=(out_features, in_features)).astype(np.float32)
  grad[2, 5] = np.nan
  grad[7, 0] = np.inf
  grad[9, :] = 1e30  # finite, but the sum of squares overflows
  kwargs = dict(hyper_kwargs(rng, C), implementation=implementation, donate=False)
  result = ternary.counter_update(packed, scale, v, jnp.asarray(grad), **kwargs)
  bad = np.array([2, 7, 9])
  good = np.setdiff1d(np.arange(out_features), bad)
  assert int(result.skipped_rows) == 3
  new_codes = codes_of(result.packed)
  np.testing.assert_array_equal(new_codes[bad], codes[bad])
  np.testing.assert_array_equal(np.asarray(result.scale)[bad], np.asarray(scale)[bad])
  np.testing.assert_array_equal(np.asarray(result.v)[bad], np.asarray(v)[bad])
  assert np.all(np.isfinite(np.asarray(result.scale))) and np.all(np.isfinite(result.v))
  # The other rows are updated exactly as without the bad rows.
  clean = grad.copy()
  clean[bad] = 0.0
  reference_result = ternary.counter_update(packed, scale, v, jnp.asarray(clean),
                                            **dict(kwargs, implementation="reference"))
  np.testing.assert_array_equal(new_codes[good], codes_of(reference_result.packed)[good])
  # From IO: a NaN in one output column of grad_out poisons exactly that row.
  x = jnp.asarray(rng.normal(size=(6, in_features)), jnp.float32)
  grad_out = rng.normal(size=(6, out_features)).astype(np.float32)
  grad_out[3, 4] = np.nan
  result = ternary.counter_update_from_io(packed, scale, v, x, jnp.asarray(grad_out), **kwargs)
  assert int(result.skipped_rows) == 1
  np.testing.assert_array_equal(codes_of(result.packed)[4], codes[4])
  assert np.all(np.isfinite(np.asarray(result.v)))


def test_donation_updates_in_place():
  packed, scale = ternary.ternary_init(jnp.ones((4, 8)), C=3)
  v = jnp.zeros(4)
  grad = jnp.ones((4, 8))
  kwargs = dict(C=3, lr=0.1, lr_scale=0.0, rms_beta=0.9, rms_eps=1e-8, seed=3,
                implementation="reference")
  kept = ternary.counter_update(packed, scale, v, grad, donate=False, **kwargs)
  assert not packed.is_deleted()
  donated = ternary.counter_update(packed, scale, v, grad, **kwargs)
  assert packed.is_deleted() and scale.is_deleted() and v.is_deleted()
  np.testing.assert_array_equal(np.asarray(kept.packed), np.asarray(donated.packed))


def test_kernel_aliases_state_buffers():
  """The compiled update writes the state in place: its outputs alias the inputs."""
  packed, scale = ternary.ternary_init(jnp.ones((4, 8)), C=3)
  args = (packed, scale, jnp.zeros(4), jnp.ones((4, 8)), jnp.ones(4, jnp.float32) * 0.5,
          jnp.zeros((1,), jnp.uint32))
  from jaxnoise.ops.ternary import update  # pylint: disable=g-import-not-at-top
  static = update._UpdateStatic(3, False, "interpret", None)  # pylint: disable=protected-access
  hlo = update._update_donating.lower(static, *args).as_text()  # pylint: disable=protected-access
  assert "tf.aliasing_output" in hlo or "jax.buffer_donor" in hlo


# ----------------------------------------------------------------------------
# Packed matmul.


@pytest.mark.parametrize("implementation", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_ternary_matmul_kernel_matches_reference(rng, implementation, dtype):
  """Every method (dot tiles, split along in, fma with vector and strided x, decode) over the
  dtypes; word and byte units."""
  # bfloat16 runs byte units (in = 4 * odd), the others word units (in = 16 * odd).
  in_features = (4 if dtype == jnp.bfloat16 else 16) * (int(rng.integers(5, 12)) | 1)
  out_features = int(rng.integers(5, 40)) | 1
  C = int(rng.integers(1, 12))
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == jnp.float32 else dict(rtol=2e-2, atol=2e-2)
  config = config_lib.MatmulConfig
  cases = [
      ((int(rng.integers(1, 9)) | 1,), None),
      ((2, 9), config(block_m=16, block_n=16, block_groups=16, num_warps=2, num_stages=2)),
      ((3,), config(block_m=16, block_n=16, block_groups=16, num_warps=2, split_k=3)),
      ((1,), config(block_m=1, block_n=4, block_groups=8, method="fma", split_k=2)),
      ((2, 1), config(block_m=2, block_n=8, block_groups=4, method="fma", word_loads=False)),
      ((5,), config(method="decode")),
      ((2,), config(block_m=2, block_n=8, block_groups=8, method="fma", split_k=2,
                    num_warps=2, x_vector_loads=False)),
  ]
  # The heuristic, and two of the six other forms per dtype (all six over the three).
  first = DTYPES.index(dtype) * 2
  for batch_shape, config in [cases[0]] + [cases[1 + (first + k) % 6] for k in range(2)]:
    x = cast(rng.normal(size=batch_shape + (in_features,)), dtype)
    y = ternary.ternary_matmul(x, packed, scale, C=C, implementation=implementation,
                               config=config)
    assert y.shape == batch_shape + (out_features,) and y.dtype == dtype
    weight = np.asarray(ternary.ternary_decode(packed, scale, C=C))
    expected = np.asarray(x, np.float32) @ weight.T
    np.testing.assert_allclose(np.asarray(y, np.float32), expected, **tolerance)
    reference_y = ternary.ternary_matmul(x, packed, scale, C=C, implementation="reference")
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(reference_y, np.float32),
                               **tolerance)


def test_int4_decode_target_is_rejected():
  """XLA's GEMM with an int4 operand gave wrong values on an H200: no config asks for one."""
  with pytest.raises(ValueError, match="decode_to='int4' was removed"):
    config_lib.MatmulConfig(method="decode", decode_to="int4")
  for m_rows in (1, 2, 4, 16, 64, 127, 128, 1024):
    for dtype in (jnp.bfloat16, jnp.float32):
      shape = (m_rows, 4096, 4096)
      configs = (config_lib.MatmulConfig.candidates(shape, dtype)
                 + config_lib.MatmulConfig.input_grad_candidates(shape, dtype))
      assert all(config.decode_to == "compute" for config in configs)


def test_bf16_pieces_sum_to_the_float32_value_exactly(rng):
  """Three bfloat16 pieces add up to ``x`` bit for bit from ``|x| = 2**-103`` up.

  ``hi`` alone is not ``x`` (a one-piece split fails), the largest float32
  does not overflow ``hi``, and infinities and NaN come back as themselves.
  Smaller values may lose subnormal pieces (flushed): less than ``2**-125``.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary.pallas_triton_matmul import bf16_pieces
  n = 4096
  x = (rng.choice([-1.0, 1.0], n) * rng.uniform(1.0, 2.0, n)
       * 2.0 ** rng.integers(-103, 127, n)).astype(np.float32)
  finfo = np.finfo(np.float32)
  x[:7] = [np.inf, -np.inf, np.nan, finfo.max, -finfo.max, -0.0, 2.0 ** -103]
  pieces = [np.asarray(piece.astype(jnp.float32)) for piece in bf16_pieces(jnp.asarray(x))]
  assert all(piece.dtype == jnp.bfloat16 for piece in bf16_pieces(jnp.asarray(x[:3])))
  np.testing.assert_array_equal(pieces[0] + pieces[1] + pieces[2], x)
  assert np.isfinite(pieces[0][3:5]).all() and (pieces[1][:2] == 0).all()
  assert np.mean(pieces[0][7:] != x[7:]) > 0.9 and np.mean(pieces[1][7:] != 0) > 0.9
  tiny = (rng.uniform(1.0, 2.0, n) * 2.0 ** rng.integers(-126, -103, n)).astype(np.float32)
  total = sum(np.asarray(piece.astype(jnp.float32)) for piece in bf16_pieces(jnp.asarray(tiny)))
  np.testing.assert_allclose(total, tiny, rtol=0, atol=2.0 ** -125)


@pytest.mark.parametrize("op", ["forward", "input_grad"])
def test_float32_pieces_match_float32_dots(rng, op):
  """float32 operands as bfloat16 pieces give the float32 dots' result to float32 rounding.

  Dot tiles (pieces split in the kernel) and decode (pieces stacked for one
  XLA GEMM, both temporaries); operands spread over six decades, so one
  bfloat16 piece (2**-9 relative per product) is far outside the tolerance;
  inf and NaN land where the float32 reference has them.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  out_features, in_features, m_rows = 23, 16 * 5, 5
  C = int(rng.integers(1, 12))
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  width = in_features if op == "forward" else out_features
  x = (rng.normal(size=(m_rows, width)) * 10.0 ** rng.uniform(-3, 3, (m_rows, width)))
  x = x.astype(np.float32)
  x[1, 3], x[2, 5] = np.inf, np.nan
  if op == "forward":
    kernel, reference_fn = matmul_kernels.ternary_matmul, reference.ternary_matmul_reference
  else:
    kernel = matmul_kernels.ternary_matmul_input_grad
    reference_fn = reference.ternary_matmul_input_grad_reference
  expected = np.asarray(reference_fn(jnp.asarray(x), packed, scale, C=C, out_dtype=jnp.float32))
  finite = np.isfinite(expected)
  assert finite[[0, 3, 4]].all() and not finite[1:3].all()
  atol = 1e-6 * np.abs(expected[finite]).max()
  matmul_config = config_lib.MatmulConfig
  for config in [matmul_config(block_m=16, block_n=16, block_groups=16, split_k=2),
                 matmul_config(method="decode")]:
    for split_float32 in (True, False):
      got = np.asarray(kernel(jnp.asarray(x), packed, scale, C=C, out_dtype=jnp.float32,
                              config=dataclasses.replace(config, split_float32=split_float32),
                              interpret=True))
      np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
      np.testing.assert_array_equal(np.where(np.isinf(got), got, 0),
                                    np.where(np.isinf(expected), expected, 0))
      np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=atol)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_input_grad_split_along_out_matches_one_slab(rng, dtype):
  """``out`` cut into slabs (float32 partial tiles summed by XLA): one slab's result.

  Ragged ``out`` (the last step masked), more slabs than steps (clamped),
  ragged rows and groups.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  out_features, in_features, m_rows = int(rng.integers(40, 90)) | 1, 4 * 21, 3
  C = int(rng.integers(1, 12))
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  grad_y = cast(rng.normal(size=(m_rows, out_features)), dtype)
  base = config_lib.MatmulConfig(block_m=16, block_n=16, block_groups=16, num_warps=2)
  grads = [np.asarray(matmul_kernels.ternary_matmul_input_grad(
      grad_y, packed, scale, C=C, out_dtype=jnp.float32,
      config=dataclasses.replace(base, split_k=split_k), interpret=True))
           for split_k in (1, 2, 3, 64)]
  for grad in grads[1:]:
    np.testing.assert_allclose(grad, grads[0], rtol=1e-6, atol=1e-6 * np.abs(grads[0]).max())
  expected = np.asarray(reference.ternary_matmul_input_grad_reference(grad_y, packed, scale,
                                                                     C=C))
  # 16-bit grad_y * scale is rounded to its dtype before the dot (~2**-8 relative).
  atol = (1e-5 if dtype == jnp.float32 else 1e-2) * np.abs(expected).max()
  np.testing.assert_allclose(grads[0], expected, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
@pytest.mark.parametrize("m_rows,block_m,in_features", [(5, 4, 16 * 9), (3, 2, 4 * 11),
                                                        (2, 2, 16 * 5)])
def test_fma_tiles_of_several_rows_agree_with_one_row_tiles(rng, dtype, m_rows, block_m,
                                                              in_features):
  """Rows sharing each weight's decode (``t * x`` per row) give the one-row tiles' sums.

  The products are exact either way; the tiles' float32 sums may associate
  differently, so the two agree to float32 rounding.
  Ragged ``M`` (rows past it masked), word and byte units, ``in`` split or not,
  ``x`` in vectors and strided.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  out_features, C = int(rng.integers(5, 40)) | 1, int(rng.integers(1, 12))
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  x = cast(rng.normal(size=(m_rows, in_features)), dtype)
  config = config_lib.MatmulConfig
  expected = reference.ternary_matmul_reference(x, packed, scale, C=C, out_dtype=jnp.float32)
  for split_k, vector in [(1, True), (3, False)]:
    tiles = dict(block_n=8, block_groups=8, split_k=split_k, method="fma",
                 x_vector_loads=vector)
    ys = [np.asarray(matmul_kernels.ternary_matmul(
        x, packed, scale, C=C, out_dtype=jnp.float32, config=config(block_m=rows, **tiles),
        interpret=True)) for rows in (block_m, 1)]
    np.testing.assert_allclose(ys[0], ys[1], rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(ys[0], np.asarray(expected), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("implementation", KERNEL_IMPLS)
def test_split_matmul_sums_every_slab_once(rng, implementation):
  """``in`` split across programs: every slab's partial tile is summed once.

  Integer ``x`` makes every partial sum exact, so any slab missed, stored
  over another's, or summed twice changes the result, and the expected value
  is exact (one float32 product with ``scale``). Then normal ``x``: repeated
  calls agree bit for bit, and with the reference to float32 rounding. fma
  and dot tiles, ragged ``M`` and ``out``, a split that does not divide the
  steps, more splits than steps (clamped), and (compiled) the one-row split
  tiles at 4096 inputs.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  config = config_lib.MatmulConfig
  compiled = implementation == "pallas"
  shapes = [(int(rng.integers(20, 60)) | 1, 16 * 12)] + ([(4099, 4096)] if compiled else [])
  cases = [(1, config(block_m=1, block_n=4, block_groups=8, method="fma", split_k=5)),
           (3, config(block_m=4, block_n=8, block_groups=4, method="fma", split_k=64)),
           (5, config(block_m=16, block_n=16, block_groups=16, num_warps=2, split_k=3))]
  if compiled:  # The split tiles of one row (16-bit x from 2048 outputs takes whole rows).
    cases.append((1, config._fma_config(1, 4096, 4096)))  # pylint: disable=protected-access
  for out_features, in_features in shapes:
    C = int(rng.integers(1, 12))
    codes, packed, scale, _ = random_state(rng, out_features, in_features, C)
    for m_rows, tiles in cases:
      assert tiles.split_k > 1
      x_int = rng.integers(-8, 9, (m_rows, in_features)).astype(np.float32)
      exact = exact_product(x_int, codes, C, scale)
      run = lambda x: np.asarray(matmul_kernels.ternary_matmul(  # noqa: E731
          jnp.asarray(x), packed, scale, C=C, out_dtype=jnp.float32, config=tiles,
          interpret=not compiled))
      np.testing.assert_array_equal(run(x_int), exact, err_msg=str(tiles))
      x = rng.normal(size=(m_rows, in_features)).astype(np.float32)
      first = run(x)
      for _ in range(8 if compiled else 1):
        np.testing.assert_array_equal(run(x), first, err_msg=str(tiles))
      expected = reference.ternary_matmul_reference(jnp.asarray(x), packed, scale, C=C,
                                                    out_dtype=jnp.float32)
      np.testing.assert_allclose(first, np.asarray(expected), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("implementation", KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_interleaved_dot_tiles_give_the_exact_product(rng, implementation, dtype):
  """Dot tiles with the code lanes joined into one tile of ``t`` (``interleave_lanes``), ``t``
  on the right or (``weights_lhs``) on the left.

  Integer ``x`` makes every product and partial sum exact, so a lane joined
  at the wrong column, an ``x`` column read at the wrong place, a masked
  step read as data or a slab summed twice changes the result: it must equal
  the exact product bit for bit, and the per-lane dot tiles' result too.
  Word units (``in % 16 == 0``) and byte units, ragged ``M``, ``out`` and
  ``in`` steps, ``in`` split, the next step's loads carried in registers
  (``register_prefetch``, 2-3 steps per program), float32 ``x`` as bfloat16
  pieces, and a ``weights_lhs`` config without ``interleave_lanes`` is
  rejected.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  config = config_lib.MatmulConfig
  tiles = [config(block_m=16, block_n=16, block_groups=16, num_warps=2, interleave_lanes=True),
           config(block_m=16, block_n=32, block_groups=32, num_warps=4, split_k=3,
                  interleave_lanes=True),
           config(block_m=16, block_n=64, block_groups=16, num_warps=4, split_k=2,
                  interleave_lanes=True, weights_lhs=True),
           config(block_m=32, block_n=64, block_groups=32, num_warps=4, num_stages=2,
                  interleave_lanes=True, weights_lhs=True),
           config(block_m=16, block_n=64, block_groups=16, num_warps=4, num_stages=1,
                  interleave_lanes=True, weights_lhs=True, register_prefetch=True),
           config(block_m=16, block_n=32, block_groups=16, num_warps=2, num_stages=1,
                  split_k=2, interleave_lanes=True, register_prefetch=True)]
  for in_features in (16 * (int(rng.integers(5, 12)) | 1), 4 * (int(rng.integers(9, 30)) | 1)):
    out_features, C = int(rng.integers(20, 60)) | 1, int(rng.integers(1, 12))
    codes, packed, scale, _ = random_state(rng, out_features, in_features, C)
    m_rows = int(rng.integers(2, 20))
    x_int = rng.integers(-8, 9, (m_rows, in_features)).astype(np.float32)
    exact = exact_product(x_int, codes, C, scale)
    run = lambda tile: np.asarray(matmul_kernels.ternary_matmul(  # noqa: E731
        cast(x_int, dtype), packed, scale, C=C, out_dtype=jnp.float32, config=tile,
        interpret=implementation == "interpret"))
    for tile in tiles:
      np.testing.assert_array_equal(run(tile), exact, err_msg=f"{tile} in={in_features}")
    lane_dots = dataclasses.replace(tiles[0], interleave_lanes=False)
    np.testing.assert_array_equal(run(lane_dots), exact, err_msg=f"{lane_dots} in={in_features}")
    x = cast(rng.normal(size=(m_rows, in_features)), dtype)
    expected = reference.ternary_matmul_reference(x, packed, scale, C=C, out_dtype=jnp.float32)
    for tile in tiles[1:3]:
      y = matmul_kernels.ternary_matmul(x, packed, scale, C=C, out_dtype=jnp.float32,
                                        config=tile, interpret=implementation == "interpret")
      np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-4)
  with pytest.raises(ValueError, match="weights_lhs needs interleave_lanes"):
    config(block_m=16, block_n=16, weights_lhs=True)


def test_matmul_candidates_hold_the_heuristic_and_its_neighbours():
  """Autotuning candidates: the heuristic first, no repeats; the joined tiles beside their
  per-lane twin (and, from 17 rows, a prefetching neighbour); GEMM tiles at 256 rows."""
  M = config_lib.MatmulConfig
  for m_rows in (1, 4, 5, 16, 17, 48, 64, 65, 256, 1024):
    for dtype in (jnp.bfloat16, jnp.float32):
      shape = (m_rows, 4096, 4096)
      candidates = M.candidates(shape, dtype)
      assert candidates[0] == M.get_heuristics_config(shape, dtype)
      assert len(set(candidates)) == len(candidates), (m_rows, dtype)
      base = candidates[0]
      if base.interleave_lanes:
        twin = dataclasses.replace(base, interleave_lanes=False, weights_lhs=False,
                                   num_stages=3)
        assert twin in candidates, (m_rows, dtype)
        assert any(c.register_prefetch for c in candidates) == (m_rows > 16), (m_rows, dtype)
      if m_rows >= 256 and dtype == jnp.bfloat16:
        assert M(block_m=128, block_n=256, block_groups=16, num_warps=8,
                 num_stages=3) in candidates


def test_matmul_heuristic_methods_per_batch_and_dtype():
  """fma tiles for 1-4 rows (every row in one program; 1-3 for float32), then dot tiles,
  then decode."""
  for dtype, fma_rows, decode_from in [(jnp.bfloat16, 4, 65), (jnp.float16, 4, 65),
                                       (jnp.float32, 3, 4)]:
    for m_rows in list(range(1, 70)) + [127, 128, 300]:
      config = config_lib.MatmulConfig.get_heuristics_config((m_rows, 4096, 4096), dtype)
      expected = ("fma" if m_rows <= fma_rows else "decode" if m_rows >= decode_from
                  else "dot")
      assert config.method == expected, (dtype, m_rows, config)
      assert config.method != "fma" or config.block_m >= m_rows, (dtype, m_rows, config)


def test_input_grad_heuristic_methods_per_batch_and_dtype():
  """Dot tiles with ``out`` split for one 16-bit row (~256 programs), decode beyond."""
  for dtype in (jnp.bfloat16, jnp.float16, jnp.float32):
    for m_rows in list(range(1, 70)) + [127, 128, 300]:
      for in_features, out_features in [(4096, 4096), (8192, 1024), (1024, 8192)]:
        config = config_lib.MatmulConfig.get_input_grad_heuristics_config(
            (m_rows, in_features, out_features), dtype)
        dot = m_rows == 1 and dtype != jnp.float32
        assert config.method == ("dot" if dot else "decode"), (dtype, m_rows, config)
        if dot:
          tiles = -(-in_features // (4 * config.block_groups))
          assert config.block_m >= m_rows and tiles * config.split_k == 256, config
          assert config.split_k <= -(-out_features // config.block_n), config


@pytest.mark.parametrize("m_rows", [1, 2, 3, 4, 5, 16, 40, 64, 65, 256])
def test_matmul_heuristic_configs_run_and_match_reference(rng, m_rows):
  """The heuristic's config per batch (fma, byte-unit dot, decode) runs in interpret mode."""
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  out_features, in_features, C = 37, 16 * 7, 5
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  x = jnp.asarray(rng.normal(size=(m_rows, in_features)), jnp.bfloat16)
  config = config_lib.MatmulConfig.get_heuristics_config((m_rows, out_features, in_features),
                                                         x.dtype)
  expected_method = {1: "fma", 2: "fma", 3: "fma", 4: "fma", 5: "dot", 16: "dot", 40: "dot",
                     64: "dot", 65: "decode", 256: "decode"}[m_rows]
  assert config.method == expected_method, config
  # fma: every row in one program (each weight read once).
  assert config.method != "fma" or config.block_m >= m_rows, config
  if config.method == "dot":
    # Words, t joined on the left, one pipeline stage, every row in one tile (session 22).
    assert config.word_loads and config.interleave_lanes and config.weights_lhs, config
    assert config.num_stages == 1 and config.block_m >= m_rows, config
  y = matmul_kernels.ternary_matmul(x, packed, scale, C=C, out_dtype=jnp.float32,
                                    config=config, interpret=True)
  expected = reference.ternary_matmul_reference(x, packed, scale, C=C, out_dtype=jnp.float32)
  np.testing.assert_allclose(np.asarray(y), np.asarray(expected), rtol=1e-5, atol=1e-4)
  # The input gradient: dot tiles (out split) for one row, decode from 2 rows; a forward
  # fma config stands for its heuristic.
  grad_y = jnp.asarray(rng.normal(size=(m_rows, out_features)), jnp.bfloat16)
  grad_config = config_lib.MatmulConfig.get_input_grad_heuristics_config(
      (m_rows, in_features, out_features), grad_y.dtype)
  assert grad_config.method == ("decode" if m_rows >= 2 else "dot"), grad_config
  assert grad_config.method != "dot" or grad_config.block_m >= 16, grad_config
  gx = matmul_kernels.ternary_matmul_input_grad(grad_y, packed, scale, C=C,
                                                out_dtype=jnp.float32, config=config,
                                                interpret=True)
  expected_gx = np.asarray(reference.ternary_matmul_input_grad_reference(grad_y, packed, scale,
                                                                        C=C))
  # The kernel rounds grad_y * scale to bfloat16 before its dot: ~2**-8 relative error.
  np.testing.assert_allclose(np.asarray(gx), expected_gx, rtol=0,
                             atol=1e-2 * np.abs(expected_gx).max())


@pytest.mark.parametrize("implementation", ["reference"] + KERNEL_IMPLS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_ternary_matmul_vjp(rng, implementation, dtype):
  """Gradients w.r.t. x and scale equal those of the dense matmul with the decoded weight."""
  out_features, in_features, C = 19, 4 * 11, 6
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  x = cast(rng.normal(size=(3, 7, in_features)), dtype)
  cotangent = jnp.asarray(rng.normal(size=(3, 7, out_features)), jnp.float32)
  t = reference.ternary_of(jnp.asarray(codes_of(packed)), C).astype(jnp.float32)

  def packed_loss(x, scale):
    y = ternary.ternary_matmul(x, packed, scale, C=C, implementation=implementation)
    return jnp.sum(y.astype(jnp.float32) * cotangent)

  def dense_loss(x, scale):
    y = jnp.einsum("...i,oi->...o", x.astype(jnp.float32), t * scale[:, None],
                   precision="highest")
    return jnp.sum(y * cotangent)

  grad_x, grad_scale = jax.grad(packed_loss, argnums=(0, 1))(x, scale)
  dense_x, dense_scale = jax.grad(dense_loss, argnums=(0, 1))(x, scale)
  assert grad_x.dtype == dtype and grad_scale.dtype == jnp.float32
  tolerance = 1e-4 if dtype == jnp.float32 else 3e-2
  np.testing.assert_allclose(np.asarray(grad_x, np.float32),
                             np.asarray(dense_x.astype(dtype), np.float32),
                             rtol=tolerance, atol=tolerance * 3)
  np.testing.assert_allclose(np.asarray(grad_scale), np.asarray(dense_scale), rtol=tolerance,
                             atol=tolerance * 10)
  # The weight "gradient" grad_y^T x is what counter training consumes; packed has none.
  assert jax.grad(packed_loss)(x, scale).shape == x.shape


# ----------------------------------------------------------------------------
# Validation.


def _state(out_features=3, in_features=8, C=3):
  packed, scale = ternary.ternary_init(jnp.ones((out_features, in_features)), C)
  return packed, scale, jnp.zeros(out_features)


UPDATE_KWARGS = dict(C=3, lr=0.1, lr_scale=0.0, rms_beta=0.9, rms_eps=1e-8, seed=0,
                     donate=False)


@pytest.mark.parametrize("bad_C,error", [(0, ValueError), (12, ValueError), (1.5, TypeError),
                                         (True, TypeError), ("3", TypeError)])
def test_bad_C(bad_C, error):
  packed, scale, v = _state()
  with pytest.raises(error, match="C must"):
    ternary.ternary_init(jnp.ones((3, 8)), bad_C)
  with pytest.raises(error, match="C must"):
    ternary.counter_update(packed, scale, v, jnp.zeros((3, 8)),
                           **dict(UPDATE_KWARGS, C=bad_C))


def test_in_features_not_multiple_of_4():
  with pytest.raises(ValueError, match=r"multiple of 4.*shape=\(3, 10\)"):
    ternary.ternary_init(jnp.ones((3, 10)), 3)
  with pytest.raises(ValueError, match=r"multiple of 4.*shape=\(2, 6\)"):
    ternary.pack_codes(jnp.zeros((2, 6), jnp.uint8))
  packed, scale, v = _state()
  with pytest.raises(ValueError, match=r"grad_w.*multiple of 4"):
    ternary.counter_update(packed, scale, v, jnp.zeros((3, 9)), **UPDATE_KWARGS)
  with pytest.raises(ValueError, match=r"x.*multiple of 4"):
    ternary.ternary_matmul(jnp.ones((2, 7)), packed, scale, C=3)


def test_codes_out_of_range():
  with pytest.raises(ValueError, match=r"codes holds 1 codes outside \[0, 9\).*max 9"):
    ternary.pack_codes(np.array([[0, 1, 9, 2]]), C=2)
  with pytest.raises(ValueError, match=r"outside \[0, 64\)"):
    ternary.pack_codes(np.array([[0, 1, 64, 2]]))
  with pytest.raises(ValueError, match=r"outside \[0, 0\)|min -1"):
    ternary.pack_codes(np.array([[0, -1, 3, 2]]))
  packed = ternary.pack_codes(np.array([[0, 1, 40, 2]]))
  with pytest.raises(ValueError, match="packed holds 1 codes outside"):
    ternary.unpack_codes(packed, C=2)
  with pytest.raises(TypeError, match=r"codes must have an integer dtype.*float32"):
    ternary.pack_codes(jnp.zeros((2, 4), jnp.float32))


def test_state_shape_and_dtype_errors():
  packed, scale, v = _state()
  grad = jnp.zeros((3, 8))
  with pytest.raises(TypeError, match=r"packed must be uint8.*int32"):
    ternary.counter_update(packed.astype(jnp.int32), scale, v, grad, **UPDATE_KWARGS)
  with pytest.raises(ValueError, match=r"packed must have a positive multiple of 3.*\(3, 5\)"):
    ternary.counter_update(packed[:, :5], scale, v, grad, **UPDATE_KWARGS)
  with pytest.raises(ValueError, match=r"scale must have shape \(3,\).*shape=\(4,\)"):
    ternary.counter_update(packed, jnp.ones(4), v, grad, **UPDATE_KWARGS)
  with pytest.raises(TypeError, match=r"v must have dtype.*bfloat16"):
    ternary.counter_update(packed, scale, v.astype(jnp.bfloat16), grad, **UPDATE_KWARGS)
  with pytest.raises(ValueError, match=r"grad_w must have shape \(out, in\) = \(3, 8\)"):
    ternary.counter_update(packed, scale, v, jnp.zeros((4, 8)), **UPDATE_KWARGS)
  with pytest.raises(TypeError, match=r"grad_w must have dtype.*int32"):
    ternary.counter_update(packed, scale, v, grad.astype(jnp.int32), **UPDATE_KWARGS)
  with pytest.raises(ValueError, match=r"x and grad_out must share.*\(5, 8\).*\(4, 3\)"):
    ternary.counter_update_from_io(packed, scale, v, jnp.ones((5, 8)), jnp.ones((4, 3)),
                                   **UPDATE_KWARGS)
  with pytest.raises(ValueError, match=r"grad_out's last dimension must be out_features=3"):
    ternary.counter_update_from_io(packed, scale, v, jnp.ones((5, 8)), jnp.ones((5, 4)),
                                   **UPDATE_KWARGS)
  with pytest.raises(ValueError, match=r"x's last dimension must be in_features=8"):
    ternary.ternary_matmul(jnp.ones((2, 12)), packed, scale, C=3)


@pytest.mark.parametrize("name,value,error", [
    ("lr", float("nan"), ValueError), ("rms_beta", 1.5, ValueError),
    ("rms_eps", 0.0, ValueError), ("lr_scale", float("inf"), ValueError),
    ("lr", jnp.ones(2), ValueError), ("seed", 1.5, TypeError), ("seed", jnp.ones(2, jnp.int32),
                                                                ValueError),
    ("implementation", "cuda", ValueError),
    ("config", config_lib.MatmulConfig(), TypeError)])
def test_hyperparameter_errors(name, value, error):
  packed, scale, v = _state()
  with pytest.raises(error, match=name if name != "implementation" else "implementation"):
    ternary.counter_update(packed, scale, v, jnp.zeros((3, 8)),
                           **dict(UPDATE_KWARGS, **{name: value}))


def test_traced_hyperparameters_and_seed():
  """lr, seeds and the state may be traced (schedules, jit-compiled train steps)."""
  packed, scale, v = _state()

  @jax.jit
  def step(packed, scale, v, lr, seed):
    return ternary.counter_update(packed, scale, v, jnp.ones((3, 8)),
                                  **dict(UPDATE_KWARGS, lr=lr, seed=seed))

  traced = step(packed, scale, v, jnp.float32(0.3), jnp.uint32(5))
  eager = ternary.counter_update(packed, scale, v, jnp.ones((3, 8)),
                                 **dict(UPDATE_KWARGS, lr=0.3, seed=5))
  np.testing.assert_array_equal(np.asarray(traced.packed), np.asarray(eager.packed))


# ----------------------------------------------------------------------------
# Configs and Triton lowering.


@pytest.mark.parametrize("shape", [(1, 4), (37, 44), (4096, 4096), (11008, 4096),
                                   (4096, 11008), (64, 40000)])
def test_heuristic_configs_are_valid(shape):
  dtype = jnp.float32
  configs = [
      config_lib.ElementwiseConfig.get_heuristics_config(shape, dtype),
      config_lib.CounterUpdateConfig.get_heuristics_config(shape, dtype),
      config_lib.FromIOConfig.get_heuristics_config((4096,) + shape, dtype),
      config_lib.MatmulConfig.get_heuristics_config((1,) + shape, dtype),
      config_lib.MatmulConfig.get_heuristics_config((4096,) + shape, jnp.bfloat16),
  ]
  for config in configs:
    hash(config)
    assert dataclasses_replace_roundtrip(config) == config
  update = configs[1]
  groups = shape[1] // 4
  if groups <= 4096:
    chunks = update.row_chunks(groups)
    assert chunks is not None, "rows up to in=16384 are updated in one pass"
    assert chunks[-1][0] + chunks[-1][1] >= groups
    assert all(size & (size - 1) == 0 and size <= update.block_groups for _, size in chunks)


def dataclasses_replace_roundtrip(config):
  import dataclasses  # pylint: disable=g-import-not-at-top
  return dataclasses.replace(config)


def test_bitwise_conversions_are_exact():
  """float_of_code and ternary_float equal the conversions they replace (also under jit)."""
  codes = jnp.arange(64, dtype=jnp.int32)
  np.testing.assert_array_equal(np.asarray(jax.jit(reference.float_of_code)(codes)),
                                np.arange(64, dtype=np.float32))
  for C in (1, 5, 11):
    np.testing.assert_array_equal(np.asarray(reference.ternary_float(codes, C)),
                                  np.asarray(reference.ternary_of(codes, C), np.float32))


def _every_code_in_every_field():
  """``(lanes, words, groups)``: 16 int32 code lanes holding every code 0..63 (past the
  range too) in every lane, packed as words and (the first four) as byte groups."""
  codes = np.stack([np.roll(np.arange(64), k)[:16 * 4] for k in range(64)]).astype(np.int32)
  lanes = [jnp.asarray(codes[:, j::16].reshape(-1)) for j in range(16)]
  groups = [x.astype(jnp.uint32) for x in reference.pack_group(*lanes[:4])]
  return lanes, reference.pack_words(lanes), groups


@pytest.mark.parametrize("jit", [False, True])
def test_centres_read_from_packed_fields_are_exact(jit):
  """word_centers / group_centers and ternary_of_center equal code_center and ternary_of.

  Every code 0..63 (past the range too) in every field position, every C; under
  jit as well (XLA's simplifier must not cancel the rounding bias).
  """
  lanes, words, groups = _every_code_in_every_field()
  maybe_jit = jax.jit if jit else (lambda f: f)
  for C in range(1, 12):
    word_lanes = maybe_jit(lambda w: [(c, reference.ternary_of_center(c, s, C))
                                      for c, s in reference.word_centers(*w, C)])(words)
    group_lanes = maybe_jit(lambda b: [(c, reference.ternary_of_center(c, s, C))
                                       for c, s in reference.group_centers(*b, C)])(groups)
    shifts = [s for _, s in reference.word_centers(*words, C)] + [
        s for _, s in reference.group_centers(*groups, C)]
    for j, ((center, t), shift) in enumerate(zip(word_lanes + group_lanes, shifts)):
      code = lanes[j % 16] if j < 16 else lanes[j - 16]
      np.testing.assert_array_equal(np.asarray(center) * np.float32(2.0**-shift),
                                    np.asarray(reference.code_center(code, C)))
      np.testing.assert_array_equal(np.asarray(t),
                                    np.asarray(reference.ternary_of(code, C), np.float32))


@pytest.mark.parametrize("jit", [False, True])
def test_ternary_from_clamped_ramps_is_exact(rng, jit):
  """word_ternary / group_ternary (two clamped adds per code) equal ternary_of, bit for bit.

  Every code 0..63 (past the range too) in every field position, every C, under
  jit too; then random words (each field's neighbours hold arbitrary bits, which the
  mask must drop).
  """
  lanes, words, groups = _every_code_in_every_field()
  maybe_jit = jax.jit if jit else (lambda f: f)
  for C in range(1, 12):
    got = maybe_jit(lambda w, b: (reference.word_ternary(*w, C),
                                  reference.group_ternary(*b, C)))(words, groups)
    for j, value in enumerate(got[0] + got[1]):
      code = lanes[j % 16] if j < 16 else lanes[j - 16]
      np.testing.assert_array_equal(np.asarray(value),
                                    np.asarray(reference.ternary_of(code, C), np.float32))
  # Random words: each field's neighbours hold arbitrary bits.
  words = [jnp.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32))
           for _ in range(3)]
  for C in (1, 6, 11):
    expected = [reference.ternary_of(c, C) for c in reference.unpack_words(*words)]
    for value, want in zip(reference.word_ternary(*words, C), expected):
      np.testing.assert_array_equal(np.asarray(value), np.asarray(want, np.float32))


def test_ramp_offsets_reject_what_they_cannot_decode():
  """Every field position a kernel reads has offsets; fields past bit 24 and bad thresholds
  are refused, and the bases miss the fields they serve."""
  for bit in range(25):
    base = reference.ramp_base(bit)
    assert base & (0x3F << bit) == 0 and not base >> 31, bit
    for threshold in range(1, 43):
      above = reference.ramp_offset(bit, threshold, True)
      below = reference.ramp_offset(bit, threshold, False)
      assert np.float32(above) == above and np.float32(below) == below
  for bad in [(25, 3, True), (0, 0, True), (0, 64, False)]:
    with pytest.raises(AssertionError):
      reference.ramp_offset(*bad)


@pytest.mark.parametrize("implementation", KERNEL_IMPLS)
@pytest.mark.parametrize("block_m", [1, 4])
def test_fma_tiles_propagate_nonfinite_x_as_the_reference(rng, block_m, implementation):
  """inf and NaN in ``x`` reach the outputs the float32 reference gives them (inf * 0 = NaN).

  The multiply-add tiles form ``x * t`` (t = 0 included), as a dense matmul does.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  out_features, in_features, C = 19, 16 * 5, int(rng.integers(1, 12))
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  x = rng.normal(size=(block_m, in_features)).astype(np.float32)
  x[0, 3] = np.inf  # +-inf where t is +-1, NaN where it is 0
  if block_m > 1:
    x[-1, 40] = np.nan
  expected = np.asarray(reference.ternary_matmul_reference(jnp.asarray(x), packed, scale, C=C,
                                                           out_dtype=jnp.float32))
  assert np.isnan(expected).any() and np.isinf(expected).any()
  config = config_lib.MatmulConfig(block_m=block_m, block_n=8, block_groups=8, method="fma")
  got = np.asarray(matmul_kernels.ternary_matmul(jnp.asarray(x), packed, scale, C=C,
                                                 out_dtype=jnp.float32, config=config,
                                                 interpret=implementation == "interpret"))
  np.testing.assert_array_equal(np.isnan(got), np.isnan(expected))
  np.testing.assert_array_equal(np.where(np.isinf(got), got, 0),
                                np.where(np.isinf(expected), expected, 0))
  finite = np.isfinite(expected)
  np.testing.assert_allclose(got[finite], expected[finite], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m_rows", [1, 3, 8])
def test_compiled_matmul_lowers_to_saturated_adds(m_rows):
  """The compiled kernels (lowered for CUDA here, without a GPU) form t with one saturated
  add per clamp and, in the multiply-add tiles, one fma per product; the bases and offsets
  are float32 immediates (the interpreter never sees this PTX)."""
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops import _pallas
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels  # pylint: disable=g-import-not-at-top
  out_features, in_features = 256, 256
  config = config_lib.MatmulConfig.get_heuristics_config((m_rows, out_features, in_features),
                                                         jnp.bfloat16)
  spec = jax.ShapeDtypeStruct
  lowered = jax.jit(lambda x, packed, scale: matmul_kernels.ternary_matmul(
      x, packed, scale, C=5, out_dtype=jnp.bfloat16, config=config)).trace(
          spec((m_rows, in_features), jnp.bfloat16),
          spec((out_features, 3 * in_features // 4), jnp.uint8),
          spec((out_features,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
  # The kernel sits in the module as MLIR bytecode, whose strings are stored once: one
  # clamp of each kind per field position (12 in place, and bit 0, where the three codes
  # at bits 26-31 or straddling two words are unpacked to).
  assert lowered.count("add.rn.sat.f32") == 13 and lowered.count("sub.rn.sat.f32") == 13
  assert ("fma.rn.f32" in lowered) == (config.method == "fma"), config
  offset = reference.ramp_offset(0, reference.levels(5), True)
  assert _pallas._float32_hex(offset) in lowered  # pylint: disable=protected-access
  assert _pallas._float32_hex(1.0) == "0f3F800000"  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="not a float32 value"):
    _pallas._float32_hex(0.1)  # pylint: disable=protected-access


def test_uniform_draw_of_masked_word_is_the_shifted_one():
  """uniform01_of_word ((w & ~0xFF) * 2**-32) is (w >> 8) * 2**-24, bit for bit."""
  from jaxnoise import noise  # pylint: disable=g-import-not-at-top
  words = np.random.default_rng(3).integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)
  words = np.concatenate([words, np.uint32([0, 255, 256, 2**24 - 1, 2**24, 2**31, 2**32 - 1])])
  expected = (words >> 8).astype(np.float32) * np.float32(2.0**-24)
  actual = np.asarray(jax.jit(noise.uniform01_of_word)(jnp.asarray(words)))
  np.testing.assert_array_equal(actual.view(np.uint32), expected.view(np.uint32))


def test_counter_update_candidates_are_valid():
  for shape in ((4096, 4096), (8192, 8192), (1536, 2304), (37, 44)):
    candidates = config_lib.CounterUpdateConfig.candidates(shape)
    assert candidates[0] == config_lib.CounterUpdateConfig.get_heuristics_config(shape)
    assert len(set(candidates)) == len(candidates)
    assert len({c.word_loads for c in candidates}) == 2


def test_config_validation():
  with pytest.raises(ValueError, match="block_groups must be a positive power of 2"):
    config_lib.CounterUpdateConfig(block_groups=48)
  with pytest.raises(ValueError, match="num_warps"):
    config_lib.CounterUpdateConfig(num_warps=3)
  with pytest.raises(ValueError, match="block_m must be >= 16"):
    config_lib.FromIOConfig(block_m=8)
  for rows in (0, -4, True, 2.0):
    with pytest.raises(ValueError, match="xla_gemm_rows must be None or a positive int"):
      config_lib.FromIOConfig(xla_gemm_rows=rows)
  with pytest.raises(ValueError, match="block_n must be >= 16"):
    config_lib.MatmulConfig(block_n=8)
  with pytest.raises(ValueError, match="block_groups must be >= 16 for method='dot'"):
    config_lib.MatmulConfig(block_groups=8)
  config_lib.MatmulConfig(block_m=1, block_n=4, block_groups=4, method="fma")  # fma: any size
  with pytest.raises(ValueError, match="decode_to must be one of"):
    config_lib.MatmulConfig(method="decode", decode_to="fp8")


def _lowerings():
  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton as kernels
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  from jaxnoise.ops.ternary import pallas_triton_update as update_kernels
  # pylint: enable=g-import-not-at-top
  spec = jax.ShapeDtypeStruct
  cases = []
  for out_features, in_features in [(37, 44), (4096, 4096), (64, 40000)]:
    n_bytes = 3 * in_features // 4
    packed, row = spec((out_features, n_bytes), jnp.uint8), spec((out_features,), jnp.float32)
    hyper, seed = spec((4,), jnp.float32), spec((1,), jnp.uint32)
    for dtype in (jnp.float32, jnp.bfloat16):
      cases.append((f"update {out_features}x{in_features} {dtype.__name__}",
                    functools.partial(update_kernels.counter_update, C=5, lagged=False),
                    (packed, row, row, spec((out_features, in_features), dtype), hyper, seed)))
      for m_rows in (1, 4096):
        cases.append((f"matmul {m_rows} {out_features}x{in_features} {dtype.__name__}",
                      functools.partial(matmul_kernels.ternary_matmul, C=5, out_dtype=dtype),
                      (spec((m_rows, in_features), dtype), packed, row)))
        cases.append((f"matmul dx {m_rows} {out_features}x{in_features} {dtype.__name__}",
                      functools.partial(matmul_kernels.ternary_matmul_input_grad, C=5,
                                        out_dtype=dtype),
                      (spec((m_rows, out_features), dtype), packed, row)))
      cases.append((f"from_io {out_features}x{in_features} {dtype.__name__}",
                    functools.partial(update_kernels.counter_update_from_io, C=5, lagged=True),
                    (packed, row, row, spec((33, in_features), dtype),
                     spec((33, out_features), dtype), hyper, seed)))
    # The non-default forms: CUDA-core GEMV tiles and byte-unit, strided update loads.
    cases.append((f"matmul fma {out_features}x{in_features}", functools.partial(
        matmul_kernels.ternary_matmul, C=5, out_dtype=jnp.bfloat16,
        config=config_lib.MatmulConfig(block_m=1, block_n=16, block_groups=64, method="fma",
                                       split_k=2)),
                  (spec((1, in_features), jnp.bfloat16), packed, row)))
    cases.append((f"update bytes {out_features}x{in_features}", functools.partial(
        update_kernels.counter_update, C=5, lagged=False,
        config=config_lib.CounterUpdateConfig(word_loads=False, vector_loads=False)),
                  (packed, row, row, spec((out_features, in_features), jnp.float32), hyper,
                   seed)))
    cases.append(("pack", kernels.pack_codes, (spec((out_features, in_features), jnp.uint8),)))
    cases.append(("unpack", kernels.unpack_codes, (packed,)))
    cases.append(("decode", functools.partial(kernels.ternary_decode, C=5, dtype=jnp.bfloat16),
                  (packed, row)))
    cases.append(("init", functools.partial(kernels.ternary_init, C=5),
                  (spec((out_features, in_features), jnp.float32),)))
  return cases


def test_kernels_lower_to_triton():
  """Every kernel lowers through Pallas' Triton backend (power-of-2 tensors, supported ops).

  Cross-platform lowering for "cuda" runs on a CPU-only machine: it catches what the
  interpreter cannot (non-power-of-2 tensors, ops the Triton lowering lacks).
  """
  for name, fn, args in _lowerings():
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
    assert "xla.gpu.triton" in text, name
    if name.startswith(("update", "from_io")):
      # The codes (and for one-kernel updates scale and v) are written in place.
      expected = 3 if name.startswith("update") or "37x44" in name else 1
      assert text.count("output_operand_alias<") >= expected, name


# ----------------------------------------------------------------------------
# Compiled on a GPU.


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1000, 4 * 999), (4096, 4096)])
def test_gpu_counter_update_matches_reference(rng, shape):
  out_features, in_features = shape
  C = 11
  _, packed, scale, v = random_state(rng, out_features, in_features, C)
  grad = jnp.asarray(rng.normal(size=shape), jnp.float32)
  kwargs = hyper_kwargs(rng, C)
  expected = ternary.counter_update(packed, scale, v, grad, implementation="reference",
                                    donate=False, **kwargs)
  result = ternary.counter_update(packed, scale, v, grad, implementation="pallas", donate=False,
                                  **kwargs)
  assert_codes_close(result.packed, expected.packed, "gpu counter_update")
  x = jnp.asarray(rng.normal(size=(333, in_features)), jnp.bfloat16)
  grad_out = jnp.asarray(rng.normal(size=(333, out_features)), jnp.bfloat16)
  expected = ternary.counter_update_from_io(packed, scale, v, x, grad_out,
                                            implementation="reference", donate=False, **kwargs)
  for config in (None, config_lib.FromIOConfig(xla_gemm_rows=384)):  # blocks: a ragged last one
    result = ternary.counter_update_from_io(packed, scale, v, x, grad_out,
                                            implementation="pallas", config=config,
                                            donate=False, **kwargs)
    assert_codes_close(result.packed, expected.packed, f"gpu counter_update_from_io {config}")
  y = ternary.ternary_matmul(x, packed, scale, C=C, implementation="pallas")
  y_ref = ternary.ternary_matmul(x, packed, scale, C=C, implementation="reference")
  np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(y_ref, np.float32),
                             rtol=2e-2, atol=2e-1)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(4099, 4096), (8192, 8192), (2048, 4 * 1001), (5000, 16 * 3)])
def test_gpu_one_row_heuristic_matches_reference(rng, shape):
  """One row of 16-bit ``x``: the whole-row programs of ``_gemv_config`` (1-2 warps), compiled.

  Ragged ``out``, byte units (``in = 4 * odd``) and a short ``in``; integer
  ``x`` makes the float32 sums exact, so the product must equal the
  reference's bit for bit before the bf16 output rounding.
  """
  out_features, in_features = shape
  C = int(rng.integers(1, 12))
  codes, packed, scale, _ = random_state(rng, out_features, in_features, C)
  config = config_lib.MatmulConfig.get_heuristics_config((1,) + shape, jnp.bfloat16)
  assert config.method == "fma" and config.split_k == 1 and config.block_n <= 16, config
  x = rng.integers(-8, 9, (1, in_features)).astype(np.float32)
  exact = exact_product(x, codes, C, scale)
  y = ternary.ternary_matmul(jnp.asarray(x, jnp.bfloat16), packed, scale, C=C,
                             implementation="pallas")
  np.testing.assert_array_equal(np.asarray(y, np.float32),
                                np.asarray(jnp.asarray(exact, jnp.bfloat16), np.float32))


# ----------------------------------------------------------------------------
# Autotuning (correctness screen against the reference).


def test_tuning_screen_excludes_a_wrong_update_config_and_records_it(rng, monkeypatch):
  """A counter-update candidate that disagrees with the reference is excluded with its deviation."""
  from jaxnoise.ops import autotune  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import pallas_triton_update, tuning  # pylint: disable=g-import-not-at-top
  autotune.clear()
  out_features, in_features, C = 9, 4 * 5, 4
  _, packed, scale, v = random_state(rng, out_features, in_features, C)
  grad = jnp.asarray(rng.normal(size=(out_features, in_features)), jnp.float32)
  good = config_lib.CounterUpdateConfig(block_rows=2, block_groups=8, tail_groups=4)
  bad = config_lib.CounterUpdateConfig(block_rows=1, block_groups=8, tail_groups=8)
  real = pallas_triton_update.counter_update

  def corrupted_when_bad(*args, config=None, **kwargs):
    packed_out, *rest = real(*args, config=config, **kwargs)
    return (packed_out.at[0, 0].set(packed_out[0, 0] ^ 0x3F) if config == bad else packed_out,
            *rest)

  monkeypatch.setattr(pallas_triton_update, "counter_update", corrupted_when_bad)
  record = tuning.tune_counter_update(packed, scale, v, grad, C=C, implementation="interpret",
                                      candidates=[bad, good], repeats=1)
  by_config = {c.config: c for c in record.candidates}
  assert by_config[bad].status == "excluded" and by_config[bad].deviation > record.tolerance
  assert by_config[good].status == "selected" and by_config[good].deviation <= 1e-4
  assert record.selected == good and autotune.records()[-1] is record

  used = []

  def spy(*args, config=None, **kwargs):
    used.append(config)
    return real(*args, config=config, **kwargs)

  monkeypatch.setattr(pallas_triton_update, "counter_update", spy)
  ternary.counter_update(packed, scale, v, grad, **dict(hyper_kwargs(rng, C), C=C),
                         implementation="interpret", donate=False)
  assert used == [good]  # the tuned config, looked up for this shape
  autotune.clear()


@pytest.mark.parametrize("gain", [1.0, 1e3])
def test_tuning_screen_step_moves_the_scale_by_about_one_percent(rng, gain):
  """The screen's scale step follows the gradient's size: s' never collapses to its floor.

  With a fixed ``lr_scale``, a large ``grad_out^T x`` drove ``s'`` to 1e-5, where
  ``s / s'`` amplified last-bit differences into codes off by more than one.
  """
  from jaxnoise.ops.ternary import tuning  # pylint: disable=g-import-not-at-top
  out_features, in_features, C = 33, 4 * 24, 4
  _, packed, scale, v = random_state(rng, out_features, in_features, C)
  x = jnp.asarray(gain * rng.normal(size=(200, in_features)), jnp.float32)
  grad_out = jnp.asarray(rng.normal(size=(200, out_features)), jnp.float32)
  hyper = tuning._update_hyper(C, scale, tuning._from_io_grad_rms(x, grad_out))
  result = ternary.counter_update_from_io(packed, scale, v, x, grad_out, **hyper,
                                          implementation="reference", donate=False)
  moved = np.abs(np.asarray(result.scale) / np.asarray(scale) - 1.0)
  # About 1% at the mean scale; rows with a 40x smaller scale move 40x more, far from the floor.
  assert 1e-3 < np.median(moved) < 0.05 and moved.max() < 0.5
  assert (codes_of(result.packed) != codes_of(packed)).mean() > 0.5  # most codes move


def test_tuning_matmul_selects_a_screened_config(rng):
  from jaxnoise.ops import autotune  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import tuning  # pylint: disable=g-import-not-at-top
  autotune.clear()
  _, packed, scale, _ = random_state(rng, 21, 16 * 5, 3)
  x = jnp.asarray(rng.normal(size=(3, 16 * 5)), jnp.float32)
  split = config_lib.MatmulConfig(block_m=16, block_n=16, block_groups=16, split_k=2)
  record = tuning.tune_matmul(x, packed, scale, C=3, implementation="interpret",
                              candidates=[None, split], repeats=1)
  assert {c.status for c in record.candidates} <= {"selected", "timed"}
  assert all(c.deviation <= record.tolerance for c in record.candidates)
  assert autotune.lookup(record.op, record.key) == record.selected
  with pytest.raises(RuntimeError, match="no candidate passed"):
    tuning.tune_matmul(x, packed, scale, C=3, implementation="interpret", candidates=[split],
                       tolerance=-1.0, repeats=1)
  autotune.clear()


def test_tuning_batches_compile_one_decode_per_call(rng):
  """The tuner's timed executable decodes each call's weights: XLA merges no decode.

  With one weight array shared by the batch, XLA computed the decode method's
  ``t`` once for all calls (H200, session 11: the tuner then preferred a
  decode that is slower per call). Each call now reads its own copy.
  """
  # pylint: disable-next=g-import-not-at-top
  from jaxnoise.ops.ternary import matmul, tuning
  _, packed, scale, _ = random_state(rng, 40, 4 * 24, 3)
  grad_y = jnp.asarray(rng.normal(size=(2, 40)), jnp.float32)
  op = functools.partial(matmul.matmul_input_grad, C=3, out_dtype=jnp.float32)
  config = config_lib.MatmulConfig(method="decode")
  calls = 3
  many = tuning._many_matmuls(op, "interpret", config)  # pylint: disable=protected-access
  shared = jax.jit(lambda xs, packed, scale: [
      op(x, packed, scale, implementation="interpret", config=config) for x in xs])
  copies = [jnp.array(packed, copy=True) for _ in range(calls)]
  for lowered, decodes in [(many.lower([grad_y] * calls, copies, scale), calls),
                           (shared.lower([grad_y] * calls, packed, scale), 1)]:
    text = lowered.compile().as_text()
    entry = text[text.index("ENTRY"):]
    # One grid loop per decode kernel in interpret mode.
    assert entry.count(" while(") == decodes, entry.count(" while(")


def test_tuning_matmul_input_grad_is_what_the_vjp_runs(rng, monkeypatch):
  """The tuned input-gradient config is screened, cached, and taken by ``jax.grad``."""
  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops import autotune
  from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels
  from jaxnoise.ops.ternary import tuning
  # pylint: enable=g-import-not-at-top
  autotune.clear()
  out_features, in_features, C = 21, 4 * 13, 3
  _, packed, scale, _ = random_state(rng, out_features, in_features, C)
  x = jnp.asarray(rng.normal(size=(3, in_features)), jnp.float32)
  grad_y = jnp.asarray(rng.normal(size=(3, out_features)), jnp.float32)
  split = config_lib.MatmulConfig(block_m=16, block_n=16, block_groups=16, split_k=2)
  record = tuning.tune_matmul_input_grad(grad_y, packed, scale, C=C, implementation="interpret",
                                         candidates=[split], repeats=1)
  assert record.selected == split and record.candidates[0].status == "selected"
  assert record.candidates[0].deviation <= record.tolerance
  seen = []
  kernel = matmul_kernels.ternary_matmul_input_grad

  def spy(*args, config=None, **kwargs):
    seen.append(config)
    return kernel(*args, config=config, **kwargs)

  monkeypatch.setattr(matmul_kernels, "ternary_matmul_input_grad", spy)
  loss = lambda x: jnp.sum(ternary.ternary_matmul(x, packed, scale, C=C,
                                                  implementation="interpret") * grad_y)
  got = jax.grad(loss)(x)
  assert seen == [split]
  expected = reference.ternary_matmul_input_grad_reference(grad_y, packed, scale, C=C)
  np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-5, atol=1e-5)
  autotune.clear()
  with pytest.raises(ValueError, match="grad_y must be"):
    tuning.tune_matmul_input_grad(grad_y[:, 1:], packed, scale, C=C, implementation="interpret")
