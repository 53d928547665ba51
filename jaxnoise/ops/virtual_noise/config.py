"""Kernel configurations of the virtual-noise ops, with heuristic defaults.

Each config is a frozen (hashable) dataclass, so it can be a static argument
and an autotuning cache value. ``validate`` rejects settings the GPU lowering
cannot compile (every block a power of two) instead of silently changing them.
"""

from __future__ import annotations

import dataclasses

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _pallas


def _is_pow2(value: int) -> bool:
  return value > 0 and value & (value - 1) == 0


def next_pow2(value: int) -> int:
  return 1 << max(0, int(value) - 1).bit_length()


def _check_pow2(config, *names: str, minimum: int = 1) -> None:
  for name in names:
    value = getattr(config, name)
    if not _is_pow2(value) or value < minimum:
      raise ValueError(
          f"{type(config).__name__}.{name} must be a power of two >= {minimum}, got {value}")


def _check_warps_stages(config) -> None:
  if config.num_warps not in (1, 2, 4, 8, 16):
    raise ValueError(f"num_warps must be one of 1, 2, 4, 8, 16, got {config.num_warps}")
  if config.num_stages is not None and config.num_stages < 1:
    raise ValueError(f"num_stages must be >= 1 or None, got {config.num_stages}")


@dataclasses.dataclass(frozen=True)
class PerturbedLinearConfig:
  """Tiles of the perturbed-linear kernels (forward and input gradient).

  Forward: one program computes a ``(block_batch, block_out)`` output tile
  for one individual (or one antithetic pair), looping over ``in`` in steps of
  ``block_in``; the noise tile ``(block_out, block_in)`` is generated in
  registers once per step and feeds both members of a pair. Input gradient:
  the program's output tile is ``(block_batch, block_in)`` and the loop runs
  over ``out`` in steps of ``block_out``.

  Attributes:
    block_batch: rows of x per tile (>= 16, the matrix units' minimum).
    block_out: output features per tile (>= 16).
    block_in: input features per tile (>= 32; a multiple of 32 keeps the
      "rademacher" kind's 32-values-per-word unpacking inside one tile).
    num_warps: warps per program.
    num_stages: software-pipelining depth; None takes the deepest that fits
      the device's shared memory (:func:`jaxnoise.ops._pallas.choose_num_stages`).
    tf32: float32 inputs use TF32 matrix units (like ``jnp.dot``'s default
      precision on GPU); False gives full float32 (IEEE) products.
    transposed_noise: the forward builds its noise tile as ``(block_in,
      block_out)``, the operand ``x @ N^T`` consumes, so the kernel has no
      transpose (same bits). False builds ``(block_out, block_in)`` and
      transposes it, which XLA's Triton pipeline (jax 0.10, 0.11) compiles in time
      exponential in the depth of the hash: its transpose folding pushes the
      transpose up through every elementwise op and copies each shared
      subexpression once per use (issue 14: 10 s to minutes once word indices
      pass 2**32). Kept for comparisons; the input gradient has no transpose.
  """

  block_batch: int = 64
  block_out: int = 64
  block_in: int = 64
  num_warps: int = 4
  num_stages: int | None = None
  tf32: bool = True
  transposed_noise: bool = True

  def validate(self) -> "PerturbedLinearConfig":
    _check_pow2(self, "block_batch", "block_out", minimum=16)
    _check_pow2(self, "block_in", minimum=32)
    _check_warps_stages(self)
    return self

  def stages(self, x_itemsize: int, tiles_per_stage: int = 1) -> int:
    """Forward pipelining depth: this config's, or the deepest that fits shared memory.

    A stage holds ``tiles_per_stage`` ``(block_batch, block_in)`` input tiles
    (two for antithetic pairs with per-individual x); the noise tile, made in
    registers, is staged once for the matrix units.
    """
    if self.num_stages is not None:
      return self.num_stages
    per_stage = tiles_per_stage * self.block_batch * self.block_in * x_itemsize
    noise_tile = self.block_out * self.block_in * x_itemsize
    return _pallas.choose_num_stages(per_stage, fixed_bytes=noise_tile)

  def input_grad_stages(self, tiles_per_stage: int = 1) -> int:
    """Input-gradient pipelining depth: this config's, or the deepest that fits.

    That kernel loops over ``out``: a stage holds ``tiles_per_stage`` float32
    ``(block_batch, block_out)`` output-gradient tiles (two for antithetic
    pairs with per-individual x), and the float32 noise tile is
    ``(block_out, block_in)``.
    """
    if self.num_stages is not None:
      return self.num_stages
    per_stage = tiles_per_stage * self.block_batch * self.block_out * 4
    noise_tile = self.block_out * self.block_in * 4
    return _pallas.choose_num_stages(per_stage, fixed_bytes=noise_tile)


def perturbed_linear_heuristics(batch: int, out_features: int, in_features: int,
                                kind: noise_lib.NoiseKind,
                                products_per_tile: int = 1) -> PerturbedLinearConfig:
  """A good untuned config: the whole batch in one tile where it fits.

  ``products_per_tile`` is the number of matrix products each noise tile
  feeds: 2 for antithetic pairs with per-individual x, else 1.

  Noise is regenerated once per batch tile, so covering the batch with one
  tile (up to 256 rows) keeps the hashing at one pass over ``out * in`` per
  individual (measured on an H200 at 1024 x 256 x 1024 x 1024: a 128-row tile
  hashes twice and ran 2.7 ms against 3.7 ms with 64 rows). 64 x 64 noise
  tiles with 4 warps were fastest at batch 64 (benchmarks/RESULTS.md).
  """
  del kind
  block_batch = min(256, max(16, next_pow2(batch)))
  # A 256-row batch tile amortises a 128-row noise tile (measured on an H200 at
  # 1024 x 256 x 1024 x 1024 rademacher: 1.70 ms against 2.07 ms with 64 rows),
  # with one accumulator; two (``products_per_tile=2``: antithetic pairs with
  # per-individual x) would need 256 float32 registers per thread.
  wide = block_batch >= 256 and products_per_tile == 1
  block_out = min(128 if wide else 64, max(16, next_pow2(out_features)))
  block_in = min(64, max(32, next_pow2(in_features)))
  num_warps = 8 if block_batch * block_out >= 128 * 64 else 4
  return PerturbedLinearConfig(block_batch, block_out, block_in, num_warps)


def input_grad_heuristics(batch: int, out_features: int, in_features: int,
                          kind: noise_lib.NoiseKind) -> PerturbedLinearConfig:
  """Heuristic tiles of the input-gradient kernel (contraction over ``out``)."""
  del kind
  block_batch = min(128, max(16, next_pow2(batch)))
  block_out = min(64, max(16, next_pow2(out_features)))
  block_in = min(64, max(32, next_pow2(in_features)))
  num_warps = 8 if block_batch * block_in >= 128 * 64 else 4
  return PerturbedLinearConfig(block_batch, block_out, block_in, num_warps)


@dataclasses.dataclass(frozen=True)
class NoiseGradientConfig:
  """Tiles of the gradient-estimate kernel (weights and biases alike).

  The parameter block is flat (index ``offset + e``); one program owns a tile
  of ``block_rows * 32`` consecutive elements (32-aligned in index space, so a
  "rademacher" word never straddles tiles) and sums over its share of the
  population. ``pop_splits`` programs share the population of one tile and
  write partial sums that are added afterwards (deterministically).

  Attributes:
    block_rows: tile rows of 32 elements (power of two).
    pop_splits: population shares per tile; None picks enough programs to
      fill the GPU.
    num_warps: warps per program.
    num_stages: software-pipelining depth of the loop over individuals (its
      loads are the per-individual fitness and stream keys).
    individuals_per_step: individuals per loop iteration (unrolled), so their
      scalar loads and hashes are independent work in flight together.
    lane_accumulators: kinds with 32 values per word keep 32 ``(rows, 1)``
      accumulators, one per lane, so each thread hashes only its own rows'
      words. Nsight Compute showed the ``(rows, 32)`` form ALU-bound (86.6% of
      the integer pipe on an H200), with each row's word hashed by every
      thread holding part of the row; with lane accumulators the rademacher
      gradient at 1024 x (1024, 1024) took 0.14 ms against 0.60 (H200,
      2026-12-03). The heuristics turn it on for those kinds; other kinds
      ignore it.
  """

  block_rows: int = 64
  pop_splits: int | None = None
  num_warps: int = 4
  num_stages: int = 2
  individuals_per_step: int = 1
  lane_accumulators: bool = False

  def validate(self) -> "NoiseGradientConfig":
    _check_pow2(self, "block_rows", "individuals_per_step")
    if self.pop_splits is not None and self.pop_splits < 1:
      raise ValueError(f"pop_splits must be >= 1 or None, got {self.pop_splits}")
    _check_warps_stages(self)
    return self


# Programs per streaming multiprocessor the heuristics aim for; 132 SMs on
# an H100/H200. Only a target for how much parallelism to create.
TARGET_PROGRAMS = 132 * 8


def noise_gradient_heuristics(n_elements: int, n_individuals: int,
                              kind: noise_lib.NoiseKind | None = None) -> NoiseGradientConfig:
  """Row tiles and enough population shares to give the GPU ~8 programs per SM.

  Two individuals per loop step (measured on an H200 at 1024 x (1024, 1024)
  rademacher: 0.73 ms against 0.83 ms with one). Kinds with 32 values per
  word (``kind.values_per_word == 32``) get lane accumulators in 128- or
  256-row tiles from 4096 elements: H200, device time (2026-12-03,
  ``bench_gradient_lanes.py``), 0.139 ms against 0.603 with the
  one-value-per-word tiles at 1024 x (1024, 1024), 0.49 against 2.28 at
  256 x (4096, 4096), 0.049 against 0.164 at 65536 x (64, 64); a 1000-element
  bias was 1 us faster without. Without ``kind`` the tiles are the
  one-value-per-word ones.
  """
  lanes = kind is not None and kind.values_per_word == 32 and n_elements >= 4096
  if lanes:
    block_rows, num_warps = (256, 8) if n_elements >= 256 * 32 * 64 else (128, 4)
  else:
    block_rows, num_warps = (64 if n_elements >= 64 * 32 * 256 else 32), 4
  tiles = -(-n_elements // (block_rows * 32))
  splits = max(1, min(n_individuals // 16, TARGET_PROGRAMS // max(1, tiles)))
  return NoiseGradientConfig(block_rows=block_rows, pop_splits=max(1, splits),
                             num_warps=num_warps,
                             individuals_per_step=2 if n_individuals >= 64 else 1,
                             lane_accumulators=lanes)


@dataclasses.dataclass(frozen=True)
class ReduceMetricConfig:
  """Tiles of the reduce-metric kernel.

  One program owns ``individuals_per_program`` individuals (pairs when
  antithetic) and walks the parameters in tiles of ``block_rows * 32``,
  reading each ``center`` tile once for all of them; ``param_splits``
  programs share the parameters of one group (partial sums).

  With ``layout="individuals"`` (kinds with one value per word) a program's
  tile is instead ``(individuals_per_program, block_params)``: each row is
  one individual whose stream keys stay in registers, each column one
  parameter; ``center`` is read once per tile for every row, the loop over
  parameter tiles adds one hashed value per element, and a single row
  reduction at the end gives every individual's sum (no per-individual
  block reductions). The parameter range is cut where the 64-bit index
  crosses a multiple of 2**32, so every launch has one constant high word.

  Attributes:
    block_rows: tile rows of 32 parameters (power of two; ``layout="rows"``).
    individuals_per_program: individuals (or pairs) per program (power of two).
    param_splits: parameter shares per group; None picks a heuristic.
    num_warps: warps per program.
    num_stages: software-pipelining depth of the loop over parameter tiles.
    layout: ``"rows"`` (tiles of ``block_rows x 32`` parameters, one
      accumulator per individual) or ``"individuals"`` (see above).
    block_params: parameters per tile of the ``"individuals"`` layout.
  """

  block_rows: int = 64
  individuals_per_program: int = 4
  param_splits: int | None = None
  num_warps: int = 8
  num_stages: int = 2
  layout: str = "rows"
  block_params: int = 256

  def validate(self) -> "ReduceMetricConfig":
    _check_pow2(self, "block_rows", "individuals_per_program", "block_params")
    if self.layout not in ("rows", "individuals"):
      raise ValueError(f'layout must be "rows" or "individuals", got {self.layout!r}')
    if self.param_splits is not None and self.param_splits < 1:
      raise ValueError(f"param_splits must be >= 1 or None, got {self.param_splits}")
    _check_warps_stages(self)
    return self


def reduce_metric_heuristics(n_params: int, n_individuals: int,
                             kind: noise_lib.NoiseKind | None = None) -> ReduceMetricConfig:
  """The ``"individuals"`` layout for kinds with one value per word, else ``"rows"``.

  Rows: 64-row tiles, 8 warps, 4 individuals per program, the fastest
  ``"rows"`` config of the first H200 sweep. With one value per word
  (``binomial``, the default, ``uniform``, ``normal``) the ``"individuals"``
  layout (:func:`reduce_metric_individuals_heuristics`) was faster on every
  shape of the 2026-11-30 session-4 run in device time (``binomial``):
  0.176 against 0.208 ms at 65,536 x 4,096, 0.633 against 0.702 ms at
  1,024 x 2^20 and 5.16 against 5.82 ms at 3,000 x 3M.
  """
  if kind is not None and kind.values_per_word == 1:
    return reduce_metric_individuals_heuristics(n_params, n_individuals)
  groups = -(-n_individuals // 4)
  tiles = -(-n_params // (64 * 32))
  splits = max(1, min(tiles, TARGET_PROGRAMS // max(1, groups)))
  return ReduceMetricConfig(block_rows=64, individuals_per_program=4, param_splits=splits,
                            num_warps=8)


@dataclasses.dataclass(frozen=True)
class LowRankLinearConfig:
  """How the low-rank perturbed linear (and its input gradient) runs.

  The kernel's program owns one individual (or antithetic pair) and a tile
  of ``block_batch`` rows. It first contracts the input with the ``r``
  factor vectors of the reduced side (``x_i B_i``, ``block_reduce``
  elements a step, each factor vector made in registers), then walks the
  emitted side ``block_emit`` features at a time, forming
  ``(x_i B_i) A_i^T`` from ``r`` broadcast multiply-adds per element and
  adding the bias and its noise. It writes the ``(pop, batch, out)`` noise
  term, which XLA adds to its own GEMM ``x W^T``. Each factor value is
  hashed once per batch tile: ``(out + in) * r`` values per individual.

  Attributes:
    block_batch: rows of the input per program (power of two).
    block_reduce: contracted features per loop step (power of two >= 32).
    block_emit: emitted features per loop step (power of two >= 32).
    num_warps: warps per program.
    num_stages: software-pipelining depth of the loops.
    materialize: skip the kernel: build the factors ``(pop, out, r)`` and
      ``(pop, in, r)`` with XLA and contract them with XLA einsums.
    fuse_base: with per-individual x, the kernel reads XLA's GEMM output and
      writes the sum (False: it writes the noise term and XLA adds it, which
      measured slower on an H200).
      Shared x always adds its small ``(batch, out)`` GEMM in the kernel.
    fused_gemm: on a Hopper GPU, x with one row per member (or a multiple
      of 64 rows, such as a sequence's tokens) in antithetic pairs runs one
      Mosaic GPU GEMM that adds the noise term in its epilogue
      (:mod:`jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank`; ``x_i B_i``
      from this kernel's reduce phase first). Calls it cannot take (other
      GPUs, other row counts, no antithetic pairs, float32 x
      under a ``jax_default_matmul_precision`` finer than TF32, shapes off
      its tiles, a layer whose noise indices cross a multiple of 2**32) run
      the kernel above. :func:`low_rank_linear_heuristics` turns it on up
      to rank 4 (a config built by hand has it off unless asked).
    gemm_tile_n: outputs per compute warpgroup of the fused GEMM (a program
      covers twice as many): 64 or 128 (two float32 accumulators of 64 x 256
      would take every register).
    gemm_tile_k: contracted features per pipeline step of the fused GEMM
      with 16-bit x (float32 x: half as many, the same bytes).
    gemm_stages: the fused GEMM's pipeline depth (lowered to what fits in
      shared memory beside the output chunks:
      :func:`~jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank.shared_memory_plan`).
    gemm_grid_width: the fused GEMM's tile order (``plgpu.planar_snake``):
      bands of this many output-column tiles, the pair-row tiles walked
      inside each band (L2 reuse). With one row per member, 1 (each column
      tile of ``W`` read by the programs of every pair tile in turn, ``x``
      kept in L2) was the fastest of 1-16 on an H200 (session 14: 2-2.5 µs
      ahead of 4 in bf16 at ranks 1 and 4, 3.4 µs in float32).
      :func:`low_rank_linear_heuristics` takes 8 for members of several
      rows, whose ``x`` is the large operand (see there).
    gemm_noise_ahead: rank components of ``A_i`` whose noise the fused GEMM
      hashes during its main loop, a few values per step while the tensor
      cores run, into shared memory as the kind's code
      (:meth:`jaxnoise.noise.NoiseKind.code`, 1-4 bytes a value); the
      epilogue then reads those codes instead of hashing, and hashes only the
      other components. Capped at the rank; the codes' shared memory is
      taken first, so the pipeline may get fewer stages
      (:func:`~jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank.noise_ahead_plan`).
      Off (0) by default: on an H100 (session 28, EGGROLL's layer, bf16,
      device time) ``gemm_noise_ahead=4`` took the rank-4 GEMM from 181.6 /
      183.5 µs to 180.5 / 182.3 µs in two runs (3 stages; the rank-1 GEMM
      takes 172.8 / 176.1), and ``1`` made rank 1 1.2-1.7 µs slower: the
      hashing costs about as much in the main loop as in the epilogue.
    gemm_member_dots: members of 64k rows with a kind of 8-bit codes
      ("binomial", "rademacher") and rank <= 8: the fused GEMM forms
      ``x_i B_i`` itself, with one more ``wgmma`` per step and sign into a
      ``(64, 8)`` accumulator, from the pairs' factor rows (made by XLA,
      ``pop / 2 * r * in`` values) loaded beside ``x``, instead of a kernel
      that reads all of ``x`` once more first
      (:func:`~jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank.member_dots_supported`).
    gemm_pipelined_tiles: the fused GEMM's tiles as one pipeline per
      multiprocessor (Pallas' pipeline of pipelines): the producer warpgroup
      loads a tile's first steps while the previous tile's last steps and
      epilogue run, instead of after the previous tile's last step. For
      shallow layers (the LM's 512-deep ones: 8 steps a tile), where that
      wait is a large part of a tile. Taken where the steps divide by the
      pipeline depth and every multiprocessor has two tiles or more
      (:func:`~jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank.pipelined_tiles`).
      :func:`low_rank_linear_heuristics` turns it on for members of several
      rows (measured there); a config built by hand has it off.
  """

  block_batch: int = 1
  block_reduce: int = 512
  block_emit: int = 512
  num_warps: int = 4
  num_stages: int = 2
  materialize: bool = False
  fuse_base: bool = True
  fused_gemm: bool = False
  gemm_tile_n: int = 128
  gemm_tile_k: int = 64
  gemm_stages: int = 4
  gemm_grid_width: int = 1
  gemm_noise_ahead: int = 0
  gemm_member_dots: bool = True
  gemm_pipelined_tiles: bool = False

  def validate(self) -> "LowRankLinearConfig":
    _check_pow2(self, "block_batch")
    _check_pow2(self, "block_reduce", "block_emit", minimum=32)
    _check_pow2(self, "gemm_tile_n", "gemm_tile_k", minimum=64)
    if self.gemm_tile_n > 128:
      raise ValueError(f"LowRankLinearConfig.gemm_tile_n must be 64 or 128, got {self.gemm_tile_n}")
    _check_warps_stages(self)
    for name in ("gemm_stages", "gemm_grid_width"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"LowRankLinearConfig.{name} must be a positive int, got {value!r}")
    ahead = self.gemm_noise_ahead
    if isinstance(ahead, bool) or not isinstance(ahead, int) or ahead < 0:
      raise ValueError(
          f"LowRankLinearConfig.gemm_noise_ahead must be a non-negative int, got {ahead!r}")
    for name in ("gemm_member_dots", "gemm_pipelined_tiles"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"LowRankLinearConfig.{name} must be a bool, got "
                         f"{getattr(self, name)!r}")
    return self


# Ranks the kernel unrolls (one accumulator per component and member); larger
# ranks take the materialised path, whose GEMMs then have a useful depth.
MAX_KERNEL_RANK = 16


def low_rank_linear_heuristics(batch: int, n_reduce: int, n_emit: int, rank: int,
                               kind: str | None = None) -> LowRankLinearConfig:
  """Register tiles of 4096 elements, the batch up to 16 rows; 8 warps above rank 1 (the
  fused forward at rank 1: 8192-wide reduce tiles and 8 warps, below).

  From the H200 sweep of device time (CUPTI kernel durations, no host
  dispatch) at 1024 members x (8192, 8192), one row each
  (benchmarks/RESULTS.md, 2026-11-30 session 4, ``tune_low_rank.py``):
  4096-wide steps were fastest in all four cases (bf16 / f32, ranks 1 and
  4), ahead of 2048 (the previous default) by 1-2% of the floor; 8 warps
  helped at rank 4 (2-3%) and made no difference at rank 1; a second or
  third pipeline stage made no difference. Reading the GEMM's output in the
  kernel (``fuse_base``) was faster than XLA's separate add in 13 of 16
  paired configs of an earlier sweep.

  The fused Mosaic GPU GEMM (``fused_gemm``): up to rank 2, and at ranks 3
  and 4 except for "rademacher". Measured in session 12 (bf16, the same shape,
  device time), it is the faster path up to rank 4: 93.6-95.0% of inference
  at rank 1 in "binomial" against 91.9-92.9% for the Triton path,
  86.0-86.3% against 84.5-84.7% at rank 4 ("rademacher": faster at rank 1,
  equal at 2, 86.0% against 87.8% at 4; from rank 8 the Triton path is
  faster, 0.230 against 0.307 ms). Compiled checks (session 13) compared it
  with the reference over 1-3 tiles of 64 pairs (every kind) and at 1024
  members x (8192, 8192) (three kinds). With float32 x (TF32, session 13)
  it was 0.8-1.8 points of inference faster at ranks 1 and 2 and within 0.3
  at rank 4, so one rule serves both dtypes.
  """
  block_batch = min(16, next_pow2(batch))
  width = max(32, 4096 // block_batch)
  fused_gemm = rank <= 2 or (rank <= 4 and kind != "rademacher")
  block_emit = min(width, max(32, next_pow2(n_emit)))
  wide_operands = fused_gemm and batch == 1 and rank == 1
  if wide_operands:
    # The fused forward's operands kernel (x_i B_i, one program per pair) runs
    # these tiles: 8192 wide and 8 warps read x at its copy speed
    # (benchmarks/tune_fused_operands.py, H200, 2026-12-03: 9.8 against 10.7 us
    # in float32, 6.2 against 6.6 us in bfloat16, reading x alone 10.2 / 6.7 us;
    # at rank 4 the 4096-wide, 8-warp tiles stay the fastest).
    width = 8192
  block_reduce = min(width, max(32, next_pow2(n_reduce)))
  warps = 8 if rank > 1 or wide_operands else 4
  # Members of several rows (a sequence each): x is the large operand, so the fused GEMM
  # walks bands of 8 column tiles and a row tile's programs run together (x read about
  # once). Session 31, H100, bf16, the LM's layers at 16,384 members of 64 rows: 7-13%
  # less device time than bands of 1 (1.234 -> 1.143 ms at 512x512, 4.967 -> 4.334 at
  # 512x2048, 4.094 -> 3.854 at 2048x512, rank 1; 6-13% at rank 4); 4 within 1% of 8.
  grid_width = 8 if batch > 1 else 1
  # And a multiprocessor's tiles chained into one pipeline (the next tile's loads overlap
  # the last steps and the epilogue). Session 32, H100, bf16, 16,384 members of 64 rows:
  # the LM's 512x512 layer 1.135 -> 1.048 ms at rank 1 (1.183 -> 1.152 at rank 4), its
  # whole step 118.05 -> 115.64 ms; one row a member (128-step tiles) not measured.
  pipelined = batch > 1
  return LowRankLinearConfig(block_batch=block_batch, block_reduce=block_reduce,
                             block_emit=block_emit, num_warps=warps,
                             num_stages=1,
                             materialize=rank > MAX_KERNEL_RANK, fuse_base=True,
                             fused_gemm=fused_gemm, gemm_grid_width=grid_width,
                             gemm_pipelined_tiles=pipelined)


# LowRankGradientConfig.splits_for: programs a split contraction aims at (about four per
# multiprocessor of an H100 / H200), and the fewest block_k steps a part keeps.
SPLIT_PROGRAMS = 512
SPLIT_MIN_STEPS = 8


@dataclasses.dataclass(frozen=True)
class LowRankGradientConfig:
  """How the low-rank gradient estimate ``sum_i f_i A_i B_i^T`` runs.

  The factors of ``chunk`` individuals at a time are generated by XLA
  (``a = f * A`` and ``b = B``, K-major: ``(out, chunk * r)`` and
  ``(in, chunk * r)``, the layout TF32 wgmma reads without a transpose) and
  contracted over ``chunk * r``; the chunks are summed in order in float32
  (the tile kernel, not ``xla_gemm``, adds each chunk to the running sum in its
  epilogue).
  ``chunk`` is rounded to a multiple of 64 (zero-weight padding, which adds
  exact zeros) so the operands' rows stay aligned.

  The contraction is a Pallas kernel whose ``(block_rows, block_cols)`` output
  tiles each sum ``a b^T`` over ``chunk * r`` in ``block_k`` steps, the same
  steps for every tile: an element's bits depend on the block's shape and this
  config, not on how many rows are formed at once, so a device's row shard
  (:mod:`jaxnoise.parallel`) equals those rows of the one-device gradient.
  ``xla_gemm=True`` hands the contraction to one XLA GEMM per chunk instead
  (cuBLAS; its summation order follows the GEMM's shape, so shards then agree
  with one device to float rounding only). On an H200 (2026-12-01) cuBLAS is
  1.2-1.5x faster with bfloat16 operands and 1.6-2.2x with float32, and XLA
  folds what follows into the GEMM's epilogue where nothing else reads the
  gradient (the cast to the parameters' dtype; an SGD step added to the
  parameters in a hand-written step, or in ``evolution_strategy`` with
  ``check_finite=False``): one ES step of a (8192, 8192) bf16 layer at rank 1
  with SGD took 0.454 ms against 0.619 ms with the default tiles (2026-12-01),
  0.358 ms without the check (2026-12-03). The tiles take an SGD step into
  their own epilogue in :func:`jaxnoise.virtual_weight_update`.
  The default block (64 x 128 x 32, 4 warps) was the fastest float32 config
  on the transformer LM's shapes (65,536 members x (2048, 512)).

  Attributes:
    chunk: individuals per contraction; None fits about 2**24 factor values.
    operand_dtype: the contraction's operand dtype, ``"float32"`` or
      ``"bfloat16"`` (exact for "rademacher" and "binomial" factors, but it
      rounds the fitness-weighted ``A`` to 8 bits).
    tf32: float32 operands may use TF32 matrix units.
    block_rows: output rows per tile (power of two >= 16); also the grain of
      a row shard's tiles.
    block_cols: output columns per tile (power of two >= 16).
    block_k: contraction steps per loop iteration (power of two >= 16).
    num_warps: warps per program.
    num_stages: software-pipelining depth of the loop over ``chunk * r``.
    xla_gemm: one XLA GEMM per chunk instead of the kernel (see above).
    split_k: the tile kernel's contraction in this many parts of equal
      steps, each its own program, their float32 partial tiles summed in
      order by XLA (``p_0 + p_1 + ...``), which then adds the running sum
      or the step; None: :meth:`splits_for`. The parts depend on the whole
      layer's shape, never on a shard's rows, so shards still equal the
      one-device gradient bit for bit.
  """

  chunk: int | None = None
  operand_dtype: str = "float32"
  tf32: bool = True
  block_rows: int = 64
  block_cols: int = 128
  block_k: int = 32
  num_warps: int = 4
  num_stages: int = 3
  xla_gemm: bool = False
  split_k: int | None = None

  def validate(self) -> "LowRankGradientConfig":
    if self.chunk is not None and self.chunk < 1:
      raise ValueError(f"chunk must be >= 1 or None, got {self.chunk}")
    if self.split_k is not None and (not isinstance(self.split_k, int) or self.split_k < 1):
      raise ValueError(f"split_k must be a positive int or None, got {self.split_k!r}")
    if self.operand_dtype not in ("float32", "bfloat16"):
      raise ValueError(
          f'operand_dtype must be "float32" or "bfloat16", got {self.operand_dtype!r}')
    _check_pow2(self, "block_rows", "block_cols", "block_k", minimum=16)
    _check_warps_stages(self)
    return self

  def splits_for(self, out_features: int, in_features: int, n_k: int) -> int:
    """The tile kernel's contraction parts for a ``(out, in)`` layer and ``n_k`` products.

    ``split_k`` if set. Otherwise the heuristic: a layer of few tiles
    (the LM's (512, 512) and (2048, 512) layers make 32 and 128 programs of
    the default 64 x 128 blocks, one per multiprocessor at most, each
    looping over tens of thousands of products) is split in powers of two
    until it makes :data:`SPLIT_PROGRAMS` programs, while each part keeps
    at least :data:`SPLIT_MIN_STEPS` steps of ``block_k``.

    Example:
      >>> config = LowRankGradientConfig()
      >>> config.splits_for(512, 512, 16384), config.splits_for(2048, 512, 6400)
      (16, 4)
      >>> config.splits_for(8192, 8192, 1024), config.splits_for(512, 512, 256)
      (1, 1)
    """
    if self.split_k is not None:
      return self.split_k
    programs = -(-out_features // self.block_rows) * -(-in_features // self.block_cols)
    steps = -(-n_k // self.block_k)
    splits = 1
    while programs * splits < SPLIT_PROGRAMS and steps >= 2 * splits * SPLIT_MIN_STEPS:
      splits *= 2
    return splits


# ----------------------------------------------------------------------------
# Autotuning: keys and candidate spaces (see jaxnoise.ops.autotune).


def _offset_class(kind: noise_lib.NoiseKind, offset: int, n_elements: int) -> tuple:
  """What of the offset changes the kernel: word alignment and the high word."""
  return (offset % kind.values_per_word, noise_lib.fits_32_bits(kind, offset, n_elements))


def perturbed_linear_key(implementation: str, x_shape, x_dtype, weight_shape, weight_dtype,
                         has_bias: bool, pop: int, kind: noise_lib.NoiseKind, antithetic: bool,
                         offset: int, out_dtype) -> tuple:
  n_elements = weight_shape[0] * weight_shape[1]
  return ("virtual_perturbed_linear", implementation, tuple(x_shape), str(x_dtype),
          tuple(weight_shape), str(weight_dtype), has_bias, pop, kind.name, antithetic,
          _offset_class(kind, offset, n_elements), str(out_dtype))


def noise_gradient_key(implementation: str, pop: int, shape, kind: noise_lib.NoiseKind,
                       antithetic: bool, offset: int) -> tuple:
  n_elements = 1
  for dim in shape:
    n_elements *= dim
  return ("virtual_noise_gradient", implementation, pop, n_elements, kind.name, antithetic,
          _offset_class(kind, offset, n_elements))


def reduce_metric_key(implementation: str, pop: int, n_params: int, kind: noise_lib.NoiseKind,
                      antithetic: bool, offset: int) -> tuple:
  return ("virtual_reduce_metric", implementation, pop, n_params, kind.name, antithetic,
          _offset_class(kind, offset, n_params))


def _valid_unique(configs) -> list:
  out = []
  for config in configs:
    try:
      config.validate()
    except ValueError:
      continue
    if config not in out:
      out.append(config)
  return out


def perturbed_linear_candidates(batch: int, out_features: int, in_features: int,
                                kind: noise_lib.NoiseKind,
                                products_per_tile: int = 1) -> list[PerturbedLinearConfig]:
  """The heuristic config and its neighbours (tile sizes, warps, pipelining)."""
  base = perturbed_linear_heuristics(batch, out_features, in_features, kind, products_per_tile)
  other_warps = 8 if base.num_warps == 4 else 4
  return _valid_unique([
      base,
      dataclasses.replace(base, block_out=base.block_out * 2),
      dataclasses.replace(base, block_out=max(16, base.block_out // 2)),
      dataclasses.replace(base, block_in=base.block_in * 2),
      dataclasses.replace(base, block_out=base.block_out * 2, block_in=max(32, base.block_in // 2)),
      dataclasses.replace(base, num_warps=other_warps),
      dataclasses.replace(base, block_batch=max(16, base.block_batch // 2)),
      dataclasses.replace(base, num_stages=2),
  ])


def noise_gradient_candidates(n_elements: int, n_individuals: int,
                              kind: noise_lib.NoiseKind | None = None
                              ) -> list[NoiseGradientConfig]:
  """The heuristic config and its neighbours (tiles, shares, warps, unrolling)."""
  base = noise_gradient_heuristics(n_elements, n_individuals, kind)
  splits = base.pop_splits or 1
  other_warps = 8 if base.num_warps == 4 else 4
  return _valid_unique([
      base,
      dataclasses.replace(base, block_rows=base.block_rows * 2),
      dataclasses.replace(base, block_rows=max(1, base.block_rows // 2)),
      dataclasses.replace(base, pop_splits=splits * 4),
      dataclasses.replace(base, pop_splits=max(1, splits // 4)),
      dataclasses.replace(base, num_warps=other_warps),
      dataclasses.replace(base, individuals_per_step=base.individuals_per_step * 4),
      dataclasses.replace(base, lane_accumulators=not base.lane_accumulators),
  ])


def reduce_metric_individuals_heuristics(n_params: int,
                                         n_individuals: int) -> ReduceMetricConfig:
  """The ``"individuals"`` layout: 32 individuals x 256 parameters per tile, 8 warps.

  32 values per thread; the parameter range is split so that there are
  about :data:`TARGET_PROGRAMS` programs. Up to 8192 parameters the tile is
  128 wide: each program's loop is short there, and its closing sum over the
  tile's columns weighs more (H200, 2026-12-03, ``binomial``, 65,536 x 4,096:
  0.161 against 0.171 ms; at 1,024 x 2^20, 256 wide stays faster, 0.562
  against 0.578 ms).
  """
  group = 32 if n_individuals >= 32 else next_pow2(n_individuals)
  widest = 128 if n_params <= 8192 else 256
  block_params = widest if n_params >= widest else max(32, next_pow2(n_params))
  groups = -(-n_individuals // group)
  tiles = -(-n_params // block_params)
  splits = max(1, min(tiles, TARGET_PROGRAMS // max(1, groups)))
  return ReduceMetricConfig(individuals_per_program=group, param_splits=splits, num_warps=8,
                            num_stages=2, layout="individuals", block_params=block_params)


def reduce_metric_candidates(n_params: int, n_individuals: int,
                             kind: noise_lib.NoiseKind | None = None) -> list[ReduceMetricConfig]:
  """The heuristic, its neighbours and (one value per word only) the ``"individuals"`` layout."""
  base = reduce_metric_heuristics(n_params, n_individuals)  # rows
  wide = reduce_metric_individuals_heuristics(n_params, n_individuals)
  if kind is not None and kind.values_per_word != 1:
    wide = base
  return _valid_unique([
      base,
      dataclasses.replace(base, block_rows=base.block_rows // 2, num_warps=4),
      dataclasses.replace(base, individuals_per_program=8),
      dataclasses.replace(base, individuals_per_program=2),
      dataclasses.replace(base, block_rows=base.block_rows * 2),
      wide,
      dataclasses.replace(wide, block_params=wide.block_params * 2),
      dataclasses.replace(wide, individuals_per_program=max(1, wide.individuals_per_program // 2),
                          num_warps=4),
  ])


# ----------------------------------------------------------------------------
# One argument carrying the configs of several ops (population_apply, ES).

KERNEL_CONFIG_TYPES = (PerturbedLinearConfig, NoiseGradientConfig, ReduceMetricConfig,
                       LowRankLinearConfig, LowRankGradientConfig)


def config_for_op(config, config_type: type, name: str = "config"):
  """The config of ``config_type`` in ``config`` (one config or a tuple of them), else None.

  Functions that run several ops (:func:`jaxnoise.nn.population_apply`,
  :func:`jaxnoise.nn.fitness_gradient`, the ES transform) take one ``config``
  argument: a single config or a tuple with at most one config of each type.
  Each op takes the one of its own type and picks its heuristics otherwise.

  Args:
    config: None, a config, or a tuple of configs of distinct types.
    config_type: the type the op takes.
    name: the argument's name, for errors.

  Returns:
    The matching config, or None.

  Raises:
    TypeError: an entry is not a virtual-noise kernel config.
    ValueError: two entries have the same type.

  Example:
    >>> both = (LowRankLinearConfig(), LowRankGradientConfig(xla_gemm=True))
    >>> config_for_op(both, LowRankGradientConfig).xla_gemm
    True
    >>> config_for_op(both, NoiseGradientConfig) is None
    True
  """
  if config is None:
    return None
  entries = tuple(config) if isinstance(config, (tuple, list)) else (config,)
  seen = set()
  for entry in entries:
    if not isinstance(entry, KERNEL_CONFIG_TYPES):
      names = ", ".join(t.__name__ for t in KERNEL_CONFIG_TYPES)
      raise TypeError(f"{name} must be None, a kernel config ({names}) or a tuple of them, "
                      f"got an entry of type {type(entry).__name__}")
    if type(entry) in seen:
      raise ValueError(f"{name} holds two {type(entry).__name__} entries; give at most one "
                       f"config of each type")
    seen.add(type(entry))
  return next((entry for entry in entries if isinstance(entry, config_type)), None)
