"""The virtual-noise ops against materialised math (issue 2's must-shows).

The oracle is plain float64 numpy on the noise that ``jaxnoise.virtual_noise``
writes out (``tests/test_noise.py`` pins those bits against an independent
implementation of the hash). ``VirtualNoiseOpsBase`` holds the tests that
every implementation must pass; ``TestReferenceOps`` runs them with
``implementation="reference"``. A kernel test module subclasses the base
with ``IMPLEMENTATION = "interpret"`` (or ``"pallas"``), ``EXACT = False``
and its own ``TOLERANCES``.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnoise
from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common
from jaxnoise.ops.virtual_noise import reference

KIND_NAMES = ("uniform", "rademacher", "normal")
F32, BF16, F16 = jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)
HIGHEST = jax.lax.Precision.HIGHEST


def _seeds(rng, pop):
  return rng.integers(0, 2**32, size=pop, dtype=np.uint64).astype(np.uint32)


def _normal(rng, shape, dtype=F32, scale=1.0):
  return jnp.asarray((scale * rng.standard_normal(shape)).astype(np.float32)).astype(dtype)


def _f64(a):
  return np.asarray(jnp.asarray(a).astype(jnp.float32), np.float64)


def _noise64(seeds, shape, offset, kind, antithetic=False):
  return np.asarray(
      jaxnoise.virtual_noise(seeds, shape, offset, kind=kind, antithetic=antithetic), np.float64)


def _materialised_linear(x, weight, bias, seeds, sigma, offset, kind, antithetic):
  """float64 ``Y[i] = X[i] @ (W + sigma N_i)^T + (b + sigma nb_i)`` and the size of its terms."""
  out_f, in_f = weight.shape
  sigma = float(np.float32(sigma))
  w = _f64(weight)[None] + sigma * _noise64(seeds, (out_f, in_f), offset, kind, antithetic)
  x64 = _f64(x)
  spec = "bk,pok->pbo" if x64.ndim == 2 else "pbk,pok->pbo"
  y = np.einsum(spec, x64, w)
  magnitude = np.einsum(spec, np.abs(x64), np.abs(w))
  if bias is not None:
    b = _f64(bias)[None] + sigma * _noise64(
        seeds, (out_f,), offset + out_f * in_f, kind, antithetic)
    y = y + b[:, None, :]
    magnitude = magnitude + np.abs(b)[:, None, :]
  return y, magnitude


def _assert_close(actual, expected, magnitude, tol, what=""):
  """``|actual - expected| <= tol * magnitude`` elementwise (magnitude: size of the summed terms)."""
  actual = np.asarray(jnp.asarray(actual).astype(jnp.float32), np.float64)
  assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
  err = np.abs(actual - expected)
  bound = tol * np.asarray(magnitude, np.float64) + 1e-30
  worst = float(np.max(err / bound)) if err.size else 0.0
  assert worst <= 1.0, f"{what}: error up to {worst:.3g} x the tolerance {tol}"


def _cosine(a, b):
  a, b = np.ravel(np.asarray(a, np.float64)), np.ravel(np.asarray(b, np.float64))
  return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


class VirtualNoiseOpsBase:
  """Tests every implementation of the virtual-noise ops must pass."""

  IMPLEMENTATION = "reference"
  # True when the op's arithmetic is plain f32 on ``W + sigma * N`` (bit-exact checks).
  EXACT = True
  # Relative tolerance (w.r.t. the size of the summed terms) by the lowest-precision
  # input dtype; the reference computes in float32 whatever the input dtype.
  TOLERANCES = {F32: 2e-6, BF16: 2e-6, F16: 2e-6}

  def tolerance(self, *dtypes):
    return max(self.TOLERANCES[jnp.dtype(d)] for d in dtypes)

  def linear(self, x, weight, bias, seeds, sigma, offset=0, **kwargs):
    return jaxnoise.virtual_perturbed_linear(x, weight, bias, seeds, sigma, offset,
                                             implementation=self.IMPLEMENTATION, **kwargs)

  def weight_gradient(self, fitness, seeds, shape, sigma, **kwargs):
    return jaxnoise.virtual_weight_gradient(fitness, seeds, shape, sigma,
                                            implementation=self.IMPLEMENTATION, **kwargs)

  def bias_gradient(self, fitness, seeds, shape, sigma, **kwargs):
    return jaxnoise.virtual_bias_gradient(fitness, seeds, shape, sigma,
                                          implementation=self.IMPLEMENTATION, **kwargs)

  def reduce_metric(self, center, seeds, sigma, **kwargs):
    return jaxnoise.virtual_reduce_metric(center, seeds, sigma,
                                          implementation=self.IMPLEMENTATION, **kwargs)

  # --------------------------------------------------------------------------
  # Forward and gradient use the same noise.

  @pytest.mark.parametrize("kind", KIND_NAMES)
  @pytest.mark.parametrize("antithetic", [False, True])
  def test_forward_exposes_w_plus_sigma_noise(self, rng, kind, antithetic):
    out_f, in_f, pop = 5, 13, 6
    offset = int(rng.integers(0, 2**40))
    weight = _normal(rng, (out_f, in_f))
    seeds = _seeds(rng, pop)
    sigma = np.float32(rng.uniform(0.01, 1.0))
    y = self.linear(jnp.eye(in_f), weight, None, seeds, sigma, offset, kind=kind,
                    antithetic=antithetic)
    assert y.shape == (pop, in_f, out_f) and y.dtype == F32
    noise = np.asarray(jaxnoise.virtual_noise(seeds, (out_f, in_f), offset, kind=kind,
                                              antithetic=antithetic))
    # W + sigma N_i up to the last bit (a fused multiply-add may round once instead of twice).
    perturbed = _f64(weight)[None] + float(sigma) * noise.astype(np.float64)
    _assert_close(np.asarray(y).transpose(0, 2, 1), perturbed,
                  np.abs(_f64(weight))[None] + np.abs(float(sigma) * noise),
                  2.0**-23 if self.EXACT else self.tolerance(F32))
    # With W = 0 every step is exact: the op exposes sigma * N_i bit for bit.
    y0 = self.linear(jnp.eye(in_f), jnp.zeros_like(weight), None, seeds, sigma, offset, kind=kind,
                     antithetic=antithetic)
    if self.EXACT:
      np.testing.assert_array_equal(np.asarray(y0).transpose(0, 2, 1), sigma * noise)
    else:
      np.testing.assert_allclose(np.asarray(y0).transpose(0, 2, 1), sigma * noise, rtol=1e-6)

  @pytest.mark.parametrize("kind", KIND_NAMES)
  def test_one_hot_fitness_returns_the_forward_noise(self, rng, kind):
    out_f, in_f, pop = 5, 13, 8
    sigma = np.float32(0.125)  # pop * sigma = 1: the estimate is N_i itself, exactly
    offset = int(rng.integers(0, 2**40))
    seeds = _seeds(rng, pop)
    # W = 0, b = 0 and a power-of-two sigma make every step exact: x = I exposes
    # sigma N_i^T, x = 0 exposes sigma nb_i.
    zero_w, zero_b = jnp.zeros((out_f, in_f)), jnp.zeros(out_f)
    forward_weight_noise = np.asarray(self.linear(
        jnp.eye(in_f), zero_w, None, seeds, sigma, offset, kind=kind)).transpose(0, 2, 1) / sigma
    forward_bias_noise = np.asarray(self.linear(
        jnp.zeros((1, in_f)), zero_w, zero_b, seeds, sigma, offset, kind=kind))[:, 0] / sigma
    for i in rng.permutation(pop)[:3]:
      one_hot = jnp.zeros(pop).at[i].set(1.0)
      weight_grad = self.weight_gradient(one_hot, seeds, (out_f, in_f), sigma, offset=offset,
                                         kind=kind)
      bias_grad = self.bias_gradient(one_hot, seeds, (out_f,), sigma,
                                     offset=offset + out_f * in_f, kind=kind)
      assert weight_grad.shape == (out_f, in_f) and bias_grad.shape == (out_f,)
      if self.EXACT:
        np.testing.assert_array_equal(np.asarray(weight_grad), forward_weight_noise[i])
        np.testing.assert_array_equal(np.asarray(bias_grad), forward_bias_noise[i])
      else:
        np.testing.assert_allclose(np.asarray(weight_grad), forward_weight_noise[i], rtol=1e-5,
                                   atol=1e-5)
        np.testing.assert_allclose(np.asarray(bias_grad), forward_bias_noise[i], rtol=1e-5,
                                   atol=1e-5)

  @pytest.mark.parametrize("kind", KIND_NAMES)
  def test_antithetic_pairs_are_plus_and_minus_the_same_noise(self, rng, kind):
    out_f, in_f, pop = 4, 9, 6
    sigma = np.float32(0.5)
    offset = int(rng.integers(0, 2**36))
    seeds = _seeds(rng, pop)
    x = jnp.eye(in_f)
    y = np.asarray(self.linear(x, jnp.zeros((out_f, in_f)), None, seeds, sigma, offset,
                               kind=kind, antithetic=True))
    np.testing.assert_array_equal(y[1::2], -y[0::2])
    plain = np.asarray(self.linear(x, jnp.zeros((out_f, in_f)), None, seeds[0::2], sigma, offset,
                                   kind=kind))
    np.testing.assert_array_equal(y[0::2], plain)
    # seeds[2m + 1] is ignored.
    other = seeds.copy()
    other[1::2] = _seeds(rng, pop // 2)
    np.testing.assert_array_equal(
        y, np.asarray(self.linear(x, jnp.zeros((out_f, in_f)), None, other, sigma, offset,
                                  kind=kind, antithetic=True)))
    # Gradient: pair (2m, 2m+1) with fitness (1, 0) gives +N_m, (0, 1) gives -N_m.
    scale = pop * float(sigma)
    for i in (0, 1, 4, 5):
      one_hot = jnp.zeros(pop).at[i].set(1.0)
      grad = np.asarray(self.weight_gradient(one_hot, seeds, (out_f, in_f), sigma, offset=offset,
                                             kind=kind, antithetic=True))
      sign = 1.0 if i % 2 == 0 else -1.0
      np.testing.assert_allclose(grad * scale, sign * y[i - i % 2].T / float(sigma), rtol=1e-6,
                                 atol=1e-6)

  # --------------------------------------------------------------------------
  # Forward against the materialised formula: kinds, layouts, odd shapes, dtypes.

  @pytest.mark.parametrize("kind", KIND_NAMES)
  @pytest.mark.parametrize("shared_x", [True, False], ids=["shared_x", "per_individual_x"])
  @pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
  @pytest.mark.parametrize("antithetic", [False, True], ids=["plain", "antithetic"])
  def test_forward_matches_materialised(self, rng, kind, shared_x, with_bias, antithetic):
    pop, batch, out_f, in_f = 6, 3, 5, 13
    offset = int(rng.integers(0, 2**34))
    x_shape = (batch, in_f) if shared_x else (pop, batch, in_f)
    x = _normal(rng, x_shape)
    weight = _normal(rng, (out_f, in_f), scale=0.3)
    bias = _normal(rng, (out_f,)) if with_bias else None
    seeds = _seeds(rng, pop)
    sigma = np.float32(rng.uniform(0.01, 0.5))
    y = self.linear(x, weight, bias, seeds, sigma, offset, kind=kind, antithetic=antithetic)
    want, magnitude = _materialised_linear(x, weight, bias, seeds, sigma, offset, kind, antithetic)
    _assert_close(y, want, magnitude, self.tolerance(F32), "forward")

  @pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 1, 1, 7), (3, 5, 1, 2), (7, 3, 33, 70),
                                     (5, 17, 12, 129)], ids=str)
  def test_odd_shapes(self, rng, shape):
    pop, batch, out_f, in_f = shape
    offset = int(rng.integers(0, 2**40))
    x = _normal(rng, (batch, in_f))
    x_per = _normal(rng, (pop, batch, in_f))
    weight = _normal(rng, (out_f, in_f), scale=0.3)
    bias = _normal(rng, (out_f,))
    seeds = _seeds(rng, pop)
    sigma = np.float32(0.1)
    for xx in (x, x_per):
      y = self.linear(xx, weight, bias, seeds, sigma, offset)
      assert y.shape == (pop, batch, out_f)
      want, magnitude = _materialised_linear(xx, weight, bias, seeds, sigma, offset,
                                             noise_lib.DEFAULT_KIND, False)
      _assert_close(y, want, magnitude, self.tolerance(F32), f"forward {shape}")
    fitness = _normal(rng, (pop,))
    grad = self.weight_gradient(fitness, seeds, (out_f, in_f), sigma, offset=offset)
    noise = _noise64(seeds, (out_f, in_f), offset, noise_lib.DEFAULT_KIND)
    want = np.einsum("p,pok->ok", _f64(fitness), noise) / (pop * float(sigma))
    magnitude = np.einsum("p,pok->ok", np.abs(_f64(fitness)), np.abs(noise)) / (pop * float(sigma))
    _assert_close(grad, want, magnitude, self.tolerance(F32), "weight gradient")

  @pytest.mark.parametrize("x_dtype,weight_dtype,out_dtype", [
      (F32, F32, F32), (BF16, F32, F32), (F16, F32, F32), (BF16, BF16, F32), (F16, BF16, F32),
      (F32, BF16, BF16), (BF16, BF16, BF16), (F16, F32, F16)], ids=str)
  @pytest.mark.parametrize("shared_x", [True, False], ids=["shared_x", "per_individual_x"])
  def test_dtypes(self, rng, x_dtype, weight_dtype, out_dtype, shared_x):
    pop, batch, out_f, in_f = 4, 3, 6, 19
    offset = int(rng.integers(0, 2**34))
    x = _normal(rng, (batch, in_f) if shared_x else (pop, batch, in_f), x_dtype)
    weight = _normal(rng, (out_f, in_f), weight_dtype, scale=0.3)
    bias = _normal(rng, (out_f,), weight_dtype)
    seeds = _seeds(rng, pop)
    sigma = np.float32(0.05)
    y = self.linear(x, weight, bias, seeds, sigma, offset, out_dtype=out_dtype, antithetic=True)
    assert y.dtype == out_dtype and y.shape == (pop, batch, out_f)
    # The oracle sees the inputs as stored (already rounded to their dtype).
    want, magnitude = _materialised_linear(x, weight, bias, seeds, sigma, offset,
                                           noise_lib.DEFAULT_KIND, True)
    tol = self.tolerance(x_dtype, weight_dtype)
    if out_dtype != F32:  # plus the output's own rounding
      tol = tol + float(jnp.finfo(out_dtype).eps)
    _assert_close(y, want, magnitude, tol, f"forward x={x_dtype} w={weight_dtype} out={out_dtype}")

  # --------------------------------------------------------------------------
  # Tiling / batch / population-position independence.

  @pytest.mark.parametrize("shared_x", [True, False], ids=["shared_x", "per_individual_x"])
  def test_a_row_does_not_depend_on_the_rest_of_the_batch(self, rng, shared_x):
    pop, batch, out_f, in_f = 5, 9, 7, 23
    offset = int(rng.integers(0, 2**34))
    x = _normal(rng, (batch, in_f) if shared_x else (pop, batch, in_f))
    weight, bias = _normal(rng, (out_f, in_f)), _normal(rng, (out_f,))
    seeds = _seeds(rng, pop)
    sigma = np.float32(0.2)
    full = np.asarray(self.linear(x, weight, bias, seeds, sigma, offset))
    _, magnitude = _materialised_linear(x, weight, bias, seeds, sigma, offset,
                                        noise_lib.DEFAULT_KIND, False)
    for rows in (slice(4, 5), slice(0, 3), slice(2, 9)):
      part = self.linear(x[..., rows, :], weight, bias, seeds, sigma, offset)
      _assert_close(part, full[:, rows].astype(np.float64), magnitude[:, rows],
                    self.tolerance(F32), f"rows {rows}")
    # Other rows changed arbitrarily: row 4's output is unchanged.
    changed = x.at[..., :4, :].set(_normal(rng, x[..., :4, :].shape))
    again = self.linear(changed, weight, bias, seeds, sigma, offset)[:, 4]
    _assert_close(again, full[:, 4].astype(np.float64), magnitude[:, 4], self.tolerance(F32))
    # Population position: permuting seeds (and x) permutes the outputs.
    order = rng.permutation(pop)
    permuted = self.linear(x if shared_x else x[order], weight, bias, seeds[order], sigma, offset)
    _assert_close(permuted, full[order].astype(np.float64), magnitude[order], self.tolerance(F32))

  # --------------------------------------------------------------------------
  # The estimator is right.

  @pytest.mark.parametrize("kind", KIND_NAMES)
  @pytest.mark.parametrize("antithetic", [False, True], ids=["plain", "antithetic"])
  def test_estimate_converges_to_the_gradient_of_a_linear_objective(self, rng, kind, antithetic):
    # f_i = <c, W + sigma N_i> + <c_b, b + sigma nb_i>, evaluated through the forward
    # op; the ES estimate of df/dW is c. Population 16384 (antithetic: 8192 pairs)
    # for 65 weights + 5 biases: each estimate's error has variance ~|c|^2 / pairs per
    # element, so the expected cosines are above 0.99 (weights) and 0.98 (biases).
    pop, out_f, in_f = 16384, 5, 13
    sigma = np.float32(0.05)
    offset = int(rng.integers(0, 2**36))
    weight, bias = _normal(rng, (out_f, in_f)), _normal(rng, (out_f,))
    c_weight = rng.standard_normal((out_f, in_f))
    c_bias = rng.standard_normal(out_f)
    seeds = _seeds(rng, pop)
    x = jnp.concatenate([jnp.eye(in_f), jnp.zeros((1, in_f))])
    y = np.asarray(self.linear(x, weight, bias, seeds, sigma, offset, kind=kind,
                               antithetic=antithetic), np.float64)
    perturbed_bias = y[:, -1, :]
    perturbed_weight = (y[:, :-1, :] - y[:, -1:, :]).transpose(0, 2, 1)
    fitness = (np.einsum("pok,ok->p", perturbed_weight, c_weight)
               + perturbed_bias @ c_bias)
    if not antithetic:
      fitness = fitness - fitness.mean()  # the usual baseline; pairs cancel <c, W> themselves
    fitness = jnp.asarray(fitness.astype(np.float32))
    weight_grad = self.weight_gradient(fitness, seeds, (out_f, in_f), sigma, offset=offset,
                                       kind=kind, antithetic=antithetic)
    bias_grad = self.bias_gradient(fitness, seeds, (out_f,), sigma, offset=offset + out_f * in_f,
                                   kind=kind, antithetic=antithetic)
    assert _cosine(weight_grad, c_weight) > 0.95
    assert _cosine(bias_grad, c_bias) > 0.95
    # Unbiased scale: the projection on c is close to |c|^2 (no factor-2 / sigma slips).
    ratio = float(np.sum(np.asarray(weight_grad) * c_weight) / np.sum(c_weight**2))
    assert 0.9 < ratio < 1.1, ratio

  @pytest.mark.parametrize("kind", KIND_NAMES)
  @pytest.mark.parametrize("antithetic", [False, True], ids=["plain", "antithetic"])
  def test_gradients_match_materialised(self, rng, kind, antithetic):
    pop, out_f, in_f = 10, 6, 11
    offset = int(rng.integers(0, 2**40))
    seeds = _seeds(rng, pop)
    fitness = _normal(rng, (pop,))
    sigma = np.float32(rng.uniform(0.01, 1.0))
    divisor = int(rng.integers(pop, 3 * pop))  # an explicit pop_size is the divisor
    for shape, grad_fn, grad_offset in (
        ((out_f, in_f), self.weight_gradient, offset),
        ((out_f,), self.bias_gradient, offset + out_f * in_f)):
      grad = grad_fn(fitness, seeds, shape, sigma, pop_size=divisor, offset=grad_offset,
                     kind=kind, antithetic=antithetic)
      noise = _noise64(seeds, shape, grad_offset, kind, antithetic)
      terms = _f64(fitness).reshape((pop,) + (1,) * len(shape)) * noise / (divisor * float(sigma))
      _assert_close(grad, terms.sum(0), np.abs(terms).sum(0), self.tolerance(F32), str(shape))

  # --------------------------------------------------------------------------
  # Reduce metric.

  @pytest.mark.parametrize("kind", KIND_NAMES)
  @pytest.mark.parametrize("antithetic", [False, True], ids=["plain", "antithetic"])
  def test_reduce_metric_matches_materialised(self, rng, kind, antithetic):
    pop, n_params = 6, 997
    offset = int(rng.integers(0, 2**40))
    center = _normal(rng, (n_params,), scale=0.1)
    seeds = _seeds(rng, pop)
    sigma = np.float32(rng.uniform(0.01, 0.5))
    metric = self.reduce_metric(center, seeds, sigma, n_params=n_params, offset=offset, kind=kind,
                                antithetic=antithetic)
    assert metric.shape == (pop,) and metric.dtype == F32
    values = np.abs(_f64(center)[None] + float(sigma) * _noise64(
        seeds, (n_params,), offset, kind, antithetic))
    _assert_close(metric, values.mean(1), values.mean(1), 4 * self.tolerance(F32))
    if antithetic:
      assert not np.allclose(np.asarray(metric)[0::2], np.asarray(metric)[1::2])

  # --------------------------------------------------------------------------
  # Custom VJP against autodiff of the materialised formula.

  # Every (shared_x, bias, antithetic) combination once; the kinds rotate through them.
  @pytest.mark.parametrize("shared_x,with_bias,antithetic,kind", [
      pytest.param(shared, bias, anti, kind, id="-".join((
          "shared_x" if shared else "per_individual_x", "bias" if bias else "no_bias",
          "antithetic" if anti else "plain", kind)))
      for (shared, bias, anti), kind in zip(
          [(s, b, a) for s in (True, False) for b in (True, False) for a in (False, True)],
          ["uniform", "rademacher", "normal"] * 3)])
  def test_vjp_matches_autodiff_of_materialised(self, rng, shared_x, with_bias, antithetic, kind):
    pop, batch, out_f, in_f = 4, 3, 5, 7
    offset = int(rng.integers(0, 2**34))
    x = _normal(rng, (batch, in_f) if shared_x else (pop, batch, in_f))
    weight = _normal(rng, (out_f, in_f))
    bias = _normal(rng, (out_f,)) if with_bias else None
    seeds = _seeds(rng, pop)
    sigma = jnp.float32(rng.uniform(0.05, 0.5))
    cotangent = _normal(rng, (pop, batch, out_f))
    noise = jaxnoise.virtual_noise(seeds, (out_f, in_f), offset, kind=kind, antithetic=antithetic)
    bias_noise = jaxnoise.virtual_noise(seeds, (out_f,), offset + out_f * in_f, kind=kind,
                                        antithetic=antithetic)
    spec = "bk,pok->pbo" if shared_x else "pbk,pok->pbo"

    def explicit(x, weight, bias, sigma):
      y = jnp.einsum(spec, x, weight[None] + sigma * noise, precision=HIGHEST)
      if bias is not None:
        y = y + (bias[None] + sigma * bias_noise)[:, None, :]
      return jnp.sum(y * cotangent)

    def op(x, weight, bias, sigma):
      y = self.linear(x, weight, bias, seeds, sigma, offset, kind=kind, antithetic=antithetic)
      return jnp.sum(y * cotangent)

    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 3)
    want = jax.grad(explicit, argnums=argnums)(x, weight, bias, sigma)
    got = jax.grad(op, argnums=argnums)(x, weight, bias, sigma)
    got_jit = jax.jit(jax.grad(op, argnums=argnums))(x, weight, bias, sigma)
    # d/dsigma sums every term with signs: its scale is the sum of their sizes.
    noise_size = jnp.einsum(spec, jnp.abs(x), jnp.abs(noise), precision=HIGHEST)
    if bias is not None:
      noise_size = noise_size + jnp.abs(bias_noise)[:, None, :]
    sigma_scale = float(jnp.sum(jnp.abs(cotangent) * noise_size))
    for name, g, g_jit, w in zip(("x", "weight", "bias", "sigma") if with_bias
                                 else ("x", "weight", "sigma"), got, got_jit, want):
      assert g.shape == w.shape and g.dtype == w.dtype, name
      scale = sigma_scale if name == "sigma" else float(np.max(np.abs(np.asarray(w)))) + 1e-6
      np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5 * scale,
                                 err_msg=name)
      np.testing.assert_allclose(np.asarray(g_jit), np.asarray(w), rtol=1e-5, atol=1e-5 * scale,
                                 err_msg=name + " (jit)")
    # One argument alone (the others get symbolic zero cotangents).
    single = jax.grad(op, argnums=1)(x, weight, bias, sigma)
    np.testing.assert_allclose(np.asarray(single), np.asarray(got[1]), rtol=1e-6, atol=1e-6)

  @pytest.mark.parametrize("x_dtype,weight_dtype", [(BF16, F32), (F16, BF16), (BF16, BF16)],
                           ids=str)
  def test_vjp_dtypes(self, rng, x_dtype, weight_dtype):
    pop, batch, out_f, in_f = 4, 2, 3, 6
    x = _normal(rng, (batch, in_f), x_dtype)
    weight = _normal(rng, (out_f, in_f), weight_dtype)
    bias = _normal(rng, (out_f,), weight_dtype)
    seeds = _seeds(rng, pop)
    grads = jax.grad(lambda x, w, b: jnp.sum(self.linear(x, w, b, seeds, 0.1) ** 2),
                     argnums=(0, 1, 2))(x, weight, bias)
    assert [g.dtype for g in grads] == [x_dtype, weight_dtype, weight_dtype]
    want = jax.grad(lambda x, w, b: jnp.sum(self.linear(x, w, b, seeds, 0.1) ** 2),
                    argnums=(0, 1, 2))(x.astype(F32), weight.astype(F32), bias.astype(F32))
    # The gradients' own rounding, plus the implementation's low-precision error
    # (a loss of y**2 doubles it).
    compute_tol = 4 * self.tolerance(x_dtype, weight_dtype)
    for g, w in zip(grads, want):
      scale = float(np.max(np.abs(np.asarray(w))))
      tol = 2 * float(jnp.finfo(g.dtype).eps) + compute_tol
      np.testing.assert_allclose(_f64(g), _f64(w), rtol=tol, atol=tol * scale)

  # --------------------------------------------------------------------------
  # jit, offsets above 2**32.

  def test_jit_matches_eager(self, rng):
    pop, batch, out_f, in_f = 6, 4, 5, 13
    offset = int(rng.integers(2**32, 2**40))
    x, weight, bias = (_normal(rng, (batch, in_f)), _normal(rng, (out_f, in_f)),
                       _normal(rng, (out_f,)))
    seeds = jnp.asarray(_seeds(rng, pop))
    fitness = _normal(rng, (pop,))
    sigma = jnp.float32(0.3)

    def everything(x, weight, bias, seeds, sigma, fitness):
      return (self.linear(x, weight, bias, seeds, sigma, offset, antithetic=True),
              self.weight_gradient(fitness, seeds, (out_f, in_f), sigma, offset=offset),
              self.bias_gradient(fitness, seeds, (out_f,), sigma, offset=offset + 65),
              self.reduce_metric(bias, seeds, sigma, offset=offset))

    eager = everything(x, weight, bias, seeds, sigma, fitness)
    jitted = jax.jit(everything)(x, weight, bias, seeds, sigma, fitness)
    for e, j in zip(eager, jitted):
      np.testing.assert_allclose(np.asarray(j), np.asarray(e), rtol=1e-6, atol=1e-6)

  @pytest.mark.parametrize("kind", KIND_NAMES)
  @pytest.mark.parametrize("offset_case", ["crosses_2**32", "2**33", "2**50"])
  def test_offsets_above_2_32(self, rng, kind, offset_case):
    pop, batch, out_f, in_f = 4, 3, 7, 11
    offset = {
        "crosses_2**32": 2**32 - int(rng.integers(1, out_f * in_f)),
        "2**33": 2**33 + int(rng.integers(0, 2**20)),  # rademacher: word index still < 2**32
        "2**50": 2**50 + int(rng.integers(0, 2**40)),
    }[offset_case]
    x, weight, bias = (_normal(rng, (batch, in_f)), _normal(rng, (out_f, in_f)),
                       _normal(rng, (out_f,)))
    seeds = _seeds(rng, pop)
    sigma = np.float32(0.25)
    y = self.linear(x, weight, bias, seeds, sigma, offset, kind=kind)
    want, magnitude = _materialised_linear(x, weight, bias, seeds, sigma, offset, kind, False)
    _assert_close(y, want, magnitude, self.tolerance(F32), "forward")
    # The block 2**32 further on has other noise (no wrapped index).
    shifted = self.linear(x, weight, bias, seeds, sigma, offset + 2**32, kind=kind)
    assert not np.allclose(np.asarray(y), np.asarray(shifted))
    fitness = _normal(rng, (pop,))
    grad = self.weight_gradient(fitness, seeds, (out_f, in_f), sigma, offset=offset, kind=kind)
    terms = _f64(fitness)[:, None, None] * _noise64(seeds, (out_f, in_f), offset, kind) / (
        pop * float(sigma))
    _assert_close(grad, terms.sum(0), np.abs(terms).sum(0), self.tolerance(F32), "gradient")
    metric = self.reduce_metric(weight.reshape(-1), seeds, sigma, offset=offset, kind=kind)
    values = np.abs(_f64(weight).reshape(-1) + float(sigma) * _noise64(
        seeds, (out_f * in_f,), offset, kind))
    _assert_close(metric, values.mean(1), values.mean(1), 4 * self.tolerance(F32), "metric")


class TestReferenceOps(VirtualNoiseOpsBase):
  IMPLEMENTATION = "reference"


# ----------------------------------------------------------------------------
# The reference functions themselves: chunking, windows, "auto" on CPU.


def test_compute_offsets():
  assert jaxnoise.compute_offsets([(256, 784), (256,), (10, 256), (10,)]) == [
      0, 200704, 200960, 203520]
  assert jaxnoise.compute_offsets([]) == []
  assert jaxnoise.compute_offsets([7, (3, 2), (), (4, 1, 5)]) == [0, 7, 13, 14]
  big = jaxnoise.compute_offsets([(2**20, 2**13), (2**16, 2**16), (5,)])
  assert big == [0, 2**33, 2**33 + 2**32]
  assert all(isinstance(o, int) for o in big)


def _reference_inputs(rng):
  pop, batch, out_f, in_f, n_params = 10, 3, 6, 9, 301
  return dict(
      offset=int(rng.integers(0, 2**40)),
      seeds=jnp.asarray(_seeds(rng, pop)),
      x=_normal(rng, (batch, in_f)),
      x_per=_normal(rng, (pop, batch, in_f)),
      weight=_normal(rng, (out_f, in_f)),
      bias=_normal(rng, (out_f,)),
      grad_out=_normal(rng, (pop, batch, out_f)),
      fitness=_normal(rng, (pop,)),
      center=_normal(rng, (n_params,)),
      sigma=jnp.float32(0.3),
  )


def _reference_calls(inputs, kind, antithetic, chunk_size):
  """Every reference function on the same inputs, in one jit (one compile per chunk size)."""
  offset = inputs["offset"]
  common = dict(kind=noise_lib.get_kind(kind), antithetic=antithetic, chunk_size=chunk_size)

  @jax.jit
  def run(seeds, x, x_per, weight, bias, grad_out, fitness, center, sigma):
    pop = seeds.shape[0]
    return {
        "linear_shared": reference.perturbed_linear_reference(x, weight, bias, seeds, sigma,
                                                              offset, **common),
        "linear_per": reference.perturbed_linear_reference(x_per, weight, None, seeds, sigma,
                                                           offset, **common),
        "input_grad_shared": reference.perturbed_linear_input_grad_reference(
            grad_out, weight, seeds, sigma, offset, shared_x=True, **common),
        "input_grad_per": reference.perturbed_linear_input_grad_reference(
            grad_out, weight, seeds, sigma, offset, shared_x=False, **common),
        "weight_grad": reference.weight_gradient_reference(fitness, seeds, weight.shape, sigma,
                                                           pop, offset, **common),
        "bias_grad": reference.bias_gradient_reference(fitness, seeds, bias.shape, sigma, pop,
                                                       offset, **common),
        "metric": reference.reduce_metric_reference(center, seeds, sigma, center.shape[0],
                                                    offset, **common),
    }

  return run(*(inputs[k] for k in ("seeds", "x", "x_per", "weight", "bias", "grad_out",
                                    "fitness", "center", "sigma")))


@pytest.mark.parametrize("kind,antithetic", [("uniform", False), ("rademacher", True)])
def test_reference_results_do_not_depend_on_chunk_size(rng, monkeypatch, kind, antithetic):
  # chunk_size=None with a small element budget also splits the population (4
  # individuals per chunk for the 6x9 weight) and the reduce-metric's 301
  # parameters into windows of 256.
  monkeypatch.setattr(reference, "DEFAULT_CHUNK_ELEMENTS", 256)
  inputs = _reference_inputs(rng)
  baseline = _reference_calls(inputs, kind, antithetic, 10)  # one chunk: the whole population
  for chunk_size in (None, 1, 3):
    outputs = _reference_calls(inputs, kind, antithetic, chunk_size)
    for name, value in outputs.items():
      np.testing.assert_allclose(np.asarray(value), np.asarray(baseline[name]), rtol=2e-6,
                                 atol=2e-6, err_msg=f"{name} with chunk_size={chunk_size}")


def test_reduce_metric_windows_match_materialised(rng, monkeypatch):
  monkeypatch.setattr(reference, "DEFAULT_CHUNK_ELEMENTS", 100)  # 997 params: 10 windows
  pop, n_params = 5, 997
  offset = 2**32 - 500  # a window boundary near the low-word wrap
  center = _normal(rng, (n_params,))
  seeds = _seeds(rng, pop)
  metric = jaxnoise.virtual_reduce_metric(center, seeds, 0.5, offset=offset, kind="normal",
                                          implementation="reference")
  values = np.abs(_f64(center)[None] + 0.5 * _noise64(seeds, (n_params,), offset, "normal"))
  np.testing.assert_allclose(np.asarray(metric), values.mean(1), rtol=1e-5)


def test_auto_is_the_reference_on_cpu(rng):
  on_gpu = jax.default_backend() == "gpu"
  assert _common.resolve_implementation("auto") == ("pallas" if on_gpu else "reference")
  x, weight = _normal(rng, (3, 8)), _normal(rng, (4, 8))
  seeds = _seeds(rng, 5)
  auto = jaxnoise.virtual_perturbed_linear(x, weight, None, seeds, 0.1)
  ref = jaxnoise.virtual_perturbed_linear(x, weight, None, seeds, 0.1, implementation="reference")
  np.testing.assert_allclose(np.asarray(auto), np.asarray(ref), rtol=0 if not on_gpu else 1e-2,
                             atol=0 if not on_gpu else 1e-2)


def test_signed_seeds_give_the_same_results_as_uint32(rng):
  signed = rng.integers(-2**31, 2**31, size=6).astype(np.int32)
  unsigned = signed.astype(np.uint32)
  x, weight = _normal(rng, (2, 5)), _normal(rng, (3, 5))
  a = jaxnoise.virtual_perturbed_linear(x, weight, None, signed, 0.1, implementation="reference")
  b = jaxnoise.virtual_perturbed_linear(x, weight, None, unsigned, 0.1, implementation="reference")
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert math.isfinite(float(jnp.sum(a)))
