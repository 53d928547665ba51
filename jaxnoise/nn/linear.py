"""``VirtualLinear``: a drop-in ``nnx.Linear`` that can be evaluated for a population.

``VirtualLinear`` *is* an ``nnx.Linear`` (same constructor, parameters,
``(in, out)`` kernel and plain call), plus:

* :meth:`VirtualLinear.population`: the layer for a whole population of
  perturbed kernels, one :func:`jaxnoise.virtual_perturbed_linear` call;
* :meth:`VirtualLinear.individual`: one individual (``jax.vmap`` over seeds is
  one op call, see :mod:`jaxnoise.batching`);
* inside :func:`jaxnoise.nn.population.population_apply` its ordinary call
  (and that of every plain ``nnx.Linear``) becomes the fused population op.

Noise layout: the kernel is stored ``(in, out)`` like ``nnx.Linear``, but its
noise uses the indices of the ``(out, in)`` view (SPEC section 1): kernel
element ``[k, j]`` has index ``offset + j * in + k`` and bias element ``j``
has index ``offset + out * in + j``. The op is called with ``kernel.T``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any

import jax
from flax import nnx

from jaxnoise import batching
from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common

__all__ = ["VirtualLinear"]

# Name of the static attribute population_apply sets on the linear layers of
# its private model copy. Static attributes live in the graphdef, so the mark
# survives nnx.split / nnx.merge inside the user's function (nnx.remat,
# nnx.jit, ...), where object identity would not.
FUSED_KEY_ATTRIBUTE = "_jaxnoise_fused_key"


@dataclasses.dataclass(frozen=True)
class FusedLinearNoise:
  """How one linear layer is perturbed inside ``population_apply``.

  ``seed``, ``sign`` and ``sigma`` are the current individual's (traced)
  values; the rest is static.
  """

  seed: jax.Array
  sign: jax.Array
  sigma: jax.Array
  offset: int
  kind: noise_lib.NoiseKind
  antithetic: bool
  implementation: str
  config: Any
  perturb_bias: bool
  rank: int | None = None
  # Given the layer's input, the layer's whole kernel (``(in, out)``), formed
  # just before the call (:func:`jaxnoise.parallel.sharded_evaluate` gathers
  # a kernel kept in shards here); None: the layer's own kernel.
  gather_kernel: Any = None


_ACTIVE = threading.local()


@contextlib.contextmanager
def fused_noise_scope(registry: dict):
  """Make ``registry`` (``{fused key: FusedLinearNoise}``) visible to layer calls."""
  stack = getattr(_ACTIVE, "stack", None)
  if stack is None:
    stack = _ACTIVE.stack = []
  stack.append(registry)
  try:
    yield
  finally:
    stack.pop()


def _active_noise(module) -> FusedLinearNoise | None:
  key = getattr(module, FUSED_KEY_ATTRIBUTE, None)
  if key is None:
    return None
  for registry in reversed(getattr(_ACTIVE, "stack", ())):
    if key in registry:
      return registry[key]
  return None


def _promoted(layer: nnx.Linear, inputs):
  kernel = layer.kernel[...]
  bias = layer.bias[...] if layer.bias is not None else None
  return layer.promote_dtype((inputs, kernel, bias), dtype=layer.dtype)


class VirtualLinear(nnx.Linear):
  """A linear layer (``y = x @ kernel + bias``) with virtual-noise population calls.

  Construct it exactly like ``nnx.Linear``::

      VirtualLinear(in_features, out_features, *, use_bias=True, dtype=None,
                    param_dtype=jnp.float32, kernel_init=..., bias_init=..., rngs)

  Called normally it is ``nnx.Linear``. Inside
  :func:`jaxnoise.nn.population.population_apply` the call is the fused op
  (the population's ``x`` shared for the first layer, per individual after);
  the fused op accumulates in float32 and ignores ``precision`` and
  ``dot_general``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> from flax import nnx
    >>> layer = VirtualLinear(8, 4, rngs=nnx.Rngs(0))
    >>> layer(jnp.ones((3, 8))).shape
    (3, 4)
    >>> seeds = jnp.arange(6, dtype=jnp.uint32)
    >>> layer.population(jnp.ones((3, 8)), seeds, 0.1).shape
    (6, 3, 4)
  """

  def __call__(self, inputs: jax.Array, *args, **kwargs) -> jax.Array:
    if not jax.numpy.shape(inputs)[-1:] == (self.in_features,):
      raise ValueError(f"inputs' last dimension must be in_features={self.in_features}, got "
                       f"{_common.describe(inputs)}")
    noise = _active_noise(self)
    if noise is None:
      return super().__call__(inputs, *args, **kwargs)
    return self._fused_call(inputs, noise)

  def _fused_call(self, inputs, noise: FusedLinearNoise) -> jax.Array:
    if noise.gather_kernel is None:
      inputs, kernel, bias = _promoted(self, inputs)
    else:
      bias = self.bias[...] if self.bias is not None else None
      inputs, kernel, bias = self.promote_dtype((inputs, noise.gather_kernel(inputs), bias),
                                                dtype=self.dtype)
    fused_bias = bias if noise.perturb_bias else None
    common = dict(kind=noise.kind, implementation=noise.implementation, config=noise.config,
                  out_dtype=inputs.dtype, rank=noise.rank)
    if noise.antithetic:
      y = batching.antithetic_member_linear(inputs, kernel.T, fused_bias, noise.seed,
                                            noise.sign, noise.sigma, noise.offset, **common)
    else:
      y = batching.perturbed_linear(inputs, kernel.T, fused_bias, noise.seed, noise.sigma,
                                    noise.offset, **common)
    if bias is not None and not noise.perturb_bias:
      y = y + bias
    return y

  def population(
      self,
      inputs: jax.Array,
      seeds: jax.Array,
      sigma: float | jax.Array,
      offset: int = 0,
      *,
      per_individual_inputs: bool = False,
      kind: str = noise_lib.DEFAULT_KIND,
      antithetic: bool = False,
      implementation: str = "auto",
      config: Any = None,
      rank: int | None = None,
  ) -> jax.Array:
    """The layer for every individual: ``x @ (kernel + sigma N_i^T) + (bias + sigma nb_i)``.

    One :func:`jaxnoise.virtual_perturbed_linear` call with ``kernel.T``;
    differentiable with respect to ``inputs``, the kernel and the bias (the
    backward pass regenerates the noise).

    Args:
      inputs: ``(*lead, in)`` shared by the population, or ``(pop, *lead, in)``
        with ``per_individual_inputs=True``.
      seeds: ``(pop,)`` seeds.
      sigma: perturbation standard deviation.
      offset: element index of the ``(out, in)`` view's element ``[0, 0]``.
      per_individual_inputs: ``inputs`` has a leading population axis.
      kind: noise kind.
      antithetic: antithetic pairs (see :func:`jaxnoise.virtual_perturbed_linear`).
      implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
      config: hashable kernel config or None.
      rank: None (full-rank noise) or a positive int: ``N_i = A_i B_i^T /
        sqrt(rank)`` (see :func:`jaxnoise.virtual_perturbed_linear`).

    Returns:
      ``(pop, *lead, out)``.
    """
    seeds = noise_lib.as_seeds(seeds)
    inputs, kernel, bias = _promoted(self, inputs)
    inputs, weight, bias = batching._check_linear_args(  # pylint: disable=protected-access
        inputs, kernel.T, bias, x_leading=int(per_individual_inputs))
    if per_individual_inputs and inputs.shape[0] != seeds.shape[0]:
      raise ValueError(f"per-individual inputs need a leading axis of pop={seeds.shape[0]}, "
                       f"got {_common.describe(inputs)}")
    if antithetic and seeds.shape[0] % 2:
      raise ValueError(f"antithetic=True needs an even population, got seeds {seeds.shape}")
    spec = batching._linear_spec(  # pylint: disable=protected-access
        offset, kind, antithetic, not per_individual_inputs, implementation, config,
        inputs.dtype, rank)
    return batching._population_linear(spec)(  # pylint: disable=protected-access
        inputs, weight, bias, seeds, _common.check_sigma(sigma))

  def individual(
      self,
      inputs: jax.Array,
      seed: Any,
      sigma: float | jax.Array,
      offset: int = 0,
      *,
      kind: str = noise_lib.DEFAULT_KIND,
      implementation: str = "auto",
      config: Any = None,
      rank: int | None = None,
  ) -> jax.Array:
    """The layer for one individual; ``jax.vmap`` over seeds is one op call.

    Args:
      inputs: ``(*lead, in)``.
      seed: the individual's integer seed (scalar).
      sigma: perturbation standard deviation.
      offset: element index of the ``(out, in)`` view's element ``[0, 0]``.
      kind: noise kind.
      implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
      config: hashable kernel config or None.
      rank: None (full-rank noise) or a positive int (low-rank noise).

    Returns:
      ``(*lead, out)``.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> from flax import nnx
      >>> layer = VirtualLinear(8, 4, rngs=nnx.Rngs(0))
      >>> seeds = jnp.arange(6, dtype=jnp.uint32)
      >>> jax.vmap(lambda s: layer.individual(jnp.ones((3, 8)), s, 0.1))(seeds).shape
      (6, 3, 4)
    """
    inputs, kernel, bias = _promoted(self, inputs)
    return batching.perturbed_linear(inputs, kernel.T, bias, seed, sigma, offset, kind=kind,
                                     implementation=implementation, config=config,
                                     out_dtype=inputs.dtype, rank=rank)
