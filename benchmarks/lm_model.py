"""A byte-level decoder-only transformer whose every matmul weight is an ``nnx.Linear``.

The model is written so that :func:`jaxnoise.nn.population_apply` fuses all of
its linear layers: the query, key, value and output projections of attention,
the two MLP layers and the output head are plain ``nnx.Linear`` modules (not
``nnx.MultiHeadAttention``, whose ``LinearGeneral`` is not fused), so with
``rank=r`` each of them is perturbed by rank-``r`` virtual noise inside the
population forward. The token embedding, the learned positions and the
RMSNorm scales are perturbed full rank in plain JAX.

Shared by ``benchmarks/bench_lm.py`` (throughput of one ES step) and
``examples/es_language_model.py`` (training by ES beside an Adam baseline):

* :class:`LMConfig` / :class:`TransformerLM`: the model;
* :func:`next_byte_loss`: mean next-byte cross-entropy (nats) of one model;
* :func:`chunked_population_fitness`: ``es.evaluate`` over population chunks
  (``lax.map``), with the same seeds and offsets as one call, so the
  activations of ``chunk x batch x context`` tokens are live, not the whole
  population's;
* :func:`make_es_step`: ask, chunked evaluate, update and apply, one function
  to put under one ``jax.jit``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

__all__ = [
    "LMConfig",
    "TransformerLM",
    "chunk_members",
    "chunked_population_fitness",
    "count_params",
    "make_es_step",
    "next_byte_loss",
]


@dataclasses.dataclass(frozen=True)
class LMConfig:
  """Shape of a :class:`TransformerLM`.

  Attributes:
    vocab_size: number of byte values (256).
    context: longest input sequence (learned positions).
    d_model: residual width.
    num_layers: transformer blocks.
    num_heads: attention heads (``d_model`` must be a multiple).
    mlp_ratio: MLP hidden width over ``d_model``.
    dtype: compute dtype of the layers (``"float32"`` or ``"bfloat16"``);
      parameters stay float32, attention softmax and the loss are float32.
  """

  vocab_size: int = 256
  context: int = 64
  d_model: int = 512
  num_layers: int = 4
  num_heads: int = 8
  mlp_ratio: int = 4
  dtype: str = "float32"

  def __post_init__(self):
    for name in ("vocab_size", "context", "d_model", "num_layers", "num_heads", "mlp_ratio"):
      value = getattr(self, name)
      if not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {self.dtype!r}")
    if self.d_model % self.num_heads:
      raise ValueError(f"d_model={self.d_model} must be a multiple of "
                       f"num_heads={self.num_heads}")


class CausalSelfAttention(nnx.Module):
  """Multi-head causal self-attention with four ``nnx.Linear`` projections."""

  def __init__(self, d_model: int, num_heads: int, *, dtype=None, rngs: nnx.Rngs):
    self.num_heads = num_heads
    projection = dict(use_bias=False, dtype=dtype, rngs=rngs)
    self.query_proj = nnx.Linear(d_model, d_model, **projection)
    self.key_proj = nnx.Linear(d_model, d_model, **projection)
    self.value_proj = nnx.Linear(d_model, d_model, **projection)
    self.output_proj = nnx.Linear(d_model, d_model, **projection)

  def __call__(self, x: jax.Array) -> jax.Array:
    """``(..., length, d_model) -> (..., length, d_model)``; position t sees 0..t."""
    *lead, length, d_model = x.shape
    head_dim = d_model // self.num_heads

    def split_heads(y):
      return y.reshape(*lead, length, self.num_heads, head_dim)

    query = split_heads(self.query_proj(x))
    key = split_heads(self.key_proj(x))
    value = split_heads(self.value_proj(x))
    scores = jnp.einsum("...qhd,...khd->...hqk", query, key,
                        preferred_element_type=jnp.float32) / math.sqrt(head_dim)
    causal = jnp.tril(jnp.ones((length, length), bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(value.dtype)
    mixed = jnp.einsum("...hqk,...khd->...qhd", weights, value)
    return self.output_proj(mixed.reshape(*lead, length, d_model))


class MLP(nnx.Module):
  """``Linear -> GELU -> Linear`` with a ``mlp_ratio`` times wider hidden layer."""

  def __init__(self, d_model: int, hidden: int, *, dtype=None, rngs: nnx.Rngs):
    self.up_proj = nnx.Linear(d_model, hidden, dtype=dtype, rngs=rngs)
    self.down_proj = nnx.Linear(hidden, d_model, dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return self.down_proj(jax.nn.gelu(self.up_proj(x)))


class Block(nnx.Module):
  """Pre-norm transformer block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

  def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
    dtype = jnp.dtype(config.dtype)
    self.attention_norm = nnx.RMSNorm(config.d_model, dtype=dtype, rngs=rngs)
    self.attention = CausalSelfAttention(config.d_model, config.num_heads, dtype=dtype,
                                         rngs=rngs)
    self.mlp_norm = nnx.RMSNorm(config.d_model, dtype=dtype, rngs=rngs)
    self.mlp = MLP(config.d_model, config.mlp_ratio * config.d_model, dtype=dtype, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    x = x + self.attention(self.attention_norm(x))
    return x + self.mlp(self.mlp_norm(x))


class TransformerLM(nnx.Module):
  """Byte-level decoder-only transformer: ``(..., length)`` bytes to next-byte logits.

  Example:
    >>> import jax.numpy as jnp
    >>> from flax import nnx
    >>> config = LMConfig(context=8, d_model=16, num_layers=1, num_heads=2)
    >>> model = TransformerLM(config, rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((3, 8), jnp.int32)).shape
    (3, 8, 256)
  """

  def __init__(self, config: LMConfig, *, rngs: nnx.Rngs):
    self.config = config
    dtype = jnp.dtype(config.dtype)
    self.token_embedding = nnx.Embed(config.vocab_size, config.d_model, dtype=dtype, rngs=rngs)
    self.position_embedding = nnx.Param(
        0.02 * jax.random.normal(rngs.params(), (config.context, config.d_model)))
    self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
    self.final_norm = nnx.RMSNorm(config.d_model, dtype=dtype, rngs=rngs)
    self.head = nnx.Linear(config.d_model, config.vocab_size, dtype=dtype, rngs=rngs)

  def __call__(self, tokens: jax.Array) -> jax.Array:
    length = tokens.shape[-1]
    if length > self.config.context:
      raise ValueError(f"tokens has length {length}, more than the context "
                       f"{self.config.context}")
    x = self.token_embedding(tokens)
    x = x + self.position_embedding[...][:length].astype(x.dtype)
    for block in self.blocks:
      x = block(x)
    return self.head(self.final_norm(x))


def next_byte_loss(model: TransformerLM, sequences: jax.Array) -> jax.Array:
  """Mean cross-entropy (nats) of predicting ``sequences[..., 1:]`` from the bytes before.

  Args:
    model: the language model.
    sequences: ``(..., length + 1)`` integer bytes.

  Returns:
    A float32 scalar; divide by ``ln 2`` for bits per byte.
  """
  logits = model(sequences[..., :-1]).astype(jnp.float32)
  targets = sequences[..., 1:].astype(jnp.int32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def route_multi_row_members(fused: bool = True, member_dots: bool = True,
                            pipelined_tiles: bool = False) -> None:
  """Where members of 64k rows (a sequence each) go: the fused Mosaic GEMM (the default since
  session 31; ``mosaic_gpu_low_rank.MULTI_ROW_MEMBERS``), with ``x B`` formed in the GEMM
  where it can (``member_dots``) or by the operands kernel, or (``fused=False``) XLA's GEMM
  and a Triton pass, as before; ``pipelined_tiles``: the heuristic configs with
  ``gemm_pipelined_tiles=True``. For the LM benchmarks' options
  (:func:`add_route_arguments`)."""
  from jaxnoise.ops.virtual_noise import config as config_lib  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank  # pylint: disable=g-import-not-at-top
  mosaic_gpu_low_rank.MULTI_ROW_MEMBERS = fused
  if not member_dots:
    mosaic_gpu_low_rank.member_dots_supported = lambda *_: False
  if pipelined_tiles:
    heuristics = config_lib.low_rank_linear_heuristics
    config_lib.low_rank_linear_heuristics = lambda *args, **kwargs: dataclasses.replace(
        heuristics(*args, **kwargs), gemm_pipelined_tiles=True)


def add_route_arguments(parser) -> None:
  """The LM benchmarks' options for :func:`route_multi_row_members` (an ``argparse`` parser);
  :func:`route_from_arguments` applies them."""
  parser.add_argument("--multi-row-fused", action="store_true",
                      help="members of 64k rows through the fused Mosaic GEMM: the default "
                           "since session 31 (kept for the run scripts that name it)")
  parser.add_argument("--multi-row-triton", action="store_true",
                      help="members of 64k rows through XLA's GEMM and a Triton pass "
                           "(mosaic_gpu_low_rank.MULTI_ROW_MEMBERS = False), as before")
  parser.add_argument("--no-member-dots", action="store_true",
                      help="fused: x B from the operands kernel, not the GEMM")
  parser.add_argument("--pipelined-tiles", action="store_true",
                      help="fused: the GEMM's tiles chained into one pipeline "
                           "(LowRankLinearConfig.gemm_pipelined_tiles)")


def route_from_arguments(args) -> None:
  """:func:`route_multi_row_members` as :func:`add_route_arguments`' options ask."""
  route_multi_row_members(fused=not args.multi_row_triton, member_dots=not args.no_member_dots,
                          pipelined_tiles=args.pipelined_tiles)


def count_params(model: nnx.Module) -> int:
  """Number of parameter elements."""
  return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))


def chunk_members(pop: int, tokens_per_member: int, tokens_per_chunk: int) -> int:
  """Members per chunk: an even divisor of ``pop`` whose tokens fit ``tokens_per_chunk``.

  Example:
    >>> chunk_members(16384, 64, 1 << 20)
    16384
    >>> chunk_members(262144, 64, 1 << 20)
    16384
  """
  if pop % 2:
    raise ValueError(f"pop must be even (antithetic pairs), got {pop}")
  wanted = max(2, tokens_per_chunk // max(1, tokens_per_member))
  chunk = min(pop, wanted - wanted % 2)
  while pop % chunk or chunk % 2:
    chunk -= 1
  return chunk


def chunked_population_fitness(es, model: nnx.Module, seeds: jax.Array, fitness_fn,
                               *args: Any, chunk: int) -> jax.Array:
  """``es.evaluate(model, seeds, fitness_fn, *args)``, ``chunk`` members at a time.

  Chunk ``c`` evaluates ``seeds[c * chunk:(c + 1) * chunk]``; the noise of a
  member depends only on its seed, its antithetic sign (its parity, kept
  because ``chunk`` is even) and the layout's offsets (the same model), so the
  result equals one call over the whole population up to float rounding.

  Args:
    es: an :class:`jaxnoise.optim.EvolutionStrategy`.
    model: the centre model.
    seeds: ``(pop,)`` seeds of ``es.ask``.
    fitness_fn: ``fitness_fn(member, *args) -> scalar`` for one member.
    *args: arguments shared by the population.
    chunk: members per chunk; an even divisor of ``pop``.

  Returns:
    ``(pop,)`` fitness.
  """
  pop = seeds.shape[0]
  if chunk < 2 or chunk % 2 or pop % chunk:
    raise ValueError(f"chunk must be an even divisor of pop={pop}, got {chunk}")
  if chunk == pop:
    return es.evaluate(model, seeds, fitness_fn, *args)
  graphdef, state = nnx.split(model)

  def evaluate_chunk(chunk_seeds):
    return es.evaluate(nnx.merge(graphdef, state), chunk_seeds, fitness_fn, *args)

  fitness = jax.lax.map(evaluate_chunk, seeds.reshape(pop // chunk, chunk))
  return fitness.reshape(pop)


def make_es_step(es, graphdef: nnx.GraphDef, *, chunk: int):
  """One ES generation as a pure function of arrays (jit it, donating params and state).

  Args:
    es: an :class:`jaxnoise.optim.EvolutionStrategy` (its ``rank`` applies).
    graphdef: the model's graph definition (``nnx.split(model, nnx.Param, ...)``).
    chunk: members evaluated at a time (:func:`chunked_population_fitness`).

  Returns:
    ``step(params, rest, es_state, sequences) -> (params, es_state,
    mean_loss)``: ask, evaluate ``-next_byte_loss`` on the minibatch
    ``sequences`` shared by the population, update, apply. ``mean_loss`` is
    the population's mean loss (nats).
  """

  def fitness_fn(member, sequences):
    return -next_byte_loss(member, sequences)

  def step(params, rest, es_state, sequences):
    model = nnx.merge(graphdef, params, rest)
    seeds, es_state = es.ask(es_state)
    fitness = chunked_population_fitness(es, model, seeds, fitness_fn, sequences, chunk=chunk)
    updates, es_state = es.update(fitness, es_state, model)
    params = optax.apply_updates(params, updates)
    return params, es_state, -jnp.mean(fitness)

  return step
