"""Population sharding over a device mesh: only fitness scalars cross devices.

Each device evaluates its contiguous slice of the population's seeds (the
model is replicated; noise is regenerated locally from the seeds), then the
``(pop / n_devices,)`` fitness slices are all-gathered into the full
``(pop,)`` fitness on every device. That is the only communication: the ES
update that follows sees the same fitness, seeds, parameters and state on
every device and is the same computation as on one device.

The parameter-sharded update (:func:`sharded_update`) splits every leaf by
the rows of its noise view: each device regenerates every individual's noise
for its rows only and runs the optimizer on them, so no device repeats
another's work; with ``keep_sharded`` parameters and optimizer state stay
split between generations (FSDP style), and :func:`sharded_evaluate` evaluates
such a model without gathering it whole.

Exactness
---------
For a given fitness vector, :func:`sharded_update` returns the updates and
state of :meth:`EvolutionStrategy.update` on one device **bit for bit**, on
any number of devices and any row counts, by construction:

* A device forms its rows of a block with the one-device op and config, and
  every gradient element is a sum over the population in an order fixed by
  the block and the config, never by how many rows are formed: the
  reference adds the terms element by element in population order; the
  Pallas kernel does the same within each population share and adds the
  shares by a fixed tree; the low-rank contraction runs over whole row tiles
  at fixed positions, each summed in the same ``block_k`` steps
  (:class:`~jaxnoise.ops.virtual_noise.config.LowRankGradientConfig`). No
  XLA dot or reduce is on that path (their order follows the shape; on a GPU
  the GEMM algorithm is picked per shape). The scales are folded into the
  fitness weights, so a gradient ends with an addition.
* XLA fuses a product into the addition that consumes it (a fused
  multiply-add, one rounding) when both land in one fusion, which depends on
  the whole program. On a GPU the optimisation barriers of
  :meth:`EvolutionStrategy.update` (kept until after fusion) separate
  shaping, estimate and optimizer; the CPU backend removes barriers before
  fusing, so the values crossing those points (the shaped fitness, the
  updates) are sealed (:func:`jaxnoise.ops._common.sealed`: the same bits,
  ending with an addition).
* The inner optimizer works element by element on identical inputs (SGD,
  momentum, Adam, AdamW, ...). A transform that reduces over a whole leaf or
  tree (global-norm clipping) sums its shards in another order: equal to
  float rounding. So is ``LowRankGradientConfig(xla_gemm=True)`` (one XLA
  GEMM per chunk, with no seal after it, and a barrier only with the
  finiteness check, so that XLA may fuse the optimizer's step into its
  epilogue).

The fitness from :func:`sharded_fitness` comes from evaluating slices of the
population: every individual's value is a function of its own seed, but XLA
may compile the smaller batched forward with another reduction order, so a
fitness can differ in the last bit; centered ranks absorb that unless two
individuals are within a rounding of each other (the two-process test
compares the parameters of three whole generations bit for bit).

Costs: a device whose first row is not a multiple of ``block_rows`` (64)
also forms the rest of that low-rank tile (fewer than ``block_rows`` rows
more), and the low-rank contraction is a Pallas kernel, not cuBLAS.

Antithetic pairs stay on one device as long as each slice holds whole pairs
(``pop / n_devices`` even), which :func:`sharded_fitness` checks.

Example:
  >>> import jax, jax.numpy as jnp
  >>> mesh = population_mesh()
  >>> seeds = jnp.arange(8, dtype=jnp.uint32)
  >>> fitness = sharded_fitness(lambda s, w: (s * w).astype(jnp.float32), seeds,
  ...                           jnp.uint32(2), mesh=mesh)
  >>> fitness.tolist()
  [0.0, 2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec

from jaxnoise import noise as noise_lib
from jaxnoise.nn import population as population_lib
from jaxnoise.ops import _common
from jaxnoise.ops import autotune
from jaxnoise.ops.virtual_noise import api as ops
from jaxnoise.ops.virtual_noise import config as config_lib

__all__ = [
    "initialize_distributed",
    "parameter_shardings",
    "population_mesh",
    "shard_tree",
    "sharded_evaluate",
    "sharded_fitness",
    "sharded_gradient",
    "sharded_update",
    "state_shardings",
]

DEFAULT_AXIS_NAME = "population"


def _shard_map():
  """``jax.shard_map`` (jax >= 0.6), else the experimental one."""
  shard_map = getattr(jax, "shard_map", None)
  if shard_map is not None:
    return shard_map, "check_vma"
  from jax.experimental.shard_map import shard_map  # pylint: disable=g-import-not-at-top
  return shard_map, "check_rep"


def population_mesh(devices: Sequence[Any] | None = None,
                    axis_name: str = DEFAULT_AXIS_NAME) -> Mesh:
  """A 1-D mesh over ``devices`` (default: all) whose axis holds the population.

  Example:
    >>> population_mesh().axis_names
    ('population',)
  """
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("devices must not be empty")
  return Mesh(np.asarray(devices), (axis_name,))


def _check_mesh(mesh, axis_name):
  if not isinstance(mesh, Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}")
  return mesh.shape[axis_name]


def _population_slices(seeds, mesh, axis_name: str, antithetic: bool) -> tuple[jax.Array, int]:
  """Checked ``(seeds, members per device)``: whole slices, and whole pairs when antithetic."""
  n_shards = _check_mesh(mesh, axis_name)
  seeds = noise_lib.as_seeds(seeds)
  pop = seeds.shape[0]
  per_shard = pop // n_shards
  if pop % n_shards:
    raise ValueError(f"the population ({pop} seeds) must divide evenly over the "
                     f"{n_shards} devices of mesh axis {axis_name!r}")
  if antithetic and per_shard % 2:
    raise ValueError(f"antithetic pairs would be split: {pop} seeds over {n_shards} devices "
                     f"gives {per_shard} per device; it must be even")
  return seeds, per_shard


def _gathered_fitness(fitness, per_shard: int, axis_name: str, requirement: str) -> jax.Array:
  """A device's ``(per_shard,)`` fitness slice, all-gathered; else ``requirement``, got what."""
  if getattr(fitness, "shape", None) != (per_shard,):
    raise ValueError(f"{requirement}, got {_common.describe(fitness)}")
  return jax.lax.all_gather(fitness, axis_name, tiled=True)


def sharded_fitness(
    fitness_fn: Callable[..., jax.Array],
    seeds: jax.Array,
    *replicated: Any,
    mesh: Mesh,
    axis_name: str = DEFAULT_AXIS_NAME,
    antithetic: bool = False,
) -> jax.Array:
  """Evaluate a population sharded over ``mesh``; return the gathered fitness.

  ``fitness_fn(local_seeds, *replicated)`` runs on every device with that
  device's contiguous slice of ``seeds`` (``(pop / n,)`` seeds, ``n`` the size
  of ``axis_name``) and the replicated arguments (parameters, an ``nnx``
  state, data), and returns the slice's ``(pop / n,)`` fitness. The slices are
  all-gathered (the only communication) into the full ``(pop,)`` fitness,
  replicated on every device, in the order of ``seeds``.

  Args:
    fitness_fn: per-slice evaluation, e.g. ``lambda s, state:
      population_apply(nnx.merge(graphdef, state), s, sigma, loss)``.
    seeds: ``(pop,)`` seeds; ``pop`` divisible by ``n`` (by ``2 n`` with
      ``antithetic``, so pairs stay together).
    *replicated: pytrees passed to every device whole.
    mesh: the device mesh.
    axis_name: the mesh axis that holds the population (other axes replicate).
    antithetic: check that every slice holds whole antithetic pairs.

  Returns:
    ``(pop,)`` fitness, replicated.
  """
  seeds, per_shard = _population_slices(seeds, mesh, axis_name, antithetic)

  def local(local_seeds, *args):
    return _gathered_fitness(fitness_fn(local_seeds, *args), per_shard, axis_name,
                             f"fitness_fn must return ({per_shard},) fitness for its slice of "
                             f"{per_shard} seeds")

  shard_map, check_name = _shard_map()
  # The all_gather output is replicated by construction; the replication
  # check is off because Pallas kernels inside fitness_fn need not carry
  # varying-manual-axes types.
  sharded = shard_map(
      local, mesh=mesh,
      in_specs=(PartitionSpec(axis_name),) + (PartitionSpec(),) * len(replicated),
      out_specs=PartitionSpec(), **{check_name: False})
  return sharded(seeds, *replicated)


# ----------------------------------------------------------------------------
# The parameter-sharded gradient estimate and update.
#
# Every leaf is split by the rows of its noise view (an ``(out, in)`` linear
# kernel by its ``out`` rows, any other leaf by its leading axis): with ``n``
# devices, device ``d`` owns rows ``[d k, min((d + 1) k, rows))``, ``k =
# ceil(rows / n)`` (the layout XLA gives an unevenly sharded axis). Rows
# ``[r0, r1)`` of a full-rank block at ``offset`` are the contiguous index
# range from ``offset + r0 * row_size``: a smaller block at another offset, so
# the gradient ops compute a shard directly, given the whole block's kernel
# config; a low-rank block's rows are asked of the op (``rows=``). Either way
# the shard is the corresponding rows, bit for bit (module docstring,
# "Exactness").


@dataclasses.dataclass(frozen=True)
class _LeafPlan:
  """How one leaf is split: ``axis`` of the stored leaf holds the noise rows."""

  block: population_lib.NoiseBlock
  axis: int | None  # None: not split (scalars, unperturbed or empty leaves)
  rows: int
  per_shard: int


def _leaf_plans(layout: population_lib.ParameterLayout, n_shards: int) -> list[_LeafPlan]:
  plans = []
  for block in layout.blocks:
    shape = block.noise_shape
    if block.offset is None or not shape or 0 in shape:
      plans.append(_LeafPlan(block, None, 0, 0))
      continue
    rows = shape[0]
    plans.append(_LeafPlan(block, 1 if block.transposed else 0, rows, -(-rows // n_shards)))
  return plans


def _spec(plan: _LeafPlan, ndim: int, axis_name: str, n_shards: int) -> PartitionSpec:
  """Where the leaf is stored: split by rows, or replicated when the rows do not divide.

  (A ``jax.Array`` needs shards of equal size; the gradient of an uneven leaf
  is still formed split, then gathered.)
  """
  if plan.axis is None or plan.rows % n_shards:
    return PartitionSpec()
  return PartitionSpec(*([None] * plan.axis + [axis_name] + [None] * (ndim - plan.axis - 1)))


def parameter_shardings(es, params: Any, mesh: Mesh, *,
                        axis_name: str = DEFAULT_AXIS_NAME) -> Any:
  """``NamedSharding`` per parameter: split by the rows of its noise view.

  A linear kernel stored ``(in, out)`` is split along ``out`` (axis 1), any
  other leaf along its leading axis; scalars, unperturbed leaves and leaves
  whose rows do not divide evenly over the mesh axis are replicated.

  Args:
    es: the :class:`~jaxnoise.optim.es.EvolutionStrategy` (its layout).
    params: the parameter tree (or ``nnx`` model) ``es`` updates.
    mesh: the device mesh.
    axis_name: the mesh axis to split over.

  Returns:
    A tree of ``NamedSharding`` like ``es``'s parameter tree.

  Example:
    >>> import jax.numpy as jnp, optax, jaxnoise
    >>> es = jaxnoise.optim.evolution_strategy(0.1, optax.sgd(0.1), pop_size=4)
    >>> params = {"w": jnp.zeros((4, 2)), "s": jnp.zeros(())}
    >>> shardings = parameter_shardings(es, params, population_mesh())
    >>> print(tuple(shardings["w"].spec), tuple(shardings["s"].spec))
    ('population', None) ()
  """
  n_shards = _check_mesh(mesh, axis_name)
  tree = es._params(params)  # pylint: disable=protected-access
  layout = es._layout(params)  # pylint: disable=protected-access
  leaves, treedef = population_lib._matched_leaves(layout, tree, "params")  # pylint: disable=protected-access
  shardings = [NamedSharding(mesh, _spec(plan, np.ndim(leaf), axis_name, n_shards))
               for plan, leaf in zip(_leaf_plans(layout, n_shards), leaves)]
  return jax.tree_util.tree_unflatten(treedef, shardings)


def state_shardings(state: Any, params: Any, shardings: Any, mesh: Mesh) -> Any:
  """Shardings for an ES / optax state: every subtree shaped like ``params`` is split like it.

  Optimizer states hold trees with the parameters' structure (Adam's ``mu``
  and ``nu``); those take ``shardings`` and every other leaf is replicated.

  Args:
    state: the state (e.g. :class:`~jaxnoise.optim.es.EvolutionStrategyState`).
    params: the parameter tree (not a model: ``nnx.state(model, wrt)``).
    shardings: :func:`parameter_shardings` of ``params``.
    mesh: the device mesh.

  Returns:
    A tree of ``NamedSharding`` like ``state``.
  """
  treedef = jax.tree_util.tree_structure(params)
  replicated = NamedSharding(mesh, PartitionSpec())

  def like_params(subtree):
    try:
      return jax.tree_util.tree_structure(subtree) == treedef
    except Exception:  # pylint: disable=broad-except
      return False

  def assign(subtree):
    if like_params(subtree):
      return shardings
    return jax.tree.map(lambda _: replicated, subtree)

  return jax.tree.map(assign, state, is_leaf=like_params)


def shard_tree(tree: Any, shardings: Any) -> Any:
  """``jax.device_put`` of ``tree`` with ``shardings`` (works across processes).

  Each process must hold the same full values (e.g. initialised from the same
  seed); every device keeps only its shard.
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)  # device to device, no host copy

  def put(value, sharding):
    value = np.asarray(value)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])
  return jax.tree.map(put, tree, shardings)


def _full_gradient_config(es, block_shape, offset, n_individuals, pop):
  """The kernel config the one-device gradient of this block uses (None: the reference).

  A config sets how the kernel splits the population; the reference has one
  order whatever the shape.
  """
  implementation = _common.resolve_implementation(es.implementation)
  if implementation == "reference":
    return None
  if es.config is not None:
    return es.config
  kind = noise_lib.get_kind(es.kind)
  key = config_lib.noise_gradient_key(implementation, pop, block_shape, kind, es.antithetic,
                                      offset)
  config = autotune.lookup(key[0], key)
  if config is None:
    config = config_lib.noise_gradient_heuristics(math.prod(block_shape), n_individuals,
                                                  kind)
  return config


def _row_block_gradient(es, plan: _LeafPlan, shaped, seeds, row0: int, n_rows: int, pop: int,
                        dtype):
  """Rows ``[row0, row0 + n_rows)`` of the leaf's gradient, in its noise view, in ``dtype``.

  The float32 rows rounded once, as on one device (a low-rank block's tiles round as they
  store, there and here).
  """
  if plan.block.rank is not None:
    return _low_rank_row_gradient(es, plan, shaped, seeds, row0, n_rows, pop, dtype)
  rest = plan.block.noise_shape[1:]
  row_size = math.prod(rest)
  # The 2-D (or 1-D) shape the one-device path hands the op, for the whole block and the shard.
  def op_shape(rows):
    return (rows * math.prod(rest[:-1]), rest[-1]) if rest else (rows,)
  n_individuals = pop // 2 if es.antithetic else pop
  setting = _full_gradient_config(es, op_shape(plan.rows), plan.block.offset, n_individuals, pop)
  grad = ops._gradient(  # pylint: disable=protected-access
      shaped, seeds, op_shape(n_rows), es.sigma, pop, plan.block.offset + row0 * row_size,
      noise_lib.get_kind(es.kind), es.antithetic, es.implementation, setting, out_dtype=dtype)
  return grad.reshape((n_rows,) + rest)


def _low_rank_row_gradient(es, plan: _LeafPlan, shaped, seeds, row0: int, n_rows: int, pop: int,
                           dtype):
  """Rows ``[row0, row0 + n_rows)`` of a low-rank block's gradient, by the one-device op.

  The op contracts the factors over whole row tiles at fixed positions
  (:func:`jaxnoise.ops.virtual_noise.pallas_triton_low_rank.tile_window`; the reference
  adds outer products element by element in order), so the shard is
  those rows of the one-device gradient, bit for bit.
  """
  config = es.config if isinstance(es.config, config_lib.LowRankGradientConfig) else None
  return ops._gradient(  # pylint: disable=protected-access
      shaped, seeds, plan.block.noise_shape, es.sigma, pop, plan.block.offset,
      noise_lib.get_kind(es.kind), es.antithetic, es.implementation, config,
      rank=plan.block.rank, rows=(row0, n_rows), out_dtype=dtype)


def sharded_gradient(es, shaped_fitness: jax.Array, seeds: jax.Array, params: Any, *,
                     mesh: Mesh, axis_name: str = DEFAULT_AXIS_NAME) -> Any:
  """:meth:`EvolutionStrategy.gradient` with each device forming only its rows.

  Inputs are replicated (``(pop,)`` fitness and seeds: no parameters are
  read). Each device regenerates every individual's noise for its rows of
  every leaf (see :func:`parameter_shardings`); nothing is communicated and
  no element is computed twice. The result is split like
  :func:`parameter_shardings` and equals the one-device gradient bit for bit.

  Args:
    es: the :class:`~jaxnoise.optim.es.EvolutionStrategy`.
    shaped_fitness: ``(pop,)`` shaped fitness (:meth:`EvolutionStrategy.shape`).
    seeds: ``(pop,)`` seeds of the generation.
    params: the parameter tree or ``nnx`` model (only its layout is used).
    mesh: the device mesh.
    axis_name: the mesh axis to split the rows over.

  Returns:
    The ascent direction, a tree like ``es``'s parameter tree.
  """
  n_shards = _check_mesh(mesh, axis_name)
  tree = es._params(params)  # pylint: disable=protected-access
  layout = es._layout(params)  # pylint: disable=protected-access
  leaves, treedef = population_lib._matched_leaves(layout, tree, "params")  # pylint: disable=protected-access
  plans = _leaf_plans(layout, n_shards)
  seeds = noise_lib.as_seeds(seeds)
  pop = seeds.shape[0]
  split = [p for p in plans if p.axis is not None]

  # Each shard's rows in the leaf's dtype (a low-rank block's tiles round as they store).
  split_dtypes = [population_lib.gradient_dtype(leaf) for plan, leaf in zip(plans, leaves)
                  if plan.axis is not None]

  def device_blocks(device, fitness, seeds):
    blocks = []
    for plan, dtype in zip(split, split_dtypes):
      view = plan.block.noise_shape
      row0 = device * plan.per_shard
      n_rows = max(0, min(plan.per_shard, plan.rows - row0))
      grad = (_row_block_gradient(es, plan, fitness, seeds, row0, n_rows, pop, dtype) if n_rows
              else jnp.zeros((0,) + view[1:], dtype))
      pad = plan.per_shard - n_rows  # the last shards of an uneven split are short
      blocks.append(jnp.pad(grad, [(0, pad)] + [(0, 0)] * (len(view) - 1)))
    return blocks

  def local(fitness, seeds):
    branches = [lambda f, s, d=d: device_blocks(d, f, s) for d in range(n_shards)]
    index = jax.lax.axis_index(axis_name)
    return tuple(jax.lax.switch(index, branches, fitness, seeds))

  shard_map, check_name = _shard_map()
  sharded = shard_map(local, mesh=mesh, in_specs=(PartitionSpec(), PartitionSpec()),
                      out_specs=tuple(PartitionSpec(axis_name) for _ in split),
                      **{check_name: False})
  padded = iter(sharded(jnp.asarray(shaped_fitness, jnp.float32), seeds) if split else ())
  grads = []
  for plan, leaf in zip(plans, leaves):
    dtype = getattr(leaf, "dtype", jnp.float32)
    if plan.axis is None:
      if plan.block.offset is None or 0 in plan.block.shape:
        grads.append(jnp.zeros(np.shape(leaf), dtype))
      else:  # a perturbed scalar: every device forms it (one value)
        grads.append(population_lib._leaf_gradient(  # pylint: disable=protected-access
            plan.block, shaped_fitness, seeds, es.sigma, pop, es.kind, es.antithetic,
            es.implementation, es.config, population_lib.gradient_dtype(leaf)).astype(dtype))
      continue
    grad = next(padded)[:plan.rows]
    if plan.block.transposed:
      grad = grad.T
    grad = jax.lax.with_sharding_constraint(
        grad.astype(dtype), NamedSharding(mesh, _spec(plan, grad.ndim, axis_name, n_shards)))
    grads.append(grad)
  return jax.tree_util.tree_unflatten(treedef, grads)


def sharded_update(es, fitness: jax.Array, state: Any, params: Any, *, mesh: Mesh,
                   axis_name: str = DEFAULT_AXIS_NAME,
                   keep_sharded: bool = False) -> tuple[Any, Any]:
  """:meth:`EvolutionStrategy.update` with the estimate and the optimizer on parameter shards.

  Call it under ``jax.jit``. The fitness (already gathered, e.g. by
  :func:`sharded_fitness`) is shaped on every device (``pop`` floats); then
  :func:`sharded_gradient` forms each device's rows and the inner optimizer
  runs on them, so no device repeats another's work. With ``keep_sharded``
  the updates and the optimizer state stay split like
  :func:`parameter_shardings` (FSDP style: put the parameters and state on
  the mesh with :func:`shard_tree` once; each device then holds ``1/n`` of
  the optimizer state). Otherwise the updates are all-gathered (``O(params)``
  communication) and the state replicated.

  Exactness: for a given fitness vector the updates and state equal
  :meth:`EvolutionStrategy.update` on one device bit for bit, on any number
  of devices, as long as the inner optimizer works element by element (SGD,
  Adam, ...); see the module docstring ("Exactness") for why and for the
  exceptions (global-norm clipping, ``xla_gemm=True``).

  Args:
    es: the :class:`~jaxnoise.optim.es.EvolutionStrategy`.
    fitness: ``(pop,)`` fitness of ``es.ask(state)``'s seeds.
    state: the ES state.
    params: the current parameters (pytree, ``nnx.State`` or ``nnx`` model).
    mesh: the device mesh.
    axis_name: the mesh axis the rows are split over.
    keep_sharded: keep the updates and optimizer state split (see above).

  Returns:
    ``(updates, new_state)`` as :meth:`EvolutionStrategy.update`.
  """
  tree = es._params(params)  # pylint: disable=protected-access
  seeds = es.seeds(state)
  shaped, count, rescaled = jax.lax.optimization_barrier(es.shape_and_bound(fitness))  # as in es.update
  ascent = sharded_gradient(es, shaped, seeds, params, mesh=mesh, axis_name=axis_name)
  split = parameter_shardings(es, params, mesh, axis_name=axis_name)
  updates, new_state = es.apply_gradient(ascent, count, state, params, rescaled)
  if keep_sharded:
    out = split
  else:
    out = jax.tree.map(lambda _: NamedSharding(mesh, PartitionSpec()), split)
  updates = jax.lax.with_sharding_constraint(updates, out)
  new_state = jax.lax.with_sharding_constraint(new_state,
                                               state_shardings(new_state, tree, out, mesh))
  return updates, new_state


# ----------------------------------------------------------------------------
# Evaluation with the parameters kept sharded (FSDP).


def _gather_just_in_time(shard, layer_input, *, axis: int, axis_name: str):
  """The whole kernel from this device's ``shard``, gathered once ``layer_input`` exists.

  The barrier makes the gather depend on the layer's input, so it cannot be
  scheduled before the previous layer ran: one gathered kernel is live at a
  time, not all of them.
  """
  shard, _ = jax.lax.optimization_barrier((shard, layer_input))
  return jax.lax.all_gather(shard, axis_name, axis=axis, tiled=True)


def sharded_evaluate(es, model: nnx.Module, seeds: jax.Array, fn: Callable[..., Any],
                     *args: Any, mesh: Mesh, axis_name: str = DEFAULT_AXIS_NAME) -> jax.Array:
  """:meth:`EvolutionStrategy.evaluate` with the population and the parameters sharded.

  The FSDP counterpart of :func:`sharded_fitness`: ``model``'s parameters
  stay split like :func:`parameter_shardings` (``sharded_update(...,
  keep_sharded=True)`` keeps them so). Each device evaluates its slice of the
  population; every fused linear layer (``nnx.Linear`` / ``VirtualLinear``)
  all-gathers its kernel just before it runs (the gather waits for the
  layer's input), so a device holds its shards plus about one layer's whole
  kernel at a time, and a model that fits only when sharded can be
  evaluated. Other split leaves (biases, norms, embeddings, unfused layers)
  are gathered whole at the start; replicated leaves are read as they are.
  The ``(pop / n,)`` fitness slices are all-gathered, as in
  :func:`sharded_fitness`.

  The gathered kernel is the one :func:`sharded_fitness` would see, so the
  fitness equals :func:`sharded_fitness` with the parameters replicated.
  Like ``population_apply``'s fused layers, ``fn`` must not read a linear
  layer's kernel directly (here it would see zeros).

  Args:
    es: the :class:`~jaxnoise.optim.es.EvolutionStrategy` (sigma, kind,
      antithetic, rank, implementation, config, wrt).
    model: the ``nnx`` model; its ``es.wrt`` state split like
      :func:`parameter_shardings` (or replicated), the rest replicated.
    seeds: ``(pop,)`` seeds (``es.ask``); ``pop`` divisible by ``n`` (by ``2 n``
      with antithetic pairs).
    fn: ``fn(member, *args) -> (pop,)``-able scalar fitness of one member.
    *args: replicated arguments of ``fn`` (data).
    mesh: the device mesh.
    axis_name: the mesh axis that holds the population and the shards.

  Returns:
    ``(pop,)`` fitness, replicated.

  Example:
    >>> import jax, jax.numpy as jnp, optax, jaxnoise
    >>> from flax import nnx
    >>> model = nnx.Sequential(nnx.Linear(3, 8, rngs=nnx.Rngs(0)), nnx.relu,
    ...                        nnx.Linear(8, 2, rngs=nnx.Rngs(1)))
    >>> es = jaxnoise.optim.evolution_strategy(0.05, optax.adam(1e-3), pop_size=8)
    >>> mesh = population_mesh()
    >>> params = nnx.state(model, nnx.Param)
    >>> nnx.update(model, shard_tree(params, parameter_shardings(es, model, mesh)))
    >>> seeds, _ = es.ask(es.init(model))
    >>> fitness = sharded_evaluate(es, model, seeds, lambda m, x: -jnp.sum(m(x) ** 2),
    ...                            jnp.ones((4, 3)), mesh=mesh)
    >>> fitness.shape
    (8,)
  """
  n_shards = _check_mesh(mesh, axis_name)
  if not isinstance(model, nnx.Module):
    raise TypeError(f"model must be an nnx.Module, got {type(model).__name__}")
  if not callable(fn):
    raise TypeError(f"fn must be callable, got {type(fn).__name__}")
  seeds, per_shard = _population_slices(seeds, mesh, axis_name, es.antithetic)
  layout = es._layout(model)  # pylint: disable=protected-access
  graphdef, params, rest = nnx.split(model, es.wrt, ...)
  leaves, treedef = population_lib._matched_leaves(layout, params, "params")  # pylint: disable=protected-access
  plans = _leaf_plans(layout, n_shards)
  specs = [_spec(plan, np.ndim(leaf), axis_name, n_shards) for plan, leaf in zip(plans, leaves)]
  fused_kernels = {l.module_path + ("kernel",) for l in layout.linears if l.fusable}
  kind = noise_lib.get_kind(es.kind)
  implementation = _common.resolve_implementation(es.implementation)
  sigma = _common.check_sigma(es.sigma)

  def local(local_seeds, local_leaves, rest, *args):
    full, gather_kernels = [], {}
    for plan, spec, leaf in zip(plans, specs, local_leaves):
      if spec == PartitionSpec():
        full.append(leaf)
      elif plan.block.path in fused_kernels:
        full.append(jnp.zeros(plan.block.shape, leaf.dtype))  # never read: see gather_kernels
        gather_kernels[plan.block.path[:-1]] = functools.partial(
            _gather_just_in_time, leaf, axis=plan.axis, axis_name=axis_name)
      else:
        full.append(jax.lax.all_gather(leaf, axis_name, axis=plan.axis, tiled=True))
    fitness = population_lib.apply_split(
        graphdef, jax.tree_util.tree_unflatten(treedef, full), rest, layout, local_seeds, sigma,
        fn, args, kind=kind, antithetic=es.antithetic, implementation=implementation,
        config=es.config, fuse_linear=True, gather_kernels=gather_kernels)
    return _gathered_fitness(fitness, per_shard, axis_name,
                             f"fn must return a scalar fitness per member ({per_shard},)")

  shard_map, check_name = _shard_map()
  sharded = shard_map(
      local, mesh=mesh,
      in_specs=(PartitionSpec(axis_name), specs, PartitionSpec())
      + (PartitionSpec(),) * len(args),
      out_specs=PartitionSpec(), **{check_name: False})
  return sharded(seeds, list(leaves), rest, *args)


# ----------------------------------------------------------------------------
# Several processes.


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None,
                           process_id: int | None = None, **kwargs: Any) -> None:
  """``jax.distributed.initialize`` for one process per device, any number of hosts.

  Call it first, before any other JAX call, with the same code in every
  process; then :func:`population_mesh` spans every process's devices and
  :func:`sharded_fitness` / :func:`sharded_update` run unchanged. Arguments
  left None come from ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
  ``JAX_PROCESS_ID`` when set, else from JAX's cluster detection (SLURM,
  Open MPI, ...). On the CPU backend, collectives across processes use gloo.

  Args:
    coordinator_address: ``host:port`` of process 0.
    num_processes: the number of processes.
    process_id: this process's index.
    **kwargs: passed on (e.g. ``local_device_ids``).
  """
  env = os.environ
  if coordinator_address is None:
    coordinator_address = env.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None and env.get("JAX_NUM_PROCESSES"):
    num_processes = int(env["JAX_NUM_PROCESSES"])
  if process_id is None and env.get("JAX_PROCESS_ID"):
    process_id = int(env["JAX_PROCESS_ID"])
  if "cpu" in env.get("JAX_PLATFORMS", "cpu").split(","):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address, num_processes, process_id, **kwargs)
