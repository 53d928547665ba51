"""Population sharding over a device mesh: only fitness scalars cross devices.

Each device evaluates its contiguous slice of the population's seeds (the
model is replicated; noise is regenerated locally from the seeds), then the
``(pop / n_devices,)`` fitness slices are all-gathered into the full
``(pop,)`` fitness on every device. That is the only communication: the ES
update that follows sees the same fitness, seeds, parameters and state on
every device and is the same computation as on one device.

Exactness: the update from a given fitness vector is the same program on
every device, so it is bit-exact. The fitness itself comes from evaluating
slices of the population instead of the whole; every individual's value is a
function of its own seed only, but XLA may compile the smaller batched
matmul with a different reduction order, so a sharded step equals the
single-device step to float rounding in the worst case (on CPU the tests
observe bit-exact results).

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

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common

__all__ = ["population_mesh", "sharded_fitness"]

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
  if not isinstance(mesh, Mesh):
    raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")
  if axis_name not in mesh.axis_names:
    raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh {mesh.axis_names}")
  seeds = noise_lib.as_seeds(seeds)
  pop = seeds.shape[0]
  n_shards = mesh.shape[axis_name]
  per_shard = pop // n_shards
  if pop % n_shards:
    raise ValueError(f"the population ({pop} seeds) must divide evenly over the "
                     f"{n_shards} devices of mesh axis {axis_name!r}")
  if antithetic and per_shard % 2:
    raise ValueError(f"antithetic pairs would be split: {pop} seeds over {n_shards} devices "
                     f"gives {per_shard} per device; it must be even")

  def local(local_seeds, *args):
    fitness = fitness_fn(local_seeds, *args)
    if getattr(fitness, "shape", None) != (per_shard,):
      raise ValueError(f"fitness_fn must return ({per_shard},) fitness for its slice of "
                       f"{per_shard} seeds, got {_common.describe(fitness)}")
    return jax.lax.all_gather(fitness, axis_name, tiled=True)

  shard_map, check_name = _shard_map()
  # The all_gather output is replicated by construction; the replication
  # check is off because Pallas kernels inside fitness_fn need not carry
  # varying-manual-axes types.
  sharded = shard_map(
      local, mesh=mesh,
      in_specs=(PartitionSpec(axis_name),) + (PartitionSpec(),) * len(replicated),
      out_specs=PartitionSpec(), **{check_name: False})
  return sharded(seeds, *replicated)
