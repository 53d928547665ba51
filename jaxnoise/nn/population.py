"""Whole-model population evaluation and ES gradients, consistent by construction.

Three functions share one :class:`ParameterLayout` (where each parameter's
noise lives in the element-index space):

* :func:`population_apply` evaluates an ``nnx`` model for every individual
  ``params + sigma * s_i * noise(seed_i)``. Every ``nnx.Linear`` /
  :class:`~jaxnoise.nn.linear.VirtualLinear` call becomes the fused
  :func:`jaxnoise.virtual_perturbed_linear` (one op call per layer for the
  whole population; the input is shared for a layer that sees the model's
  input, per individual after), and every other parameter (LayerNorm scales,
  conv kernels, embeddings, ...) is perturbed with the same hash in plain JAX.
* :func:`perturb_params` perturbs any parameter pytree (or ``nnx.State``) for
  one individual, explicitly (for plain-pytree models, tests, small models).
* :func:`fitness_gradient` turns (shaped) fitness into the ES gradient
  estimate ``sum_i f_i s_i noise_i / (pop * sigma)`` for the whole tree:
  linear kernels and every 2-D-or-more leaf through
  :func:`jaxnoise.virtual_weight_gradient`, vectors and scalars through
  :func:`jaxnoise.virtual_bias_gradient`, never materialising the noise.

Offset order (the documented, stable layout)
--------------------------------------------
1. Take the perturbed leaves: the floating-point leaves of ``nnx.state(model,
   wrt)`` (default ``wrt=nnx.Param``), or of a plain pytree. Integer and
   boolean leaves are never perturbed.
2. Sort them by path (``nnx`` state path, or the pytree key path with dict
   keys, sequence indices and attribute names; integers sort numerically
   before strings; an ``nnx.Variable``'s ``value`` is not part of its path).
3. Walk them in that order, giving each block the next free element index
   (:func:`jaxnoise.compute_offsets`). A linear layer's block is its kernel
   in the ``(out, in)`` view, immediately followed by its bias (when the bias
   is perturbed too): the bias takes ``kernel offset + out * in`` and is
   skipped when its own path comes up. Any other leaf is flattened row-major
   as stored.

Low rank (``rank=r``): a linear layer's kernel owns the ``r * (out + in)``
indices of its low-rank factors (:mod:`jaxnoise.noise`, "Low-rank layout")
and its bias follows at ``kernel offset + r * (out + in)``; in a plain pytree
every 2-D leaf is a matrix stored ``(rows, cols)`` and takes ``r * (rows +
cols)`` indices. Every other leaf (biases, embeddings, norms, higher-rank
arrays) stays full rank.

"Linear layer" means an ``nnx.Linear`` instance (``VirtualLinear`` and other
subclasses included) found with ``nnx.iter_modules`` whose 2-D kernel is
perturbed; plain pytrees have no linear layers (store weights ``(out, in)`` and
give :func:`jaxnoise.virtual_perturbed_linear` ``layout.offset(path)``).

Example:
  >>> from flax import nnx
  >>> model = nnx.Sequential(nnx.Linear(3, 4, rngs=nnx.Rngs(0)),
  ...                        nnx.LayerNorm(4, rngs=nnx.Rngs(0)))
  >>> print(parameter_layout(model))
  offset  size  shape   path
       0    16  (4, 3)  layers/0/kernel (in, out) kernel, (out, in) noise view
      12     -  (4,)    layers/0/bias (after its kernel)
      16     4  (4,)    layers/1/bias
      20     4  (4,)    layers/1/scale
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxnoise import batching
from jaxnoise import noise as noise_lib
from jaxnoise.nn import linear as linear_lib
from jaxnoise.ops import _common
from jaxnoise.ops.virtual_noise import api as ops
from jaxnoise.ops.virtual_noise import config as config_lib

__all__ = [
    "LinearBlock",
    "NoiseBlock",
    "ParameterLayout",
    "fitness_gradient",
    "parameter_layout",
    "perturb_params",
    "population_apply",
]

Path = tuple[Any, ...]


# ----------------------------------------------------------------------------
# Layout.


@dataclasses.dataclass(frozen=True)
class NoiseBlock:
  """One leaf of the parameter tree and where its noise lives.

  Attributes:
    path: the leaf's path (see the module docstring).
    shape: the leaf's stored shape.
    offset: element index of the first noise value, or None when the leaf is
      not perturbed.
    transposed: the leaf is a linear kernel stored ``(in, out)`` whose noise
      is the ``(out, in)`` view's, transposed.
    fused_linear: module path of the linear layer whose fused call perturbs
      this leaf in :func:`population_apply` (None: perturbed in plain JAX).
    rank: the rank of the leaf's low-rank noise, or None (full rank).
  """

  path: Path
  shape: tuple[int, ...]
  offset: int | None
  transposed: bool = False
  fused_linear: Path | None = None
  rank: int | None = None

  @property
  def noise_shape(self) -> tuple[int, ...]:
    """Shape of the noise block in index order (``(out, in)`` for a kernel)."""
    return self.shape[::-1] if self.transposed else self.shape


@dataclasses.dataclass(frozen=True)
class LinearBlock:
  """A linear layer's kernel and bias as one noise block (the op's layout).

  Attributes:
    module_path: the layer's path in the model.
    offset: element index of the ``(out, in)`` view's ``[0, 0]``.
    in_features: kernel rows.
    out_features: kernel columns.
    perturb_bias: the bias is perturbed (at ``offset + out * in``).
    fusable: ``population_apply`` can replace the layer's call by the fused
      op (an exact ``nnx.Linear``, or a ``VirtualLinear`` whose ``__call__``
      is not overridden).
  """

  module_path: Path
  offset: int
  in_features: int
  out_features: int
  perturb_bias: bool
  fusable: bool


@dataclasses.dataclass(frozen=True)
class ParameterLayout:
  """Noise offsets of every leaf of a parameter tree (static and hashable).

  Attributes:
    blocks: one :class:`NoiseBlock` per leaf, in the tree's flatten order.
    linears: the linear layers, sorted by offset.
    size: total number of noise elements (the next free index).
    rank: the rank of the matrices' low-rank noise, or None (full rank).
  """

  blocks: tuple[NoiseBlock, ...]
  linears: tuple[LinearBlock, ...]
  size: int
  rank: int | None = None

  def offset(self, path: Sequence[Any] | str) -> int:
    """Offset of the leaf at ``path`` (a tuple, or a ``"a/0/kernel"`` string)."""
    wanted = _format_path(tuple(path)) if not isinstance(path, str) else path
    for block in self.blocks:
      if _format_path(block.path) == wanted:
        if block.offset is None:
          raise ValueError(f"parameter {wanted!r} is not perturbed (not a float leaf)")
        return block.offset
    known = ", ".join(_format_path(b.path) for b in self.blocks)
    raise KeyError(f"no parameter at path {wanted!r}; paths: {known}")

  def __str__(self) -> str:
    rows = [("offset", "size", "shape", "path")]
    sizes = {}
    for linear in self.linears:
      sizes[linear.module_path] = noise_lib.noise_block_size(
          (linear.out_features, linear.in_features), self.rank) + (
              linear.out_features if linear.perturb_bias else 0)
    for block in sorted((b for b in self.blocks if b.offset is not None),
                        key=lambda b: (b.offset, _path_sort_key(b.path))):
      name = _format_path(block.path)
      if block.transposed:
        size = str(sizes[block.path[:-1]])
        name += " (in, out) kernel, (out, in) noise view"
      elif _is_attached_bias(block, self.linears):
        size = "-"
        name += " (after its kernel)"
      else:
        size = str(noise_lib.noise_block_size(block.shape, block.rank))
      rows.append((str(block.offset), size, str(block.noise_shape), name))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:>{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:<{widths[2]}}  {r[3]}"
             for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def _is_attached_bias(block: NoiseBlock, linears) -> bool:
  return any(l.perturb_bias and block.path == l.module_path + ("bias",) for l in linears)


def _key_name(key) -> Any:
  if isinstance(key, jax.tree_util.DictKey):
    return key.key
  if isinstance(key, jax.tree_util.SequenceKey):
    return key.idx
  if isinstance(key, jax.tree_util.GetAttrKey):
    return key.name
  if isinstance(key, jax.tree_util.FlattenedIndexKey):
    return key.key
  return str(key)


def _flatten(tree) -> tuple[list[Path], list[Any], Any]:
  """Leaves with normalised paths (an ``nnx.Variable``'s ``value`` key dropped)."""
  with_path, treedef = jax.tree_util.tree_flatten_with_path(tree)
  paths = []
  for key_path, _ in with_path:
    if key_path and isinstance(key_path[-1], jax.tree_util.GetAttrKey) and \
        key_path[-1].name == "value":
      key_path = key_path[:-1]
    paths.append(tuple(_key_name(k) for k in key_path))
  return paths, [leaf for _, leaf in with_path], treedef


def _path_sort_key(path: Path):
  return tuple((0, k, "") if isinstance(k, (int, np.integer)) else (1, 0, str(k)) for k in path)


def _format_path(path: Path) -> str:
  return "/".join(str(k) for k in path)


def _is_float(leaf) -> bool:
  dtype = getattr(leaf, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jnp.floating)


def _fusable(module) -> bool:
  if type(module) is nnx.Linear:  # pylint: disable=unidiomatic-typecheck
    return True
  return (isinstance(module, linear_lib.VirtualLinear)
          and type(module).__call__ is linear_lib.VirtualLinear.__call__)


def parameter_layout(tree_or_model: Any, *, wrt: Any = nnx.Param,
                     rank: int | None = None) -> ParameterLayout:
  """The noise layout of an ``nnx`` model's parameters or of a plain pytree.

  Args:
    tree_or_model: an ``nnx.Module`` (its ``nnx.state(model, wrt)`` is laid
      out, linear kernels in the ``(out, in)`` view) or any pytree of arrays
      (laid out row-major as stored).
    wrt: ``nnx`` filter selecting the perturbed state of a model.
    rank: None (full rank), or the rank of the low-rank noise of the linear
      kernels (of every 2-D leaf of a plain pytree).

  Returns:
    The :class:`ParameterLayout` (see the module docstring for the order).

  Example:
    >>> import jax.numpy as jnp
    >>> layout = parameter_layout({"w": jnp.zeros((2, 3)), "b": jnp.zeros(2)})
    >>> layout.offset("b"), layout.offset("w"), layout.size
    (0, 2, 8)
    >>> parameter_layout({"w": jnp.zeros((2, 3)), "b": jnp.zeros(2)}, rank=1).size
    7
  """
  rank = noise_lib.check_rank(rank)
  linear_modules: dict[Path, Any] = {}
  if isinstance(tree_or_model, nnx.Module):
    params = nnx.state(tree_or_model, wrt)
    for module_path, module in nnx.iter_modules(tree_or_model):
      if isinstance(module, nnx.Linear):
        linear_modules[tuple(module_path)] = module
  else:
    params = tree_or_model
  paths, leaves, _ = _flatten(params)
  if len(set(paths)) != len(paths):
    raise ValueError("parameter paths are not unique; cannot lay out the noise")
  perturbed = {path: leaf for path, leaf in zip(paths, leaves) if _is_float(leaf)}

  linear_by_kernel: dict[Path, tuple[Path, Any, bool]] = {}
  attached_biases: dict[Path, Path] = {}
  for module_path, module in linear_modules.items():
    kernel = perturbed.get(module_path + ("kernel",))
    if kernel is None or np.ndim(kernel) != 2:
      continue
    bias_path = module_path + ("bias",)
    bias = perturbed.get(bias_path)
    perturb_bias = bias is not None and np.shape(bias) == (np.shape(kernel)[1],)
    linear_by_kernel[module_path + ("kernel",)] = (module_path, module, perturb_bias)
    if perturb_bias:
      attached_biases[bias_path] = module_path

  is_model = isinstance(tree_or_model, nnx.Module)
  ranks: dict[Path, int | None] = {}
  offsets: dict[Path, int] = {}
  linears = []
  next_offset = 0
  for path in sorted(perturbed, key=_path_sort_key):
    if path in attached_biases:
      continue
    offsets[path] = next_offset
    if path in linear_by_kernel:
      module_path, module, perturb_bias = linear_by_kernel[path]
      in_features, out_features = (int(d) for d in np.shape(perturbed[path]))
      linears.append(LinearBlock(module_path, next_offset, in_features, out_features,
                                 perturb_bias, _fusable(module)))
      ranks[path] = rank
      kernel_size = noise_lib.noise_block_size((out_features, in_features), rank)
      if perturb_bias:
        offsets[module_path + ("bias",)] = next_offset + kernel_size
      next_offset += kernel_size + (out_features if perturb_bias else 0)
    else:
      shape = np.shape(perturbed[path])
      ranks[path] = rank if (not is_model and len(shape) == 2) else None
      next_offset += noise_lib.noise_block_size(shape, ranks[path])

  fusable_by_path = {l.module_path: l for l in linears if l.fusable}
  blocks = []
  for path, leaf in zip(paths, leaves):
    module_path = path[:-1]
    in_linear = path in linear_by_kernel or path in attached_biases
    blocks.append(NoiseBlock(
        path=path,
        shape=tuple(int(d) for d in np.shape(leaf)),
        offset=offsets.get(path),
        transposed=path in linear_by_kernel,
        fused_linear=module_path if in_linear and module_path in fusable_by_path else None,
        rank=ranks.get(path),
    ))
  return ParameterLayout(tuple(blocks), tuple(linears), next_offset, rank)


def _matched_leaves(layout: ParameterLayout, tree, name: str):
  """Flatten ``tree`` and check it is the tree ``layout`` was made for."""
  paths, leaves, treedef = _flatten(tree)
  if len(paths) != len(layout.blocks):
    raise ValueError(f"{name} has {len(paths)} leaves but the layout has "
                     f"{len(layout.blocks)}; build the layout from the same tree")
  for path, leaf, block in zip(paths, leaves, layout.blocks):
    if path != block.path or tuple(np.shape(leaf)) != block.shape:
      raise ValueError(
          f"{name} does not match the layout: leaf {_format_path(path)!r} with shape "
          f"{tuple(np.shape(leaf))}, layout expects {_format_path(block.path)!r} with "
          f"shape {block.shape}")
  return leaves, treedef


def _params_and_layout(model_or_params, layout, wrt, rank=None):
  rank = noise_lib.check_rank(rank)
  if isinstance(model_or_params, nnx.Module):
    params = nnx.state(model_or_params, wrt)
    if layout is None:
      layout = parameter_layout(model_or_params, wrt=wrt, rank=rank)
  else:
    params = model_or_params
    layout = layout if layout is not None else parameter_layout(params, rank=rank)
  if not isinstance(layout, ParameterLayout):
    raise TypeError(f"layout must be a ParameterLayout, got {type(layout).__name__}")
  if rank is not None and layout.rank != rank:
    raise ValueError(f"rank={rank} does not match the layout's rank={layout.rank}; build the "
                     "layout with the same rank or leave rank out")
  return params, layout


# ----------------------------------------------------------------------------
# Perturbation of a parameter tree (one individual, plain JAX).


def _perturb_leaf(leaf, block: NoiseBlock, seed, scale, kind):
  noise = batching.individual_noise(seed, block.noise_shape, block.offset, kind=kind,
                                    rank=block.rank)
  if block.transposed:
    noise = noise.T
  # Same arithmetic as the ops: float32(W) + (sigma * sign) * noise.
  return (leaf.astype(jnp.float32) + scale * noise).astype(leaf.dtype)


def perturb_params(
    params: Any,
    seed: Any,
    sigma: float | jax.Array,
    *,
    layout: ParameterLayout | None = None,
    sign: float | jax.Array = 1.0,
    kind: str = noise_lib.DEFAULT_KIND,
    skip_fused: bool = False,
    rank: int | None = None,
) -> Any:
  """One individual's parameters ``params + sigma * sign * noise(seed)``.

  Materialises the perturbed tree (one copy per individual under
  ``jax.vmap``); fine for small models and as the explicit oracle of
  :func:`population_apply`.

  Args:
    params: a pytree of arrays or an ``nnx.State``.
    seed: the individual's integer seed (scalar).
    sigma: perturbation standard deviation.
    layout: the tree's layout; default ``parameter_layout(params)`` (a plain
      tree: no linear views). Pass ``parameter_layout(model)`` for an
      ``nnx.State`` of ``model`` so its linear kernels use the ``(out, in)``
      view.
    sign: noise multiplier (``+1`` / ``-1`` for antithetic members).
    kind: noise kind.
    skip_fused: leave the leaves of fusable linear layers unperturbed (their
      fused call perturbs them).
    rank: low-rank noise for the matrices (see :func:`parameter_layout`);
      must match ``layout``'s when both are given.

  Returns:
    A tree like ``params``.

  Example:
    >>> import jax.numpy as jnp
    >>> params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(2)}
    >>> perturb_params(params, 7, 0.1)["w"].shape
    (2, 3)
  """
  params, layout = _params_and_layout(params, layout, nnx.Param, rank)
  leaves, treedef = _matched_leaves(layout, params, "params")
  scale = _common.check_sigma(sigma) * jnp.asarray(sign, jnp.float32)
  seed = batching.as_seed(seed)
  new_leaves = []
  for leaf, block in zip(leaves, layout.blocks):
    if block.offset is None or (skip_fused and block.fused_linear is not None):
      new_leaves.append(leaf)
    else:
      new_leaves.append(_perturb_leaf(leaf, block, seed, scale, kind))
  return jax.tree_util.tree_unflatten(treedef, new_leaves)


# ----------------------------------------------------------------------------
# Population evaluation of an nnx model.

_FUSED_TOKENS = itertools.count()


def population_apply(
    model: nnx.Module,
    seeds: jax.Array,
    sigma: float | jax.Array,
    fn: Callable[..., Any],
    *args: Any,
    kind: str = noise_lib.DEFAULT_KIND,
    antithetic: bool = False,
    implementation: str = "auto",
    config: Any = None,
    wrt: Any = nnx.Param,
    fuse_linear: bool = True,
    rank: int | None = None,
) -> Any:
  """Evaluate ``fn(perturbed_model, *args)`` for every individual of a population.

  Individual ``i`` sees the model with every perturbed parameter (``wrt``)
  replaced by ``param + sigma * s_i * noise(seed_i)`` at the offsets of
  :func:`parameter_layout` (``s_i`` is ``-1`` for the second member of an
  antithetic pair, else ``+1``). ``fn`` is written for one individual and is
  vmapped; its outputs get a leading ``(pop,)`` axis.

  With ``fuse_linear`` (default), each ``nnx.Linear`` / ``VirtualLinear``
  call inside ``fn`` is the fused op, one call per layer for the population
  (through :mod:`jaxnoise.batching`'s vmap rules), and the layer's kernel and
  bias are *not* perturbed in the state ``fn`` sees: code that reads a linear
  layer's kernel directly (weight tying, ``x @ layer.kernel``) would see the
  centre; pass ``fuse_linear=False`` for such models (every parameter is then
  perturbed in plain JAX, materialising one kernel per individual).

  The model is treated functionally: state changes made by ``fn`` (batch
  statistics, RNG counters) are discarded.

  Args:
    model: the ``nnx`` model (not modified).
    seeds: ``(pop,)`` seeds (with ``antithetic``, pairs share ``seeds[2m]``;
      see :func:`jaxnoise.draw_seeds`).
    sigma: perturbation standard deviation.
    fn: ``fn(model, *args) -> pytree`` for one individual.
    *args: extra arguments of ``fn``, shared by the population.
    kind: noise kind.
    antithetic: antithetic pairs.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
    config: None, a kernel config or a tuple of them: the fused layers take
      the :class:`~jaxnoise.ops.virtual_noise.config.PerturbedLinearConfig`
      (full rank) or ``LowRankLinearConfig`` (``rank``) in it, and ignore
      the other types (see ``config_for_op``).
    wrt: ``nnx`` filter of the perturbed state.
    fuse_linear: fuse linear layers (see above).
    rank: None (full rank), or the rank of the linear kernels' low-rank noise
      ``A_i B_i^T / sqrt(rank)`` (see :func:`parameter_layout`); every other
      parameter stays full rank.

  Returns:
    ``fn``'s output with a leading ``(pop,)`` axis on every leaf.

  Example:
    >>> import jax, jax.numpy as jnp, jaxnoise
    >>> from flax import nnx
    >>> model = nnx.Sequential(nnx.Linear(3, 8, rngs=nnx.Rngs(0)), nnx.relu,
    ...                        nnx.Linear(8, 2, rngs=nnx.Rngs(1)))
    >>> seeds = jaxnoise.draw_seeds(jax.random.key(0), 6, antithetic=True)
    >>> out = population_apply(model, seeds, 0.05, lambda m, x: m(x), jnp.ones((5, 3)),
    ...                        antithetic=True)
    >>> out.shape
    (6, 5, 2)
  """
  if not isinstance(model, nnx.Module):
    raise TypeError(f"model must be an nnx.Module, got {type(model).__name__}; for a plain "
                    "pytree use jax.vmap over perturb_params")
  if not callable(fn):
    raise TypeError(f"fn must be callable, got {type(fn).__name__}")
  seeds = noise_lib.as_seeds(seeds)
  pop = seeds.shape[0]
  if antithetic and pop % 2:
    raise ValueError(f"antithetic=True needs an even population, got seeds {seeds.shape}")
  sigma = _common.check_sigma(sigma)
  kind = noise_lib.get_kind(kind)
  implementation = _common.resolve_implementation(implementation)
  layout = parameter_layout(model, wrt=wrt, rank=rank)
  graphdef, params, rest = nnx.split(model, wrt, ...)
  return apply_split(graphdef, params, rest, layout, seeds, sigma, fn, args, kind=kind,
                     antithetic=antithetic, implementation=implementation, config=config,
                     fuse_linear=fuse_linear)


def apply_split(graphdef, params, rest, layout: ParameterLayout, seeds, sigma, fn, args, *,
                kind: noise_lib.NoiseKind, antithetic: bool, implementation: str, config: Any,
                fuse_linear: bool, gather_kernels: dict[Path, Callable] | None = None) -> Any:
  """:func:`population_apply` on a split model (arguments validated), for the library.

  ``gather_kernels`` maps a fused linear layer's module path to
  ``gather(layer_input) -> kernel``: the layer's call forms its kernel with it
  (its kernel in ``params`` is never read), which
  :func:`jaxnoise.parallel.sharded_evaluate` uses to gather a kernel kept in
  shards just before the layer runs.
  """
  pop = seeds.shape[0]
  gather_kernels = gather_kernels or {}
  fused = {l.module_path: l for l in layout.linears if l.fusable} if fuse_linear else {}
  missing = set(gather_kernels) - set(fused)
  if missing:
    raise ValueError(f"gather_kernels names layers that are not fused: {sorted(missing)}")
  token = next(_FUSED_TOKENS)
  linear_config = config_lib.config_for_op(
      config, config_lib.PerturbedLinearConfig if layout.rank is None
      else config_lib.LowRankLinearConfig)

  def one_individual(seed, sign):
    perturbed = perturb_params(params, seed, sigma, layout=layout, sign=sign, kind=kind,
                               skip_fused=bool(fused))
    member = nnx.merge(graphdef, perturbed, rest)
    registry = {}
    for module_path, module in nnx.iter_modules(member):
      linear = fused.get(tuple(module_path))
      if linear is None:
        continue
      if type(module) is nnx.Linear:  # pylint: disable=unidiomatic-typecheck
        # Same attributes and plain behaviour; only this private copy changes.
        object.__setattr__(module, "__class__", linear_lib.VirtualLinear)
      key = (token, tuple(module_path))
      setattr(module, linear_lib.FUSED_KEY_ATTRIBUTE, key)
      registry[key] = linear_lib.FusedLinearNoise(
          seed=seed, sign=sign, sigma=sigma, offset=linear.offset, kind=kind,
          antithetic=antithetic, implementation=implementation, config=linear_config,
          perturb_bias=linear.perturb_bias, rank=layout.rank,
          gather_kernel=gather_kernels.get(tuple(module_path)))
    with linear_lib.fused_noise_scope(registry):
      return fn(member, *args)

  return jax.vmap(one_individual)(noise_lib.pair_seeds(seeds, antithetic),
                                  noise_lib.antithetic_signs(pop, antithetic))


# ----------------------------------------------------------------------------
# ES gradient for the whole tree.


def gradient_dtype(leaf) -> jnp.dtype:
  """The dtype a leaf's estimate is rounded to: its own float dtype (float32, bfloat16 or
  float16), else float32 (the caller casts the rest)."""
  dtype = jnp.dtype(getattr(leaf, "dtype", jnp.float32))
  return dtype if dtype in _common.FLOAT_DTYPES else jnp.dtype(jnp.float32)


def _leaf_gradient(block: NoiseBlock, fitness, seeds, sigma, pop_size, kind, antithetic,
                   implementation, config, dtype):
  """The leaf's estimate: a low-rank block's in ``dtype`` (its kernel rounds as it stores
  where it can), the others in float32; the caller casts to the leaf's dtype."""
  # Each leaf's op takes the config of its own type; the others pick their heuristics.
  config_type = (config_lib.LowRankGradientConfig if block.rank is not None
                 else config_lib.NoiseGradientConfig)
  common = dict(kind=kind, antithetic=antithetic, implementation=implementation,
                config=config_lib.config_for_op(config, config_type))
  shape = block.noise_shape
  if block.rank is not None:
    grad = ops.virtual_weight_gradient(fitness, seeds, shape, sigma, pop_size, block.offset,
                                       rank=block.rank, out_dtype=dtype, **common)
  elif len(shape) >= 2:
    rows = (math.prod(shape[:-1]), shape[-1])
    grad = ops.virtual_weight_gradient(fitness, seeds, rows, sigma, pop_size, block.offset,
                                       **common).reshape(shape)
  else:
    grad = ops.virtual_bias_gradient(fitness, seeds, (math.prod(shape),), sigma, pop_size,
                                     block.offset, **common).reshape(shape)
  return grad.T if block.transposed else grad


def fitness_gradient(
    model_or_params: Any,
    fitness: jax.Array,
    seeds: jax.Array,
    sigma: float | jax.Array,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    antithetic: bool = False,
    implementation: str = "auto",
    config: Any = None,
    wrt: Any = nnx.Param,
    layout: ParameterLayout | None = None,
    pop_size: int | None = None,
    rank: int | None = None,
) -> Any:
  """ES estimate of the gradient of expected fitness for every parameter.

  ``grad = sum_i fitness_i s_i noise_i / (pop_size * sigma)`` with exactly the
  noise :func:`population_apply` / :func:`perturb_params` used (same layout,
  seeds, kind, antithetic signs), formed by the gradient ops without
  materialising the noise. Feed it already-shaped fitness (see
  :mod:`jaxnoise.optim.es`); it is an *ascent* direction of fitness.

  Args:
    model_or_params: an ``nnx`` model (the result matches
      ``nnx.state(model, wrt)``) or a pytree of arrays.
    fitness: ``(pop,)`` float fitness.
    seeds: ``(pop,)`` seeds used in the evaluation.
    sigma: perturbation standard deviation used in the evaluation.
    kind: noise kind.
    antithetic: antithetic pairs.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
    config: None, a kernel config or a tuple of them: full-rank leaves take
      the :class:`~jaxnoise.ops.virtual_noise.config.NoiseGradientConfig` in
      it, low-rank matrices the ``LowRankGradientConfig``; other types are
      ignored (see ``config_for_op``).
    wrt: ``nnx`` filter of the perturbed state (models only).
    layout: layout override (default: :func:`parameter_layout`).
    pop_size: divisor's population size (default ``len(fitness)``).
    rank: low-rank noise of the matrices, as in :func:`population_apply`
      (must match ``layout``'s when both are given).

  Returns:
    A tree like the parameters; unperturbed (non-float) leaves get zeros.
    Leaves have the parameters' dtypes.

  Example:
    >>> import jax.numpy as jnp
    >>> params = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(2)}
    >>> grad = fitness_gradient(params, jnp.ones(4), jnp.arange(4), 0.1)
    >>> grad["w"].shape
    (2, 3)
  """
  params, layout = _params_and_layout(model_or_params, layout, wrt, rank)
  leaves, treedef = _matched_leaves(layout, params, "params")
  seeds = noise_lib.as_seeds(seeds)
  fitness = _common.check_float_array(fitness, "fitness", (1,))
  if fitness.shape != seeds.shape:
    raise ValueError(f"fitness and seeds must have the same length: fitness "
                     f"{_common.describe(fitness)}, seeds {_common.describe(seeds)}")
  sigma = _common.check_sigma(sigma)
  grads = []
  for leaf, block in zip(leaves, layout.blocks):
    if block.offset is None or 0 in block.shape:
      grads.append(jnp.zeros(np.shape(leaf), getattr(leaf, "dtype", jnp.float32)))
      continue
    grad = _leaf_gradient(block, fitness, seeds, sigma, pop_size, kind, antithetic,
                          implementation, config, gradient_dtype(leaf))
    grads.append(grad.astype(leaf.dtype))
  return jax.tree_util.tree_unflatten(treedef, grads)
