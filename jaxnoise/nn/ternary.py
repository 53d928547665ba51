"""Flax nnx ternary layer: packed 6-bit counters, trained by counter updates.

:class:`TernaryLinear` keeps its state in three :class:`TernaryState`
variables (filter them with ``nnx.state(model, TernaryCodes)`` and friends):

* :class:`TernaryCodes`: ``(out, 3 * in // 4)`` uint8 packed counters;
* :class:`TernaryScale`: ``(out,)`` float32 row scale;
* :class:`TernaryRMS`: ``(out,)`` float32 RMS state ``v`` of the update;

and an optional ``nnx.Param`` bias (train it with any optax optimizer). The
forward pass is :func:`jaxnoise.ops.ternary.ternary_matmul`, which reads the
packed codes directly (0.75 byte per weight).

Training: the counter update needs each layer's weight gradient
``grad_out^T x``. :func:`ternary_value_and_grad` works like
``nnx.value_and_grad`` and also returns, for every :class:`TernaryLinear`,
a :class:`~jaxnoise.ops.ternary.TernaryGrad` ``(x, grad_out)``: the layer's
input and the gradient of its output (captured with a zero "probe" added to
the output, so no dense ``(out, in)`` array is formed). Feed those to
:func:`jaxnoise.optim.ternary.ternary_counter`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from jaxnoise.ops import _common
from jaxnoise.ops.ternary import api as ternary_ops

__all__ = [
    "DEFAULT_C",
    "TernaryCodes",
    "TernaryLinear",
    "TernaryRMS",
    "TernaryScale",
    "TernaryState",
    "get_ternary_params",
    "set_ternary_params",
    "ternary_value_and_grad",
]

DEFAULT_C = 11


class TernaryState(nnx.Variable):
  """Base of the ternary counter state (``nnx.state(model, TernaryState)`` selects all)."""


class TernaryCodes(TernaryState):
  """Packed 6-bit counters, ``(out, 3 * in // 4)`` uint8 (0.75 byte per weight)."""


class TernaryScale(TernaryState):
  """Per-row (output unit) scale, ``(out,)`` float32; weight = scale * t."""


class TernaryRMS(TernaryState):
  """RMS state ``v`` of the counter update, ``(out,)`` float32."""


# ----------------------------------------------------------------------------
# Capture of (x, grad_out) for ternary_value_and_grad.

_ACTIVE_CAPTURE: list["_Capture"] = []


class _Capture:
  """Records each registered layer's inputs and adds its output probes."""

  def __init__(self, keys: dict[int, str], probes: dict[str, list[jax.Array]] | None):
    self.keys = keys
    self.probes = probes
    self.inputs: dict[str, list[jax.Array]] = {key: [] for key in keys.values()}
    self.templates: dict[str, list[jax.Array]] = {key: [] for key in keys.values()}

  def __call__(self, layer: "TernaryLinear", x: jax.Array, y: jax.Array) -> jax.Array:
    key = self.keys.get(id(layer))
    if key is None:
      raise RuntimeError(
          "a TernaryLinear ran inside ternary_value_and_grad but is not part of the model "
          "passed to it (nnx transforms such as nnx.scan/nnx.vmap inside the loss copy "
          "layers and are not supported there); its weight gradient cannot be captured")
    call = len(self.inputs[key])
    self.inputs[key].append(x.reshape(-1, x.shape[-1]))
    if self.probes is None:
      self.templates[key].append(jnp.zeros(y.shape, y.dtype))
      return y
    probes = self.probes[key]
    if call >= len(probes) or probes[call].shape != y.shape:
      raise RuntimeError(
          f"TernaryLinear {key!r} was called differently in the shape pass and the gradient "
          "pass of ternary_value_and_grad (the loss must be a deterministic function of its "
          "inputs' shapes)")
    return y + probes[call]

  @contextlib.contextmanager
  def active(self):
    _ACTIVE_CAPTURE.append(self)
    try:
      yield self
    finally:
      _ACTIVE_CAPTURE.pop()


def _capture_output(layer: "TernaryLinear", x: jax.Array, y: jax.Array) -> jax.Array:
  if not _ACTIVE_CAPTURE:
    return y
  return _ACTIVE_CAPTURE[-1](layer, x, y)


def _path_key(path: tuple) -> str:
  return "/".join(str(part) for part in path)


def _ternary_layers(model: Any) -> dict[str, "TernaryLinear"]:
  """``{path: layer}`` of every :class:`TernaryLinear` in ``model``'s graph."""
  return {_path_key(path): node for path, node in nnx.iter_graph(model)
          if isinstance(node, TernaryLinear)}


# ----------------------------------------------------------------------------
# The layer.


class TernaryLinear(nnx.Module):
  """A linear layer with ternary weights stored as packed 6-bit counters.

  ``y = x @ (scale[:, None] * t)^T + bias`` where ``t`` in {-1, 0, +1} is the
  bucket of each weight's counter (SPEC section 3). Initialised from a float
  ``kernel_init`` draw by absmean ternarisation
  (:func:`jaxnoise.ops.ternary.ternary_init`); the RMS state starts at zero.

  Args:
    in_features: input size (a multiple of 4: codes pack 4 per 3 bytes).
    out_features: output size.
    C: counter half-width in ``1..11`` (``2C - 1`` counter steps per ternary
      value; the default uses all 63 codes of 6 bits).
    use_bias: add an ``nnx.Param`` bias.
    dtype: computation dtype of ``x`` (None: ``x``'s own dtype).
    kernel_init: float initialiser of the ``(in, out)`` kernel that is
      ternarised (Flax layout, so fan-in is ``in``).
    bias_init: bias initialiser.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or
      ``"reference"`` for the matmul and the init.
    rngs: ``nnx.Rngs`` with a ``params`` stream.

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> layer = TernaryLinear(8, 3, rngs=nnx.Rngs(0))
    >>> layer(jnp.ones((2, 8))).shape
    (2, 3)
    >>> codes = nnx.state(layer, TernaryCodes)
    >>> codes['codes'].get_value().shape, codes['codes'].get_value().dtype
    ((3, 6), dtype('uint8'))
  """

  def __init__(
      self,
      in_features: int,
      out_features: int,
      *,
      C: int = DEFAULT_C,
      use_bias: bool = True,
      dtype: Any = None,
      kernel_init: Callable = nnx.initializers.lecun_normal(),
      bias_init: Callable = nnx.initializers.zeros_init(),
      implementation: str = "auto",
      rngs: nnx.Rngs,
  ):
    in_features = _common.check_positive_int(in_features, "in_features")
    out_features = _common.check_positive_int(out_features, "out_features")
    if in_features % 4:
      raise ValueError(
          f"in_features must be a multiple of 4 (4 codes pack into 3 bytes), got {in_features}")
    self.in_features = in_features
    self.out_features = out_features
    self.C = ternary_ops.check_C(C)
    self.use_bias = bool(use_bias)
    self.dtype = dtype
    self.implementation = implementation
    kernel = kernel_init(rngs.params(), (in_features, out_features), jnp.float32)
    packed, scale = ternary_ops.ternary_init(kernel.T, self.C, implementation=implementation)
    self.codes = TernaryCodes(packed)
    self.scale = TernaryScale(scale)
    self.rms = TernaryRMS(jnp.zeros((out_features,), jnp.float32))
    if self.use_bias:
      self.bias = nnx.Param(bias_init(rngs.params(), (out_features,), jnp.float32))
    else:
      self.bias = None

  def __call__(self, x: jax.Array) -> jax.Array:
    """Apply the layer to ``(..., in)`` inputs; returns ``(..., out)``."""
    if self.dtype is not None:
      x = x.astype(self.dtype)
    y = ternary_ops.ternary_matmul(x, self.codes.get_value(), self.scale.get_value(), C=self.C,
                                   implementation=self.implementation)
    y = _capture_output(self, x, y)
    if self.bias is not None:
      y = y + self.bias.get_value().astype(y.dtype)
    return y

  def weight(self, dtype: Any = jnp.float32) -> jax.Array:
    """The dense ``(out, in)`` weight ``scale * t`` (for inspection and export)."""
    return ternary_ops.ternary_decode(self.codes.get_value(), self.scale.get_value(), C=self.C,
                                      dtype=dtype,
                                      implementation=self.implementation)


# ----------------------------------------------------------------------------
# State access and gradients.


def get_ternary_params(model: Any) -> dict[str, ternary_ops.TernaryParams]:
  """The counter state of every :class:`TernaryLinear` in ``model``.

  Args:
    model: an nnx module (graph).

  Returns:
    ``{path: TernaryParams(packed, scale, v, C)}`` keyed by the layer's path
    in the graph (``"layers/0"``), the pytree the ternary optimizer updates.

  Example:
    >>> from flax import nnx
    >>> params = get_ternary_params(TernaryLinear(8, 3, rngs=nnx.Rngs(0)))
    >>> list(params), params[''].packed.shape
    ([''], (3, 6))
  """
  return {key: ternary_ops.TernaryParams(layer.codes.get_value(), layer.scale.get_value(),
                                         layer.rms.get_value(), C=layer.C)
          for key, layer in _ternary_layers(model).items()}


def set_ternary_params(model: Any, params: dict[str, ternary_ops.TernaryParams]) -> None:
  """Write counter states (as from :func:`get_ternary_params`) back into ``model``.

  Args:
    model: the nnx module the states came from.
    params: ``{path: TernaryParams}``; every key must name a
      :class:`TernaryLinear` of ``model`` with matching shapes and ``C``.
  """
  layers = _ternary_layers(model)
  for key, state in params.items():
    if key not in layers:
      raise KeyError(f"no TernaryLinear at path {key!r}; the model has {sorted(layers)}")
    layer = layers[key]
    if state.C != layer.C or state.packed.shape != layer.codes.get_value().shape:
      raise ValueError(
          f"TernaryParams for {key!r} do not match the layer: packed {state.packed.shape} "
          f"C={state.C}, layer codes {layer.codes.get_value().shape} C={layer.C}")
    layer.codes.set_value(state.packed)
    layer.scale.set_value(state.scale)
    layer.rms.set_value(state.v)


def ternary_value_and_grad(loss_fn: Callable, *, has_aux: bool = False,
                           wrt: Any = nnx.Param) -> Callable:
  """``nnx.value_and_grad`` over ``wrt`` plus every ternary layer's ``(x, grad_out)``.

  The returned function evaluates ``loss_fn(model, *args, **kwargs)`` and
  returns ``(value, (param_grads, ternary_grads))``:

  * ``param_grads``: ``nnx.State`` of the gradients of the ``wrt`` variables
    (e.g. biases and float layers, for an optax optimizer);
  * ``ternary_grads``: ``{path: TernaryGrad(x, grad_out)}`` for every
    :class:`TernaryLinear` (``None`` for layers the loss did not call), rows of
    repeated calls concatenated. ``grad_out^T @ x`` is the layer's weight
    gradient; :func:`jaxnoise.optim.ternary.ternary_counter` consumes it.

  Mechanism: one abstract trace (``jax.eval_shape``, no compute) finds the
  output shape of each layer call; the gradient pass then adds a zero probe of
  that shape to each output and differentiates with respect to it. State the
  loss changes (other than ``wrt``) is written back to ``model``. The loss must
  call the layers directly (not through ``nnx.scan``/``nnx.vmap`` inside it).

  Args:
    loss_fn: ``loss_fn(model, *args, **kwargs) -> scalar`` (or
      ``(scalar, aux)`` with ``has_aux``).
    has_aux: ``loss_fn`` returns ``(loss, aux)``; the value is then
      ``(loss, aux)``.
    wrt: nnx filter of the float variables to differentiate.

  Returns:
    ``fn(model, *args, **kwargs) -> (value, (param_grads, ternary_grads))``.

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> layer = TernaryLinear(8, 3, rngs=nnx.Rngs(0))
    >>> loss = lambda m, x: jnp.sum(m(x) ** 2)
    >>> value, (param_grads, ternary_grads) = ternary_value_and_grad(loss)(
    ...     layer, jnp.ones((5, 8)))
    >>> ternary_grads[''].x.shape, ternary_grads[''].grad_out.shape
    ((5, 8), (5, 3))
  """

  def value_and_grad_fn(model, *args, **kwargs):
    graphdef, params, rest = nnx.split(model, wrt, ...)

    def evaluate(params, probes):
      merged = nnx.merge(graphdef, params, rest)
      keys = {id(layer): key for key, layer in _ternary_layers(merged).items()}
      capture = _Capture(keys, probes)
      with capture.active():
        out = loss_fn(merged, *args, **kwargs)
      loss, aux = out if has_aux else (out, None)
      _, _, new_rest = nnx.split(merged, wrt, ...)
      return loss, (aux, capture.inputs, capture.templates, new_rest)

    _, (_, _, templates, _) = jax.eval_shape(lambda p: evaluate(p, None), params)
    probes = {key: [jnp.zeros(t.shape, t.dtype) for t in calls]
              for key, calls in templates.items()}
    (loss, (aux, inputs, _, new_rest)), (param_grads, probe_grads) = jax.value_and_grad(
        evaluate, argnums=(0, 1), has_aux=True)(params, probes)
    nnx.update(model, new_rest)
    ternary_grads = {}
    for key, calls in inputs.items():
      if not calls:
        ternary_grads[key] = None
        continue
      grad_out = [g.reshape(-1, g.shape[-1]) for g in probe_grads[key]]
      ternary_grads[key] = ternary_ops.TernaryGrad(
          x=jnp.concatenate(calls, axis=0) if len(calls) > 1 else calls[0],
          grad_out=jnp.concatenate(grad_out, axis=0) if len(grad_out) > 1 else grad_out[0])
    value = (loss, aux) if has_aux else loss
    return value, (param_grads, ternary_grads)

  return value_and_grad_fn
