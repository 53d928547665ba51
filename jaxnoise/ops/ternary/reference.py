"""Pure-JAX reference of the ternary counter ops (the CPU path and the test oracle).

Counter state (SPEC section 3)
------------------------------
A weight row of ``in`` entries is ``in`` 6-bit counters ("codes") ``c`` in
``[0, 3 * lv)`` with ``lv = 2 * C - 1`` and ``C`` in ``1..11``. A code's
ternary value is ``t = c // lv - 1`` (one of -1, 0, +1) and its latent
position is ``p = (c + 0.5) / lv - 1.5`` (in ``(-1.5, 1.5)``); the weight
is ``scale[row] * t``. Four codes of a row group ``m`` (columns ``4m..4m+3``)
are packed into three bytes::

    b0 = c0 | c1 << 6,   b1 = c1 >> 2 | c2 << 4,   b2 = c2 >> 4 | c3 << 2

(low 8 bits each), so a ``(out, in)`` matrix is stored as ``(out, 3 * in // 4)``
uint8: 0.75 byte per weight.

Codes ``>= 3 * lv`` cannot come out of :func:`pack_codes_reference` with a
checked ``C`` or out of an update, but a hand-made byte array may hold them;
every op then *saturates* them to ``t = +1`` (``t`` is computed as
``(c >= lv) + (c >= 2 * lv) - 1``), and an update clips them back into range.

Update
------
For a row with gradient ``g`` (``in`` values), old scale ``s`` and RMS state
``v`` (see SPEC section 3)::

    v'     = beta * v + (1 - beta) * mean(g**2)
    d      = max(sqrt(v if lagged else v'), eps)
    grad_s = sum(g * t) / sqrt(in)
    s'     = clip(s - lr_scale * grad_s, 1e-5, 10)
    p'     = p * (s / s') - lr * g / d
    c'     = clip(floor((p' + 1.5) * lv - 0.5 + u), 0, 3 * lv - 1)

with ``u`` in ``[0, 1)`` from :func:`jaxnoise.noise.uniform01` at
``(seed, row * in + col)``. Substituting ``p`` gives the identical real-valued
target in *code units*::

    (p' + 1.5) * lv - 0.5 = c + delta,
    delta = (s / s' - 1) * (c + 0.5 - 1.5 * lv) - (lr * lv / d) * g

and the ops compute ``c' = clip(c + floor(delta + u), 0, 3 * lv - 1)``. The
two forms are equal in exact arithmetic; this one is also exact in float32
where it matters: with ``g = 0`` and ``s' = s`` the step ``delta`` is exactly
0 and ``floor(u) = 0``, so every code is unchanged, whereas the literal form
rounds ``c + u`` up to ``c + 1`` when ``u`` is within one float32 ulp of 1.
``E[floor(delta + u)] = delta`` (to ``2**-24``), so the rounding is unbiased.

Non-finite gradients
--------------------
A row whose statistics ``mean(g**2)`` or ``sum(g * t)`` are not finite (any
NaN or inf in ``g``, or an overflowing sum of squares) is *skipped*: its
codes, scale and ``v`` are returned unchanged, and it is counted in the
``skipped_rows`` output. A NaN gradient therefore never reaches the state.
Rows whose own state is invalid (``scale <= 0``, ``v < 0``, NaN or inf), and
rows whose step or scale ratio is not finite (a traced NaN or inf
hyperparameter), are skipped and counted the same way.

Inputs are assumed validated by :mod:`jaxnoise.ops.ternary.api`.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jaxnoise import noise as noise_lib

_F32 = jnp.float32
_HIGHEST = jax.lax.Precision.HIGHEST
SCALE_MIN = 1e-5
SCALE_MAX = 10.0
C_MIN, C_MAX = 1, 11


def levels(C: int) -> int:
  """``lv = 2 * C - 1``: codes per ternary bucket."""
  return 2 * C - 1


def n_codes(C: int) -> int:
  """Number of valid codes ``3 * lv`` (at most 63, so a code fits 6 bits)."""
  return 3 * levels(C)


# ----------------------------------------------------------------------------
# Shared element math. The Pallas kernels call these same functions on their
# tiles, so the reference and the kernels share one definition of every
# formula (only the order of the row reductions differs).


def pack_group(c0, c1, c2, c3):
  """Four integer code arrays (values in [0, 64)) -> three byte arrays (values in [0, 256)).

  The shifted codes' bits do not overlap, so they are added (one shift-add
  instruction each on a GPU) rather than or-ed.
  """
  b0 = (c0 + (c1 << 6)) & 0xFF
  b1 = ((c1 >> 2) + (c2 << 4)) & 0xFF
  b2 = ((c2 >> 4) + (c3 << 2)) & 0xFF
  return b0, b1, b2


def unpack_group(b0, b1, b2):
  """Three int32 byte arrays -> four int32 code arrays (values in [0, 64))."""
  c0 = b0 & 0x3F
  c1 = ((b0 >> 6) | (b1 << 2)) & 0x3F
  c2 = ((b1 >> 4) | (b2 << 4)) & 0x3F
  c3 = (b2 >> 2) & 0x3F
  return c0, c1, c2, c3


# A row's packed bytes are a little-endian 6-bit stream: code ``j`` of a row
# is bits ``6j .. 6j + 5`` (the byte formulas above are that stream cut into
# bytes). Cut into uint32 words instead (rows of ``in % 16 == 0`` start on a
# word), 16 codes are 3 words and code ``j`` is bits ``6j % 32`` onwards of
# word ``6j // 32``; codes 5 and 10 straddle two words.
CODES_PER_WORD_GROUP = 16


def unpack_words(w0, w1, w2):
  """Three uint32 word arrays -> sixteen int32 code arrays (values in [0, 64))."""
  words = (w0, w1, w2)
  codes = []
  for j in range(CODES_PER_WORD_GROUP):
    word, bit = divmod(6 * j, 32)
    value = words[word] >> bit
    if bit > 26:  # straddles into the next word
      value = value | (words[word + 1] << (32 - bit))
    codes.append((value & 0x3F).astype(jnp.int32))
  return codes


# The ternary value of a packed field in float adds (the packed matmul's
# multiply-add tiles), with no integer compare or select. A positive float32's bits
# order it as an unsigned integer orders them, so a 6-bit field at bits b..b+5 <= 29
# of a uint32, or-ed with base bits that miss the field (:func:`ramp_base`), is a
# float32 F(c) that increases with the code c. The base makes consecutive values at
# least 1 apart, so c >= k iff F(c) - F(k - 1) >= 1, and the difference is <= 0
# otherwise, exactly or not (rounding keeps a real >= 1 at >= 1 and one <= 0 at
# <= 0): clamped to [0, 1], one add gives the bucket bit. Compiled that add is one
# saturated ``add.f32`` with an immediate; interpreted, an add and a clip.
_RAMP_TOP_BIT = 24  # highest bit at which a 6-bit field ends at or below bit 29


RAMP_BASES = (0x4B000000, 0x60000000, 0x40000000)


def ramp_base_index(bit: int) -> int:
  """Which of :data:`RAMP_BASES` is or-ed with the field at ``bit`` (<= 24).

  The base is exponent bits that miss the field: ``0x4B000000`` (2**23: a field
  at bits <= 18 weighs at least 1 per code), ``0x60000000`` for fields at 19-22
  (values from 2**65 up), ``0x40000000`` above (the field is all exponent:
  ``2**(1 + 2c)`` at bit 24).
  """
  assert 0 <= bit <= _RAMP_TOP_BIT, bit
  if bit <= 18:
    return 0
  return 1 if bit <= 22 else 2


def ramp_base(bit: int) -> int:
  """The base bits of the field at ``bit`` (:func:`ramp_base_index`)."""
  return RAMP_BASES[ramp_base_index(bit)]


def _field_floats(bit: int) -> np.ndarray:
  """float32 ``F(c)`` for c = 0..63 of a field at ``bit``."""
  bits = (np.arange(64, dtype=np.uint64) << np.uint64(bit)) | np.uint64(ramp_base(bit))
  return bits.astype(np.uint32).view(np.float32)


@functools.cache
def ramp_offset(bit: int, threshold: int, above: bool) -> float:
  """float32 ``o``: ``clip(F(c) + o, 0, 1)`` is ``c >= threshold`` (``above``), and
  ``clip(o - F(c), 0, 1)`` is ``c < threshold`` (else), for every code c of a field at ``bit``.

  Checked for all 64 codes in float32 here.
  """
  assert 1 <= threshold <= 63, threshold
  values = _field_floats(bit)
  assert np.all(np.isfinite(values)) and np.all(np.diff(values.astype(np.float64)) >= 1), bit
  codes = np.arange(64)
  if above:
    offset = -values[threshold - 1]
    got, want = values + offset, codes >= threshold
  else:
    offset = values[threshold]
    got, want = offset - values, codes < threshold
  got = np.clip(got, np.float32(0), np.float32(1))
  assert np.array_equal(got, want.astype(np.float32)), (bit, threshold, above)
  return float(offset)


def clip_add(value, offset: float, negate: bool):
  """``clip(offset +- value, 0, 1)`` in float32 (the reference of a saturated add)."""
  total = _F32(offset) - value if negate else value + _F32(offset)
  return jnp.clip(total, _F32(0.0), _F32(1.0))


def field_ternary(field, bit: int, C: int, saturated_add=clip_add, bases=RAMP_BASES):
  """float32 ternary value of the code at ``bit`` (<= 24) of a uint32, by two clamped adds.

  ``field`` may hold other bits: it is masked here. ``t = [c >= lv] - [c < 2 lv]``
  (codes past the valid range saturate to +1, as :func:`ternary_of`);
  ``saturated_add(value, offset, negate)`` is :func:`clip_add` or a kernel's
  one ``add.rn.sat.f32``. ``bases`` is :data:`RAMP_BASES`, which a kernel
  passes as data: the compiler then keeps them in registers and masks and
  biases a field in one logic instruction (with two constants it emits two).
  """
  lv = levels(C)
  masked = field & jnp.uint32(0x3F << bit)
  base = jnp.asarray(bases[ramp_base_index(bit)], jnp.uint32)
  ramp = jax.lax.bitcast_convert_type(masked | base, _F32)
  at_least_lv = saturated_add(ramp, ramp_offset(bit, lv, True), False)
  below_2lv = saturated_add(ramp, ramp_offset(bit, 2 * lv, False), True)
  return at_least_lv - below_2lv


def word_ternary(w0, w1, w2, C: int, saturated_add=clip_add, bases=RAMP_BASES):
  """float32 ternary values of the 16 codes of three uint32 words (:func:`field_ternary`).

  Codes ending at or below bit 29 of a word are read in place; the two that
  straddle words and the one at bits 26-31 are unpacked first. Equal to
  ``ternary_of(unpack_words(...))`` exactly.
  """
  words = (w0, w1, w2)
  codes = None
  values = []
  for j in range(CODES_PER_WORD_GROUP):
    word, bit = divmod(6 * j, 32)
    if bit > _RAMP_TOP_BIT:
      if codes is None:
        codes = unpack_words(w0, w1, w2)
      values.append(field_ternary(codes[j].astype(jnp.uint32), 0, C, saturated_add, bases))
    else:
      values.append(field_ternary(words[word], bit, C, saturated_add, bases))
  return values


def group_ternary(b0, b1, b2, C: int, saturated_add=clip_add, bases=RAMP_BASES):
  """float32 ternary values of the 4 codes of three bytes (uint32 arrays below 256).

  The bytes are joined into one 24-bit stream (codes at bits 0, 6, 12 and 18),
  each code read in place (:func:`field_ternary`).
  """
  stream = b0 + (b1 << 8) + (b2 << 16)
  return [field_ternary(stream, bit, C, saturated_add, bases) for bit in (0, 6, 12, 18)]


# A code's centre ``c + 0.5 - 1.5 lv`` (:func:`code_center`) read straight from
# its packed field: a 6-bit field at bit ``b <= 17`` of a uint32 lies inside a
# float32 mantissa, so ``bitcast(0x4B000000 | field)`` is ``2**23 + c * 2**b``
# exactly, and one exact subtraction leaves the centre scaled by ``2**b`` (no
# unpack, no shift, no conversion). The scale folds into the constants that
# meet the centre: ``2**-b / lv`` for ``t`` and ``ratio * 2**-b`` (formed once
# per row, exact) for the tick, so the products are those of the centre.
FLOAT_BIAS_BITS = 0x4B000000  # bitcast to float32: 2**23
_IN_MANTISSA_TOP = 17  # highest bit at which a 6-bit field still lies inside the mantissa
_HIGH_FIELD_SHIFT = 16  # fields above bit 17 are moved down by this (to bits 2..10)


def field_center(word, bit: int, C: int, bias_bits=FLOAT_BIAS_BITS):
  """float32 ``(c + 0.5 - 1.5 lv) * 2**bit``: the centre of the code at ``bit`` (<= 17) of a uint32.

  Exact: ``2**23 + c * 2**bit`` and ``2**23 + (1.5 lv - 0.5) * 2**bit`` are
  integers below ``2**24`` (``1.5 lv - 0.5`` is an integer, ``lv`` being
  odd). ``bias_bits`` is ``0x4B000000``; a kernel passes it as data
  (:func:`kernel_words`), so the compiler keeps it in a register and masks and
  biases the field in one logic instruction (with two constants it emits two).
  """
  assert 0 <= bit <= _IN_MANTISSA_TOP, bit
  field = word & jnp.uint32(0x3F << bit)
  biased = jax.lax.bitcast_convert_type(field | jnp.asarray(bias_bits, jnp.uint32), _F32)
  return biased - _F32(8388608.0 + (1.5 * levels(C) - 0.5) * 2**bit)


def word_centers(w0, w1, w2, C: int, bias_bits=FLOAT_BIAS_BITS):
  """``(centre * 2**shift, shift)`` of the 16 codes of three uint32 words, without unpacking.

  Codes at bits 0-17 of a word are read in place (:func:`field_center`);
  those higher up from the word shifted down by 16 (one shift per word,
  shared by its high codes); the two that straddle words from the
  funnel-shifted pair. ``centre`` is :func:`code_center` of
  :func:`unpack_words`'s code, exactly.
  """
  words = (w0, w1, w2)
  high = {}
  centers = []
  for j in range(CODES_PER_WORD_GROUP):
    word, bit = divmod(6 * j, 32)
    if bit > 26:  # straddles into the next word
      value = (words[word] >> bit) | (words[word + 1] << (32 - bit))
      centers.append((field_center(value, 0, C, bias_bits), 0))
    elif bit > _IN_MANTISSA_TOP:
      if word not in high:
        high[word] = words[word] >> _HIGH_FIELD_SHIFT
      shift = bit - _HIGH_FIELD_SHIFT
      centers.append((field_center(high[word], shift, C, bias_bits), shift))
    else:
      centers.append((field_center(words[word], bit, C, bias_bits), bit))
  return centers


def group_centers(b0, b1, b2, C: int, bias_bits=FLOAT_BIAS_BITS):
  """``(centre * 2**shift, shift)`` of the 4 codes of three bytes (uint32 arrays below 256).

  The bytes are joined into one 24-bit stream ``b0 + b1 * 2**8 + b2 * 2**16``
  (codes at bits 0, 6, 12 and 18); the last code is read in place from ``b2``.
  """
  stream = b0 + (b1 << 8) + (b2 << 16)
  return [(field_center(stream, bit, C, bias_bits), bit) for bit in (0, 6, 12)] + [
      (field_center(b2, 2, C, bias_bits), 2)]


_ROUNDING_BIAS = 12582912.0  # 1.5 * 2**23: a float32 in (-2**22, 2**22) plus this is rounded


def ternary_of_center(center, shift: int, C: int):
  """float32 ternary value ``t`` of a code from its centre scaled by ``2**shift``, without compares.

  ``t = c // lv - 1`` is the centre over ``lv`` rounded to the nearest integer
  (the centre is an integer, so the quotient is at least ``0.5 / lv`` from a
  tie), capped at ``+1`` so codes past the range saturate as :func:`ternary_of`
  does. Adding ``1.5 * 2**23`` rounds (one multiply-add with the division by
  ``2**shift * lv``), the cap is taken on the biased value and one add
  removes the bias: three float ops, and a row sum takes ``g * t`` as one more
  multiply-add (exact, ``t`` being -1, 0 or +1). The cap sits between the two
  bias terms so that XLA's simplifier (the interpreter runs kernels through
  XLA) cannot cancel them as it does ``(x + b) - b``.
  """
  biased = center * _F32(2.0**-shift / levels(C)) + _F32(_ROUNDING_BIAS)
  return jnp.minimum(biased, _F32(_ROUNDING_BIAS + 1.0)) - _F32(_ROUNDING_BIAS)


def pack_words(codes):
  """Sixteen integer code arrays (values in [0, 64)) -> three uint32 word arrays.

  Fields do not overlap, so each shifted code is added to its word (one
  shift-add instruction on a GPU) rather than or-ed.
  """
  words = [None, None, None]
  for j, code in enumerate(codes):
    code = code.astype(jnp.uint32)
    word, bit = divmod(6 * j, 32)
    part = code << bit
    words[word] = part if words[word] is None else words[word] + part
    if bit > 26:
      words[word + 1] = code >> (32 - bit)
  return tuple(words)


def ternary_of(codes, C: int):
  """int32 ternary value ``c // lv - 1`` (codes >= 3 * lv saturate to +1)."""
  lv = levels(C)
  return (codes >= lv).astype(jnp.int32) + (codes >= 2 * lv).astype(jnp.int32) - 1


def ternary_float(codes, C: int):
  """float32 ternary value of int32 codes, with selects instead of a conversion (same values)."""
  lv = levels(C)
  return jnp.where(codes >= 2 * lv, _F32(1.0), jnp.where(codes >= lv, _F32(0.0), _F32(-1.0)))


def float_of_code(codes):
  """float32 of int32 codes in ``[0, 2**22)``: ``bitcast(2**23 + c) - 2**23``, exact, no conversion."""
  biased = jax.lax.bitcast_convert_type(codes | 0x4B000000, jnp.float32)
  return biased - _F32(8388608.0)


def code_of_latent(latent, C: int):
  """Nearest code to a latent position (float32): ``round((p + 1.5) * lv - 0.5)``."""
  lv = levels(C)
  position = (jnp.clip(latent, -1.5, 1.5) + 1.5) * lv - 0.5
  return jnp.clip(jnp.floor(position + 0.5), 0, 3 * lv - 1).astype(jnp.int32)


def is_finite(value):
  """``isfinite`` as a comparison (NaN compares false), as the kernels compute it."""
  return jnp.abs(value) < jnp.inf


def row_update(sum_sq, sum_gt, scale, v, hyper, *, in_features: int, C: int, lagged: bool):
  """Per-row part of the update, from the row's reductions.

  Args:
    sum_sq: float32 ``sum(g**2)`` per row.
    sum_gt: float32 ``sum(g * t)`` per row.
    scale: float32 old scale ``s``.
    v: float32 old RMS state.
    hyper: float32 ``(4,)`` ``[lr, lr_scale, rms_beta, rms_eps]`` (or a
      sequence of four float32 scalars).
    in_features: the row length.
    C: counter half-width.
    lagged: use the old ``v`` in the denominator.

  Returns:
    ``(scale_out, v_out, ratio, step, active)``: the new scale and state
    (unchanged on skipped rows), ``s / s'``, ``lr * lv / d`` and a bool
    that is False on rows skipped for a non-finite gradient or an invalid
    ``scale`` / ``v``.
  """
  lr, lr_scale, beta, eps = hyper[0], hyper[1], hyper[2], hyper[3]
  lv = levels(C)
  mean_sq = sum_sq * _F32(1.0 / in_features)
  v_new = beta * v + (_F32(1.0) - beta) * mean_sq
  denom = jnp.maximum(jnp.sqrt(v if lagged else v_new), eps)
  grad_scale = sum_gt * _F32(1.0 / math.sqrt(in_features))
  scale_new = jnp.clip(scale - lr_scale * grad_scale, _F32(SCALE_MIN), _F32(SCALE_MAX))
  # A row with an invalid state (scale <= 0, v < 0, NaN or inf: only from
  # hand-made or traced state; the API rejects concrete ones) is skipped too.
  ratio = scale / scale_new
  step = (lr * _F32(lv)) / denom
  # A non-finite step or ratio (only from traced non-finite hyperparameters:
  # the API rejects concrete ones) skips the row as well.
  active = (is_finite(sum_sq) & is_finite(sum_gt) & (scale > 0) & is_finite(scale)
            & (v >= 0) & is_finite(v) & is_finite(step) & is_finite(ratio))
  scale_out = jnp.where(active, scale_new, scale)
  v_out = jnp.where(active, v_new, v)
  return scale_out, v_out, ratio, step, active


def code_center(codes, C: int):
  """float32 ``c + 0.5 - 1.5 * lv`` of int32 codes in ``[0, 64)``, exactly, without a conversion.

  ``bitcast(2**23 | c)`` is ``2**23 + c`` exactly, and ``2**23 + 1.5 * lv - 0.5``
  is an integer (``lv`` is odd) below ``2**24``, so the one subtraction is exact.
  """
  biased = jax.lax.bitcast_convert_type(codes | 0x4B000000, jnp.float32)
  return biased - _F32(8388608.0 + 1.5 * levels(C) - 0.5)


def rounded_target(center, grad, u, ratio, step, C: int):
  """float32 new code before its floor (:func:`tick`), clipped to ``[0, 3 lv - 1]``.

  ``clip(ratio center + (1.5 lv - 0.5) - step g + u, 0, 3 lv - 1)``, where
  ``center`` is :func:`code_center`, or a centre scaled by ``2**b`` met by
  ``ratio * 2**-b`` (the same product, exactly).
  """
  lv = levels(C)
  z = ratio * center + _F32(1.5 * lv - 0.5) - step * grad.astype(_F32) + u
  return jnp.clip(z, _F32(0.0), _F32(3 * lv - 1))


def tick(codes, grad, u, ratio, step, active, C: int):
  """New int32 codes: SPEC's ``clip(floor((p' + 1.5) lv - 0.5 + u), 0, 3lv - 1)`` on active rows.

  With ``p = (c + 0.5) / lv - 1.5`` the rounded quantity is
  ``ratio (c + 0.5 - 1.5 lv) + (1.5 lv - 0.5) - step g + u``: the code's
  centre ``p lv`` under the rescale ``ratio = s / s'``, shifted back to code
  units (``1.5 lv - 0.5`` is an integer as ``lv`` is odd, so an unchanged
  scale gives back ``c`` exactly), the gradient step and the draw.
  It is clipped to ``[0, 3lv - 1]`` *before* the floor (the same codes, as
  the bounds are integers), so the floor of a non-negative value is a plain
  float -> int truncation (no floor, no magic-number add).

  ``codes``, ``grad`` and ``u`` are element arrays; ``ratio``, ``step``
  and ``active`` broadcast against them (per row); ``active=None`` returns
  the moved codes of every row (a kernel that skips the store of inactive
  rows instead). On active rows every term is finite (:func:`row_update`
  checks the row's step and ratio).
  """
  moved = rounded_target(code_center(codes, C), grad, u, ratio, step, C).astype(jnp.int32)
  if active is None:
    return moved
  return jnp.where(active, moved, codes)


def element_index(rows, cols, in_features: int, high_word: bool):
  """``(hi, lo)`` uint32 words of ``row * in + col`` (rows ``(r, 1)``, cols ``(1, k)``)."""
  rows = rows.astype(jnp.uint32)
  cols = cols.astype(jnp.uint32)
  if not high_word:
    return None, rows * jnp.uint32(in_features) + cols
  base_hi, base_lo = noise_lib.row_base(0, rows, in_features)
  lo = base_lo + cols
  hi = base_hi + (lo < base_lo).astype(jnp.uint32)
  return hi, lo


def rounding_draw(seed, rows, cols, in_features: int, high_word: bool):
  """``u`` in ``[0, 1)`` at ``(seed, row * in + col)`` (the stochastic-rounding draw)."""
  hi, lo = element_index(rows, cols, in_features, high_word)
  if not high_word:
    return noise_lib.uniform01(seed, jnp.uint32(0), lo, high_word=False)
  return noise_lib.uniform01(seed, hi, lo, high_word=True)


def kernel_words(seed):
  """uint32 ``(4,)`` the update kernels take: ``[seed, multiplier, increment, 0x4B000000]``.

  The draw's stream keys at high word 0, formed once (in XLA) rather than in
  every program, so the kernels hash no seed (:func:`rounding_draw_run`; the
  seed itself serves the 64-bit index path), and the float bias of
  :func:`field_center` as data.
  """
  seed = jnp.asarray(seed, jnp.uint32).reshape(())
  multiplier, increment = noise_lib.stream_keys(seed, jnp.zeros((), jnp.uint32))
  return jnp.stack([seed, multiplier, increment, jnp.uint32(FLOAT_BIAS_BITS)])


def rounding_draw_run(stream, rows, first_cols, n: int, in_features: int, high_word: bool):
  """:func:`rounding_draw` at columns ``first_cols + j`` for ``j < n`` (a list of ``n`` arrays).

  ``stream`` is ``(seed, multiplier, increment)`` (:func:`kernel_words`).
  The kernels draw a unit's ``n`` consecutive columns at once; without the
  high word the hash's index product is shared
  (:func:`noise.uniform01_run_of_keys`).
  """
  seed, multiplier, increment = stream
  if high_word:
    return [rounding_draw(seed, rows, first_cols + jnp.uint32(j), in_features, True)
            for j in range(n)]
  _, lo = element_index(rows, first_cols, in_features, False)
  return noise_lib.uniform01_run_of_keys(multiplier, increment, lo, n)


def needs_high_word(out_features: int, in_features: int) -> bool:
  """True when some index ``row * in + col`` is 2**32 or more."""
  return out_features * in_features > (1 << 32)


# ----------------------------------------------------------------------------
# Reference ops.


def pack_codes_reference(codes: jax.Array) -> jax.Array:
  """``(out, in)`` integer codes -> ``(out, 3 * in // 4)`` uint8 (low 6 bits kept)."""
  out_features, in_features = codes.shape
  groups = codes.astype(jnp.int32).reshape(out_features, in_features // 4, 4) & 0x3F
  b0, b1, b2 = pack_group(groups[..., 0], groups[..., 1], groups[..., 2], groups[..., 3])
  packed = jnp.stack([b0, b1, b2], axis=-1).astype(jnp.uint8)
  return packed.reshape(out_features, 3 * (in_features // 4))


def unpack_codes_reference(packed: jax.Array) -> jax.Array:
  """``(out, 3 * in // 4)`` uint8 -> ``(out, in)`` uint8 codes."""
  out_features, n_bytes = packed.shape
  groups = packed.astype(jnp.int32).reshape(out_features, n_bytes // 3, 3)
  codes = unpack_group(groups[..., 0], groups[..., 1], groups[..., 2])
  return jnp.stack(codes, axis=-1).reshape(out_features, 4 * (n_bytes // 3)).astype(jnp.uint8)


def absmean_scale(weight: jax.Array) -> jax.Array:
  """Per-row ``mean(|w|)`` clipped to ``[1e-5, 10]`` (float32)."""
  scale = jnp.mean(jnp.abs(weight.astype(_F32)), axis=1)
  return jnp.clip(scale, _F32(SCALE_MIN), _F32(SCALE_MAX))


def ternary_init_reference(weight: jax.Array, C: int) -> tuple[jax.Array, jax.Array]:
  """Absmean ternary init: ``scale = mean|w|`` per row, code nearest ``w / scale``."""
  scale = absmean_scale(weight)
  latent = weight.astype(_F32) / scale[:, None]
  return pack_codes_reference(code_of_latent(latent, C)), scale


def ternary_decode_reference(packed: jax.Array, scale: jax.Array, C: int,
                             dtype=jnp.float32) -> jax.Array:
  """``(out, in)`` weights ``scale[row] * t`` in ``dtype``."""
  codes = unpack_codes_reference(packed).astype(jnp.int32)
  t = ternary_of(codes, C).astype(_F32)
  return (t * scale.astype(_F32)[:, None]).astype(dtype)


def counter_update_reference(
    packed: jax.Array,
    scale: jax.Array,
    v: jax.Array,
    grad_w: jax.Array,
    hyper: jax.Array,
    seed: jax.Array,
    *,
    C: int,
    lagged: bool,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """The counter update of SPEC section 3 on a dense ``(out, in)`` gradient.

  Args:
    packed: ``(out, 3 * in // 4)`` uint8 codes.
    scale: ``(out,)`` float32.
    v: ``(out,)`` float32 RMS state.
    grad_w: ``(out, in)`` float gradient.
    hyper: ``(4,)`` float32 ``[lr, lr_scale, rms_beta, rms_eps]``.
    seed: uint32 scalar.
    C: counter half-width.
    lagged: use the previous ``v`` in the denominator.

  Returns:
    ``(packed, scale, v, skipped)``; ``skipped`` is ``(out,)`` bool, True on
    rows left unchanged because their gradient was not finite.
  """
  out_features, in_features = grad_w.shape
  codes = unpack_codes_reference(packed).astype(jnp.int32)
  grad = grad_w.astype(_F32)
  t = ternary_of(codes, C).astype(_F32)
  sum_sq = jnp.sum(grad * grad, axis=1)
  sum_gt = jnp.sum(grad * t, axis=1)
  scale_out, v_out, ratio, step, active = row_update(
      sum_sq, sum_gt, scale, v, hyper, in_features=in_features, C=C, lagged=lagged)
  rows = jax.lax.broadcasted_iota(jnp.uint32, (out_features, 1), 0)
  cols = jax.lax.broadcasted_iota(jnp.uint32, (1, in_features), 1)
  u = rounding_draw(seed, rows, cols, in_features, needs_high_word(out_features, in_features))
  new_codes = tick(codes, grad, u, ratio[:, None], step[:, None], active[:, None], C)
  return pack_codes_reference(new_codes), scale_out, v_out, ~active


def io_weight_gradient(x: jax.Array, grad_out: jax.Array) -> jax.Array:
  """``grad_out^T @ x`` in float32: the ``(out, in)`` weight gradient of a linear layer."""
  return jnp.einsum("mo,mi->oi", grad_out.astype(_F32), x.astype(_F32), precision=_HIGHEST)


def counter_update_from_io_reference(packed, scale, v, x, grad_out, hyper, seed, *, C: int,
                                     lagged: bool):
  """:func:`counter_update_reference` with ``grad_w = grad_out^T x`` (formed densely here)."""
  return counter_update_reference(packed, scale, v, io_weight_gradient(x, grad_out), hyper, seed,
                                  C=C, lagged=lagged)


def ternary_matmul_reference(x: jax.Array, packed: jax.Array, scale: jax.Array, *, C: int,
                             out_dtype=None) -> jax.Array:
  """``y = x @ (scale * t)^T`` with float32 accumulation; ``x`` is ``(M, in)``."""
  out_dtype = x.dtype if out_dtype is None else out_dtype
  t = ternary_of(unpack_codes_reference(packed).astype(jnp.int32), C).astype(_F32)
  y = jnp.einsum("mi,oi->mo", x.astype(_F32), t, precision=_HIGHEST)
  return (y * scale.astype(_F32)[None, :]).astype(out_dtype)


def ternary_matmul_input_grad_reference(grad_y: jax.Array, packed: jax.Array, scale: jax.Array,
                                        *, C: int, out_dtype=jnp.float32) -> jax.Array:
  """``grad_x = (grad_y * scale) @ t``: ``(M, out) -> (M, in)``."""
  t = ternary_of(unpack_codes_reference(packed).astype(jnp.int32), C).astype(_F32)
  scaled = grad_y.astype(_F32) * scale.astype(_F32)[None, :]
  return jnp.einsum("mo,oi->mi", scaled, t, precision=_HIGHEST).astype(out_dtype)
