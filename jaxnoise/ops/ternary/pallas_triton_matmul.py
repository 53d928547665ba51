"""Pallas (Triton) kernels of the packed ternary matmul and its input gradient."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxnoise.ops.ternary import reference as ref_lib
from jaxnoise.ops.ternary.config import MatmulConfig, check_config
from jaxnoise.ops.ternary.pallas_triton import (
    _call,
    _cdiv,
    _dense_view,
    _dot_setup,
    _iota,
    _load_codes,
    _load_lanes,
    _load_vector,
    _loop,
    _packed_view,
    _store_lanes,
)

__all__ = ["ternary_matmul", "ternary_matmul_input_grad"]

_F32 = jnp.float32
# x (BM, BG) . t (BN, BG)^T -> (BM, BN).
_DIMS_NT = (((1,), (1,)), ((), ()))
# g (BM, BN) . t (BN, BG) -> (BM, BG).
_DIMS_NN = (((1,), (0,)), ((), ()))


def _matmul_kernel(x_ref, packed_ref, scale_ref, y_ref, *, C, m_rows, n_out, n_groups, block_m,
                   block_n, block_groups, compute_dtype, precision):
  m0 = pl.program_id(0) * block_m
  n0 = pl.program_id(1) * block_n
  m_mask = (m0 + _iota(block_m)) < m_rows
  n_mask = (n0 + _iota(block_n)) < n_out

  def step(i, acc):
    g0 = i * block_groups
    group_mask = (g0 + _iota(block_groups)) < n_groups
    codes = _load_codes(packed_ref, n0, block_n, g0, block_groups,
                        n_mask[:, None] & group_mask[None, :])
    lanes = _load_lanes(x_ref, m0, block_m, g0, block_groups, 4,
                        m_mask[:, None] & group_mask[None, :], 0)
    for code, x in zip(codes, lanes):
      # int -> float32 -> compute dtype: exact, and avoids int -> bf16 conversions.
      t = ref_lib.ternary_of(code, C).astype(_F32).astype(compute_dtype)
      acc = acc + jax.lax.dot_general(x.astype(compute_dtype), t, _DIMS_NT,
                                      precision=precision, preferred_element_type=_F32)
    return acc

  acc = _loop(_cdiv(n_groups, block_groups), step, jnp.zeros((block_m, block_n), _F32))
  scale = _load_vector(scale_ref, n0, block_n, n_mask, 0.0).astype(_F32)
  plgpu.store(y_ref.at[pl.ds(m0, block_m), pl.ds(n0, block_n)],
              (acc * scale[None, :]).astype(y_ref.dtype),
              mask=m_mask[:, None] & n_mask[None, :])


def _matmul_input_grad_kernel(grad_y_ref, packed_ref, scale_ref, grad_x_ref, *, C, m_rows, n_out,
                              n_groups, block_m, block_n, block_groups, compute_dtype,
                              precision):
  m0 = pl.program_id(0) * block_m
  g0 = pl.program_id(1) * block_groups
  m_mask = (m0 + _iota(block_m)) < m_rows
  group_mask = (g0 + _iota(block_groups)) < n_groups

  def step(i, accumulators):
    n0 = i * block_n
    n_mask = (n0 + _iota(block_n)) < n_out
    grad_y = plgpu.load(grad_y_ref.at[pl.ds(m0, block_m), pl.ds(n0, block_n)],
                        mask=m_mask[:, None] & n_mask[None, :], other=0)
    scale = _load_vector(scale_ref, n0, block_n, n_mask, 0.0).astype(_F32)
    scaled = (grad_y.astype(_F32) * scale[None, :]).astype(compute_dtype)
    codes = _load_codes(packed_ref, n0, block_n, g0, block_groups,
                        n_mask[:, None] & group_mask[None, :])
    return tuple(
        acc + jax.lax.dot_general(
            scaled, ref_lib.ternary_of(code, C).astype(_F32).astype(compute_dtype), _DIMS_NN,
            precision=precision, preferred_element_type=_F32)
        for acc, code in zip(accumulators, codes))

  zeros = jnp.zeros((block_m, block_groups), _F32)
  accumulators = _loop(_cdiv(n_out, block_n), step, (zeros,) * 4)
  _store_lanes(grad_x_ref, m0, block_m, g0, block_groups,
               [acc.astype(grad_x_ref.dtype) for acc in accumulators],
               m_mask[:, None] & group_mask[None, :])


def _matmul_config(config, shape, dtype) -> MatmulConfig:
  if check_config(config, MatmulConfig) is None:
    return MatmulConfig.get_heuristics_config(shape, dtype)
  return config


def ternary_matmul(x, packed, scale, *, C: int, out_dtype, config: MatmulConfig | None = None,
                   interpret: bool = False):
  """``(M, in) @ (scale * t)^T -> (M, out)`` reading the packed codes in the kernel."""
  m_rows, in_features = x.shape
  out_features = packed.shape[0]
  config = _matmul_config(config, (m_rows, out_features, in_features), x.dtype)
  compute_dtype, precision = _dot_setup(x.dtype, x.dtype, config.allow_tf32)
  kernel = functools.partial(
      _matmul_kernel, C=C, m_rows=m_rows, n_out=out_features, n_groups=in_features // 4,
      block_m=config.block_m, block_n=config.block_n, block_groups=config.block_groups,
      compute_dtype=compute_dtype, precision=precision)
  return _call(
      kernel, name="ternary_matmul",
      grid=(_cdiv(m_rows, config.block_m), _cdiv(out_features, config.block_n)),
      out_shape=jax.ShapeDtypeStruct((m_rows, out_features), out_dtype), config=config,
      interpret=interpret,
  )(_dense_view(x), _packed_view(packed), scale)


def ternary_matmul_input_grad(grad_y, packed, scale, *, C: int, out_dtype,
                              config: MatmulConfig | None = None, interpret: bool = False):
  """``(grad_y * scale) @ t``: ``(M, out) -> (M, in)``, reading the packed codes."""
  m_rows, out_features = grad_y.shape
  in_features = 4 * (packed.shape[1] // 3)
  config = _matmul_config(config, (m_rows, in_features, out_features), grad_y.dtype)
  compute_dtype, precision = _dot_setup(grad_y.dtype, grad_y.dtype, config.allow_tf32)
  n_groups = in_features // 4
  kernel = functools.partial(
      _matmul_input_grad_kernel, C=C, m_rows=m_rows, n_out=out_features, n_groups=n_groups,
      block_m=config.block_m, block_n=config.block_n, block_groups=config.block_groups,
      compute_dtype=compute_dtype, precision=precision)
  grad_x = _call(
      kernel, name="ternary_matmul_input_grad",
      grid=(_cdiv(m_rows, config.block_m), _cdiv(n_groups, config.block_groups)),
      out_shape=jax.ShapeDtypeStruct((m_rows, n_groups, 4), out_dtype), config=config,
      interpret=interpret,
  )(grad_y, _packed_view(packed), scale)
  return grad_x.reshape(m_rows, in_features)


