"""Pallas kernels of the virtual-noise ops against the pure-JAX reference.

On CPU the kernels run through Pallas's interpreter (``implementation=
"interpret"``); on a GPU the same tests also run compiled (``"pallas"``).
The noise is compared bit for bit (identity inputs, one-hot fitness), outputs
to per-dtype float tolerance, on odd shapes, for every kind, dtype and
antithetic setting, and under several tile configs.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxnoise
from jaxnoise import noise as noise_lib
from jaxnoise.ops import _pallas
from jaxnoise.ops import autotune
from jaxnoise.ops.virtual_noise import config as config_lib
from jaxnoise.ops.virtual_noise import pallas_triton
from jaxnoise.ops.virtual_noise import pallas_triton_low_rank
from jaxnoise.ops.virtual_noise import tuning

KINDS = ("uniform", "rademacher", "normal", "binomial")
IMPLEMENTATIONS = ["interpret"] + (["pallas"] if jax.default_backend() == "gpu" else [])
# Relative max error against the float32 reference, by input dtype. The kernel
# feeds bfloat16 / float16 noise to the matrix units; float32 uses IEEE products
# in these tests (tf32=False) so the bound is float32 rounding.
TOLERANCE = {"float32": 2e-5, "bfloat16": 2e-2, "float16": 5e-3}
IEEE = config_lib.PerturbedLinearConfig(tf32=False)


def _rel_err(value, ref):
  value = np.asarray(value, np.float64)
  ref = np.asarray(ref, np.float64)
  assert np.all(np.isfinite(value)), "kernel output has non-finite values"
  return float(np.abs(value - ref).max() / np.abs(ref).max())


def _seeds(rng, pop):
  return jnp.asarray(rng.integers(0, 2**32, pop, dtype=np.uint64).astype(np.uint32))


def _normal(rng, shape, dtype):
  return jnp.asarray(rng.normal(size=shape), jnp.float32).astype(dtype)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("offset", [3, 2**32 - 50, 2**37 - 999])
def test_noise_bit_for_bit(rng, implementation, kind, offset):
  """Identity x exposes N_i in the forward; a one-hot fitness returns it from the gradient."""
  pop, out_features, in_features = 4, 11, 37
  seeds = _seeds(rng, pop)
  expected = np.asarray(jaxnoise.virtual_noise(seeds, (out_features, in_features), offset,
                                               kind=kind))
  y = jaxnoise.virtual_perturbed_linear(
      jnp.eye(in_features), jnp.zeros((out_features, in_features)), None, seeds, 1.0, offset,
      kind=kind, implementation=implementation, config=IEEE)
  np.testing.assert_array_equal(np.transpose(np.asarray(y), (0, 2, 1)), expected)
  member = int(rng.integers(pop))
  one_hot = jnp.zeros((pop,)).at[member].set(1.0)
  # pop_size * sigma == 1: the estimate is N_member exactly.
  grad = jaxnoise.virtual_weight_gradient(one_hot, seeds, (out_features, in_features), 0.25,
                                          None, offset, kind=kind,
                                          implementation=implementation)
  np.testing.assert_array_equal(np.asarray(grad), expected[member])
  if kind == "rademacher":
    lanes = config_lib.NoiseGradientConfig(16, 2, lane_accumulators=True)
    grad = jaxnoise.virtual_weight_gradient(one_hot, seeds, (out_features, in_features), 0.25,
                                            None, offset, kind=kind,
                                            implementation=implementation, config=lanes)
    np.testing.assert_array_equal(np.asarray(grad), expected[member])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shared_x", [True, False])
def test_linear_matches_reference(rng, implementation, kind, antithetic, dtype, shared_x):
  pop, batch, out_features, in_features = 6, 5, 37, 70
  x_shape = (batch, in_features) if shared_x else (pop, batch, in_features)
  x = _normal(rng, x_shape, dtype)
  weight = _normal(rng, (out_features, in_features), "float32" if dtype == "float32" else dtype)
  bias = _normal(rng, (out_features,), "float32")
  seeds = _seeds(rng, pop)
  op = functools.partial(jaxnoise.virtual_perturbed_linear, x, weight, bias, seeds, 0.05, 5,
                         kind=kind, antithetic=antithetic)
  ref = op(implementation="reference")
  out = op(implementation=implementation, config=IEEE if dtype == "float32" else None)
  assert out.shape == (pop, batch, out_features)
  assert _rel_err(out, ref) <= TOLERANCE[dtype]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["uniform", "rademacher"])
@pytest.mark.parametrize("in_features", [64, 70])
@pytest.mark.parametrize("config", [
    config_lib.PerturbedLinearConfig(16, 16, 32, 2, tf32=False),
    config_lib.PerturbedLinearConfig(32, 128, 64, 4, tf32=False),
    config_lib.PerturbedLinearConfig(64, 32, 128, 8, num_stages=2, tf32=False),
], ids=["16x16x32", "32x128x64", "64x32x128"])
def test_linear_tilings_agree(rng, implementation, kind, in_features, config):
  """The output does not depend on the tiling (aligned and unaligned rows)."""
  pop, batch, out_features = 4, 19, 45
  x = _normal(rng, (batch, in_features), "float32")
  weight = _normal(rng, (out_features, in_features), "float32")
  seeds = _seeds(rng, pop)
  op = functools.partial(jaxnoise.virtual_perturbed_linear, x, weight, None, seeds, 0.1, 96,
                         kind=kind)
  assert _rel_err(op(implementation=implementation, config=config),
                  op(implementation="reference")) <= TOLERANCE["float32"]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["uniform", "rademacher"])
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("shared_x", [True, False])
def test_linear_gradients_match_reference(rng, implementation, kind, antithetic, shared_x):
  """The custom VJP (noise regenerated in the input-gradient kernel) against the reference."""
  pop, batch, out_features, in_features = 4, 3, 21, 40
  x = _normal(rng, (batch, in_features) if shared_x else (pop, batch, in_features), "float32")
  weight = _normal(rng, (out_features, in_features), "float32")
  bias = _normal(rng, (out_features,), "float32")
  seeds = _seeds(rng, pop)

  def loss(x, weight, bias, sigma, implementation):
    y = jaxnoise.virtual_perturbed_linear(x, weight, bias, seeds, sigma, 7, kind=kind,
                                          antithetic=antithetic, implementation=implementation,
                                          config=None if implementation == "reference" else IEEE)
    return jnp.sum(jnp.sin(y))

  grad = jax.grad(loss, argnums=(0, 1, 2, 3))
  # d/dsigma is one scalar sum over every output, with cancellation: its
  # float32 rounding is relative to the sum of |terms|, not to the result.
  tolerances = {"x": 1e-5, "weight": 1e-5, "bias": 1e-5, "sigma": 5e-5}
  for name, got, want in zip(tolerances, grad(x, weight, bias, 0.3, implementation),
                             grad(x, weight, bias, 0.3, "reference")):
    assert _rel_err(got, want) <= tolerances[name], name


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_input_grad_kernel_tilings(rng, implementation):
  pop, batch, out_features, in_features = 6, 9, 50, 70
  grad_out = _normal(rng, (pop, batch, out_features), "float32")
  weight = _normal(rng, (out_features, in_features), "float32")
  seeds = _seeds(rng, pop)
  kind = noise_lib.get_kind("rademacher")
  from jaxnoise.ops.virtual_noise import reference  # pylint: disable=g-import-not-at-top
  for shared_x in (True, False):
    want = reference.perturbed_linear_input_grad_reference(
        grad_out, weight, seeds, jnp.float32(0.2), 3, kind=kind, antithetic=True,
        shared_x=shared_x)
    for config in (config_lib.PerturbedLinearConfig(16, 16, 32, 2, tf32=False),
                   config_lib.PerturbedLinearConfig(16, 64, 64, 4, tf32=False),
                   config_lib.PerturbedLinearConfig(32, 32, 128, 4, tf32=False)):
      got = pallas_triton.perturbed_linear_input_grad(
          grad_out, weight, seeds, jnp.float32(0.2), 3, kind=kind, antithetic=True,
          shared_x=shared_x, config=config, interpret=implementation == "interpret")
      assert _rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("antithetic", [False, True])
@pytest.mark.parametrize("offset", [5, 2**32 - 300])
def test_flat_ops_match_reference(rng, implementation, kind, antithetic, offset):
  pop = 10
  fitness = _normal(rng, (pop,), "float32")
  seeds = _seeds(rng, pop)
  kw = dict(kind=kind, antithetic=antithetic)
  for fn, shape in ((jaxnoise.virtual_weight_gradient, (13, 45)),
                    (jaxnoise.virtual_bias_gradient, (77,))):
    want = fn(fitness, seeds, shape, 0.2, None, offset, implementation="reference", **kw)
    got = fn(fitness, seeds, shape, 0.2, None, offset, implementation=implementation, **kw)
    assert got.shape == shape
    assert _rel_err(got, want) <= 1e-5
  center = _normal(rng, (1234,), "float32")
  want = jaxnoise.virtual_reduce_metric(center, seeds, 0.5, None, offset,
                                        implementation="reference", **kw)
  got = jaxnoise.virtual_reduce_metric(center, seeds, 0.5, None, offset,
                                       implementation=implementation, **kw)
  assert _rel_err(got, want) <= 1e-5


def test_binomial_unit_is_exact(rng):
  words = np.concatenate([rng.integers(0, 2**32, 4093, dtype=np.uint64).astype(np.uint32),
                          np.array([0, 0xFFFFFFFF, 1], np.uint32)])
  unit = np.asarray(pallas_triton._binomial_unit(jnp.asarray(words)))  # pylint: disable=protected-access
  want = np.asarray(noise_lib.get_kind("binomial").unscaled(jnp.asarray(words)))
  np.testing.assert_array_equal(unit, 1.0 + (want + 16.0) / 32.0)
  np.testing.assert_array_equal(32.0 * unit - 48.0, want)
  assert unit.min() == 1.0 and unit.max() == 2.0


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("kind", ["binomial", "uniform", "normal"])
@pytest.mark.parametrize("n_params, offset", [
    (128 * 7, 11),  # whole tiles only; the last of 4 splits takes one tile
    (128 * 6 + 37, 3),  # whole tiles, then a ragged one
    (100, 2**32 + 5),  # one ragged tile
    (128 * 5 + 3, 2**32 - 128 * 3 - 10),  # two high words, each whole tiles and a ragged rest
])
def test_reduce_metric_individuals_whole_and_ragged_tiles(rng, implementation, kind, n_params,
                                                          offset):
  pop = 10  # 10 individuals or 5 pairs: groups of 4 with a partial last group
  seeds = _seeds(rng, pop)
  center = _normal(rng, (n_params,), "float32")
  config = config_lib.ReduceMetricConfig(layout="individuals", individuals_per_program=4,
                                         block_params=128, param_splits=4, num_warps=4)
  for antithetic in (False, True):
    kw = dict(kind=kind, antithetic=antithetic)
    want = jaxnoise.virtual_reduce_metric(center, seeds, 0.3, None, offset,
                                          implementation="reference", **kw)
    got = jaxnoise.virtual_reduce_metric(center, seeds, 0.3, None, offset,
                                         implementation=implementation, config=config, **kw)
    assert got.shape == (pop,)
    assert _rel_err(got, want) <= 1e-5


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_flat_ops_tilings_agree(rng, implementation):
  pop = 9
  fitness = _normal(rng, (pop,), "float32")
  seeds = _seeds(rng, pop)
  center = _normal(rng, (3001,), "float32")
  for kind in ("uniform", "rademacher"):
    want_grad = jaxnoise.virtual_weight_gradient(fitness, seeds, (31, 97), 0.1, None, 17,
                                                 kind=kind, implementation="reference")
    want_metric = jaxnoise.virtual_reduce_metric(center, seeds, 0.1, None, 17, kind=kind,
                                                 implementation="reference")
    for config in (config_lib.NoiseGradientConfig(8, 1, 2), config_lib.NoiseGradientConfig(32, 3),
                   config_lib.NoiseGradientConfig(128, 9, 8, num_stages=1),
                   config_lib.NoiseGradientConfig(16, 2, individuals_per_step=4),
                   config_lib.NoiseGradientConfig(16, 2, 4, individuals_per_step=2,
                                                  lane_accumulators=True),
                   config_lib.NoiseGradientConfig(128, 1, lane_accumulators=True)):
      got = jaxnoise.virtual_weight_gradient(fitness, seeds, (31, 97), 0.1, None, 17, kind=kind,
                                             implementation=implementation, config=config)
      assert _rel_err(got, want_grad) <= 1e-5
    for config in (config_lib.ReduceMetricConfig(8, 1, 1, 2), config_lib.ReduceMetricConfig(16, 4, 3),
                   config_lib.ReduceMetricConfig(64, 8, 2, 8, num_stages=1)):
      got = jaxnoise.virtual_reduce_metric(center, seeds, 0.1, None, 17, kind=kind,
                                           implementation=implementation, config=config)
      assert _rel_err(got, want_metric) <= 1e-5


def test_configs_reject_what_the_gpu_cannot_compile():
  with pytest.raises(ValueError, match="block_out"):
    config_lib.PerturbedLinearConfig(block_out=48).validate()
  with pytest.raises(ValueError, match="block_in"):
    config_lib.PerturbedLinearConfig(block_in=16).validate()
  with pytest.raises(ValueError, match="num_warps"):
    config_lib.PerturbedLinearConfig(num_warps=3).validate()
  with pytest.raises(ValueError, match="block_rows"):
    config_lib.NoiseGradientConfig(block_rows=24).validate()
  with pytest.raises(ValueError, match="individuals_per_program"):
    config_lib.ReduceMetricConfig(individuals_per_program=3).validate()
  x, weight = jnp.ones((2, 40)), jnp.ones((3, 40))
  with pytest.raises(ValueError, match="block_batch"):
    jaxnoise.virtual_perturbed_linear(x, weight, None, jnp.arange(2), 0.1,
                                      implementation="interpret",
                                      config=config_lib.PerturbedLinearConfig(block_batch=8))


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="checks the CPU error")
def test_pallas_without_gpu_is_a_clear_error():
  with pytest.raises(ValueError, match="needs a GPU"):
    jaxnoise.virtual_reduce_metric(jnp.ones(4), jnp.arange(2), 0.1, implementation="pallas")


def test_autotune_screen_excludes_a_wrong_config_and_records_it(rng, monkeypatch):
  """A candidate whose output disagrees with the reference is excluded, with its deviation."""
  autotune.clear()
  good = config_lib.PerturbedLinearConfig(16, 64, 64, 4)
  bad = config_lib.PerturbedLinearConfig(16, 32, 64, 4)
  real = pallas_triton.perturbed_linear

  def corrupted_when_bad(*args, config=None, **kwargs):
    out = real(*args, config=config, **kwargs)
    return out.at[..., 0].add(1.0) if config == bad else out

  monkeypatch.setattr(pallas_triton, "perturbed_linear", corrupted_when_bad)
  x = _normal(rng, (5, 70), "float32")
  weight = _normal(rng, (37, 70), "float32")
  seeds = _seeds(rng, 4)
  record = tuning.tune_perturbed_linear(x, weight, None, seeds, 0.1, implementation="interpret",
                                        candidates=[bad, good], repeats=1)
  by_config = {c.config: c for c in record.candidates}
  assert by_config[bad].status == "excluded" and by_config[bad].deviation > record.tolerance
  assert by_config[good].status == "selected" and by_config[good].deviation <= record.tolerance
  assert record.selected == good and record.excluded == (by_config[bad],)
  assert autotune.records()[-1] is record

  used = []

  def spy(*args, config=None, **kwargs):
    used.append(config)
    return real(*args, config=config, **kwargs)

  monkeypatch.setattr(pallas_triton, "perturbed_linear", spy)
  jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, implementation="interpret"))(
      x, weight, None, seeds, 0.1)
  assert used == [good]  # the tuned config, found under jit
  autotune.clear()
  used.clear()
  jaxnoise.virtual_perturbed_linear(x, weight, None, seeds, 0.1, implementation="interpret")
  assert used == [None]  # untuned again: the kernel takes its heuristic config


def test_autotune_raises_when_every_candidate_fails(rng):
  autotune.clear()
  center = _normal(rng, (500,), "float32")
  seeds = _seeds(rng, 4)
  with pytest.raises(RuntimeError, match="no candidate passed"):
    tuning.tune_reduce_metric(center, seeds, 0.1, implementation="interpret",
                              candidates=[None], tolerance=-1.0, repeats=1)
  (record,) = autotune.records()
  assert record.selected is None and record.candidates[0].status == "excluded"
  autotune.clear()


def test_autotune_timing_queues_short_calls_and_interleaves_candidates(monkeypatch):
  """Short calls are queued several per sample; candidates' samples alternate by round."""
  monkeypatch.setattr(autotune, "_SAMPLE_SECONDS", 0.05)
  calls = []

  def candidate(name):
    def call():
      calls.append(name)
      return jnp.zeros(())
    return call

  medians = autotune._interleaved_medians([candidate("a"), candidate("b")], warmup=1,
                                          repeats=4)
  assert calls[:4] == ["a", "a", "b", "b"]  # warm-up and sizing call of each
  timed = calls[4:]
  queued = timed.count("a") // 4
  assert queued > 1 and timed.count("b") == 4 * queued
  # Rounds start at a rotating candidate: a b, b a, a b, b a (in runs of `queued` calls).
  runs = [timed[i] for i in range(0, len(timed), queued)]
  assert runs == ["a", "b", "b", "a", "a", "b", "b", "a"]
  assert all(0 < m < 0.05 for m in medians)


def test_autotune_times_the_batched_run_per_call_and_screens_with_run(monkeypatch):
  """With batched_run, run only screens; the batched calls are timed and divided by their count."""
  monkeypatch.setattr(autotune, "_SAMPLE_SECONDS", 0.01)
  autotune.clear()
  screened, batched = [], []

  def run(config):
    screened.append(config)
    return jnp.ones(3)

  def batched_run(config):
    def many():
      batched.append(config)
      return jnp.ones(3)
    return many

  record = autotune.tune("test_op", ("k",), ["a", "b"], run, lambda: jnp.ones(3), 0.0,
                         warmup=1, repeats=3, batched_run=batched_run, batch_calls=4)
  assert screened == ["a", "b"] and {"a", "b"} == set(batched)
  seconds = {c.config: c.seconds for c in record.candidates}
  assert record.selected in ("a", "b") and all(0 < t < 0.01 / 4 for t in seconds.values())
  autotune.clear()


def test_reference_never_holds_the_population_noise():
  """The reference builds the noise a chunk of individuals at a time."""
  pop, batch, out_features, in_features = 512, 4, 256, 512
  args = (jnp.ones((batch, in_features)), jnp.ones((out_features, in_features)), None,
          jnp.arange(pop, dtype=jnp.uint32), 0.1)
  fn = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, implementation="reference"))
  stats = fn.lower(*args).compile().memory_analysis()
  noise_bytes = pop * out_features * in_features * 4
  assert stats.temp_size_in_bytes < noise_bytes // 2


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["linear", "gradient", "metric"])
def test_compiled_kernels_hold_no_population_noise(op):
  """The compiled executable has no (pop, out, in) buffer (GPU only)."""
  pop, batch, out_features, in_features = 256, 8, 512, 512
  noise_bytes = pop * out_features * in_features * 4
  seeds = jnp.arange(pop, dtype=jnp.uint32)
  if op == "linear":
    fn = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, implementation="pallas"))
    args = (jnp.ones((batch, in_features), jnp.bfloat16),
            jnp.ones((out_features, in_features), jnp.bfloat16), None, seeds, 0.1)
  elif op == "gradient":
    fn = jax.jit(lambda f: jaxnoise.virtual_weight_gradient(
        f, seeds, (out_features, in_features), 0.1, implementation="pallas"))
    args = (jnp.ones((pop,)),)
  else:
    fn = jax.jit(lambda c: jaxnoise.virtual_reduce_metric(c, seeds, 0.1, implementation="pallas"))
    args = (jnp.ones((out_features * in_features,)),)
  stats = fn.lower(*args).compile().memory_analysis()
  assert stats.temp_size_in_bytes < noise_bytes // 8


def test_kernels_lower_to_triton():
  """Every kernel and config variant lowers through Pallas' Triton backend for CUDA.

  Runs on a CPU-only machine: it catches what the interpreter accepts and the GPU
  lowering rejects (non-power-of-2 tensors, ops the Triton lowering lacks). It
  does not prove the Triton compiler accepts the kernel; the GPU runs do that.
  """
  spec = jax.ShapeDtypeStruct
  seeds, sigma = spec((64,), jnp.uint32), spec((), jnp.float32)
  cases = []
  for kind_name in KINDS:
    kind = noise_lib.get_kind(kind_name)
    for offset in (0, 2**37 - 999):
      for shared in (True, False):
        x = spec((7, 70) if shared else (64, 7, 70), jnp.bfloat16)
        cases.append((f"linear {kind_name} {offset} shared={shared}", functools.partial(
            pallas_triton.perturbed_linear, bias=None, offset=offset, kind=kind,
            antithetic=True, out_dtype=jnp.float32),
            dict(x=x, weight=spec((37, 70), jnp.bfloat16), seeds=seeds, sigma=sigma)))
        cases.append((f"input grad {kind_name} {offset} shared={shared}", functools.partial(
            pallas_triton.perturbed_linear_input_grad, offset=offset, kind=kind,
            antithetic=False, shared_x=shared),
            dict(grad_out=spec((64, 7, 37), jnp.float32), weight=spec((37, 70), jnp.float32),
                 seeds=seeds, sigma=sigma)))
      for config in (None, config_lib.NoiseGradientConfig(128, 2, lane_accumulators=True,
                                                          individuals_per_step=2)):
        cases.append((f"gradient {kind_name} {offset} {config}", functools.partial(
            pallas_triton.noise_gradient, shape=(37, 129), pop_size=64, offset=offset,
            kind=kind, antithetic=False, config=config),
            dict(fitness=spec((64,), jnp.float32), seeds=seeds, sigma=sigma)))
      cases.append((f"reduce-metric {kind_name} {offset}", functools.partial(
          pallas_triton.reduce_metric, offset=offset, kind=kind, antithetic=False),
          dict(center=spec((5003,), jnp.float32), seeds=seeds, sigma=sigma)))
      if kind.values_per_word == 1:
        cases.append((f"reduce-metric individuals {kind_name} {offset}", functools.partial(
            pallas_triton.reduce_metric, offset=offset, kind=kind, antithetic=True,
            config=config_lib.reduce_metric_individuals_heuristics(5003, 32)),
            dict(center=spec((5003,), jnp.float32), seeds=seeds, sigma=sigma)))
      for shared in (True, False):  # the low-rank kernel, forward and input gradient
        x = spec((7, 70) if shared else (64, 7, 70), jnp.bfloat16)
        cases.append((f"low-rank linear {kind_name} {offset} shared={shared}",
                      functools.partial(pallas_triton_low_rank.low_rank_perturbed_linear,
                                        offset=offset, kind=kind, antithetic=True,
                                        out_dtype=jnp.bfloat16, rank=3),
                      dict(x=x, weight=spec((37, 70), jnp.bfloat16),
                           bias=spec((37,), jnp.float32), seeds=seeds, sigma=sigma)))
      for gradient_config in (config_lib.LowRankGradientConfig(),
                              config_lib.LowRankGradientConfig(operand_dtype="bfloat16",
                                                               tf32=False, block_rows=16),
                              config_lib.LowRankGradientConfig(split_k=3)):
        cases.append((f"low-rank gradient tiles {kind_name} {offset} {gradient_config}",
                      functools.partial(pallas_triton_low_rank.low_rank_gradient,
                                        shape=(37, 129), pop_size=64, offset=offset, kind=kind,
                                        antithetic=True, rank=2, config=gradient_config,
                                        rows=(5, 20)),
                      dict(fitness=spec((64,), jnp.float32), seeds=seeds, sigma=sigma)))
      cases.append((f"low-rank input grad {kind_name} {offset}", functools.partial(
          pallas_triton_low_rank.low_rank_input_grad, offset=offset, kind=kind,
          antithetic=False, shared_x=False, rank=2),
          dict(grad_out=spec((64, 7, 37), jnp.float32), weight=spec((37, 70), jnp.float32),
               seeds=seeds, sigma=sigma)))
  for name, fn, kwargs in cases:
    text = jax.jit(lambda kw, fn=fn: fn(**kw)).trace(kwargs).lower(
        lowering_platforms=("cuda",)).as_text()
    assert "xla.gpu.triton" in text, name


@pytest.mark.parametrize("transposed_noise", [True, False])
def test_forward_kernel_transposes_nothing(monkeypatch, transposed_noise):
  """The forward's Triton IR has no ``tt.trans`` unless asked for the old tile (issue 14).

  XLA's Triton pipeline (jax 0.11) pushes a transpose up through every elementwise op
  and copies shared subexpressions once per use: over the hash that took the compile
  from 1 s to 10 s - minutes once word indices pass 2**32. Checked on the lowered IR, so
  it runs without a GPU; ``transposed_noise=False`` shows the check sees a transpose.
  """
  from jax._src.pallas.triton import lowering  # pylint: disable=g-import-not-at-top
  from jax._src.pallas.triton import pallas_call_registration  # pylint: disable=g-import-not-at-top
  modules = []
  original = lowering.lower_jaxpr_to_triton_module

  def capture(*args, **kwargs):
    result = original(*args, **kwargs)
    modules.append(result.module.operation.get_asm())
    return result

  monkeypatch.setattr(lowering, "lower_jaxpr_to_triton_module", capture)
  monkeypatch.setattr(pallas_call_registration.lowering, "lower_jaxpr_to_triton_module",
                      capture)
  spec = jax.ShapeDtypeStruct
  config = config_lib.PerturbedLinearConfig(transposed_noise=transposed_noise)
  for kind in KINDS:
    for offset in (0, 2**37 - 999):
      fn = functools.partial(pallas_triton.perturbed_linear, bias=None, offset=offset,
                             kind=noise_lib.get_kind(kind), antithetic=True,
                             out_dtype=jnp.float32, config=config)
      kwargs = dict(x=spec((7, 70), jnp.bfloat16), weight=spec((37, 70), jnp.bfloat16),
                    seeds=spec((64,), jnp.uint32), sigma=spec((), jnp.float32))
      jax.jit(lambda kw, fn=fn: fn(**kw)).trace(kwargs).lower(lowering_platforms=("cuda",))
  assert len(modules) == 2 * len(KINDS)
  assert all(("tt.trans" in m) != transposed_noise for m in modules)


@pytest.mark.parametrize("tf32", [False, True, None])
def test_backward_follows_the_forwards_precision(tf32):
  """``tf32=False`` makes every product of forward and backward IEEE float32 (HIGHEST).

  Checked in the traced program: on a GPU the default would be TF32, which is what the
  kernels use unless the forward's config says otherwise; the reference is always exact.
  """
  x, weight, bias = jnp.ones((3, 40)), jnp.ones((21, 40)), jnp.ones((21,))
  seeds = jnp.arange(4, dtype=jnp.uint32)
  implementation = "reference" if tf32 is None else "interpret"
  config = None if tf32 is None else config_lib.PerturbedLinearConfig(tf32=tf32)

  def loss(x, weight, bias):
    return jnp.sum(jaxnoise.virtual_perturbed_linear(
        x, weight, bias, seeds, 0.1, kind="rademacher", implementation=implementation,
        config=config))

  text = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, weight, bias))
  n_products = sum("dot_general" in line for line in text.splitlines())
  n_highest = text.count("precision=(Precision.HIGHEST")
  assert n_products >= 3
  assert n_highest == (0 if tf32 else n_products)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [1, 7, 64, 256, 4096])
def test_pipelining_fits_shared_memory(monkeypatch, dtype, batch):
  """Heuristic tiles times the chosen pipelining depth fit an H200's 232,448 bytes per block.

  Every tile a kernel loads per step counts: antithetic pairs with per-individual x
  load two input (or output-gradient) tiles per step. Triton refuses to compile a
  kernel whose pipeline does not fit.
  """
  limit = 232448
  monkeypatch.setattr(_pallas, "max_shared_memory_per_block", lambda: limit)
  itemsize = jnp.dtype(dtype).itemsize
  kind = noise_lib.get_kind("rademacher")
  for products in (1, 2):
    config = config_lib.perturbed_linear_heuristics(batch, 1024, 1024, kind, products)
    stages = config.stages(itemsize, products)
    tile = config.block_batch * config.block_in * itemsize
    assert stages * products * tile + config.block_out * config.block_in * itemsize <= limit
    # Two float32 accumulators of (block_batch, block_out) stay within 128 registers a thread.
    assert products * config.block_batch * config.block_out <= 128 * 32 * config.num_warps
    grad_config = config_lib.input_grad_heuristics(batch, 1024, 1024, kind)
    stages = grad_config.input_grad_stages(products)
    tile = grad_config.block_batch * grad_config.block_out * 4
    assert stages * products * tile + grad_config.block_out * grad_config.block_in * 4 <= limit


@pytest.mark.parametrize("kind", ["uniform", "normal"])
@pytest.mark.parametrize("offset", [0, 5, 2**32 - 300, 2**40 + 3])
@pytest.mark.parametrize("antithetic", [False, True])
def test_reduce_metric_individuals_layout_matches_reference(kind, offset, antithetic):
  """The ``(individuals, parameters)`` layout, ragged on both axes and across 2**32."""
  center = jax.random.normal(jax.random.key(1), (1003,))
  seeds = jnp.arange(10, dtype=jnp.uint32) * 7 + 3
  config = config_lib.ReduceMetricConfig(layout="individuals", individuals_per_program=4,
                                         block_params=128, param_splits=3, num_warps=4)
  kwargs = dict(offset=offset, kind=kind, antithetic=antithetic)
  result = jaxnoise.virtual_reduce_metric(center, seeds, 0.3, implementation="interpret",
                                          config=config, **kwargs)
  expected = jaxnoise.virtual_reduce_metric(center, seeds, 0.3, implementation="reference",
                                            **kwargs)
  np.testing.assert_allclose(np.asarray(result), np.asarray(expected), rtol=1e-6)


def test_reduce_metric_individuals_layout_rejects_packed_kinds():
  config = config_lib.ReduceMetricConfig(layout="individuals")
  with pytest.raises(ValueError, match="one value per word"):
    jaxnoise.virtual_reduce_metric(jnp.ones(64), jnp.arange(4, dtype=jnp.uint32), 0.1,
                                   kind="rademacher", implementation="interpret", config=config)
  assert all(c.layout == "rows" for c in config_lib.reduce_metric_candidates(
      4096, 64, noise_lib.get_kind("rademacher")))
  with pytest.raises(ValueError, match="layout"):
    config_lib.ReduceMetricConfig(layout="columns").validate()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batch", [128, 257, 512])
def test_compiled_pairs_with_per_individual_x_at_large_batch(rng, dtype, batch):
  """Antithetic pairs with per-individual x load two tiles a step; heuristic tiles compile.

  The pipelining estimate counts both tiles (``test_pipelining_fits_shared_memory``);
  this compiles the forward and its VJP (input, weight, bias) at those sizes and
  compares them with the reference (GPU only).
  """
  pop, out_features, in_features = 4, 300, 1000
  x = _normal(rng, (pop, batch, in_features), dtype)
  weight = _normal(rng, (out_features, in_features), dtype)
  bias = _normal(rng, (out_features,), jnp.float32)
  seeds = _seeds(rng, pop)
  cotangent = _normal(rng, (pop, batch, out_features), jnp.float32)

  def loss_and_grads(implementation):
    def loss(x, weight, bias):
      y = jaxnoise.virtual_perturbed_linear(x, weight, bias, seeds, 0.05, 7, kind="rademacher",
                                            antithetic=True, implementation=implementation)
      return jnp.sum(y * cotangent), y
    (_, y), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(x, weight, bias)
    return (y,) + grads

  got = loss_and_grads("pallas")
  expected = loss_and_grads("reference")
  # The kernels use the matrix units at default precision: TF32 for float32 inputs.
  tolerance = 2e-2 if dtype == "bfloat16" else 5e-3
  for name, value, ref in zip(("y", "dx", "dweight", "dbias"), got, expected):
    assert _rel_err(value, ref) <= tolerance, name


def test_gradient_heuristics_pick_lane_accumulators_for_packed_kinds(rng):
  """32-values-per-word kinds get lane accumulators (same bits as the row tiles); others not."""
  packed, single = noise_lib.get_kind("rademacher"), noise_lib.get_kind("binomial")
  assert config_lib.noise_gradient_heuristics(1 << 20, 1024, packed).lane_accumulators
  assert config_lib.noise_gradient_heuristics(4096, 64, packed).lane_accumulators
  assert not config_lib.noise_gradient_heuristics(1000, 64, packed).lane_accumulators
  assert not config_lib.noise_gradient_heuristics(1 << 20, 1024, single).lane_accumulators
  assert not config_lib.noise_gradient_heuristics(1 << 20, 1024).lane_accumulators
  pop, shape = 70, (37, 129)
  fitness = _normal(rng, (pop,), jnp.float32)
  seeds = _seeds(rng, pop)
  lanes = config_lib.noise_gradient_heuristics(37 * 129, pop, packed)
  results = [jaxnoise.virtual_weight_gradient(fitness, seeds, shape, 0.1, None, 2**32 - 77,
                                              kind="rademacher", implementation="interpret",
                                              config=config)
             for config in (lanes, dataclasses.replace(lanes, lane_accumulators=False))]
  np.testing.assert_array_equal(np.asarray(results[0]), np.asarray(results[1]))
