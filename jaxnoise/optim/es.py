"""An optax-style evolution-strategies transform over virtual noise.

:func:`evolution_strategy` returns an :class:`EvolutionStrategy` with

* ``init(params) -> state``,
* ``ask(state) -> (seeds, state)``: the generation's ``(pop,)`` seeds,
* ``update(fitness, state, params) -> (updates, state)``: optax-style
  updates to add to the parameters (``optax.apply_updates``),

that chains **any** optax optimizer: the ES gradient estimate (from
:func:`jaxnoise.nn.population.fitness_gradient`, which never materialises the
noise) is handed to the inner optimizer *as the gradient of a loss to
minimise*.

Sign conventions
----------------
``maximize=True`` (default): larger fitness is better (e.g. reward, accuracy,
negative loss). ``maximize=False``: smaller is better (a loss); the fitness
is negated first. After shaping, ``g = sum_i shaped_i s_i noise_i /
(pop * sigma)`` estimates the gradient of expected (oriented) fitness, an
ascent direction; the inner optimizer receives ``-g + weight_decay *
params``, so ``optax.sgd(lr)`` moves the parameters by ``lr * g - lr *
weight_decay * params``.

Fitness shaping
---------------
``"centered_rank"`` (default): ranks ``0 .. pop-1`` mapped to ``[-0.5, 0.5]``
(``rank / (pop - 1) - 0.5``); equal fitness values share their average rank,
so an all-equal population (or an antithetic pair with equal fitness) gives
no gradient. ``"z_score"``: ``(f - mean) / std`` (zeros when ``std == 0``).
``"raw"``: the oriented fitness as is, except that a generation whose largest
``|f|`` exceeds ``2**37 * sigma`` is scaled down below that bound (a positive
factor, see :func:`bound_raw_fitness`: the direction is kept), so no gradient entry ``sum_i f_i s_i noise_i /
(pop * sigma)`` can pass ``2**40`` (noise values are below 8 in magnitude) and
the inner optimizer's moments (``g**2``) stay far inside float32 range. Such
generations are counted in ``state.rescaled_count``. ``"z_score"`` divides by
the largest ``|f|`` first when it exceeds ``2**50``, so finite fitness near the
float32 limit cannot overflow the mean or the variance.

Finite updates
--------------
Whatever the fitness, nothing that is not finite reaches the parameters or
the optimizer state, and ``state.dropped_count`` counts every generation in
which something was dropped:

* a generation whose new inner-optimizer state holds a NaN or inf (e.g. an
  optimizer state that overflowed earlier, or momentum of an overflowed
  update) is dropped whole: the updates are zeros and the inner state is kept;
* otherwise each NaN or inf entry of the updates (e.g. a weight decay
  overflowing on huge parameters) is zeroed on its own, as ``optax.zero_nans``
  does for NaNs, and the other entries apply.

Checked entry by entry, the updates' check is a reduction beside the
parameters' addition, not a pass that the addition waits for, so XLA can read
the updates once for both (one multi-output fusion). After XLA's GEMM
(``LowRankGradientConfig(xla_gemm=True)``) it did not while the optimizer's
element-wise steps sat in the GEMM's epilogue: the check's reduction and the
addition each read the GEMM's output (jax 0.11.2; the step took as long as
with a whole-generation check, ``benchmarks/RESULTS.md``, session 25). With
the check, a barrier now holds the estimate apart from the optimizer there,
as it does after the library's own kernels, and the optimizer, the check and
the addition compile to one fusion: for SGD on one bf16 (8192, 8192) layer
the update moves 544 MiB instead of 672, and 288 without the check (its
step in the GEMM's epilogue; ``benchmarks/offline_es_passes.py``, session 26).
Timed on an H100 (session 28, rank 1, bf16, device time): 0.466-0.468 ms
with the check against 0.510-0.511 before the barrier, and 0.376 without
the check.
The optimizer state's check reads every state leaf once more and the select
that keeps the old state is a pass of its own (Adam: its moments). Without
the check, XLA adds SGD's step to the parameters in the GEMM's epilogue (the
gradient is never stored): that layer's bf16 generation took 0.357 ms against
0.454 ms with the check on an H200 (session 25). ``check_finite=False``
leaves the check out, as optax does: the estimate is still finite by
construction (shaped fitness and noise are bounded), so with finite
parameters and optimizer state and no weight decay, SGD and Adam give finite
updates unless the learning rate times the estimate overflows; nothing else
is guaranteed, and ``dropped_count`` stays 0.

Non-finite fitness
------------------
``nonfinite="worst"`` (default): NaN and +-inf are replaced by the worst
finite fitness of the generation (after orientation), so those individuals
rank last (tied with the worst finite one) and never put a NaN into the
parameters; if no fitness is finite the generation's gradient is zero.
``nonfinite="skip"``: a generation with any non-finite fitness makes no
update at all (updates are zero and the inner optimizer's state is kept).
Either way, ``state.nonfinite_count`` counts the replaced values.

Weight decay
------------
``weight_decay * params`` is added to the gradient handed to the inner
optimizer (an L2 penalty on the minimised loss, so it is scaled by the
optimizer, as in ``torch.optim.SGD``). For decoupled decay use
``optax.adamw`` as the inner optimizer.

State
-----
:class:`EvolutionStrategyState` is a NamedTuple of arrays (the generation,
the key's raw data, the inner optimizer state and three counters), so it can
be jitted, sharded, saved and restored bit for bit. ``rescaled_count`` and
``dropped_count`` were added after the first release; a state (or checkpoint
template) built without them (``None``) is accepted by ``update``, which
starts them at zero. The seeds of a
generation are a pure function of ``(key, generation)``: ``ask`` changes
nothing, ``update`` recomputes the same seeds and advances the generation.

Example:
  >>> import jax, jax.numpy as jnp, optax
  >>> es = evolution_strategy(0.1, optax.sgd(0.05), pop_size=64)
  >>> def sphere(params):
  ...   return -jnp.sum(params["x"] ** 2)
  >>> @jax.jit
  ... def step(params, state):
  ...   seeds, state = es.ask(state)
  ...   population = jax.vmap(es.perturb, in_axes=(None, 0, 0))(params, *es.individuals(seeds))
  ...   fitness = jax.vmap(sphere)(population)
  ...   updates, state = es.update(fitness, state, params)
  ...   return optax.apply_updates(params, updates), state
  >>> params = {"x": jnp.full(3, 2.0)}
  >>> state = es.init(params)
  >>> for _ in range(30):
  ...   params, state = step(params, state)
  >>> bool(sphere(params) > -0.1)  # from -12.0
  True

References:
  Salimans et al., "Evolution Strategies as a Scalable Alternative to
  Reinforcement Learning", 2017 (centered ranks, antithetic sampling,
  shared seeds).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxnoise import noise as noise_lib
from jaxnoise.nn import population as population_lib
from jaxnoise.ops import _common
from jaxnoise.ops.virtual_noise import config as vn_config

__all__ = [
    "FITNESS_SHAPINGS",
    "NONFINITE_POLICIES",
    "EvolutionStrategy",
    "EvolutionStrategyState",
    "bound_raw_fitness",
    "centered_rank",
    "evolution_strategy",
    "replace_nonfinite",
    "shape_fitness",
    "z_score",
]

FITNESS_SHAPINGS = ("centered_rank", "z_score", "raw")
NONFINITE_POLICIES = ("worst", "skip")
# Raw fitness is bounded so that |gradient entry| <= _GRADIENT_BOUND: with
# |noise| < _NOISE_BOUND, |sum_i f_i s_i n_i / (pop sigma)| <= max|f| * 8 / sigma.
_GRADIENT_BOUND = 2.0**40
_NOISE_BOUND = 8.0
# z-score divides by max|f| first above this (the sum and the squares stay finite).
_Z_SCORE_PRESCALE = 2.0**50
# centered_rank counts comparisons up to this population (one fused reduction of pop**2
# comparisons) and sorts above it; both give the same bits. On an H200 at pop 1024 the
# sort, its scans and its scatter were three kernels and ~16 us of a 0.48 ms ES step
# (benchmarks/RESULTS.md, session 14); on a 2-core CPU counting took 1.1 ms against
# 0.37 ms for the sort at pop 1024, and 14 ms against 0.37 ms at 2048.
_COUNTED_RANKS_MAX_POP = 1024


class EvolutionStrategyState(NamedTuple):
  """State of :class:`EvolutionStrategy` (a pytree of arrays)."""

  generation: jax.Array  # () int32: generations completed (indexes the seeds).
  key_data: jax.Array  # raw uint32 data of the jax.random key (e.g. (2,) for threefry).
  inner_state: optax.OptState  # the inner optimizer's state.
  nonfinite_count: jax.Array  # () int32: non-finite fitness values seen so far.
  # () int32: generations whose raw fitness was scaled down to keep the gradient bounded.
  rescaled_count: jax.Array | None = None
  # () int32: generations dropped because their updates or optimizer state were not finite.
  dropped_count: jax.Array | None = None


# ----------------------------------------------------------------------------
# Fitness shaping.


def centered_rank(fitness: jax.Array) -> jax.Array:
  """Ranks mapped to ``[-0.5, 0.5]``; ties share their average rank.

  Args:
    fitness: ``(pop,)`` finite fitness (larger is better).

  Returns:
    ``(pop,)`` float32: ``rank / (pop - 1) - 0.5`` (zeros for ``pop == 1``).

  Example:
    >>> import jax.numpy as jnp
    >>> centered_rank(jnp.array([3.0, 1.0, 2.0, 2.0])).tolist()
    [0.5, -0.5, 0.0, 0.0]
  """
  fitness = jnp.asarray(fitness, jnp.float32)
  pop = fitness.shape[0]
  if pop == 1:
    return jnp.zeros_like(fitness)
  if pop <= _COUNTED_RANKS_MAX_POP:
    average_rank = _average_ranks_by_counting(fitness)
  else:
    average_rank = _average_ranks_by_sorting(fitness)
  # Sealed: the product is never fused into the subtraction in one program and not another.
  return _common.sealed(average_rank / jnp.float32(pop - 1)) - 0.5


def _average_ranks_by_counting(fitness: jax.Array) -> jax.Array:
  """Average ranks (ties share theirs) from ``pop**2`` comparisons: one fused reduction.

  Rank ``less + (equal - 1) / 2``, with ``less`` the members below and
  ``equal`` the members equal (itself included): the mean of the tie run's
  first and last sorted positions, as :func:`_average_ranks_by_sorting` gives
  it, bit for bit (integers below ``2**24``, halved).
  """
  below = jnp.sum(fitness[None, :] < fitness[:, None], axis=1, dtype=jnp.int32)
  equal = jnp.sum(fitness[None, :] == fitness[:, None], axis=1, dtype=jnp.int32)
  return (2 * below + equal - 1).astype(jnp.float32) / 2.0


def _average_ranks_by_sorting(fitness: jax.Array) -> jax.Array:
  """Average ranks (ties share theirs) from one sort: ``O(pop log pop)``."""
  pop = fitness.shape[0]
  # One sort carrying the positions, then each tie run's first and last sorted position by
  # a max / min scan; the average rank goes back to its individual by one scatter. (Two
  # jnp.searchsorted calls cost ~0.1 ms on an H200 at pop 1024, mostly in tiny copies of
  # their while loops: session 8, benchmarks/probe_es_step.py.)
  position = jax.lax.iota(jnp.int32, pop)
  ordered, order = jax.lax.sort((fitness, position), num_keys=1)
  differs = ordered[1:] != ordered[:-1]
  run_starts = jnp.concatenate([jnp.ones((1,), bool), differs])
  run_ends = jnp.concatenate([differs, jnp.ones((1,), bool)])
  first = jax.lax.cummax(jnp.where(run_starts, position, 0))
  last = jax.lax.cummin(jnp.where(run_ends, position, pop), reverse=True)
  return jnp.zeros((pop,), jnp.float32).at[order].set(
      (first + last).astype(jnp.float32) / 2.0, unique_indices=True, mode="promise_in_bounds")


def z_score(fitness: jax.Array) -> jax.Array:
  """``(f - mean) / std``; zeros when all values are equal.

  Example:
    >>> import jax.numpy as jnp
    >>> z_score(jnp.array([1.0, 3.0])).tolist()
    [-1.0, 1.0]
  """
  fitness = jnp.asarray(fitness, jnp.float32)
  # Scale-invariant; dividing huge values first keeps the mean and squares finite.
  # (A power of two, by ldexp: XLA divides through a reciprocal, which
  # flushes to zero for divisors near the float32 maximum.)
  largest = jnp.max(jnp.abs(fitness))
  _, exponent = jnp.frexp(largest)
  fitness = jnp.where(largest > _Z_SCORE_PRESCALE, jnp.ldexp(fitness, -exponent), fitness)
  centred = fitness - _common.sealed(jnp.mean(fitness))  # see centered_rank
  std = jnp.sqrt(jnp.mean(centred * centred))
  return jnp.where(std > 0, centred / jnp.where(std > 0, std, 1.0), 0.0)


def shape_fitness(fitness: jax.Array, method: str) -> jax.Array:
  """Apply ``"centered_rank"``, ``"z_score"`` or ``"raw"`` shaping (float32 out)."""
  if method == "centered_rank":
    return centered_rank(fitness)
  if method == "z_score":
    return z_score(fitness)
  if method == "raw":
    return jnp.asarray(fitness, jnp.float32)
  raise ValueError(f"fitness_shaping must be one of {FITNESS_SHAPINGS}, got {method!r}")


def bound_raw_fitness(fitness: jax.Array, sigma: float | jax.Array) -> tuple[jax.Array, jax.Array]:
  """Scale fitness down so that the ES gradient estimate stays below ``2**40``.

  Args:
    fitness: ``(pop,)`` finite float32 fitness (raw shaping).
    sigma: the perturbation standard deviation.

  Returns:
    ``(fitness, rescaled)``: ``fitness`` unchanged when ``max|f| <= limit =
    2**37 * sigma``, else ``fitness * 2**-e * limit`` with ``2**e`` the power
    of two just above ``max|f|`` (so ``max|f|`` lands in ``[limit / 2,
    limit)``); and an int32 0 / 1 flag (1 when it was scaled down).

  Example:
    >>> import jax.numpy as jnp
    >>> bounded, rescaled = bound_raw_fitness(jnp.array([2.0**100, -2.0**99]), 1.0)
    >>> bounded.tolist(), int(rescaled)
    ([68719476736.0, -34359738368.0], 1)
  """
  fitness = jnp.asarray(fitness, jnp.float32)
  limit = jnp.float32(_GRADIENT_BOUND / _NOISE_BOUND) * jnp.asarray(sigma, jnp.float32)
  largest = jnp.max(jnp.abs(fitness))
  over = largest > limit
  # ldexp by a power of two, not a division: XLA divides through a reciprocal,
  # which flushes to zero for divisors near the float32 maximum.
  _, exponent = jnp.frexp(largest)
  return (jnp.where(over, jnp.ldexp(fitness, -exponent) * limit, fitness),
          over.astype(jnp.int32))


def _seal(value: jax.Array) -> jax.Array:
  """:func:`jaxnoise.ops._common.sealed` for floating leaves; others unchanged."""
  if jnp.issubdtype(value.dtype, jnp.floating):
    return _common.sealed(value)
  return value


def _inexact(leaf: Any) -> bool:
  """Whether ``leaf`` is an array of floating (or complex) values: a leaf the check reads."""
  return hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.inexact)


def _all_finite(tree: Any) -> jax.Array:
  """True when every floating leaf of ``tree`` is finite (True for no such leaf)."""
  flags = [jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree) if _inexact(leaf)]
  return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def _zero_nonfinite(value: jax.Array) -> jax.Array:
  """``value`` with its NaN and +-inf entries replaced by zeros (non-floating leaves as they are)."""
  if _inexact(value):
    return jnp.where(jnp.isfinite(value), value, jnp.zeros_like(value))
  return value


def replace_nonfinite(fitness: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Replace NaN / +-inf by the worst (smallest) finite value.

  Args:
    fitness: ``(pop,)`` oriented fitness (larger is better).

  Returns:
    ``(fitness, count)``: the repaired fitness (all zeros if nothing is
    finite) and the int32 number of replaced values.

  Example:
    >>> import jax.numpy as jnp
    >>> fixed, count = replace_nonfinite(jnp.array([1.0, jnp.nan, 3.0, jnp.inf]))
    >>> fixed.tolist(), int(count)
    ([1.0, 1.0, 3.0, 1.0], 2)
  """
  fitness = jnp.asarray(fitness, jnp.float32)
  finite = jnp.isfinite(fitness)
  worst = jnp.min(jnp.where(finite, fitness, jnp.inf))
  worst = jnp.where(jnp.isfinite(worst), worst, 0.0)
  return jnp.where(finite, fitness, worst), jnp.sum(~finite).astype(jnp.int32)


# ----------------------------------------------------------------------------
# The transform.


@dataclasses.dataclass(frozen=True)
class EvolutionStrategy:
  """Virtual-noise ES chained with an optax optimizer (see the module docstring).

  Build it with :func:`evolution_strategy`. ``params`` arguments are a
  pytree of arrays or an ``nnx`` model; for a model, the parameters are
  ``nnx.state(model, wrt)`` with linear kernels in the ``(out, in)`` noise
  view (:func:`jaxnoise.nn.population.parameter_layout`), and ``updates``
  match that state (``nnx.update(model, optax.apply_updates(nnx.state(model,
  wrt), updates))``).

  Attributes:
    sigma: perturbation standard deviation.
    optimizer: the inner optax optimizer.
    pop_size: population size.
    antithetic: antithetic pairs.
    fitness_shaping: one of :data:`FITNESS_SHAPINGS`.
    maximize: larger fitness is better.
    weight_decay: coefficient of the L2 term added to the gradient.
    nonfinite: one of :data:`NONFINITE_POLICIES`.
    kind: noise kind.
    implementation: op implementation.
    config: None, a kernel config or a tuple of them (at most one per type):
      :meth:`evaluate` and :meth:`gradient` each hand every op the config of
      its type (``config_for_op`` in :mod:`jaxnoise.ops.virtual_noise.config`).
    wrt: ``nnx`` filter of a model's ES parameters.
    layout: explicit :class:`~jaxnoise.nn.population.ParameterLayout` (e.g.
      of an ``nnx.State``), or None to derive it from ``params``.
    seed: integer seed of the default key.
    rank: None (full rank), or the rank of the low-rank noise of the
      matrices (linear kernels of a model, 2-D leaves of a pytree).
    check_finite: drop (and count) a generation whose new optimizer state is
      not finite, and zero (and count) non-finite update entries; False skips
      the check.
  """

  sigma: float
  optimizer: optax.GradientTransformation
  pop_size: int
  antithetic: bool = True
  fitness_shaping: str = "centered_rank"
  maximize: bool = True
  weight_decay: float = 0.0
  nonfinite: str = "worst"
  kind: str = noise_lib.DEFAULT_KIND
  implementation: str = "auto"
  config: Any = None
  wrt: Any = nnx.Param
  layout: population_lib.ParameterLayout | None = None
  seed: int = 0
  rank: int | None = None
  check_finite: bool = True

  # -- parameters ---------------------------------------------------------

  def _params(self, params):
    if isinstance(params, nnx.Module):
      return nnx.state(params, self.wrt)
    return params

  def _layout(self, params):
    if self.layout is not None:
      return self.layout
    if isinstance(params, nnx.Module):
      return population_lib.parameter_layout(params, wrt=self.wrt, rank=self.rank)
    return population_lib.parameter_layout(params, rank=self.rank)

  # -- API ----------------------------------------------------------------

  def init(self, params: Any, key: jax.Array | None = None) -> EvolutionStrategyState:
    """Initial state: generation 0, the key, the inner optimizer's state.

    Args:
      params: pytree of arrays or ``nnx`` model.
      key: ``jax.random`` key (default ``jax.random.key(self.seed)``).

    Returns:
      :class:`EvolutionStrategyState`.
    """
    if key is None:
      key = jax.random.key(self.seed)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
      key = jax.random.wrap_key_data(key)
    return EvolutionStrategyState(
        generation=jnp.zeros((), jnp.int32),
        key_data=jax.random.key_data(key),
        inner_state=self.optimizer.init(self._params(params)),
        nonfinite_count=jnp.zeros((), jnp.int32),
        rescaled_count=jnp.zeros((), jnp.int32),
        dropped_count=jnp.zeros((), jnp.int32),
    )

  def seeds(self, state: EvolutionStrategyState) -> jax.Array:
    """The ``(pop,)`` uint32 seeds of the current generation (pairs share a seed)."""
    key = jax.random.fold_in(jax.random.wrap_key_data(state.key_data), state.generation)
    return noise_lib.draw_seeds(key, self.pop_size, antithetic=self.antithetic)

  def ask(self, state: EvolutionStrategyState) -> tuple[jax.Array, EvolutionStrategyState]:
    """The generation's seeds; the state is returned unchanged (seeds are a function of it)."""
    return self.seeds(state), state

  def individuals(self, seeds: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``(seed, sign)`` per individual, to vmap a per-individual evaluation over.

    With antithetic pairs, individual ``2m + 1`` uses ``seeds[2m]`` and sign
    ``-1``.
    """
    seeds = noise_lib.as_seeds(seeds)
    return (noise_lib.pair_seeds(seeds, self.antithetic),
            noise_lib.antithetic_signs(seeds.shape[0], self.antithetic))

  def perturb(self, params: Any, seed: Any, sign: float | jax.Array = 1.0) -> Any:
    """One individual's parameters (materialised), with this ES's noise and layout.

    Use it under ``jax.vmap(..., )(*es.individuals(seeds))`` for pytree models.
    """
    return population_lib.perturb_params(self._params(params), seed, self.sigma,
                                         layout=self._layout(params), sign=sign,
                                         kind=self.kind)

  def evaluate(self, model: nnx.Module, seeds: jax.Array, fn: Callable[..., Any],
               *args: Any) -> Any:
    """:func:`~jaxnoise.nn.population.population_apply` with this ES's settings."""
    return population_lib.population_apply(
        model, seeds, self.sigma, fn, *args, kind=self.kind, antithetic=self.antithetic,
        implementation=self.implementation, config=self.config, wrt=self.wrt, rank=self.rank)

  def gradient(self, fitness: jax.Array, seeds: jax.Array, params: Any) -> Any:
    """The ES ascent direction from shaped fitness (no optimizer, no decay)."""
    return population_lib.fitness_gradient(
        self._params(params), fitness, seeds, self.sigma, kind=self.kind,
        antithetic=self.antithetic, implementation=self.implementation, config=self.config,
        layout=self._layout(params))

  def shape(self, fitness: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Orient, repair non-finite values and shape: ``(shaped, nonfinite count)``."""
    fitness = _common.check_float_array(fitness, "fitness", (1,))
    if fitness.shape != (self.pop_size,):
      raise ValueError(f"fitness must have shape ({self.pop_size},) (pop_size), got "
                       f"{_common.describe(fitness)}")
    oriented = fitness.astype(jnp.float32)
    if not self.maximize:
      oriented = -oriented
    repaired, count = replace_nonfinite(oriented)
    return shape_fitness(repaired, self.fitness_shaping), count

  def _loss_gradient(self, ascent: jax.Array, param: jax.Array) -> jax.Array:
    """``-ascent + weight_decay * param`` (non-float leaves: zero, no decay)."""
    if not jnp.issubdtype(param.dtype, jnp.floating):
      return jnp.zeros_like(ascent)
    if not self.weight_decay:
      return -ascent
    decayed = -ascent.astype(jnp.float32) + jnp.float32(self.weight_decay) * param.astype(
        jnp.float32)
    return decayed.astype(param.dtype)

  def _estimate_by_xla_gemm(self) -> bool:
    """Whether the low-rank estimate is XLA's GEMM (``LowRankGradientConfig(xla_gemm=True)``).

    Its bits already depend on the program (the GEMM's algorithm follows its
    shape), so no seal holds it apart from the optimizer and the parameters'
    addition, and a barrier only with the finiteness check: without the
    check, XLA adds an element-wise optimizer's update (SGD) to the
    parameters in the GEMM's epilogue (nothing else reads the updates), and
    the gradient is never stored.
    """
    config = vn_config.config_for_op(self.config, vn_config.LowRankGradientConfig)
    return self.rank is not None and config is not None and config.xla_gemm

  def update(self, fitness: jax.Array, state: EvolutionStrategyState,
             params: Any) -> tuple[Any, EvolutionStrategyState]:
    """Updates for the generation's fitness; advances the generation.

    Args:
      fitness: ``(pop,)`` fitness of the individuals of ``ask(state)``'s seeds.
      state: the state ``ask`` was called with.
      params: the current parameters (pytree or ``nnx`` model).

    Returns:
      ``(updates, new_state)``; add the updates with ``optax.apply_updates``.
    """
    seeds = self.seeds(state)
    # Barriers here and in apply_gradient keep XLA from fusing shaping, estimate
    # and optimizer into one another, so each stage's float arithmetic is the
    # same however the estimate is formed (one device or parameter shards,
    # jaxnoise.parallel.sharded_update): the two agree bit for bit.
    shaped, count, rescaled = jax.lax.optimization_barrier(self.shape_and_bound(fitness))
    ascent = self.gradient(shaped, seeds, params)
    return self.apply_gradient(ascent, count, state, params, rescaled)

  def shape_and_bound(self, fitness: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """:meth:`shape`, then the ``"raw"`` bound: ``(shaped, nonfinite count, rescaled count)``."""
    shaped, count = self.shape(fitness)
    rescaled = jnp.zeros((), jnp.int32)
    if self.fitness_shaping == "raw":
      shaped, rescaled = bound_raw_fitness(shaped, self.sigma)
    # Sealed (an addition), so the gradient's first subtraction sees the same bits in
    # any program (jaxnoise.parallel.sharded_update and update agree bit for bit).
    return _common.sealed(shaped), count, rescaled

  def apply_gradient(self, ascent: Any, nonfinite_count: jax.Array, state: EvolutionStrategyState,
                     params: Any, rescaled_count: jax.Array | None = None
                     ) -> tuple[Any, EvolutionStrategyState]:
    """The second half of :meth:`update`: decay, the inner optimizer, the skip policy.

    :func:`jaxnoise.parallel.sharded_update` forms ``ascent`` on parameter
    shards and finishes here.

    Args:
      ascent: :meth:`gradient` of the shaped fitness (a tree like the parameters).
      nonfinite_count: the count :meth:`shape` returned.
      state: the state ``ask`` was called with.
      params: the current parameters (pytree or ``nnx`` model).
      rescaled_count: the rescaled count :meth:`shape_and_bound` returned
        (None: 0).

    Returns:
      ``(updates, new_state)``, as :meth:`update`.
    """
    param_tree = self._params(params)
    count = nonfinite_count
    rescaled = jnp.zeros((), jnp.int32) if rescaled_count is None else rescaled_count
    fixed_order = not self._estimate_by_xla_gemm()
    # After XLA's GEMM with the check, the barrier is for speed: without it XLA adds the
    # optimizer's element-wise steps to the GEMM's epilogue, then the check's reduction and
    # the parameters' addition each read its output (two passes over the layer). Held
    # apart, the optimizer, the check and the addition are one multi-output fusion
    # (XLA of jax 0.11.2, compiled for an H200: benchmarks/offline_es_passes.py).
    if fixed_order or self.check_finite:
      ascent = jax.lax.optimization_barrier(ascent)
    loss_gradient = jax.tree.map(self._loss_gradient, ascent, param_tree)
    updates, inner_state = self.optimizer.update(loss_gradient, state.inner_state, param_tree)
    # The library owns this state: a non-finite optimizer state drops the whole
    # generation, a non-finite update entry is zeroed; either is counted, neither applied.
    # The entries' check is a reduction beside the parameters' addition, not before it,
    # so XLA forms both in one pass over the updates (with the barrier above after XLA's
    # GEMM: benchmarks/RESULTS.md, session 26).
    if self.check_finite:
      state_dropped = ~_all_finite(inner_state)
      dropped = state_dropped | ~_all_finite(updates)
      updates = jax.tree.map(_zero_nonfinite, updates)
    else:
      state_dropped = dropped = jnp.zeros((), bool)
    skip = state_dropped | (count > 0) if self.nonfinite == "skip" else state_dropped
    # Sealed (an addition): optax.apply_updates' ``params + updates`` cannot absorb the
    # optimizer's last product as a fused multiply-add in one program and not another.
    # (Not after XLA's GEMM: the seal's second use of the update would keep XLA from
    # adding it to the parameters in the GEMM's epilogue.)
    updates = jax.tree.map(
        lambda u: jnp.where(skip, jnp.zeros_like(u), u), updates)
    if fixed_order:
      updates = jax.tree.map(_seal, updates)
    if self.check_finite or self.nonfinite == "skip":
      inner_state = jax.tree.map(lambda new, old: jnp.where(skip, old, new), inner_state,
                                 state.inner_state)
    zero = jnp.zeros((), jnp.int32)
    rescaled_total = zero if state.rescaled_count is None else state.rescaled_count
    if self.fitness_shaping == "raw":  # otherwise nothing is rescaled: no addition of a zero
      rescaled_total = rescaled_total + rescaled  # (which XLA, past the barrier, would run)
    new_state = EvolutionStrategyState(
        generation=state.generation + 1,
        key_data=state.key_data,
        inner_state=inner_state,
        nonfinite_count=state.nonfinite_count + count,
        rescaled_count=rescaled_total,
        dropped_count=(zero if state.dropped_count is None else state.dropped_count)
        + dropped.astype(jnp.int32),
    )
    return updates, new_state


def evolution_strategy(
    sigma: float,
    optimizer: optax.GradientTransformation,
    *,
    pop_size: int,
    antithetic: bool = True,
    fitness_shaping: str = "centered_rank",
    maximize: bool = True,
    weight_decay: float = 0.0,
    nonfinite: str = "worst",
    check_finite: bool = True,
    kind: str = noise_lib.DEFAULT_KIND,
    implementation: str = "auto",
    config: Any = None,
    wrt: Any = nnx.Param,
    layout: population_lib.ParameterLayout | None = None,
    seed: int = 0,
    rank: int | None = None,
) -> EvolutionStrategy:
  """An ES transform that feeds its virtual-noise gradient to ``optimizer``.

  Args:
    sigma: positive perturbation standard deviation (a Python float).
    optimizer: any optax ``GradientTransformation`` (e.g. ``optax.adam(1e-2)``).
    pop_size: population size (even with ``antithetic``).
    antithetic: antithetic pairs (individuals ``2m``, ``2m+1`` share a seed).
    fitness_shaping: ``"centered_rank"``, ``"z_score"`` or ``"raw"``.
    maximize: True if larger fitness is better, False for a loss.
    weight_decay: L2 coefficient added to the gradient (>= 0).
    nonfinite: ``"worst"`` or ``"skip"`` (see the module docstring).
    check_finite: drop and count a generation whose new optimizer state
      holds a NaN or inf, and zero and count the updates' NaN and inf entries
      (default). False leaves the check and its passes over the updates and
      state out (see "Finite updates" in the module docstring).
    kind: noise kind.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
    config: None, a kernel config or a tuple of them, at most one per type,
      e.g. ``(LowRankLinearConfig(...), LowRankGradientConfig(xla_gemm=True))``:
      the forward and the estimate each take the one of their type.
    wrt: ``nnx`` filter of a model's ES parameters.
    layout: explicit parameter layout, or None to derive it from ``params``.
    seed: integer seed of the default key.
    rank: None (full-rank noise), or a positive int: every linear kernel of a
      model (every 2-D leaf of a pytree) is perturbed by ``A_i B_i^T /
      sqrt(rank)``, which needs ``rank * (out + in)`` noise values per
      individual instead of ``out * in``; other leaves stay full rank.

  Returns:
    An :class:`EvolutionStrategy`.

  Example:
    >>> import optax
    >>> es = evolution_strategy(0.02, optax.adam(1e-2), pop_size=256)
    >>> es.pop_size, es.antithetic
    (256, True)
  """
  sigma = _common.check_sigma(sigma)
  pop_size = _common.check_positive_int(pop_size, "pop_size")
  if antithetic and pop_size % 2:
    raise ValueError(f"antithetic=True needs an even pop_size, got {pop_size}")
  if not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
    raise TypeError(f"optimizer must be an optax GradientTransformation, got "
                    f"{type(optimizer).__name__}")
  if fitness_shaping not in FITNESS_SHAPINGS:
    raise ValueError(f"fitness_shaping must be one of {FITNESS_SHAPINGS}, got "
                     f"{fitness_shaping!r}")
  if nonfinite not in NONFINITE_POLICIES:
    raise ValueError(f"nonfinite must be one of {NONFINITE_POLICIES}, got {nonfinite!r}")
  if not isinstance(check_finite, bool):
    raise TypeError(f"check_finite must be a bool, got {type(check_finite).__name__} "
                    f"{check_finite!r}")
  weight_decay = float(weight_decay)
  if not weight_decay >= 0:
    raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
  if implementation not in _common.IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {_common.IMPLEMENTATIONS}, got "
                     f"{implementation!r}")
  if layout is not None and not isinstance(layout, population_lib.ParameterLayout):
    raise TypeError(f"layout must be a ParameterLayout or None, got {type(layout).__name__}")
  vn_config.config_for_op(config, vn_config.LowRankGradientConfig)  # validates every entry
  if isinstance(config, list):
    config = tuple(config)  # hashable, as the transform is
  rank = noise_lib.check_rank(rank)
  if layout is not None and rank is not None and layout.rank != rank:
    raise ValueError(f"rank={rank} does not match the layout's rank={layout.rank}")
  return EvolutionStrategy(
      sigma=float(sigma), optimizer=optimizer, pop_size=pop_size, antithetic=bool(antithetic),
      fitness_shaping=fitness_shaping, maximize=bool(maximize), weight_decay=weight_decay,
      nonfinite=nonfinite, check_finite=bool(check_finite), kind=noise_lib.get_kind(kind).name,
      implementation=implementation, config=config, wrt=wrt,
      layout=layout, seed=int(seed), rank=rank)
