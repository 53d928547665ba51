"""An optax-style optimizer for ternary counter state.

:func:`ternary_counter` returns a :class:`TernaryCounter` ``(init, update)``
pair, like an ``optax.GradientTransformation``, with one difference forced
by the state: counters are not additive, so ``update`` returns the *new
parameters* instead of additive updates::

    optimizer = ternary_counter(0.05)
    opt_state = optimizer.init(params)
    params, opt_state = optimizer.update(grads, opt_state, params)

Shapes:

* ``params``: any pytree whose ternary nodes are
  :class:`~jaxnoise.ops.ternary.TernaryParams` ``(packed, scale, v, C)``
  (e.g. ``jaxnoise.nn.ternary.get_ternary_params(model)``,
  ``{path: TernaryParams}``); every node is updated.
* ``grads``: the same structure with, at each ternary node, either a
  :class:`~jaxnoise.ops.ternary.TernaryGrad` ``(x (M, in), grad_out (M, out))``,
  a dense ``(out, in)`` weight gradient, or ``None`` (node left unchanged).
* state: :class:`TernaryCounterState` ``(count, skipped_rows)``, two int32
  scalars (a pytree: checkpoint it with the parameters; resuming is
  bit-exact because every step's rounding seed is a pure function of
  ``(seed, count, node index)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxnoise import noise as noise_lib
from jaxnoise.ops.ternary import api as ternary_ops
from jaxnoise.ops.ternary.api import TernaryGrad, TernaryParams

__all__ = [
    "TernaryCounter",
    "TernaryCounterState",
    "TernaryGrad",
    "TernaryParams",
    "step_seed",
    "ternary_counter",
]

_GRADIENT_MODES = ("dense", "io")


class TernaryCounterState(NamedTuple):
  """State of :func:`ternary_counter`.

  Attributes:
    count: ``()`` int32, updates applied so far (feeds the rounding seed and
      the learning-rate schedule).
    skipped_rows: ``()`` int32, total rows left unchanged because their
      gradient was not finite (see :func:`jaxnoise.ops.ternary.counter_update`).
  """

  count: jax.Array
  skipped_rows: jax.Array


class TernaryCounter(NamedTuple):
  """``init(params) -> state`` and ``update(grads, state, params) -> (params, state)``."""

  init: Callable[[Any], TernaryCounterState]
  update: Callable[[Any, TernaryCounterState, Any], tuple[Any, TernaryCounterState]]


def step_seed(seed: int, count: jax.Array, node_index: int) -> jax.Array:
  """The uint32 rounding seed of ternary node ``node_index`` at step ``count``.

  ``mix32(seed ^ mix32(count * 0x9E3779B9 + node_index * 0x85EBCA6B))``: every
  step and every layer gets its own stream of the shared hash.

  Example:
    >>> import jax.numpy as jnp
    >>> bool(step_seed(0, jnp.int32(1), 0) != step_seed(0, jnp.int32(2), 0))
    True
  """
  count = jnp.asarray(count).astype(jnp.uint32)
  inner = noise_lib.mix32(count * jnp.uint32(0x9E3779B9)
                          + jnp.uint32((node_index * 0x85EBCA6B) & 0xFFFFFFFF))
  return noise_lib.mix32(jnp.uint32(seed & 0xFFFFFFFF) ^ inner)


def _is_ternary(node: Any) -> bool:
  return isinstance(node, TernaryParams)


def ternary_counter(
    learning_rate: float | optax.Schedule,
    *,
    lr_scale: float | optax.Schedule = 1e-3,
    rms_beta: float = 0.99,
    rms_eps: float = 1e-8,
    lagged: bool = False,
    seed: int = 0,
    gradient: str = "dense",
    implementation: str = "auto",
) -> TernaryCounter:
  """The ternary counter update (SPEC section 3) as an optax-style optimizer.

  Each step applies :func:`jaxnoise.ops.ternary.counter_update` (dense
  gradient) or :func:`~jaxnoise.ops.ternary.counter_update_from_io` to every
  ternary node, with the rounding seed ``step_seed(seed, count, node_index)``
  so each step (and layer) rounds differently.

  Args:
    learning_rate: latent step ``lr`` per RMS-normalised gradient, or an
      ``optax`` schedule of the step count.
    lr_scale: step of the row scales (float or schedule).
    rms_beta: RMS decay in ``[0, 1]``.
    rms_eps: positive floor of the RMS denominator.
    lagged: denominator from the previous step's ``v``.
    seed: base seed (Python int).
    gradient: for :class:`TernaryGrad` nodes, ``"dense"`` forms
      ``grad_out^T x`` with an XLA GEMM and runs the fused update (fastest);
      ``"io"`` hands ``(x, grad_out)`` to the update-from-IO kernel (no dense
      gradient in memory).
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``
      (kernel tilings are the per-shape heuristic defaults).

  Returns:
    :class:`TernaryCounter` ``(init, update)``.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxnoise.ops.ternary import ternary_init
    >>> packed, scale = ternary_init(jnp.ones((3, 8)), C=4)
    >>> params = {"layer": TernaryParams(packed, scale, jnp.zeros(3), C=4)}
    >>> optimizer = ternary_counter(0.1)
    >>> state = optimizer.init(params)
    >>> params, state = optimizer.update({"layer": jnp.ones((3, 8))}, state, params)
    >>> int(state.count), params["layer"].packed.shape
    (1, (3, 6))
  """
  if gradient not in _GRADIENT_MODES:
    raise ValueError(f"gradient must be one of {_GRADIENT_MODES}, got {gradient!r}")
  if isinstance(seed, bool) or not isinstance(seed, int):
    raise TypeError(f"seed must be a Python int, got {type(seed).__name__}")

  def schedule(value, count):
    return value(count) if callable(value) else value

  def init(params: Any) -> TernaryCounterState:
    nodes = jax.tree.leaves(params, is_leaf=_is_ternary)
    for node in nodes:
      if not _is_ternary(node):
        raise TypeError(
            f"ternary_counter params must hold only TernaryParams nodes, found a "
            f"{type(node).__name__}; split float parameters off for an optax optimizer")
    return TernaryCounterState(count=jnp.zeros((), jnp.int32),
                               skipped_rows=jnp.zeros((), jnp.int32))

  def update(grads: Any, state: TernaryCounterState, params: Any):
    nodes, treedef = jax.tree.flatten(params, is_leaf=_is_ternary)
    try:
      node_grads = treedef.flatten_up_to(grads)
    except (ValueError, TypeError) as error:
      raise ValueError(
          f"grads must have the structure of params (one gradient or None per TernaryParams "
          f"node): {error}") from None
    lr = schedule(learning_rate, state.count)
    scale_lr = schedule(lr_scale, state.count)
    new_nodes, skipped = [], state.skipped_rows
    for index, (node, grad) in enumerate(zip(nodes, node_grads)):
      if not _is_ternary(node):
        raise TypeError(f"params node {index} is a {type(node).__name__}, not TernaryParams")
      if grad is None:
        new_nodes.append(node)
        continue
      kwargs = dict(C=node.C, lr=lr, lr_scale=scale_lr, rms_beta=rms_beta, rms_eps=rms_eps,
                    seed=step_seed(seed, state.count, index), lagged=lagged,
                    implementation=implementation, donate=False)
      if isinstance(grad, TernaryGrad) and gradient == "io":
        result = ternary_ops.counter_update_from_io(node.packed, node.scale, node.v, grad.x,
                                                    grad.grad_out, **kwargs)
      else:
        if isinstance(grad, TernaryGrad):
          grad = jnp.einsum("mo,mi->oi", grad.grad_out, grad.x,
                            preferred_element_type=jnp.float32)
        result = ternary_ops.counter_update(node.packed, node.scale, node.v, grad, **kwargs)
      new_nodes.append(TernaryParams(result.packed, result.scale, result.v, C=node.C))
      skipped = skipped + result.skipped_rows
    new_state = TernaryCounterState(count=optax.safe_int32_increment(state.count),
                                    skipped_rows=skipped)
    return jax.tree.unflatten(treedef, new_nodes), new_state

  return TernaryCounter(init, update)
