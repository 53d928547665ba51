"""User-input validation: clear ValueError / TypeError naming the argument.

Every error message must name the offending argument and, where it is about
an array, its shape and / or dtype. Seeds of signed or wider integer dtypes
wrap modulo 2**32 (SPEC section 1).
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnoise

REF = dict(implementation="reference")


def _inputs(rng, pop=6, batch=3, out_f=5, in_f=13):
  return dict(
      x=jnp.asarray(rng.standard_normal((batch, in_f)), jnp.float32),
      weight=jnp.asarray(rng.standard_normal((out_f, in_f)), jnp.float32),
      bias=jnp.asarray(rng.standard_normal(out_f), jnp.float32),
      seeds=jnp.asarray(rng.integers(0, 2**32, size=pop, dtype=np.uint64).astype(np.uint32)),
      fitness=jnp.asarray(rng.standard_normal(pop), jnp.float32),
      center=jnp.asarray(rng.standard_normal(17), jnp.float32),
  )


def _linear(a, **overrides):
  args = dict(x=a["x"], weight=a["weight"], bias=a["bias"], seeds=a["seeds"], sigma=0.1, offset=0)
  kwargs = {k: overrides.pop(k) for k in ("kind", "antithetic", "implementation")
            if k in overrides}
  args.update(overrides)
  return jaxnoise.virtual_perturbed_linear(args["x"], args["weight"], args["bias"], args["seeds"],
                                           args["sigma"], args["offset"], **{**REF, **kwargs})


def _weight_grad(a, **overrides):
  args = dict(fitness=a["fitness"], seeds=a["seeds"], weight_shape=a["weight"].shape, sigma=0.1)
  args.update(overrides)
  args = {**REF, **args}
  return jaxnoise.virtual_weight_gradient(**args)


def _bias_grad(a, **overrides):
  args = dict(fitness=a["fitness"], seeds=a["seeds"], bias_shape=a["bias"].shape, sigma=0.1)
  args.update(overrides)
  args = {**REF, **args}
  return jaxnoise.virtual_bias_gradient(**args)


def _metric(a, **overrides):
  args = dict(center=a["center"], seeds=a["seeds"], sigma=0.1)
  args.update(overrides)
  args = {**REF, **args}
  return jaxnoise.virtual_reduce_metric(**args)


def _noise(a, **overrides):
  args = dict(seeds=a["seeds"], shape=(2, 3))
  args.update(overrides)
  return jaxnoise.virtual_noise(**args)


OPS = {"linear": _linear, "weight_gradient": _weight_grad, "bias_gradient": _bias_grad,
       "reduce_metric": _metric, "virtual_noise": _noise}
SIGMA_OPS = ("linear", "weight_gradient", "bias_gradient", "reduce_metric")


def _raises(exc, *patterns):
  """pytest.raises whose message must contain every pattern (regex), in any order."""
  lookaheads = "".join(f"(?=.*{p})" for p in patterns)
  return pytest.raises(exc, match=re.compile(lookaheads, re.DOTALL))


# ----------------------------------------------------------------------------
# Ranks and shapes.


@pytest.mark.parametrize("shape", [(13,), (1, 5, 13)])
def test_weight_rank(rng, shape):
  a = _inputs(rng)
  with _raises(ValueError, "weight", "2-D", re.escape(str(shape))):
    _linear(a, weight=jnp.ones(shape))


@pytest.mark.parametrize("shape", [(13,), (2, 6, 3, 13)])
def test_x_rank(rng, shape):
  a = _inputs(rng)
  with _raises(ValueError, r"\bx\b", "2-D or 3-D", re.escape(str(shape))):
    _linear(a, x=jnp.ones(shape))


def test_x_features_must_match_weight(rng):
  a = _inputs(rng)
  with _raises(ValueError, r"\bx\b", "in_features=13", re.escape("(3, 12)"), re.escape("(5, 13)")):
    _linear(a, x=jnp.ones((3, 12)))


def test_per_individual_x_must_have_one_block_per_seed(rng):
  a = _inputs(rng)
  with _raises(ValueError, "per-individual x", re.escape("(4, 3, 13)"), "seeds",
               re.escape("(6,)")):
    _linear(a, x=jnp.ones((4, 3, 13)))


@pytest.mark.parametrize("shape", [(4,), (5, 1)])
def test_bias_shape(rng, shape):
  a = _inputs(rng)
  with _raises(ValueError, "bias", re.escape(str(shape))):
    _linear(a, bias=jnp.ones(shape))


@pytest.mark.parametrize("op", ["weight_gradient", "bias_gradient"])
@pytest.mark.parametrize("length", [5, 7])
def test_fitness_and_seeds_of_different_lengths(rng, op, length):
  a = _inputs(rng)
  with _raises(ValueError, "fitness", "seeds", re.escape(f"({length},)"), re.escape("(6,)")):
    OPS[op](a, fitness=jnp.ones(length))


@pytest.mark.parametrize("op", ["weight_gradient", "bias_gradient"])
def test_fitness_rank_and_dtype(rng, op):
  a = _inputs(rng)
  with _raises(ValueError, "fitness", "1-D", re.escape("(6, 1)")):
    OPS[op](a, fitness=jnp.ones((6, 1)))
  with _raises(TypeError, "fitness", "int32"):
    OPS[op](a, fitness=jnp.ones(6, jnp.int32))


@pytest.mark.parametrize("shape,exc", [((5,), ValueError), ((5, 13, 1), ValueError),
                                       ((5, -13), ValueError), ((5, 2.5), TypeError),
                                       ((5, True), TypeError)], ids=str)
def test_weight_shape(rng, shape, exc):
  a = _inputs(rng)
  with _raises(exc, "weight_shape", re.escape(str(shape)[:-1])):
    _weight_grad(a, weight_shape=shape)


@pytest.mark.parametrize("op,shape", [("weight", (5, 0)), ("weight", (0, 3)), ("bias", (0,))])
def test_empty_gradient_block_is_an_empty_result(rng, op, shape):
  """Zero-size blocks give an empty float32 gradient (documented), not a ZeroDivisionError."""
  a = _inputs(rng)
  grad = (_weight_grad(a, weight_shape=shape) if op == "weight"
          else _bias_grad(a, bias_shape=shape))
  assert grad.shape == shape and grad.dtype == jnp.float32


@pytest.mark.parametrize("shape,exc", [((5, 1), ValueError), ((-1,), ValueError),
                                       (("5",), TypeError)], ids=str)
def test_bias_shape_argument(rng, shape, exc):
  a = _inputs(rng)
  with _raises(exc, "bias_shape"):
    _bias_grad(a, bias_shape=shape)


def test_center_rank_and_n_params(rng):
  a = _inputs(rng)
  with _raises(ValueError, "center", "1-D", re.escape("(17, 1)")):
    _metric(a, center=jnp.ones((17, 1)))
  with _raises(ValueError, "n_params=16", re.escape("(17,)")):
    _metric(a, n_params=16)


@pytest.mark.parametrize("pop_size,exc", [(0, ValueError), (-3, ValueError), (2.5, TypeError)])
def test_pop_size(rng, pop_size, exc):
  a = _inputs(rng)
  with _raises(exc, "pop_size"):
    _weight_grad(a, pop_size=pop_size)


def test_float64_arrays_are_taken_as_float32_like_jnp_asarray(rng):
  """With x64 off, float64 data becomes float32 (JAX's own canonicalisation)."""
  a = _inputs(rng)
  as_f64 = {k: np.asarray(a[k], np.float64) for k in ("x", "weight", "bias")}
  np.testing.assert_array_equal(_linear(a, **as_f64), _linear(a))


@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.complex64])
def test_weight_and_x_dtypes(rng, dtype):
  a = _inputs(rng)
  with _raises(TypeError, "weight", np.dtype(dtype).name, re.escape("(5, 13)")):
    _linear(a, weight=np.ones((5, 13), dtype))
  with _raises(TypeError, r"\bx\b", np.dtype(dtype).name, re.escape("(3, 13)")):
    _linear(a, x=np.ones((3, 13), dtype))
  with _raises(TypeError, "bias", np.dtype(dtype).name):
    _linear(a, bias=np.ones(5, dtype))


# ----------------------------------------------------------------------------
# Seeds.


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("seeds,exc,patterns", [
    (np.arange(6, dtype=np.float32), TypeError, ["seeds", "float32", re.escape("(6,)")]),
    (jnp.arange(6, dtype=jnp.float32), TypeError, ["seeds", "float32"]),
    (np.ones(6, dtype=bool), TypeError, ["seeds", "bool"]),
    (jnp.ones(6, dtype=bool), TypeError, ["seeds", "bool"]),
    ([1.0, 2.5, 3.0, 4.0, 5.0, 6.0], TypeError, ["seeds", "float"]),
    ([True, False, True, False, True, False], TypeError, ["seeds", "bool"]),
    (np.arange(6, dtype=np.uint32).reshape(2, 3), ValueError, ["seeds", "1-D",
                                                              re.escape("(2, 3)")]),
    (np.zeros(0, dtype=np.uint32), ValueError, ["seeds", "empty"]),
], ids=["np_float", "jnp_float", "np_bool", "jnp_bool", "list_float", "list_bool", "2d", "empty"])
def test_bad_seeds(rng, op, seeds, exc, patterns):
  a = _inputs(rng)
  overrides = {"seeds": seeds}
  if op in ("weight_gradient", "bias_gradient"):
    overrides["fitness"] = jnp.ones(max(np.size(seeds), 1))
  with _raises(exc, *patterns):
    OPS[op](a, **overrides)


@pytest.mark.parametrize("op", list(OPS))
def test_odd_population_with_antithetic(rng, op):
  a = _inputs(rng, pop=5)
  with _raises(ValueError, "antithetic", "even", "5"):
    OPS[op](a, antithetic=True)


def test_draw_seeds_arguments():
  key = jax.random.key(0)
  with _raises(ValueError, "pop_size", "0"):
    jaxnoise.draw_seeds(key, 0)
  with _raises(ValueError, "antithetic", "even", "7"):
    jaxnoise.draw_seeds(key, 7, antithetic=True)
  with pytest.raises(TypeError):
    jaxnoise.draw_seeds(key, 2.5)


def _wrap_cases(rng):
  """(signed / wide seeds, their uint32 equivalents), incl. the edges of each range."""
  int32 = np.concatenate([[-1, -2**31, 2**31 - 1, 0],
                          rng.integers(-2**31, 2**31, size=4)]).astype(np.int32)
  int64 = np.concatenate([np.array([-1, 2**32, 2**32 + 7, -2**40 - 3, 2**63 - 1, -2**63], np.int64),
                          rng.integers(-2**62, 2**62, size=2)])
  uint64 = np.concatenate([np.array([2**64 - 1, 2**32, 2**33 + 5], np.uint64),
                           rng.integers(0, 2**63, size=5).astype(np.uint64)])
  as_python = [int(v) for v in int64]
  return {
      "np_int32": (int32, np.array([int(v) % 2**32 for v in int32], np.uint32)),
      "jnp_int32": (jnp.asarray(int32), np.array([int(v) % 2**32 for v in int32], np.uint32)),
      "np_int64": (int64, np.array([int(v) % 2**32 for v in int64], np.uint32)),
      "np_uint64": (uint64, np.array([int(v) % 2**32 for v in uint64], np.uint32)),
      "python_ints": (as_python + [2**70 + 9], np.array(
          [v % 2**32 for v in as_python + [2**70 + 9]], np.uint32)),
  }


@pytest.mark.parametrize("case", ["np_int32", "jnp_int32", "np_int64", "np_uint64",
                                  "python_ints"])
def test_integer_seeds_wrap_modulo_2_32(rng, case):
  seeds, wrapped = _wrap_cases(rng)[case]
  np.testing.assert_array_equal(np.asarray(jaxnoise.as_seeds(seeds)), wrapped)
  assert jaxnoise.as_seeds(seeds).dtype == jnp.uint32
  pop = wrapped.size
  noise = jaxnoise.virtual_noise(seeds, (3, 4), 11, kind="normal")
  np.testing.assert_array_equal(np.asarray(noise),
                                np.asarray(jaxnoise.virtual_noise(wrapped, (3, 4), 11, kind="normal")))
  a = _inputs(rng, pop=pop)
  np.testing.assert_array_equal(np.asarray(_linear(a, seeds=seeds)),
                                np.asarray(_linear(a, seeds=wrapped)))
  np.testing.assert_array_equal(np.asarray(_weight_grad(a, seeds=seeds)),
                                np.asarray(_weight_grad(a, seeds=wrapped)))
  np.testing.assert_array_equal(np.asarray(_metric(a, seeds=seeds)),
                                np.asarray(_metric(a, seeds=wrapped)))


# ----------------------------------------------------------------------------
# sigma, offset, kind, implementation.


@pytest.mark.parametrize("op", SIGMA_OPS)
@pytest.mark.parametrize("sigma", [0.0, -0.1, float("nan"), float("inf"), np.float32(-1.0),
                                   jnp.float32(0.0)], ids=str)
def test_sigma_must_be_positive_and_finite(rng, op, sigma):
  with _raises(ValueError, "sigma", "positive"):
    OPS[op](_inputs(rng), sigma=sigma)


@pytest.mark.parametrize("op", SIGMA_OPS)
def test_sigma_type_and_rank(rng, op):
  a = _inputs(rng)
  with _raises(ValueError, "sigma", "scalar", re.escape("(2,)")):
    OPS[op](a, sigma=jnp.ones(2))
  with _raises(TypeError, "sigma", "int32"):
    OPS[op](a, sigma=jnp.int32(1))
  with _raises(TypeError, "sigma", "bool"):
    OPS[op](a, sigma=True)


def test_traced_sigma_is_accepted(rng):
  # Not checkable under jit; a traced positive sigma must work.
  a = _inputs(rng)
  out = jax.jit(lambda s: _linear(a, sigma=s))(jnp.float32(0.1))
  np.testing.assert_allclose(np.asarray(out), np.asarray(_linear(a, sigma=0.1)), rtol=1e-5,
                             atol=1e-5)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("offset,exc", [(-1, ValueError), (2**64, ValueError), (1.5, TypeError),
                                        (3.0, TypeError), ("3", TypeError), (True, TypeError)],
                         ids=str)
def test_offset(rng, op, offset, exc):
  with _raises(exc, "offset"):
    OPS[op](_inputs(rng), offset=offset)


def test_numpy_int_offset_is_accepted(rng):
  a = _inputs(rng)
  np.testing.assert_array_equal(np.asarray(_linear(a, offset=np.int64(2**33 + 1))),
                                np.asarray(_linear(a, offset=2**33 + 1)))


def test_traced_offset_is_rejected(rng):
  a = _inputs(rng)
  with _raises(TypeError, "offset"):
    jax.jit(lambda o: _linear(a, offset=o))(3)


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("kind", ["gaussian", "Uniform", None, 3])
def test_bad_kind(rng, op, kind):
  with _raises(ValueError, "kind", "uniform", "rademacher", "normal", re.escape(repr(kind))):
    OPS[op](_inputs(rng), kind=kind)


@pytest.mark.parametrize("op", SIGMA_OPS)
def test_bad_implementation(rng, op):
  a = _inputs(rng)
  with _raises(ValueError, "implementation", "'triton'", "reference"):
    OPS[op](a, implementation="triton")
  if jax.default_backend() != "gpu":
    with _raises(ValueError, "pallas", "GPU", "interpret"):
      OPS[op](a, implementation="pallas")


def test_compute_offsets_rejects_negative_dimensions():
  with _raises(ValueError, re.escape("param_shapes[1]"), re.escape("(-2, 3)")):
    jaxnoise.compute_offsets([(4, 4), (-2, 3)])
