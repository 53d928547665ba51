"""The one definition of jaxnoise's counter-based noise.

Every noise value in jaxnoise is a pure function of ``(seed, index, kind)``:
``seed`` is an individual's uint32 seed, ``index`` a 64-bit element index
(``offset + flat index``) and ``kind`` one of :data:`KINDS`. Nothing else
enters: not tiling, block sizes, batch position, jit/vmap, sharding or
backend. The pure-JAX reference ops and every Pallas kernel call the functions
of this module, so they produce the same bits.

Construction
------------
All arithmetic is on uint32 (no x64 mode). The 64-bit word index is split
into ``(hi, lo)``.

1. *Stream key*, once per ``(seed, hi)`` (hoisted out of inner loops)::

       h          = mix32(hi * 0x9E3779B9 + 0x632BE5AB)
       k          = mix32(seed ^ h)
       multiplier = mix32(k + 0x3C6EF372) | 1
       increment  = mix32(k ^ 0xA54FF53A)

2. *Word*, once per 32 random bits::

       word = mix32(lo * multiplier + increment)

   where ``mix32`` is the ``lowbias32`` finaliser (C. Wellons' hash
   prospector; the splitmix family's xor-shift / multiply finaliser)::

       x ^= x >> 16; x *= 0x7FEB352D; x ^= x >> 15; x *= 0x846CA68B; x ^= x >> 16

   That is one multiply-add plus eight operations per word (nine in all).

The key enters *non-linearly*: each stream is an arithmetic progression
``lo * multiplier + increment`` with its own odd stride before the bijective
finaliser. With a key that only entered additively (``mix32(key + lo)``) or
by xor, two seeds would give shifted or permuted copies of one stream; here
two streams share a shifted copy only if their multipliers collide (chance
2**-31 per pair). Because ``mix32`` and ``lo -> lo * m + c`` are both
bijections, one stream never repeats a word within 2**32 indices, and the
high word changes both keys, so index ``i`` and ``i + 2**32`` give unrelated
words. See Jarzynski & Olano, "Hash Functions for GPU Rendering", JCGT 2020,
for the cost and quality of such integer hashes on GPUs.

Kinds
-----
All kinds have zero mean and unit variance, so ``sigma`` is the standard
deviation of the perturbation. Each value is an integer-valued float32
``q`` (exact, computed with integer operations, one int-to-float conversion
or bitcast and at most two float operations whose results are exact or
correctly rounded, so no backend or fused multiply-add can change a bit) times the
kind's float32 ``scale``. Kernels feed ``q`` to the matrix units and apply
``scale`` once to the accumulated result.

``"uniform"`` (one value per word; the default before 2026-11-30)
    ``q = int32(word) >> 7 | 1``: an odd integer in ``(-2**24, 2**24)``
    built from the word's top 24 bits, symmetric about zero;
    ``scale = sqrt(12) * 2**-25``. Dividing by ``sqrt(12)`` gives the centred
    ``[-0.5, 0.5)`` uniform of the seed document.
``"rademacher"`` (32 values per word)
    ``+1`` or ``-1``; element ``index`` takes bit ``index & 31`` of the word
    at word index ``index >> 5`` (so the mapping stays a function of the
    index alone). The fastest kind.
``"normal"`` (one value per word)
    Fleishman-corrected Irwin-Hall: the word's four bytes give four centred
    odd integers ``c = 2 * byte - 255`` whose sum ``s`` is exact;
    ``q = s * (4448279 + s * s)`` (``s * s + 4448279 < 2**24`` is exact, the
    product is one rounding) and ``scale`` normalises the exact variance. The
    cubic term fixes the kurtosis to 3 (sixth moment 14.46 against 15);
    the Kolmogorov-Smirnov distance to N(0, 1) is 0.0032 and the tails stop
    at 4.04 standard deviations. Bit-exact everywhere, unlike Box-Muller
    whose ``log`` / ``cos`` differ between backends in the last place.
``"binomial"`` (default; one value per word)
    A centred Binomial(32, 1/2): ``q = popcount(word) - 16``, an integer in
    ``[-16, 16]`` (33 levels, exact in bfloat16 and float16);
    ``scale = 1 / sqrt(8)`` (float32). Variance 8, kurtosis
    ``3 - 2 / 32 = 2.9375``, tails at 5.66 standard deviations; the
    Kolmogorov-Smirnov distance to N(0, 1) is 0.070 (a lattice with steps
    of 0.354; the largest step, at zero, is 0.14), and at the midpoints
    between levels the CDF is within 0.0009 of N(0, 1)'s. The float is
    built without an int-to-float conversion:
    ``q = bitcast_f32(0x4B000000 | popcount(word)) - 8388624.0``
    (``2**23 + popcount`` minus ``2**23 + 16``, both exact), so a value is one
    hashed word, one population count, one ``or`` and one float subtraction:
    uniform's cost with ``popc`` in place of the shift-or and conversion.
    The default because it matches Gaussian noise in ES results (evosax
    Open_ES's BBOB regret, gymnax, digits: ``benchmarks/es_quality.py``,
    ``benchmarks/RESULTS.md``) where "uniform" and "rademacher" do not, at
    uniform's cost.

Layout
------
Weight element ``(j, k)`` of an ``(out, in)`` matrix uses index
``offset + j * in + k``; its bias element ``j`` uses ``offset + out * in + j``
(see :func:`jaxnoise.compute_offsets`). Antithetic pairs: individuals ``2m``
and ``2m + 1`` share ``seeds[2m]`` with signs ``+1`` and ``-1``.

Low-rank layout
---------------
With ``rank=r`` an ``(out, in)`` weight block at ``offset`` is perturbed by

    E_i = s_i * A_i @ B_i.T / sqrt(r),     A_i: (out, r),  B_i: (in, r)

whose entries are noise values of the chosen kind (so every entry of ``E_i``
has zero mean and unit variance, and antithetic pairs mirror ``E_i``). The
factors are the rows of one row-major ``(r, out + in)`` block at ``offset``:
component ``c`` owns the ``out + in`` consecutive indices starting at
``offset + c * (out + in)``, first ``A_i[:, c]`` then ``B_i[:, c]``::

    A_i[j, c]  at  offset + c * (out + in) + j
    B_i[k, c]  at  offset + c * (out + in) + out + k

The block owns ``r * (out + in)`` indices (:func:`noise_block_size`); a bias
of a low-rank layer follows at ``offset + r * (out + in)`` and stays full
rank. Ranks are nested: the first ``r`` components of rank ``r + 1`` are
those of rank ``r``.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "DEFAULT_KIND",
    "KINDS",
    "NoiseKind",
    "as_seeds",
    "draw_seeds",
    "check_rank",
    "get_kind",
    "low_rank_factors",
    "mix32",
    "noise_block_size",
    "virtual_noise",
]

_U32 = jnp.uint32
_MASK32 = 0xFFFFFFFF

# Finaliser constants (lowbias32) and key-schedule constants.
_MIX_MUL_1 = 0x7FEB352D
_MIX_MUL_2 = 0x846CA68B
_GOLDEN = 0x9E3779B9
_HI_SALT = 0x632BE5AB
_MULTIPLIER_SALT = 0x3C6EF372
_INCREMENT_SALT = 0xA54FF53A

# "normal": q = s * (_NORMAL_CUBIC + s*s) with s the sum of four centred bytes.
_NORMAL_CUBIC = 4448279

# "binomial": bitcast(_BINOMIAL_BITS | popcount) is 2**23 + popcount exactly;
# subtracting 2**23 + 16 centres it (exact: both are integers below 2**24).
_BINOMIAL_BITS = 0x4B000000
_BINOMIAL_CENTRE = 8388624.0


def mix32(x: jax.Array) -> jax.Array:
  """The lowbias32 finaliser: a bijection on uint32 with full avalanche.

  Args:
    x: uint32 array.

  Returns:
    uint32 array of the same shape.

  Example:
    >>> import jax.numpy as jnp
    >>> int(mix32(jnp.uint32(1)))
    1753845952
  """
  x = x ^ (x >> 16)
  x = x * _U32(_MIX_MUL_1)
  x = x ^ (x >> 15)
  x = x * _U32(_MIX_MUL_2)
  return x ^ (x >> 16)


def stream_keys(seed: jax.Array, word_hi: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per-stream ``(multiplier, increment)`` for ``seed`` and high word.

  Args:
    seed: uint32 seeds (any shape, broadcast against ``word_hi``).
    word_hi: uint32 high 32 bits of the word index.

  Returns:
    ``(multiplier, increment)``, uint32; ``multiplier`` is odd.
  """
  h = mix32(word_hi * _U32(_GOLDEN) + _U32(_HI_SALT))
  k = mix32(seed ^ h)
  multiplier = mix32(k + _U32(_MULTIPLIER_SALT)) | _U32(1)
  increment = mix32(k ^ _U32(_INCREMENT_SALT))
  return multiplier, increment


def hash_word(multiplier: jax.Array, increment: jax.Array, word_lo: jax.Array) -> jax.Array:
  """The 32-bit word at low index ``word_lo`` of the stream ``(multiplier, increment)``."""
  return mix32(word_lo * multiplier + increment)


# ----------------------------------------------------------------------------
# 64-bit index arithmetic on (hi, lo) uint32 pairs.


def split_u64(value: int) -> tuple[int, int]:
  """Python int in ``[0, 2**64)`` -> ``(hi, lo)`` 32-bit halves."""
  return (value >> 32) & _MASK32, value & _MASK32


def mul_wide(a: jax.Array, b: jax.Array | int) -> tuple[jax.Array, jax.Array]:
  """Full 64-bit product of two uint32 values as ``(hi, lo)`` (16-bit limbs)."""
  a = jnp.asarray(a, _U32)
  b = jnp.asarray(b, _U32)
  mask = _U32(0xFFFF)
  a_lo, a_hi = a & mask, a >> 16
  b_lo, b_hi = b & mask, b >> 16
  p0 = a_lo * b_lo
  p1 = a_lo * b_hi
  p2 = a_hi * b_lo
  p3 = a_hi * b_hi
  mid = (p0 >> 16) + (p1 & mask) + (p2 & mask)
  lo = (p0 & mask) | (mid << 16)
  hi = p3 + (p1 >> 16) + (p2 >> 16) + (mid >> 16)
  return hi, lo


def add_wide(a_hi, a_lo, b_hi, b_lo) -> tuple[jax.Array, jax.Array]:
  """``(a_hi, a_lo) + (b_hi, b_lo)`` modulo 2**64 on uint32 halves."""
  lo = a_lo + b_lo
  carry = (lo < a_lo).astype(_U32)
  return a_hi + b_hi + carry, lo


def row_base(offset: int, rows: jax.Array, n_cols: int) -> tuple[jax.Array, jax.Array]:
  """Index ``offset + rows * n_cols`` as ``(hi, lo)`` (``rows`` uint32)."""
  off_hi, off_lo = split_u64(offset)
  prod_hi, prod_lo = mul_wide(rows, int(n_cols))
  return add_wide(prod_hi, prod_lo, _U32(off_hi), _U32(off_lo))


# ----------------------------------------------------------------------------
# Kinds.


@dataclasses.dataclass(frozen=True)
class NoiseKind:
  """A noise kind: how words become values.

  Attributes:
    name: the kind's name.
    log2_values_per_word: 0 (one value per 32-bit word) or 5 (32 values).
    scale: float32 factor from the integer-valued ``q`` to unit variance.
  """

  name: str
  log2_values_per_word: int
  scale: float

  @property
  def values_per_word(self) -> int:
    return 1 << self.log2_values_per_word

  @property
  def code_bits(self) -> int:
    """Bits of :meth:`code`: 8 (binomial, rademacher), 16 (normal) or 32 (uniform)."""
    return {"binomial": 8, "rademacher": 8, "normal": 16}.get(self.name, 32)

  def code(self, words: jax.Array, lane: jax.Array | None = None, *,
           population_count=None) -> jax.Array:
    """The uint32 integer a value is made from, below ``2**code_bits``.

    :meth:`unscaled` is ``from_code(code(words, lane))``; a kernel may store
    the code (e.g. hashed ahead, in fewer bytes than the float) and finish
    the value later. binomial: the bit count; rademacher: the lane's bit;
    normal: the sum of the word's four bytes; uniform: the word.

    Example:
      >>> import jax.numpy as jnp
      >>> kind = get_kind("binomial")
      >>> words = jnp.array([0, 0xFF, 0xFFFFFFFF], jnp.uint32)
      >>> kind.code(words).tolist(), kind.from_code(kind.code(words)).tolist()
      ([0, 8, 32], [-16.0, -8.0, 16.0])
    """
    if self.name == "uniform":
      return words
    if self.name == "rademacher":
      return (words >> lane) & _U32(1)
    if self.name == "normal":
      # SWAR sum of the four bytes.
      pairs = (words & _U32(0x00FF00FF)) + ((words >> 8) & _U32(0x00FF00FF))
      return (pairs & _U32(0xFFFF)) + (pairs >> 16)
    if self.name == "binomial":
      if population_count is not None:
        return population_count(words)
      # popcount on int32: Pallas lowers it to CUDA's __nv_popc; a uint32 operand
      # takes a generic fallback that the Triton compiler rejected on an H200.
      count = jax.lax.population_count(jax.lax.bitcast_convert_type(words, jnp.int32))
      return jax.lax.bitcast_convert_type(count, _U32)
    raise ValueError(f"unknown noise kind {self.name!r}")

  def from_code(self, code: jax.Array) -> jax.Array:
    """Integer-valued float32 ``q`` from a uint32 :meth:`code`."""
    if self.name == "uniform":
      signed = jax.lax.bitcast_convert_type(code, jnp.int32)
      return ((signed >> 7) | 1).astype(jnp.float32)
    if self.name == "rademacher":
      return (1 - 2 * code.astype(jnp.int32)).astype(jnp.float32)
    if self.name == "normal":
      s = (2 * code.astype(jnp.int32) - 1020).astype(jnp.float32)  # centred: sum(2*b - 255)
      return s * (s * s + jnp.float32(_NORMAL_CUBIC))
    if self.name == "binomial":
      ones = jax.lax.bitcast_convert_type(code, jnp.int32) | jnp.int32(_BINOMIAL_BITS)
      return jax.lax.bitcast_convert_type(ones, jnp.float32) - jnp.float32(_BINOMIAL_CENTRE)
    raise ValueError(f"unknown noise kind {self.name!r}")

  def unscaled(self, words: jax.Array, lane: jax.Array | None = None, *,
               population_count=None) -> jax.Array:
    """Integer-valued float32 ``q`` from uint32 ``words`` (and ``lane`` for packed kinds).

    ``population_count`` (``"binomial"`` only): a bit count of uint32 words
    to use instead of ``lax.population_count``, for a backend that has no
    rule for it (Mosaic GPU); it must count the same bits.
    """
    return self.from_code(self.code(words, lane, population_count=population_count))


def _normal_scale() -> float:
  """Exact ``1 / sqrt(E[q**2])`` for the "normal" kind, from the exact law of s."""
  byte_law = np.full(256, 1.0 / 256)
  law = byte_law
  for _ in range(3):
    law = np.convolve(law, byte_law)
  s = -1020.0 + 2.0 * np.arange(law.size)
  q = s * (_NORMAL_CUBIC + s * s)
  return float(np.float32(1.0 / math.sqrt(float(np.sum(law * q * q)))))


KINDS: dict[str, NoiseKind] = {
    "uniform": NoiseKind("uniform", 0, float(np.float32(math.sqrt(12.0) * 2.0**-25))),
    "rademacher": NoiseKind("rademacher", 5, 1.0),
    "normal": NoiseKind("normal", 0, _normal_scale()),
    "binomial": NoiseKind("binomial", 0, float(np.float32(1.0 / math.sqrt(8.0)))),
}
DEFAULT_KIND = "binomial"


def get_kind(kind: str | NoiseKind) -> NoiseKind:
  """Look up a kind by name, with a clear error for unknown names."""
  if isinstance(kind, NoiseKind):
    return kind
  try:
    return KINDS[kind]
  except (KeyError, TypeError):
    raise ValueError(f"kind must be one of {sorted(KINDS)}, got {kind!r}") from None


def word_address(kind: NoiseKind, index_hi, index_lo):
  """Element index -> ``(word_hi, word_lo, lane)`` for ``kind``."""
  shift = kind.log2_values_per_word
  if shift == 0:
    return index_hi, index_lo, None
  word_lo = (index_lo >> shift) | (index_hi << (32 - shift))
  word_hi = index_hi >> shift
  lane = index_lo & _U32((1 << shift) - 1)
  return word_hi, word_lo, lane


def max_word_index(kind: NoiseKind, end_index: int) -> int:
  """Largest word index used by element indices below ``end_index``."""
  return max(end_index - 1, 0) >> kind.log2_values_per_word


def unscaled_noise(seed, index_hi, index_lo, kind: NoiseKind, *, high_word: bool = True):
  """Integer-valued noise ``q`` at element index ``(index_hi, index_lo)``.

  Args:
    seed: uint32 seeds, broadcastable against the index arrays.
    index_hi: uint32 high index words.
    index_lo: uint32 low index words.
    kind: the noise kind.
    high_word: False when every *word* index is known to be below 2**32,
      which makes the stream keys independent of the element (same bits).

  Returns:
    float32 ``q``; the noise is ``q * kind.scale``.
  """
  word_hi, word_lo, lane = word_address(kind, index_hi, index_lo)
  if not high_word:
    word_hi = jnp.zeros((), _U32)
  multiplier, increment = stream_keys(seed, word_hi)
  return kind.unscaled(hash_word(multiplier, increment, word_lo), lane)


def noise_at(seed, index_hi, index_lo, kind, *, high_word: bool = True) -> jax.Array:
  """Noise values (float32, unit variance) at the given element indices."""
  kind = get_kind(kind)
  q = unscaled_noise(seed, index_hi, index_lo, kind, high_word=high_word)
  return q * jnp.float32(kind.scale)


def uniform01(seed, index_hi, index_lo, *, high_word: bool = True) -> jax.Array:
  """Uniform float32 in ``[0, 1)`` (24 bits: ``(word >> 8) * 2**-24``) at an index.

  The stochastic-rounding draw of the ternary counter update; one word per
  index, the same hash as the noise kinds.
  """
  if not high_word:
    index_hi = jnp.zeros((), _U32)
  multiplier, increment = stream_keys(seed, index_hi)
  return uniform01_of_word(hash_word(multiplier, increment, index_lo))


def uniform01_of_word(word: jax.Array) -> jax.Array:
  """The ``[0, 1)`` float32 of :func:`uniform01` from its hashed uint32 word.

  ``(word >> 8) * 2**-24`` computed as ``(word & ~0xFF) * 2**-32``: the same
  value (the masked word has at most 24 significant bits, so its conversion
  is exact), but the mask merges with the finaliser's last xor-shift into one
  logic op where the shift would be one more instruction.
  """
  return (word & _U32(0xFFFFFF00)).astype(jnp.float32) * jnp.float32(2.0**-32)


def uniform01_run_of_keys(multiplier, increment, index_lo, n: int) -> list[jax.Array]:
  """:func:`uniform01` at ``index_lo + j`` for ``j < n`` (high word 0), sharing the product.

  ``multiplier`` and ``increment`` are the stream's keys (:func:`stream_keys`
  at high word 0), which kernels take formed once outside (in XLA) rather
  than hashing the seed in every program. ``(lo + j) * m + c = (lo * m + c) +
  j * m`` modulo 2**32, so a run of ``n`` consecutive indices costs one
  multiply and ``n`` adds before the finaliser. The caller guarantees
  ``index_lo + j`` does not wrap past 2**32.
  """
  base = index_lo * multiplier + increment
  return [uniform01_of_word(mix32(base + _U32(j) * multiplier)) for j in range(n)]


def fits_32_bits(kind: NoiseKind, offset: int, n_elements: int) -> bool:
  """True when all word indices of ``[offset, offset + n_elements)`` are < 2**32."""
  return max_word_index(kind, offset + n_elements) < (1 << 32)


def block_index(offset: int, shape: Sequence[int], rows=None, cols=None):
  """``(hi, lo)`` element indices of a row-major block at ``offset``.

  For a 2-D ``(n_rows, n_cols)`` block, element ``(j, k)`` has index
  ``offset + j * n_cols + k``; ``rows`` / ``cols`` select a sub-tile (uint32
  arrays broadcastable to ``(rows, 1)`` / ``(1, cols)``). A 1-D block is a
  single row.
  """
  if len(shape) == 1:
    n_rows, n_cols = 1, int(shape[0])
  elif len(shape) == 2:
    n_rows, n_cols = int(shape[0]), int(shape[1])
  else:
    raise ValueError(f"block_index takes a 1-D or 2-D shape, got {tuple(shape)}")
  if rows is None:
    rows = jax.lax.broadcasted_iota(_U32, (n_rows, 1), 0)
  if cols is None:
    cols = jax.lax.broadcasted_iota(_U32, (1, n_cols), 1)
  base_hi, base_lo = row_base(offset, rows, n_cols)
  lo = base_lo + cols
  hi = base_hi + (lo < base_lo).astype(_U32)
  if len(shape) == 1:
    return hi.reshape(hi.shape[1:]), lo.reshape(lo.shape[1:])
  return hi, lo


# ----------------------------------------------------------------------------
# Seeds.


def as_seeds(seeds: Any, name: str = "seeds") -> jax.Array:
  """Validate seeds and return them as a 1-D uint32 array.

  uint32 is taken as is; other integer dtypes (int32, int64, uint64, Python
  ints) are wrapped modulo 2**32. Floats and booleans raise ``TypeError``.

  Args:
    seeds: ``(pop,)`` integer array-like.
    name: argument name used in error messages.

  Returns:
    ``(pop,)`` uint32 array.
  """
  if isinstance(seeds, (list, tuple)):
    # operator.index, not int(): int() would truncate floats. Bools are ints to Python.
    for s in seeds:
      if isinstance(s, bool) or not _is_integer_scalar(s):
        raise TypeError(
            f"{name} must be integers (uint32 preferred; signed ints wrap modulo 2**32), "
            f"got an element of type {type(s).__name__} in a {type(seeds).__name__} of "
            f"length {len(seeds)}"
        )
    seeds = np.asarray([operator.index(s) & _MASK32 for s in seeds], dtype=np.uint32)
  dtype = getattr(seeds, "dtype", None)
  if dtype is None:
    seeds = np.asarray(seeds)
    dtype = seeds.dtype
  dtype = np.dtype(dtype)
  if dtype == np.bool_ or not np.issubdtype(dtype, np.integer):
    raise TypeError(
        f"{name} must be an integer array (uint32 preferred; signed ints wrap "
        f"modulo 2**32), got dtype {dtype} with shape {np.shape(seeds)}"
    )
  if np.ndim(seeds) != 1:
    raise ValueError(f"{name} must be 1-D (pop,), got shape {np.shape(seeds)} and dtype {dtype}")
  if np.shape(seeds)[0] == 0:
    raise ValueError(f"{name} must not be empty, got shape {np.shape(seeds)}")
  if isinstance(seeds, np.ndarray):
    # astype wraps modulo 2**32 for every integer dtype.
    return jnp.asarray(seeds.astype(np.uint32))
  if dtype == np.uint32:
    return seeds
  return jax.lax.convert_element_type(seeds, _U32)


def draw_seeds(key: jax.Array, pop_size: int, *, antithetic: bool = False) -> jax.Array:
  """Draw ``(pop_size,)`` uint32 seeds from a ``jax.random`` key.

  With ``antithetic=True``, ``pop_size`` must be even and each pair
  ``(2m, 2m + 1)`` gets the same seed (the ops give them signs +1 and -1).

  Args:
    key: a ``jax.random`` key (typed or raw uint32); anything else raises
      ``TypeError``.
    pop_size: population size (a positive Python int; floats raise ``TypeError``).
    antithetic: duplicate seeds in pairs.

  Returns:
    ``(pop_size,)`` uint32 seeds.

  Example:
    >>> import jax
    >>> seeds = draw_seeds(jax.random.key(0), 4, antithetic=True)
    >>> seeds.shape, bool(seeds[0] == seeds[1])
    ((4,), True)
  """
  if isinstance(pop_size, (bool, np.bool_)) or not _is_integer_scalar(pop_size):
    raise TypeError(f"pop_size must be a Python int, got {type(pop_size).__name__} {pop_size!r}")
  pop_size = operator.index(pop_size)
  if pop_size <= 0:
    raise ValueError(f"pop_size must be positive, got {pop_size}")
  if not hasattr(key, "dtype") or not (jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
                                       or key.dtype == _U32):
    raise TypeError(f"key must be a jax.random key (typed, or raw uint32 key data), got "
                    f"{type(key).__name__} with dtype {getattr(key, 'dtype', None)}")
  if antithetic:
    if pop_size % 2:
      raise ValueError(f"antithetic sampling needs an even pop_size, got {pop_size}")
    half = jax.random.bits(key, (pop_size // 2,), _U32)
    return jnp.repeat(half, 2)
  return jax.random.bits(key, (pop_size,), _U32)


def antithetic_signs(pop_size: int, antithetic: bool) -> jax.Array:
  """``(pop,)`` float32 signs: +1, -1, +1, ... with antithetic pairs, else ones."""
  if not antithetic:
    return jnp.ones((pop_size,), jnp.float32)
  return jnp.where(jnp.arange(pop_size) % 2 == 0, 1.0, -1.0).astype(jnp.float32)


def pair_seeds(seeds: jax.Array, antithetic: bool) -> jax.Array:
  """The seed each individual uses: ``seeds[2m]`` for both members of a pair."""
  if not antithetic:
    return seeds
  return jnp.repeat(seeds[0::2], 2)


# ----------------------------------------------------------------------------
# Materialised noise (reference, tests, small parameters).


def virtual_noise(
    seeds: Any,
    shape: Sequence[int] | int,
    offset: int = 0,
    *,
    kind: str = DEFAULT_KIND,
    antithetic: bool = False,
    rank: int | None = None,
) -> jax.Array:
  """Materialise the noise of a parameter block for a population.

  This is the noise every jaxnoise op uses, written out: element ``e`` (in
  row-major order) of individual ``i`` is ``sign_i * noise(seed_i, offset + e)``.
  With ``rank=r`` the block must be 2-D ``(out, in)`` and the result is the
  low-rank perturbation ``E_i = sign_i * A_i @ B_i.T / sqrt(r)`` (see the
  module's "Low-rank layout" and :func:`low_rank_factors`). It holds
  ``(pop, *shape)`` values, so use it for tests and small parameter blocks;
  the ops never build it.

  Args:
    seeds: ``(pop,)`` seeds (see :func:`as_seeds`).
    shape: the block's shape (any rank; flattened row-major); non-negative
      ints (floats and bools raise ``TypeError``; zero dims give an empty block).
    offset: the block's first element index (a Python int, may exceed 2**32;
      ``offset + size <= 2**64`` or ``ValueError``).
    kind: noise kind.
    antithetic: individuals ``2m`` and ``2m + 1`` use ``seeds[2m]`` with
      signs ``+1`` and ``-1``.
    rank: None for full-rank noise, or a positive int for the low-rank
      perturbation of a 2-D block.

  Returns:
    ``(pop, *shape)`` float32 noise.

  Example:
    >>> import jax.numpy as jnp
    >>> n = virtual_noise(jnp.arange(3, dtype=jnp.uint32), (2, 5), offset=7)
    >>> n.shape
    (3, 2, 5)
    >>> virtual_noise(jnp.arange(3, dtype=jnp.uint32), (4, 6), rank=2).shape
    (3, 4, 6)
  """
  kind = get_kind(kind)
  seeds = as_seeds(seeds)
  shape = check_dims(shape, "shape")
  offset = check_offset(offset)
  rank = check_rank(rank)
  if rank is not None:
    a, b = low_rank_factors(seeds, shape, offset, rank=rank, kind=kind, antithetic=antithetic)
    scale = jnp.float32(1.0 / math.sqrt(rank))
    return jnp.einsum("por,pkr->pok", a, b, precision=jax.lax.Precision.HIGHEST) * scale
  n = math.prod(shape)
  check_block_end(offset, n, "shape")
  # Row-major: any rank is a (rows, last) block with the same flat indices.
  flat_shape = (n // shape[-1], shape[-1]) if len(shape) >= 1 and shape[-1] else (1, n)
  if antithetic:
    _check_even(seeds.shape[0])
  hi, lo = block_index(offset, flat_shape)
  high = not fits_32_bits(kind, offset, n)
  seed_b = pair_seeds(seeds, antithetic)[:, None, None]
  values = noise_at(seed_b, hi[None], lo[None], kind, high_word=high)
  values = values * antithetic_signs(seeds.shape[0], antithetic)[:, None, None]
  return values.reshape((seeds.shape[0],) + shape)


def low_rank_factors(
    seeds: Any,
    shape: Sequence[int],
    offset: int = 0,
    *,
    rank: int,
    kind: str = DEFAULT_KIND,
    antithetic: bool = False,
) -> tuple[jax.Array, jax.Array]:
  """Materialise the low-rank factors ``(A, B)`` of an ``(out, in)`` block.

  ``A[i, j, c]`` is ``sign_i * noise(seed_i, offset + c * (out + in) + j)``
  and ``B[i, k, c]`` is ``noise(seed_i, offset + c * (out + in) + out + k)``
  (the antithetic sign goes on ``A``), so individual ``i``'s perturbation is
  ``A[i] @ B[i].T / sqrt(rank)``.

  Args:
    seeds: ``(pop,)`` seeds (see :func:`as_seeds`).
    shape: ``(out, in)``.
    offset: the block's first element index (a Python int).
    rank: the number of components ``r`` (a positive int).
    kind: noise kind.
    antithetic: pairs share ``seeds[2m]`` with signs ``+1`` and ``-1``.

  Returns:
    ``A`` of shape ``(pop, out, r)`` and ``B`` of shape ``(pop, in, r)``,
    float32.

  Example:
    >>> import jax.numpy as jnp
    >>> a, b = low_rank_factors(jnp.arange(2), (3, 5), rank=4)
    >>> a.shape, b.shape
    ((2, 3, 4), (2, 5, 4))
  """
  kind = get_kind(kind)
  seeds = as_seeds(seeds)
  rank = check_rank(rank)
  if rank is None:
    raise ValueError("low_rank_factors needs a positive int rank, got None")
  out_features, in_features = _matrix_shape(shape)
  offset = check_offset(offset)
  check_block_end(offset, noise_block_size((out_features, in_features), rank), "shape")
  if antithetic:
    _check_even(seeds.shape[0])
  values = factor_block_noise(pair_seeds(seeds, antithetic), offset,
                              (out_features, in_features), rank, kind)
  values = jnp.swapaxes(values, 1, 2)
  signs = antithetic_signs(seeds.shape[0], antithetic)[:, None, None]
  return values[:, :out_features] * signs, values[:, out_features:]


def factor_block_noise(seeds: jax.Array, offset: int, shape: tuple[int, int], rank: int,
                       kind: NoiseKind) -> jax.Array:
  """The ``(pop, r, out + in)`` factor block of a low-rank ``(out, in)`` block, unsigned.

  Row ``c`` of individual ``i`` is ``[A_i[:, c], B_i[:, c]]`` (see "Low-rank
  layout"); ``seeds`` are validated uint32 and ``kind`` a :class:`NoiseKind`.
  The one construction behind :func:`low_rank_factors` and the reference ops.
  """
  width = shape[0] + shape[1]
  hi, lo = block_index(offset, (rank, width))
  high = not fits_32_bits(kind, offset, rank * width)
  return noise_at(seeds[:, None, None], hi[None], lo[None], kind, high_word=high)


def check_rank(rank: Any, name: str = "rank") -> int | None:
  """None (full rank) or a positive Python int; raises a named error otherwise."""
  if rank is None:
    return None
  if isinstance(rank, (bool, np.bool_)) or not _is_integer_scalar(rank):
    raise TypeError(f"{name} must be None (full rank) or a positive int, got "
                    f"{type(rank).__name__} {rank!r}")
  value = operator.index(rank)
  if value <= 0:
    raise ValueError(f"{name} must be None (full rank) or a positive int, got {value}")
  return value


def noise_block_size(shape: Sequence[int] | int, rank: int | None = None) -> int:
  """Element indices a parameter block owns: ``prod(shape)``, or ``r * (out + in)``.

  A block with a rank must be 2-D ``(out, in)``.

  Example:
    >>> noise_block_size((256, 784)), noise_block_size((256, 784), rank=4)
    (200704, 4160)
  """
  shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
  if rank is None:
    return math.prod(int(d) for d in shape)
  out_features, in_features = _matrix_shape(shape)
  return int(rank) * (out_features + in_features)


def _matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
  shape = tuple(shape)
  if len(shape) != 2:
    raise ValueError(f"a low-rank block must be 2-D (out, in), got shape {shape}")
  return int(shape[0]), int(shape[1])


def check_offset(offset: Any, name: str = "offset") -> int:
  """Offsets are non-negative Python ints below 2**64 (bools are rejected)."""
  if isinstance(offset, (bool, np.bool_)):
    raise TypeError(f"{name} must be a Python int (a static element index), got bool")
  try:
    value = operator.index(offset)
  except TypeError:
    raise TypeError(
        f"{name} must be a Python int (a static element index), got {type(offset).__name__}"
    ) from None
  if value < 0 or value >= 1 << 64:
    raise ValueError(f"{name} must be in [0, 2**64), got {value}")
  return value


def check_dims(shape: Any, name: str = "shape") -> tuple[int, ...]:
  """A block shape: a tuple of non-negative Python ints (an int is a 1-D shape).

  Floats (``2.7``), bools and negative dims raise, naming ``name``; zero
  dims are allowed (an empty block).
  """
  if _is_integer_scalar(shape) and not isinstance(shape, (bool, np.bool_)):
    shape = (shape,)
  try:
    dims = tuple(shape)
  except TypeError:
    raise TypeError(f"{name} must be a tuple of ints, got {type(shape).__name__} "
                    f"{shape!r}") from None
  for d in dims:
    if isinstance(d, (bool, np.bool_)) or not _is_integer_scalar(d):
      raise TypeError(f"{name} must be a tuple of ints, got {shape!r} (element of type "
                      f"{type(d).__name__})")
  dims = tuple(operator.index(d) for d in dims)
  if any(d < 0 for d in dims):
    raise ValueError(f"{name} must have non-negative dimensions, got {dims}")
  return dims


def check_block_end(offset: int, n_elements: int, name: str = "shape") -> None:
  """A block's indices ``offset .. offset + n_elements - 1`` must stay below 2**64.

  Indices are 64-bit; a block that ran past 2**64 would wrap around onto the
  noise of index 0 silently, so it raises (naming ``name`` and the offset).
  """
  if offset + n_elements > 1 << 64:
    raise ValueError(
        f"offset + size must be <= 2**64 (indices are 64-bit and would wrap around): offset="
        f"{offset}, {name} holds {n_elements} elements, offset + size - 2**64 = "
        f"{offset + n_elements - (1 << 64)}")


def _is_integer_scalar(value: Any) -> bool:
  """An int-like scalar (Python / numpy / 0-d array int), not a float or bool."""
  try:
    operator.index(value)
  except TypeError:
    return False
  return True


def _check_even(pop_size: int) -> None:
  if pop_size % 2:
    raise ValueError(f"antithetic=True needs an even population, got {pop_size} seeds")
