"""Ternary kernel benchmark: compiled checks and the sweeps that set the heuristics.

Parts (``--part``; each writes ``ternary_<part>.json`` to ``--out`` after every
case, and prints each row as it completes):

* ``check``: every kernel variant compiled once on this device, at small odd
  shapes, against the pure-JAX reference (counter update: resident rows in
  words / bytes, ragged chunks, two-pass rows, the non-default loads, two
  rows per program; update from ``(x, grad_out)``: fused and two-kernel;
  matmul: fma, dot in bytes / words, GEMM tiles, decode, float32, the input
  gradient; decode, pack / unpack, init). Heuristic choices first.
* ``update``: :func:`counter_update` configs at 8192x8192 float32 / bfloat16,
  1000x3996 and 1536x2304 as a fraction of the measured copy bandwidth (the
  heuristic first, then the candidates most likely to help: more rows per
  program, fewer / more warps, the other code layout, whole-chunk tails,
  strided loads), each screened against the reference. ``--before`` adds
  main's kernels at their old default.
* ``matmul``: ``ternary_matmul`` at M = 1, 4, 16 on 4096^2 and 8192^2 against
  a dense bf16 matmul: the heuristic, then fma and dot tiles around it; M = 64
  dot vs decode last. Each call in a timed group reads its own copy of the
  weights (shared copies let XLA merge the dense calls into one GEMM), so
  small-M numbers are DRAM-bound as in a model's decode step. Times are
  device busy time (CUPTI, ``_harness.device_busy``) where PyTorch with CUDA
  is installed, next to the wall-clock group medians. ``--before-matmul PATH``
  also times a frozen copy of the kernel module, at session 5's heuristics or
  (``--before-config heuristic``) at today's; ``--before-config session10``
  times today's kernels at session 10's configs (float32 ``x`` as exact
  float32 dots, no bfloat16 pieces). ``--op input_grad`` times
  ``ternary_matmul_input_grad`` (``grad_y @ W``: the dense baseline is
  ``g @ w``) over its heuristic, split and decode neighbours.
* ``decode``: :func:`ternary_decode` (the decode method's temporary) at 4096^2
  and 8192^2 to bfloat16 and float32, bytes moved against a copy of the same
  bytes; ``--before-elementwise PATH`` also times a frozen copy of the
  elementwise kernel module. Every output is compared with the reference.
* ``from_io``: :func:`counter_update_from_io` at M = 4096 (then 1024 and 256)
  on 4096x4096 bf16 against an XLA GEMM plus the fused update: the heuristic,
  (the kernels' own GEMM), XLA's GEMM by blocks of 256-2048 rows
  (``FromIOConfig.xla_gemm_rows``), each with its temporary memory, and with
  ``--from-io-sweep`` larger tiles, ``block_m`` and ``num_stages``. Each chained step reads
  its own ``(x, grad_out)`` (with shared inputs XLA formed the baseline's
  GEMM once per group: session 5's ratios were up to 2.2x too high).
* ``tune``: the library's autotuners (:mod:`jaxnoise.ops.ternary.tuning`,
  screen included) at the update, matmul, input-gradient and from_io shapes; every
  candidate's fate is recorded, and the heuristic and the selected config are
  then timed side by side in device time.

The update and from_io parts report device busy time next to the wall clock
(updates chained ``--inner`` deep, each profiled call on a fresh state), and
the update part's fraction of copy bandwidth both ways.

Sweeps interleave their cases by rank (every case's best-guess candidates run
before any case's long tail), so a budget cut drops the least likely configs.

Timing: median of ``--samples`` groups after a warm-up; a group is ``--inner``
calls compiled into one executable (state chained through in-place updates, or
distinct inputs), so dispatch is not timed. Each part stops starting new cases
once ``--budget`` seconds are spent (the rest are listed as skipped), so an
outer ``timeout`` never cuts a JSON file.

GPU (all parts: benchmarks/gpu_session5_ternary.sh; the matmul:
benchmarks/gpu_session6_matmul.sh)::

    python benchmarks/bench_ternary.py --part check --budget 45 --out $OUT
    python benchmarks/bench_ternary.py --part check --only matmul --out $OUT

CPU (interpret mode, tiny shapes; checks that it runs)::

    python benchmarks/bench_ternary.py --part check --quick
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import pathlib
import re
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise.ops.ternary import config as config_lib  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton as elementwise  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton_matmul as matmul_kernels  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton_update as update_kernels  # noqa: E402
from jaxnoise.ops.ternary import reference  # noqa: E402

C = 11
HYPER = (0.05, 1e-3, 0.99, 1e-8)  # lr, lr_scale, rms_beta, rms_eps
L2_BYTES = 50 * 2**20  # H200: 50 MiB; weight copies per group cover >= 2x this.


def _baseline():
  """main's kernels (benchmarks/baseline_ternary), imported lazily."""
  from benchmarks.baseline_ternary import pallas_triton as old  # pylint: disable=g-import-not-at-top
  return old


# ----------------------------------------------------------------------------
# Timing and memory.


def median_time(fn, args_fn, *, samples: int, warmup: int = 2) -> dict:
  """Median seconds of ``fn(*args_fn())``; ``args_fn`` runs outside the timed region."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args_fn()))
  times = []
  for _ in range(samples):
    args = args_fn()
    jax.block_until_ready(args)
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return {"median_s": statistics.median(times), "min_s": min(times)}


def memory(fn, *args) -> dict:
  """``memory_analysis()`` of ``jax.jit(fn)`` compiled for ``args`` (bytes)."""
  analysis = jax.jit(fn).lower(*args).compile().memory_analysis()
  if analysis is None:
    return {}
  names = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
           "temp_size_in_bytes")
  return {name: int(getattr(analysis, name, 0) or 0) for name in names}


class Budget:
  """Wall-clock budget of a part, and its record: cases past the budget are skipped (and listed).

  :meth:`report` prints a row at once and rewrites the part's JSON file, so a
  run cut by an outer timeout still leaves every finished case on disk.
  """

  def __init__(self, seconds: float, path: pathlib.Path | None = None,
               record: dict | None = None):
    self.start = time.perf_counter()
    self.end = self.start + seconds
    self.skipped: list[str] = []
    self.path, self.record = path, record if record is not None else {}

  def allows(self, name: str) -> bool:
    if time.perf_counter() < self.end:
      return True
    self.skipped.append(name)
    return False

  def save(self) -> None:
    if self.path is None:
      return
    self.record["wall_s"] = time.perf_counter() - self.start
    self.record["skipped_for_budget"] = self.skipped
    tmp = self.path.with_suffix(".tmp")
    tmp.write_text(json.dumps(self.record, indent=2, default=str))
    tmp.replace(self.path)

  def report(self, line: str) -> None:
    print(f"[{time.perf_counter() - self.start:5.1f}s] {line}", flush=True)
    self.save()


def _ranked(per_case: dict) -> list[tuple]:
  """``(case, item)`` pairs of ``{case: [items best-guess first]}`` interleaved by rank."""
  lists = list(per_case.items())
  out = []
  for rank in range(max((len(items) for _, items in lists), default=0)):
    out += [(case, items[rank]) for case, items in lists if rank < len(items)]
  return out


# ----------------------------------------------------------------------------
# Inputs and comparisons.


def make_state(key, out_features, in_features):
  k1, k2 = jax.random.split(key)
  codes = jax.random.randint(k1, (out_features, in_features), 0, reference.n_codes(C),
                             jnp.int32).astype(jnp.uint8)
  packed = reference.pack_codes_reference(codes)
  scale = jax.random.uniform(k2, (out_features,), jnp.float32, 0.05, 1.0)
  return packed, scale, jnp.full((out_features,), 0.5, jnp.float32)


def hyper_array():
  return jnp.asarray(HYPER, jnp.float32)


def compare_states(actual, expected, old_packed) -> dict:
  new = np.asarray(reference.unpack_codes_reference(actual[0])).astype(np.int64)
  ref = np.asarray(reference.unpack_codes_reference(expected[0])).astype(np.int64)
  old = np.asarray(reference.unpack_codes_reference(old_packed)).astype(np.int64)
  diff = np.abs(new - ref)
  rel = lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b))
                                  / np.maximum(np.abs(np.asarray(b)), 1e-30)))
  return {"codes": int(new.size), "moved_by_update": int((ref != old).sum()),
          "off_by_one": int((diff == 1).sum()), "off_by_more": int((diff > 1).sum()),
          "off_fraction": float((diff != 0).mean()),
          "within_spec": bool((diff != 0).mean() <= 1e-4 and diff.max() <= 1),
          "scale_max_rel": rel(actual[1], expected[1]), "v_max_rel": rel(actual[2], expected[2]),
          "skipped_rows": int(np.asarray(actual[3]).sum())}


def relative_error(y, y_ref) -> dict:
  y, y_ref = np.asarray(y, np.float64), np.asarray(y_ref, np.float64)
  scale = max(float(np.abs(y_ref).max()), 1e-30)
  return {"max_abs_error": float(np.abs(y - y_ref).max()), "max_abs_value": scale,
          "relative": float(np.abs(y - y_ref).max() / scale)}



# ----------------------------------------------------------------------------
# Shared helpers.


def _case_label(config) -> str:
  """A sweep item's label: a baseline's name, ``("before", config)``, or a config."""
  if isinstance(config, str):
    return config
  if isinstance(config, tuple):
    return f"before {_short(config[1])}"
  return _short(config)


def _short(config) -> str:
  """A config without its defaults, for table rows."""
  fields = type(config).__dataclass_fields__
  parts = [f"{k}={getattr(config, k)}" for k in fields
           if getattr(config, k) != fields[k].default]
  return f"{type(config).__name__}({', '.join(parts)})"


# ----------------------------------------------------------------------------
# Part: counter update throughput.


def update_bytes(out_features, in_features, itemsize) -> int:
  """Bytes an update must move: the gradient, codes read + written, row state read + written."""
  return (out_features * in_features * itemsize + 2 * (out_features * in_features * 3 // 4)
          + out_features * (2 * 4 + 2 * 4 + 4))


def chained(update_fn, inner: int, *, per_step: bool = False):
  """``inner`` updates in one executable, the state chained (in place) through them.

  ``run(packed, scale, v, *operands)`` passes the same operands to every
  step; with ``per_step``, ``run(packed, scale, v, steps)`` takes one operand
  tuple per step. Distinct operands matter where part of a step depends on
  them alone: XLA computes identical subexpressions once, so a GEMM of the
  same ``(x, grad_out)`` in every step ran once per group (session 7).
  """

  def run(packed, scale, v, *operands):
    hyper = hyper_array()
    for step in range(inner):
      seed = jnp.full((1,), step + 1, jnp.uint32)
      step_operands = operands[0][step] if per_step else operands
      packed, scale, v, _ = update_fn(packed, scale, v, *step_operands, hyper, seed)
    return packed, scale, v

  return jax.jit(run, donate_argnums=(0, 1, 2))


def copy_bandwidth(args) -> dict:
  """Device-to-device copy bandwidth (read + write bytes per second), best of two forms.

  ``"wall"`` from the wall clock of 4 copies per call, ``"device"`` from their
  kernels' busy time (CUPTI; absent without PyTorch's CUDA build).
  """
  n = (1 << 18) if args.quick else (1 << 28)
  inputs = tuple(jnp.ones((n,), jnp.float32) + i for i in range(4))
  moved = 2 * 4 * n * len(inputs)
  best = {"wall": 0.0}
  for fn in (jax.jit(lambda xs: tuple(jnp.copy(x) for x in xs)),
             jax.jit(lambda xs: tuple(x * 2.0 for x in xs))):
    seconds = median_time(fn, lambda: (inputs,), samples=args.samples)["median_s"]
    best["wall"] = max(best["wall"], moved / seconds)
    busy = _harness.device_busy(fn, inputs, calls=5)
    if busy is not None:
      best["device"] = max(best.get("device", 0.0), moved / (busy["busy_ms"] / 1e3))
  return best


def time_update(args, update_fn, shape, dtype, copy_bps) -> dict:
  """Wall clock of ``args.inner`` chained updates per call, and their device busy time."""
  grad = jax.random.normal(jax.random.key(4), shape, dtype)
  run = chained(update_fn, args.inner)
  key = jax.random.key(5)
  timing = median_time(lambda p, s, v: run(p, s, v, grad), lambda: make_state(key, *shape),
                       samples=args.samples)
  seconds = timing["median_s"] / args.inner
  moved = update_bytes(*shape, jnp.dtype(dtype).itemsize)
  row = {"seconds": seconds, "bytes_per_s": moved / seconds,
         "fraction_of_copy": moved / seconds / copy_bps["wall"]}
  if "device" in copy_bps:  # Each call donates its state: a fresh one per profiled call.
    busy = _harness.device_busy(lambda p, s, v: run(p, s, v, grad),
                                arg_sets=[make_state(key, *shape) for _ in range(4)])
    if busy is not None:
      row["device_s"] = busy["busy_ms"] / 1e3 / args.inner
      row["kernels_ms"] = {k: v / args.inner for k, v in busy["kernels"].items()}
      row["device_fraction_of_copy"] = moved / row["device_s"] / copy_bps["device"]
  return row


def _copies(packed_bytes: int, quick: bool) -> int:
  """Weight copies per timed group: the packed ones alone cover twice the L2 cache."""
  return 1 if quick else max(1, min(8, -(-2 * L2_BYTES // packed_bytes)))


def _guard(fn, *args, **kwargs) -> dict:
  """``fn(...)``, or ``{"error": ...}`` (the traceback goes to stderr)."""
  try:
    return fn(*args, **kwargs)
  except Exception as error:  # pylint: disable=broad-except
    traceback.print_exc()
    return {"error": f"{type(error).__name__}: {str(error)[:400]}"}




# ----------------------------------------------------------------------------
# Part: compiled correctness of every kernel variant (small odd shapes).


def _describe(row) -> str:
  if "error" in row:
    return f"ERROR {row['error'][:160]}"
  if "off_by_one" in row:
    return (f"off-by-one {row['off_by_one']}/{row['codes']} worse {row['off_by_more']} "
            f"scale rel {row['scale_max_rel']:.1e} v rel {row['v_max_rel']:.1e} "
            f"spec ok {row['within_spec']}")
  if "relative" in row:
    return f"rel err {row['relative']:.1e} ok {row.get('ok')}"
  return str(row)[:160]


def _check_update(shape, dtype, lagged, config, interpret):
  packed, scale, v = make_state(jax.random.key(0), *shape)
  grad = jax.random.normal(jax.random.key(1), shape, dtype)
  hyper, seed = hyper_array(), jnp.full((1,), 12345, jnp.uint32)
  expected = jax.jit(functools.partial(reference.counter_update_reference, C=C, lagged=lagged))(
      packed, scale, v, grad, hyper, seed[0])
  actual = jax.jit(functools.partial(update_kernels.counter_update, C=C, lagged=lagged,
                                     config=config, interpret=interpret))(
                                         packed, scale, v, grad, hyper, seed)
  return compare_states(actual, expected, packed)


def _check_from_io(shape, dtype, lagged, config, interpret):
  m_rows, out_features, in_features = shape
  packed, scale, v = make_state(jax.random.key(2), out_features, in_features)
  x = jax.random.normal(jax.random.key(3), (m_rows, in_features), dtype)
  grad_out = jax.random.normal(jax.random.key(4), (m_rows, out_features), dtype)
  hyper, seed = hyper_array(), jnp.full((1,), 777, jnp.uint32)
  expected = jax.jit(functools.partial(reference.counter_update_from_io_reference, C=C,
                                       lagged=lagged))(packed, scale, v, x, grad_out, hyper,
                                                       seed[0])
  actual = jax.jit(functools.partial(update_kernels.counter_update_from_io, C=C, lagged=lagged,
                                     config=config, interpret=interpret))(
                                         packed, scale, v, x, grad_out, hyper, seed)
  return compare_states(actual, expected, packed)


def _check_matmul(shape, dtype, config, interpret):
  m_rows, out_features, in_features = shape
  packed, scale, _ = make_state(jax.random.key(5), out_features, in_features)
  x = jax.random.normal(jax.random.key(6), (m_rows, in_features), dtype)
  y_ref = jax.jit(functools.partial(reference.ternary_matmul_reference, C=C,
                                    out_dtype=jnp.float32))(x, packed, scale)
  config = config or config_lib.MatmulConfig.get_heuristics_config(shape, dtype)
  y = jax.jit(functools.partial(matmul_kernels.ternary_matmul, C=C, out_dtype=jnp.float32,
                                config=config, interpret=interpret))(x, packed, scale)
  row = relative_error(y, y_ref)
  row["config"] = _short(config)
  row["ok"] = row["relative"] < (1e-5 if dtype == jnp.float32 else 1e-2)
  return row


def _check_input_grad(shape, dtype, interpret, config=None):
  m_rows, out_features, in_features = shape
  packed, scale, _ = make_state(jax.random.key(7), out_features, in_features)
  grad_y = jax.random.normal(jax.random.key(8), (m_rows, out_features), dtype)
  expected = jax.jit(functools.partial(reference.ternary_matmul_input_grad_reference, C=C))(
      grad_y, packed, scale)
  actual = jax.jit(functools.partial(matmul_kernels.ternary_matmul_input_grad, C=C,
                                     out_dtype=jnp.float32, config=config,
                                     interpret=interpret))(grad_y, packed, scale)
  row = relative_error(actual, expected)
  row["ok"] = row["relative"] < (1e-5 if dtype == jnp.float32 else 2e-2)
  return row


def _check_elementwise(shape, interpret):
  packed, scale, _ = make_state(jax.random.key(9), *shape)
  codes = reference.unpack_codes_reference(packed)
  weight = jax.random.normal(jax.random.key(10), shape, jnp.float32)
  decoded = jax.jit(functools.partial(elementwise.ternary_decode, C=C, dtype=jnp.bfloat16,
                                      interpret=interpret))(packed, scale)
  init = jax.jit(functools.partial(elementwise.ternary_init, C=C, interpret=interpret))(weight)
  init_ref = reference.ternary_init_reference(weight, C)
  return {
      "decode_mismatches": int(jnp.sum(decoded != reference.ternary_decode_reference(
          packed, scale, C, jnp.bfloat16))),
      "pack_mismatches": int(jnp.sum(jax.jit(functools.partial(
          elementwise.pack_codes, interpret=interpret))(codes) != packed)),
      "unpack_mismatches": int(jnp.sum(jax.jit(functools.partial(
          elementwise.unpack_codes, interpret=interpret))(packed) != codes)),
      "init_code_mismatches": int(jnp.sum(init[0] != init_ref[0])),
      "init_scale_max_rel": float(jnp.max(jnp.abs(init[1] - init_ref[1])
                                          / jnp.maximum(jnp.abs(init_ref[1]), 1e-30)))}


def check_cases(quick: bool) -> list[tuple]:
  """``(name, fn, kwargs)`` of every variant, heuristic choices first (small odd shapes)."""
  replace = dataclasses.replace
  U = config_lib.CounterUpdateConfig
  M = config_lib.MatmulConfig
  f32, bf16 = jnp.float32, jnp.bfloat16
  words, chunks, bytes_, long_rows = ((12, 16 * 9), (9, 4 * 144), (10, 4 * 13), (3, 16400)) \
      if quick else ((45, 16 * 37), (33, 2304), (17, 3996), (5, 16400))
  mm_words, mm_bytes = ((19, 16 * 5), (21, 4 * 13)) if quick else ((37, 16 * 37), (41, 1044))
  small_io, large_io = ((29, 48, 4 * 37), (21, 20, 16 * 33)) if quick else \
      ((29, 48, 4 * 37), (77, 40, 1040))
  big_m = 40 if quick else 300
  cases = []
  for name, shape, dtype, lagged in [("resident words", words, f32, False),
                                     ("resident bytes", bytes_, bf16, True),
                                     ("ragged chunks", chunks, f32, True),
                                     ("two-pass rows", long_rows, f32, True)]:
    cases.append((f"counter_update {name} {shape[0]}x{shape[1]} {jnp.dtype(dtype).name} "
                   f"lagged={lagged} {_short(U.get_heuristics_config(shape, dtype))}",
                   _check_update, dict(shape=shape, dtype=dtype, lagged=lagged, config=None)))
  for shape, dtype, lagged in [(small_io, bf16, True), (large_io, bf16, False),
                               (large_io, f32, True)]:
    config = config_lib.FromIOConfig.get_heuristics_config(shape, dtype)
    kind = "fused" if config.fused(shape[2]) else "two-kernel"
    cases.append((f"from_io {kind} M={shape[0]} {shape[1]}x{shape[2]} {jnp.dtype(dtype).name}",
                  _check_from_io, dict(shape=shape, dtype=dtype, lagged=lagged, config=None)))
  for m_rows, (out_features, in_features), dtype in [
      (1, mm_words, bf16), (2, mm_words, bf16), (3, mm_words, bf16), (5, mm_words, bf16),
      (big_m, mm_words, bf16), (33, mm_words, bf16),
      (1, mm_bytes, f32), (3, mm_bytes, f32), (5, mm_words, f32), (20, mm_bytes, f32),
      (big_m, mm_words, f32)]:
    shape = (m_rows, out_features, in_features)
    config = M.get_heuristics_config(shape, dtype)
    cases.append((f"matmul heuristic M={m_rows} {out_features}x{in_features} "
                  f"{jnp.dtype(dtype).name} {config.method}", _check_matmul,
                  dict(shape=shape, dtype=dtype, config=config)))
  for m_rows, dtype, config in [
      (1, bf16, None), (big_m, bf16, None), (3, f32, None), (20, f32, None), (big_m, f32, None),
      (5, f32, M(block_m=16, block_n=16, block_groups=16, split_k=3, split_float32=False)),
      (5, bf16, M(block_m=16, block_n=128, block_groups=64, split_k=2)),
      (big_m, bf16, M(block_m=64, block_n=64, block_groups=32))]:
    shape = (m_rows,) + mm_words
    label = "heuristic" if config is None else _short(config)
    cases.append((f"matmul input grad M={m_rows} {mm_words[0]}x{mm_words[1]} "
                  f"{jnp.dtype(dtype).name} {label}", _check_input_grad,
                  dict(shape=shape, dtype=dtype, config=config)))
  base = U.get_heuristics_config(chunks, f32)
  for config in [replace(base, word_loads=not base.word_loads),
                 replace(base, vector_loads=False),
                 replace(base, block_rows=2, num_warps=min(16, 2 * base.num_warps))]:
    cases.append((f"counter_update variant {chunks[0]}x{chunks[1]} f32 {_short(config)}",
                  _check_update, dict(shape=chunks, dtype=f32, lagged=False, config=config)))
  shape = (5,) + mm_words
  # fma tiles of one and of several rows, the last two over a ragged M (rows past it masked).
  for m_rows, config in [
      (5, replace(M.get_heuristics_config(shape, bf16), word_loads=True)),
      (4, M(block_m=4, block_n=16, block_groups=16, split_k=2, method="fma")),
      (1, M(block_m=1, block_n=32, block_groups=32, split_k=4, method="fma", word_loads=False)),
      (11, M(block_m=8, block_n=16, block_groups=64, split_k=3, method="fma",
             x_vector_loads=False)),
      (3, M(block_m=4, block_n=16, block_groups=16, split_k=2, method="fma", word_loads=False))]:
    cases.append((f"matmul variant M={m_rows} {mm_words[0]}x{mm_words[1]} bf16 {_short(config)}",
                  _check_matmul, dict(shape=(m_rows,) + mm_words, dtype=bf16, config=config)))
  config = M(block_m=128, block_n=128, block_groups=32, num_warps=8)
  cases.append((f"matmul variant M={big_m} {mm_words[0]}x{mm_words[1]} bf16 {_short(config)}",
                _check_matmul, dict(shape=(big_m,) + mm_words, dtype=bf16, config=config)))
  for shape, dtype in [(mm_bytes, bf16), (mm_bytes, f32)]:
    config = M(method="decode")
    cases.append((f"matmul variant M={big_m} {shape[0]}x{shape[1]} {jnp.dtype(dtype).name} "
                  f"{_short(config)}", _check_matmul,
                  dict(shape=(big_m,) + shape, dtype=dtype, config=config)))
  config = replace(config_lib.FromIOConfig.get_heuristics_config(large_io, bf16),
                   word_loads=False)
  cases.append((f"from_io variant M={large_io[0]} {large_io[1]}x{large_io[2]} {_short(config)}",
                _check_from_io, dict(shape=large_io, dtype=bf16, lagged=False, config=config)))
  # XLA's GEMM by row blocks, a ragged last block (float32: exact products).
  for dtype, lagged in ((bf16, False), (f32, True)):
    config = config_lib.FromIOConfig(xla_gemm_rows=max(1, large_io[1] // 3))
    cases.append((f"from_io variant M={large_io[0]} {large_io[1]}x{large_io[2]} "
                  f"{jnp.dtype(dtype).name} {_short(config)}", _check_from_io,
                  dict(shape=large_io, dtype=dtype, lagged=lagged, config=config)))
  cases.append((f"decode / pack / unpack / init {mm_bytes[0]}x{mm_bytes[1]}",
                 _check_elementwise, dict(shape=mm_bytes)))
  return cases


def part_check(args, budget, out) -> None:
  for name, fn, kwargs in check_cases(args.quick):
    if args.only and not re.search(args.only, name):
      continue
    if not budget.allows(name):
      continue
    out[name] = _guard(fn, interpret=args.quick, **kwargs)
    budget.report(f"{name:<90} {_describe(out[name])}")


# ----------------------------------------------------------------------------
# Part: counter update throughput.


def update_sweep_configs(shape, dtype) -> list:
  """The heuristic, then the candidates most likely to help first."""
  replace = dataclasses.replace
  base = config_lib.CounterUpdateConfig.get_heuristics_config(shape, dtype)
  warps = base.num_warps
  out = [base,
         replace(base, block_rows=2 * base.block_rows, num_warps=min(16, 2 * warps)),
         replace(base, num_warps=max(1, warps // 2)),
         replace(base, word_loads=not base.word_loads),
         replace(base, tail_groups=base.block_groups),
         replace(base, block_rows=2 * base.block_rows),
         replace(base, block_rows=4 * base.block_rows, num_warps=min(16, 4 * warps)),
         replace(base, vector_loads=False),
         replace(base, num_warps=min(16, 2 * warps)),
         replace(base, num_warps=max(1, warps // 4)),
         replace(base, block_groups=max(base.tail_groups, base.block_groups // 2))]
  return list(dict.fromkeys(out))


def part_update(args, budget, out) -> None:
  interpret = args.quick
  copy_bps = out["copy_bytes_per_s"] = copy_bandwidth(args)
  budget.report("copy bandwidth " + ", ".join(f"{k} {v / 1e12:.3f} TB/s"
                                              for k, v in copy_bps.items()))
  f32, bf16 = jnp.float32, jnp.bfloat16
  cases = [((64, 16 * 33), f32), ((40, 4 * 37), f32)] if args.quick else \
      [((8192, 8192), f32), ((8192, 8192), bf16), ((1000, 3996), f32), ((1536, 2304), f32)]
  rows = out["cases"] = {}
  befores = []
  if args.before:
    befores.append(("before", functools.partial(_baseline().counter_update, C=C, lagged=False,
                                                interpret=interpret)))
  if args.before_update:  # The frozen module at today's heuristic config, not screened.
    frozen = _harness.frozen_module(args.before_update)
    befores.append(("frozen", lambda *a, **k: frozen.counter_update(
        *a, C=C, lagged=False, config=None, interpret=interpret)))
  for shape, dtype in cases:
    for label, fn in befores:
      name = f"{shape[0]}x{shape[1]} {jnp.dtype(dtype).name} {label}"
      if budget.allows(name):
        rows[name] = _guard(time_update, args, fn, shape, dtype, copy_bps)
        budget.report(f"{name:<100} {_describe_time(rows[name], copy_bps)}")
  per_case = {(shape, dtype): update_sweep_configs(shape, dtype)[: (2 if args.quick else None)]
              for shape, dtype in cases}
  expected_of = {}
  hyper, seed = hyper_array(), jnp.full((1,), 99, jnp.uint32)
  for (shape, dtype), config in _ranked(per_case):
    name = f"{shape[0]}x{shape[1]} {jnp.dtype(dtype).name} {_short(config)}"
    if not budget.allows(name):
      continue

    def screened(shape=shape, dtype=dtype, config=config):
      state = make_state(jax.random.key(6), *shape)
      grad = jax.random.normal(jax.random.key(7), shape, dtype)
      if (shape, dtype) not in expected_of:
        expected_of[(shape, dtype)] = jax.jit(functools.partial(
            reference.counter_update_reference, C=C, lagged=False))(*state, grad, hyper, seed[0])
      fn = functools.partial(update_kernels.counter_update, C=C, lagged=False, config=config,
                             interpret=interpret)
      check = compare_states(jax.jit(fn)(*state, grad, hyper, seed), expected_of[(shape, dtype)],
                             state[0])
      if not check["within_spec"]:
        return {"excluded": True, "check": check}
      return {**time_update(args, fn, shape, dtype, copy_bps),
              "off_fraction": check["off_fraction"], "config": _short(config)}

    rows[name] = _guard(screened)
    budget.report(f"{name:<100} {_describe_time(rows[name], copy_bps)}")


def _describe_time(row, copy_bps=None) -> str:
  if "seconds" not in row:
    return str(row)[:160]
  text = f"{row['seconds'] * 1e6:9.1f} us"
  if "device_s" in row:
    text += f" ({row['device_s'] * 1e6:7.1f} us device)"
  if "device_speedup_vs_bf16" in row:
    text += f"  {row['device_speedup_vs_bf16']:.2f}x of dense (device)"
  if "fraction_of_copy" in row:
    text += f"  {100 * row['fraction_of_copy']:5.1f}% of copy"
  if "device_fraction_of_copy" in row:
    text += f" ({100 * row['device_fraction_of_copy']:5.1f}% device)"
  if "speedup_vs_bf16" in row:
    text += f"  {row['speedup_vs_bf16']:.2f}x of dense matmul"
  if "time_vs_gemm_plus_update" in row:
    text += f"  x{row['time_vs_gemm_plus_update']:.2f} of GEMM+update"
  if "device_vs_gemm_plus_update" in row:
    text += f" (x{row['device_vs_gemm_plus_update']:.2f} device)"
  return text


# ----------------------------------------------------------------------------
# Part: packed matmul.


def session5_matmul_config(shape):
  """The session-5 heuristic of the packed matmul (for ``--before-matmul``'s frozen kernels)."""
  m_rows, out_features, in_features = shape
  M = config_lib.MatmulConfig
  if m_rows == 1:
    return M(block_m=1, block_n=32, block_groups=64, split_k=4, method="fma")
  if m_rows >= 64:
    return M(method="decode")
  if m_rows <= 4 and in_features <= 4096:
    return M(block_m=16, block_n=64, block_groups=64, split_k=16, word_loads=False)
  if m_rows <= 4:
    return M(block_m=16, block_n=64, block_groups=32, split_k=8, word_loads=False)
  return M(block_m=16, block_n=64, block_groups=64, split_k=8, word_loads=False)


def session10_matmul_config(shape, dtype, op="forward"):
  """Session 10's config, run by today's kernels (``--before-config session10``).

  Forward: float32 ``x`` at 4-16 rows took fma tiles of all rows, and beyond
  16 rows the decode method with a float32 temporary and a float32 GEMM.
  Input gradient (``shape = (M, in, out)``): the dot tiles over all of
  ``out`` in one program (no split) at every ``M``. Both without
  ``split_float32``.
  """
  M = config_lib.MatmulConfig
  m_rows, out_features, in_features = shape
  itemsize = jnp.dtype(dtype).itemsize
  if op == "input_grad":
    return dataclasses.replace(lane_dot_tiles(shape, dtype), split_k=1, split_float32=False)
  if itemsize >= 4 and 4 <= m_rows <= 16:
    return M._fma_rows_config(m_rows, out_features, in_features)  # pylint: disable=protected-access
  if itemsize >= 4 and m_rows > 16:
    return M(method="decode", split_float32=False)
  return M.get_heuristics_config(shape, dtype)


def lane_dot_tiles(shape, dtype):
  """``MatmulConfig._dot_tiles`` as sessions 6-21 had it: per-lane dots, 3 stages.

  Session 22 gave 16-bit ``x`` up to 64 rows joined tiles there; the other
  cases are today's.
  """
  M = config_lib.MatmulConfig
  m_rows, out_features, in_features = shape
  if jnp.dtype(dtype).itemsize > 2 or m_rows > 64:
    return M._dot_tiles(shape, dtype)  # pylint: disable=protected-access
  if m_rows <= 16:
    return M(block_m=16, block_n=64, block_groups=64, num_warps=4, num_stages=3,
             split_k=config_lib.matmul._gemv_split_k(  # pylint: disable=protected-access
                 out_features, in_features, 64, 64))
  steps = -(-max(1, in_features // 4) // 32)
  split = min(steps, config_lib.next_power_of_2(max(1, 256 // -(-out_features // 64))))
  return M(block_m=max(16, config_lib.next_power_of_2(m_rows)), block_n=64, block_groups=32,
           num_warps=4, num_stages=3, split_k=split)


def lane_dot_heuristic(shape):
  """Sessions 6-21's heuristic from 5 to 16 rows: 16-row per-lane dot tiles of 32 outputs,
  one 512-input step per program."""
  steps = max(1, -(-max(1, shape[2] // 4) // 128))
  return config_lib.MatmulConfig(block_m=16, block_n=32, block_groups=128, num_warps=4,
                                 num_stages=3, split_k=steps)


def matmul_sweep_configs(shape, dtype=jnp.bfloat16) -> list:
  """The heuristic, then the fma grid and the dot tiles, most likely first."""
  m_rows = shape[0]
  M = config_lib.MatmulConfig
  base = M.get_heuristics_config(shape, dtype)
  block_m = config_lib.next_power_of_2(m_rows)
  # (block_n, block_groups, split_k, num_warps) around session 6's best fma tiles; split 1
  # needs no XLA sum of partial tiles after the kernel.
  fma_grid = [(8, 256, 4, 4), (16, 128, 8, 4), (8, 512, 1, 4), (16, 512, 1, 8), (4, 256, 4, 2)]
  fma = [M(block_m=block_m, block_n=n, block_groups=g, num_warps=w, num_stages=3, split_k=k,
           method="fma") for n, g, k, w in fma_grid]
  # (block_n, block_groups, split_k, num_warps) of 16-row dot tiles on words.
  dot_grid = [(32, 128, 4, 4), (64, 128, 16, 4), (32, 256, 8, 4)]
  dot = [M(block_m=16, block_n=n, block_groups=g, num_warps=w, num_stages=3, split_k=k)
         for n, g, k, w in dot_grid]
  if jnp.dtype(dtype).itemsize >= 4 and 1 < m_rows <= 16:
    # float32 x: the heuristic against fma tiles of all rows (session 10's heuristic), the
    # decode method (its GEMM on bfloat16 pieces, session 11) and the dot tiles that split x
    # in registers.
    return list(dict.fromkeys([base, M._fma_rows_config(*shape),  # pylint: disable=protected-access
                               M(method="decode"),
                               M._dot_tiles(shape, dtype)]))  # pylint: disable=protected-access
  if m_rows == 1:  # The heuristic, then the split tiles (session 18's heuristic).
    split = M._fma_config(*shape)  # pylint: disable=protected-access
    strided = dataclasses.replace(split, x_vector_loads=False)
    # Session 19: small programs (GEMV-like: 2-8 outputs, 1-2 warps), split along in or whole
    # rows per program (no XLA sum of partial tiles after the kernel).
    gemv = [M(block_m=1, block_n=n, block_groups=g, num_warps=w, num_stages=3, split_k=k,
              method="fma")
            for n, g, k, w in [(4, 1024, 1, 2), (8, 1024, 1, 4), (4, 512, 1, 2), (2, 1024, 1, 1),
                               (4, 1024, 1, 1), (8, 1024, 1, 2), (16, 1024, 1, 4), (8, 512, 1, 2),
                               (8, 256, 4, 2), (4, 128, 8, 2)]]
    out = [base, split] + gemv + [strided, dataclasses.replace(split, num_stages=2),
                                  dataclasses.replace(split, num_stages=2,
                                                      split_k=2 * split.split_k)]
    out += fma + [dataclasses.replace(c, x_vector_loads=False) for c in fma[:2]]
    out += dot[:2]
  elif m_rows <= 4:
    # Sessions 6-9's heuristic for 2-16 rows (16-row dot tiles, one 512-input step per
    # program), then the other dot tiles and the fma grid (rows sharing each weight's decode).
    dot16 = lane_dot_heuristic(shape)
    # Session 18: fma tiles of all rows were latency-bound (Nsight Compute: long-scoreboard
    # stalls, 40% occupancy with 8 blocks per SM for the pipeline's shared memory), so
    # shallower pipelines and more programs too.
    latency = [dataclasses.replace(base, num_stages=2), dataclasses.replace(base, split_k=2),
               dataclasses.replace(base, num_stages=2, split_k=2),
               dataclasses.replace(base, num_stages=2, split_k=2, num_warps=8),
               dataclasses.replace(base, block_groups=256, num_stages=2, split_k=4)]
    # Session 19: small programs (2 warps, 4-8 outputs).
    latency = [dataclasses.replace(base, block_n=n, block_groups=g, split_k=k, num_warps=2)
               for n, g, k in [(4, 256, 4), (4, 512, 2), (8, 256, 4), (4, 1024, 1)]] + latency
    out = ([base] + (latency if base.method == "fma" else []) + [dot16] + dot[:4] + fma[:4]
           + dot[4:] + fma[4:8])
  elif m_rows <= 16:
    # fma tiles of all rows (each weight's t shared by the rows, one multiply-add per row),
    # small enough that the rows' accumulators stay in registers.
    many = [M(block_m=block_m, block_n=n, block_groups=g, num_warps=w, num_stages=3,
              split_k=k, method="fma")
            for n, g, k, w in [(8, 128, 4, 4), (8, 256, 2, 4), (16, 128, 4, 4), (4, 256, 4, 2),
                               (8, 512, 1, 4)]]
    out = [base] + dot + many
  elif m_rows < 256:
    out = [base] + [c for c in M.candidates(shape, jnp.bfloat16)
                                     if c.method != base.method][:3]
  else:
    # GEMM tiles that decode in registers (bytes: 4 code lanes, so 4 dots of block_groups
    # each; words: 16 dots of block_groups / 4) against the decode-then-XLA-GEMM default.
    out = [base] + [
        M(block_m=bm, block_n=bn, block_groups=g, num_warps=w, word_loads=words)
        for bm, bn, g, w, words in [(128, 128, 64, 8, False), (128, 128, 32, 8, False),
                                    (64, 128, 64, 4, False), (128, 256, 32, 8, False),
                                    (128, 128, 128, 8, True)]]
  return list(dict.fromkeys(out))


def wgmma_sweep_configs(shape, dtype=jnp.bfloat16) -> list:
  """The ``"wgmma"`` kernel's heuristic tiles (Hopper), then the Triton heuristic, then the
  kernel's neighbours (``MatmulConfig.wgmma_candidates``: its ``in`` split doubled and
  halved, the other pipeline depth) and (from 128 rows) batch tiles of 64."""
  M = config_lib.MatmulConfig
  tiles, *neighbours = M.wgmma_candidates(shape, dtype)
  out = [tiles, M.get_heuristics_config(shape, dtype), *neighbours]
  if tiles.block_m == 128:
    out.append(dataclasses.replace(tiles, block_m=64))
  return list(dict.fromkeys(out))


def _joined_tiles(in_features, block_m, block_n, groups, warps, stages, steps_per_program,
                  **fields):
  """Joined dot tiles (``interleave_lanes``) with ``in`` split into slabs of
  ``steps_per_program`` steps of ``groups`` groups; ``fields``: the other config fields."""
  steps = -(-max(1, in_features // 4) // groups)
  return config_lib.MatmulConfig(
      block_m=block_m, block_n=block_n, block_groups=groups, num_warps=warps,
      num_stages=stages, split_k=-(-steps // steps_per_program), interleave_lanes=True,
      **fields)


def _gemm_tiles(shape, block_n, groups, warps, stages, **fields):
  """Joined GEMM tiles of up to 128 rows (a power of 2, at least 16) for ``(M, out,
  in)``, ``in`` split while the tiles give fewer programs than the H200's 132 SMs."""
  m_rows, out_features, in_features = shape
  block_m = min(128, max(16, config_lib.next_power_of_2(m_rows)))
  n_tiles = -(-m_rows // block_m) * -(-out_features // block_n)
  steps = -(-max(1, in_features // 4) // groups)
  split = min(steps, config_lib.next_power_of_2(max(1, 132 // n_tiles))) if n_tiles < 132 else 1
  return config_lib.MatmulConfig(
      block_m=block_m, block_n=block_n, block_groups=groups, num_warps=warps,
      num_stages=stages, split_k=split, interleave_lanes=True, **fields)


def interleave_sweep_configs(shape, dtype=jnp.bfloat16) -> list:
  """The heuristic, then dot tiles with the code lanes joined into one tile of ``t``
  (``MatmulConfig.interleave_lanes``: one dot per step on ``x`` as it is), ``t`` on the
  right or on the left (``weights_lhs``: Hopper's warpgroup MMA reads it from registers).

  Decode-sized ``M`` (<= 16): 16-row tiles of 32-128 outputs, 128-512 inputs
  per step, 1-32 steps per program (``in`` split for the rest), beside the
  per-lane dot tiles. ``M`` from 17 to 64: sessions 6-21's per-lane tiles and
  decode next. ``M > 16``: GEMM tiles with ``t`` on the left (its
  64-128 outputs the MMA's rows, 64-256 rows of ``x`` its columns), one with
  ``t`` on the right; without a software pipeline, or with the next step's
  loads carried in registers (``register_prefetch``).
  """
  m_rows, _, in_features = shape
  M = config_lib.MatmulConfig
  base = M.get_heuristics_config(shape, dtype)
  out = [base]

  def tiles(block_m, block_n, groups, warps, stages, steps_per_program, lhs, prefetch=False):
    return _joined_tiles(in_features, block_m, block_n, groups, warps, stages,
                         steps_per_program, weights_lhs=lhs, register_prefetch=prefetch)

  if m_rows <= 16:
    out.append(lane_dot_heuristic(shape))
    # Runs 2-3 (session 22): one step per program was the rule; with a 2-3 stage pipeline
    # every config of several steps took 2-3x longer, without one 1-2.4x. Run 6: several
    # steps with the next step's loads in registers (register_prefetch).
    out += [tiles(16, *t) for t in [
        (64, 64, 4, 1, 2, True, True), (64, 64, 4, 1, 4, True, True),
        (64, 64, 4, 1, 8, True, True), (64, 32, 4, 1, 4, True, True),
        (64, 32, 4, 1, 8, True, True), (64, 32, 4, 1, 32, True, True),
        (128, 32, 8, 1, 4, True, True), (128, 32, 8, 1, 8, True, True),
        (64, 64, 4, 1, 16, True, True), (64, 64, 4, 1, 4, True, False)]]
  else:
    if m_rows <= 64:  # sessions 6-21's heuristic from 17 to 63 rows (per-lane dots), decode
      out += [lane_dot_tiles(shape, jnp.bfloat16), M(method="decode")]  # 16-bit x's tiles
      out += [dataclasses.replace(base, register_prefetch=True),
              dataclasses.replace(base, register_prefetch=True, block_groups=64),
              dataclasses.replace(base, register_prefetch=True, split_k=2 * base.split_k)]
    for block_n, groups, warps, stages, lhs in [
        (128, 16, 8, 1, True), (128, 32, 8, 1, True), (64, 16, 4, 1, True),
        (128, 16, 8, 1, False)]:
      for prefetch in (False, True):
        out.append(_gemm_tiles(shape, block_n, groups, warps, stages, weights_lhs=lhs,
                               register_prefetch=prefetch))
  return list(dict.fromkeys(out))


def part_matmul(args, budget, out) -> None:
  interpret = args.quick
  x_dtype = jnp.dtype(args.x_dtype)
  forward = args.op == "forward"
  dense_name = ("bf16_matmul" if x_dtype == jnp.bfloat16 else "f32_matmul") + (
      "" if forward else "_input_grad")
  shapes = [(48, 16 * 5)] if args.quick else [(4096, 4096), (8192, 8192)]
  if args.batches:
    batches, extra = tuple(int(m) for m in args.batches.split(",")), []
  else:
    batches = (1, 4) if args.quick else (1, 4, 16)
    extra = [] if args.quick else [(64, (4096, 4096))]
  cases = [(m, shape) for shape in shapes for m in batches] + extra
  weights = {}
  for shape in shapes:
    # One copy per call of a timed group: calls sharing a weight let XLA merge the dense
    # GEMVs into one GEMM (session 6: 8192^2 M=1 at 8.7 TB/s with 2 copies).
    n_copies = max(_copies(shape[0] * shape[1] * 3 // 4, args.quick),
                   1 if args.quick else args.inner)
    weights[shape] = [make_state(jax.random.key(10 + i), *shape)[:2] for i in range(n_copies)]
  rows = out["cases"] = {}
  # "speedup_vs_bf16" in the rows: against this dense matmul (weights in x's dtype).
  out["dense"] = dense_name
  out["op"] = args.op
  # The operand's width: x (M, in) forward, grad_y (M, out) for the input gradient.
  width = lambda shape: shape[1] if forward else shape[0]

  def measure(m_rows, shape, call, operands, y_ref=None):
    xs = [jax.random.normal(jax.random.key(100 + i), (m_rows, width(shape)), x_dtype)
          for i in range(args.inner)]
    jitted = jax.jit(lambda xs, ws: [call(x, *ws[i % len(ws)]) for i, x in enumerate(xs)])
    row = {}
    if y_ref is not None:  # Screen with the timed executable's own first output.
      row = relative_error(jitted(xs, operands)[0], y_ref)
      if not row["relative"] < 1e-2:
        return {"excluded": True, **row}
    seconds = median_time(jitted, lambda: (xs, operands),
                          samples=args.samples)["median_s"] / args.inner
    busy = _harness.device_busy(jitted, xs, operands, calls=3)
    if busy is not None:  # Device busy time (CUPTI): no launch gaps, same on both sides.
      row["device_s"] = busy["busy_ms"] / 1e3 / args.inner
      row["kernels_ms"] = {k: v / args.inner for k, v in busy["kernels"].items()}
    return {"seconds": seconds, **row}

  bf16_seconds, y_refs = {}, {}
  per_case = {}
  for m_rows, shape in cases:
    if forward:
      sweep = {"interleave": interleave_sweep_configs,
               "wgmma": wgmma_sweep_configs}.get(args.sweep, matmul_sweep_configs)
      configs = sweep((m_rows,) + shape, x_dtype)
    else:  # (M, in, out)
      configs = config_lib.MatmulConfig.input_grad_candidates((m_rows, shape[1], shape[0]),
                                                               x_dtype)
    configs = configs[: (2 if args.quick else None)]
    if args.before_config == "session10":  # Today's kernels at session 10's configs.
      before = session10_matmul_config((m_rows,) + (shape if forward else shape[::-1]), x_dtype,
                                       args.op)
      if before != configs[0]:
        configs.insert(1, ("before", before))
    elif args.before_matmul:  # The frozen kernels, right after the new heuristic.
      before = (session5_matmul_config((m_rows,) + shape) if args.before_config == "session5"
                else configs[0])
      configs.insert(1, ("before", before))
    per_case[(m_rows, shape)] = [dense_name] + configs
  for (m_rows, shape), config in _ranked(per_case):
    tag = f"M={m_rows} {shape[0]}x{shape[1]}"
    name = f"{tag} {_case_label(config)}"
    if not budget.allows(name):
      continue
    packs = weights[shape]
    if config == dense_name:
      dense = [(reference.ternary_decode_reference(p, s, C, x_dtype),) for p, s in packs]
      row = _guard(measure, m_rows, shape, lambda x, w: jnp.dot(
          x, w.T if forward else w, preferred_element_type=jnp.float32).astype(x_dtype), dense)
      del dense
      bf16_seconds[(m_rows, shape)] = row if "seconds" in row else None
    else:
      if (m_rows, shape) not in y_refs:
        x0 = jax.random.normal(jax.random.key(100), (m_rows, width(shape)), x_dtype)
        ref_fn = (reference.ternary_matmul_reference if forward
                  else reference.ternary_matmul_input_grad_reference)
        y_refs[(m_rows, shape)] = ref_fn(x0, *packs[0], C=C, out_dtype=jnp.float32)
      kernels, kernel_config = matmul_kernels, config
      if isinstance(config, tuple):  # ("before", config)
        kernel_config = config[1]
        if args.before_matmul:  # the frozen kernels of --before-matmul
          kernels = _harness.frozen_module(args.before_matmul)
      call = functools.partial(
          kernels.ternary_matmul if forward else kernels.ternary_matmul_input_grad, C=C,
          out_dtype=x_dtype, config=kernel_config, interpret=interpret)
      row = _guard(measure, m_rows, shape, call, packs, y_refs[(m_rows, shape)])
      row["config"] = _case_label(config)
      base = bf16_seconds.get((m_rows, shape))
      if row.get("seconds") and base:
        row["speedup_vs_bf16"] = base["seconds"] / row["seconds"]
        if "device_s" in row and "device_s" in base:
          row["device_speedup_vs_bf16"] = base["device_s"] / row["device_s"]
    rows[name] = row
    budget.report(f"{name:<100} {_describe_time(row)}")


# ----------------------------------------------------------------------------
# Part: update from (x, grad_out).


def from_io_sweep_configs(shape) -> list:
  """The heuristic, then larger tiles, deeper reductions and pipelining."""
  replace = dataclasses.replace
  base = config_lib.FromIOConfig.get_heuristics_config(shape, jnp.bfloat16)
  if base.fused(shape[2]):
    return [base]
  out = [base,
         replace(base, block_rows=128, num_warps=8),
         replace(base, block_rows=128, block_groups=64, num_warps=8),
         replace(base, block_groups=64, num_warps=8),
         replace(base, num_stages=4),
         replace(base, block_m=32, num_stages=4),
         replace(base, block_rows=128, num_warps=8, num_stages=4),
         replace(base, num_stages=2),
         replace(base, block_rows=128, block_groups=64, num_warps=8, num_stages=2),
         replace(base, word_loads=False),
         replace(base, block_rows=128, block_groups=64, block_m=32, num_warps=8, num_stages=4)]
  return list(dict.fromkeys(out))


def from_io_cases(shape, sweep: bool) -> list:
  """The heuristic (the kernels' own GEMM), XLA's GEMM by row blocks, and (``sweep``) the
  tile sweep."""
  base = config_lib.FromIOConfig.get_heuristics_config(shape, jnp.bfloat16)
  blocks = [dataclasses.replace(base, xla_gemm_rows=rows) for rows in (1024, 512, 2048, 256)
            if rows < shape[1]]
  sweep_configs = from_io_sweep_configs(shape)[1:] if sweep else []
  return list(dict.fromkeys([base] + blocks + sweep_configs))


def part_from_io(args, budget, out) -> None:
  interpret = args.quick
  out_features, in_features = (64, 16 * 40) if args.quick else (4096, 4096)
  batches = (64,) if args.quick else (4096, 1024, 256)
  rows = out["cases"] = {}
  hyper, seed = hyper_array(), jnp.full((1,), 7, jnp.uint32)
  state_key = jax.random.key(10)
  inner = max(1, min(args.inner, 3))

  def gemm_plus_update(packed, scale, v, x, grad_out, hyper, seed):
    grad = jnp.einsum("mo,mi->oi", grad_out, x, preferred_element_type=jnp.float32)
    return update_kernels.counter_update(packed, scale, v, grad, hyper, seed, C=C, lagged=False,
                                         interpret=interpret)

  per_case = {}
  for m_rows in batches:
    per_case[m_rows] = ["gemm_plus_update"] + from_io_cases(
        (m_rows, out_features, in_features), sweep=args.from_io_sweep and m_rows == batches[0])
  inputs, dense_seconds, expected_of = {}, {}, {}
  for m_rows, config in _ranked(per_case):
    tag = f"M={m_rows} {out_features}x{in_features} bf16"
    name = f"{tag} {_case_label(config)}"
    if not budget.allows(name):
      continue
    if m_rows not in inputs:  # One (x, grad_out) per chained step: see chained().
      inputs[m_rows] = [
          (jax.random.normal(jax.random.key(8 + 2 * i), (m_rows, in_features), jnp.bfloat16),
           jax.random.normal(jax.random.key(9 + 2 * i), (m_rows, out_features), jnp.bfloat16))
          for i in range(inner)]
    steps = inputs[m_rows]
    x, grad_out = steps[0]

    def measure(config=config, m_rows=m_rows, x=x, grad_out=grad_out, steps=steps):
      row = {}
      if config == "gemm_plus_update":
        fn = gemm_plus_update
      else:
        fn = functools.partial(update_kernels.counter_update_from_io, C=C, lagged=False,
                               config=config, interpret=interpret)
        state = make_state(jax.random.key(13), out_features, in_features)
        if m_rows not in expected_of:
          expected_of[m_rows] = jax.jit(functools.partial(
              reference.counter_update_from_io_reference, C=C, lagged=False))(
                  *state, x, grad_out, hyper, seed[0])
        check = compare_states(jax.jit(fn)(*state, x, grad_out, hyper, seed),
                               expected_of[m_rows], state[0])
        if not check["within_spec"]:
          return {"excluded": True, "check": check}
        row = {"off_fraction": check["off_fraction"], "config": _short(config)}
      run = chained(fn, inner, per_step=True)
      timing = median_time(lambda p, s, v: run(p, s, v, steps),
                           lambda: make_state(state_key, out_features, in_features),
                           samples=max(3, args.samples // 2))
      row["seconds"] = timing["median_s"] / inner
      busy = _harness.device_busy(
          lambda p, s, v: run(p, s, v, steps),
          arg_sets=[make_state(state_key, out_features, in_features) for _ in range(4)])
      if busy is not None:
        row["device_s"] = busy["busy_ms"] / 1e3 / inner
        row["kernels_ms"] = {k: v / inner for k, v in busy["kernels"].items()}
      if config == "gemm_plus_update" or config.xla_gemm_rows or config == per_case[m_rows][1]:
        row["memory"] = memory(lambda p, s, v, x, g: fn(p, s, v, x, g, hyper_array(),
                                                         jnp.ones((1,), jnp.uint32)),
                               *make_state(state_key, out_features, in_features), x, grad_out)
      return row

    row = rows[name] = _guard(measure)
    if config == "gemm_plus_update":
      dense_seconds[m_rows] = row
    elif row.get("seconds") and dense_seconds.get(m_rows, {}).get("seconds"):
      dense = dense_seconds[m_rows]
      row["time_vs_gemm_plus_update"] = row["seconds"] / dense["seconds"]
      if "device_s" in row and "device_s" in dense:
        row["device_vs_gemm_plus_update"] = row["device_s"] / dense["device_s"]
    budget.report(f"{name:<100} {_describe_time(row)}")


# ----------------------------------------------------------------------------
# Part: the library's autotuners (jaxnoise.ops.ternary.tuning) on this device.


def _record_row(record) -> dict:
  """A tuning record as JSON: every candidate's status, deviation and seconds."""
  return {"selected": _short(record.selected) if record.selected is not None else None,
          "candidates": [{"config": _short(c.config), "status": c.status,
                          "deviation": c.deviation, "seconds": c.seconds, "error": c.error}
                         for c in record.candidates]}


def _tuned_and_timed(tune, heuristic, time_config) -> dict:
  """Runs ``tune()`` and times the heuristic and, if another, the selected config.

  ``time_config(config)`` returns the timing fields of one config's row.
  """
  start = time.perf_counter()
  record = tune()
  row = {**_record_row(record), "tune_s": time.perf_counter() - start, "timed": {}}
  for label, config in (("heuristic", heuristic), ("selected", record.selected)):
    row["timed"][label] = {"config": _short(config), **time_config(config)}
    if record.selected == heuristic:
      break
  return row


def part_tune(args, budget, out) -> None:
  """Runs the four ternary tuners at the benchmark shapes and times the winner.

  The tuner times several calls per dispatch by wall clock (see
  ``jaxnoise.ops.ternary.tuning``); here the heuristic and the selected config
  are then timed side by side in device time as the other parts do (updates
  chained, matmuls on a weight copy per call), so a selection that only won
  on noise shows up.
  """
  from jaxnoise.ops import autotune  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.ternary import tuning  # pylint: disable=g-import-not-at-top
  implementation = "interpret" if args.quick else "pallas"
  interpret = args.quick
  repeats = 3 if args.quick else 10
  f32, bf16 = jnp.float32, jnp.bfloat16
  copy_bps = out["copy_bytes_per_s"] = copy_bandwidth(args)
  rows = out["cases"] = {}

  def run_case(name, case):
    if budget.allows(name) and not (args.only and not re.search(args.only, name)):
      rows[name] = _guard(case)
      budget.report(f"{name:<60} {_describe_tune(rows[name])}")

  update_cases = [((40, 4 * 37), f32)] if args.quick else \
      [((8192, 8192), f32), ((8192, 8192), bf16), ((1536, 2304), f32), ((1000, 3996), f32)]
  for shape, dtype in update_cases:
    def tune_update(shape=shape, dtype=dtype):
      state = make_state(jax.random.key(20), *shape)
      grad = jax.random.normal(jax.random.key(21), shape, dtype)
      return _tuned_and_timed(
          lambda: tuning.tune_counter_update(*state, grad, C=C, implementation=implementation,
                                             repeats=repeats),
          config_lib.CounterUpdateConfig.get_heuristics_config(shape, dtype),
          lambda config: time_update(args, functools.partial(
              update_kernels.counter_update, C=C, lagged=False, config=config,
              interpret=interpret), shape, dtype, copy_bps))

    run_case(f"counter_update {shape[0]}x{shape[1]} {jnp.dtype(dtype).name}", tune_update)

  M = config_lib.MatmulConfig
  # (name, kernel, tuner, heuristic for (M, out, in), operand width of (out, in), first key).
  products = {
      "forward": ("ternary_matmul", matmul_kernels.ternary_matmul, tuning.tune_matmul,
                  M.get_heuristics_config, lambda shape: shape[1], 30),
      "input_grad": ("matmul input grad", matmul_kernels.ternary_matmul_input_grad,
                     tuning.tune_matmul_input_grad,
                     lambda s, dtype: M.get_input_grad_heuristics_config((s[0], s[2], s[1]),
                                                                         dtype),
                     lambda shape: shape[0], 50)}
  product_cases = [("forward", 3, (48, 16 * 5), bf16), ("input_grad", 3, (48, 16 * 5), f32)] \
      if args.quick else \
      [("forward", m, (n, n), bf16) for n in (4096, 8192) for m in (1, 4, 16, 256)] + \
      [("input_grad", m, (4096, 4096), dtype) for dtype in (bf16, f32) for m in (1, 4, 256)]
  for op, m_rows, shape, dtype in product_cases:
    name, kernel, tuner, heuristic, width, key = products[op]

    def tune_product(m_rows=m_rows, shape=shape, dtype=dtype, kernel=kernel, tuner=tuner,
                     heuristic=heuristic, width=width, key=key):
      n_copies = 2 if args.quick else max(2, _copies(shape[0] * shape[1] * 3 // 4, False))
      packs = [make_state(jax.random.key(key + i), *shape)[:2] for i in range(n_copies + 1)]
      operand = jax.random.normal(jax.random.key(key + 1), (m_rows, width(shape)), dtype)

      def time_config(config):
        call = jax.jit(functools.partial(kernel, C=C, out_dtype=dtype, config=config,
                                         interpret=interpret))
        busy = _harness.device_busy(call, arg_sets=[(operand, *pack) for pack in packs])
        return {"device_s": None if busy is None else busy["busy_ms"] / 1e3}

      return _tuned_and_timed(
          lambda: tuner(operand, *packs[0], C=C, implementation=implementation, repeats=repeats),
          heuristic((m_rows,) + shape, dtype), time_config)

    run_case(f"{name} M={m_rows} {shape[0]}x{shape[1]} {jnp.dtype(dtype).name}", tune_product)

  from_io_shape = (64, 16 * 40) if args.quick else (4096, 4096)
  for m_rows in (64,) if args.quick else (1024, 4096):
    def tune_from_io(m_rows=m_rows):
      state = make_state(jax.random.key(40), *from_io_shape)
      x = jax.random.normal(jax.random.key(41), (m_rows, from_io_shape[1]), bf16)
      grad_out = jax.random.normal(jax.random.key(42), (m_rows, from_io_shape[0]), bf16)

      def time_config(config):
        run = chained(functools.partial(update_kernels.counter_update_from_io, C=C,
                                        lagged=False, config=config, interpret=interpret), 2)
        busy = _harness.device_busy(
            lambda p, s, v: run(p, s, v, x, grad_out),
            arg_sets=[make_state(jax.random.key(43), *from_io_shape) for _ in range(3)])
        return {"device_s": None if busy is None else busy["busy_ms"] / 2e3}

      return _tuned_and_timed(
          lambda: tuning.tune_counter_update_from_io(*state, x, grad_out, C=C,
                                                     implementation=implementation,
                                                     repeats=repeats),
          config_lib.FromIOConfig.get_heuristics_config((m_rows,) + from_io_shape, bf16),
          time_config)

    run_case(f"counter_update_from_io M={m_rows} {from_io_shape[0]}x{from_io_shape[1]} "
             f"bfloat16", tune_from_io)
  autotune.clear()


def _describe_tune(row) -> str:
  if "candidates" not in row:
    return str(row)[:160]
  statuses = [c["status"] for c in row["candidates"]]
  text = (f"{len(statuses)} candidates ({statuses.count('excluded')} excluded, "
          f"{statuses.count('failed')} failed) in {row['tune_s']:.0f} s; selected "
          f"{'the heuristic' if len(row.get('timed', {})) == 1 else row['selected']}")
  for label, timed in row.get("timed", {}).items():
    if timed.get("device_s"):
      text += f"; {label} {timed['device_s'] * 1e6:.1f} us device"
  return text


# ----------------------------------------------------------------------------
# Driver.


def part_decode(args, budget, out) -> None:
  shapes = [(48, 16 * 5)] if args.quick else [(4096, 4096), (8192, 8192)]
  modules = [("now", elementwise)]
  if args.before_elementwise:
    modules.append(("before", _harness.frozen_module(args.before_elementwise)))
  rows = out["cases"] = {}
  for shape in shapes:
    packed, scale = make_state(jax.random.key(3), *shape)[:2]
    for dtype in (jnp.bfloat16, jnp.float32):
      expected = reference.ternary_decode_reference(packed, scale, C, dtype)
      moved = packed.size + 4 * scale.size + shape[0] * shape[1] * jnp.dtype(dtype).itemsize
      copy_bytes = jnp.zeros((moved // 4,), jnp.uint32)
      for label, module in [("copy", None)] + modules:
        name = f"{shape[0]}x{shape[1]} {jnp.dtype(dtype).name} {label}"
        if not budget.allows(name):
          continue
        if module is None:
          fn, operands = jax.jit(lambda v: v + jnp.uint32(1)), (copy_bytes,)
          row = {}
        else:
          fn = jax.jit(functools.partial(module.ternary_decode, C=C, dtype=dtype,
                                         interpret=args.quick))
          operands = (packed, scale)
          row = {"mismatches": int(jnp.sum(fn(*operands) != expected))}
        busy = _harness.device_busy(fn, *operands, calls=5)
        if busy is not None:
          row["device_s"] = busy["busy_ms"] / 1e3
          row["tb_per_s"] = 2 * moved / row["device_s"] / 1e12 if module is None else (
              moved / row["device_s"] / 1e12)
        rows[name] = row
        budget.report(f"{name:<40} {row}")


PARTS = {"check": part_check, "update": part_update, "matmul": part_matmul,
         "decode": part_decode, "from_io": part_from_io, "tune": part_tune}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", choices=sorted(PARTS), required=True)
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--quick", action="store_true",
                      help="tiny shapes through the Pallas interpreter (CPU check)")
  parser.add_argument("--samples", type=int, default=None)
  parser.add_argument("--inner", type=int, default=None)
  parser.add_argument("--budget", type=float, default=1e9,
                      help="seconds after which no new case starts")
  parser.add_argument("--batches", default=None,
                      help="matmul part: comma-separated M (default 1,4,16 and M=64 at 4096^2)")
  parser.add_argument("--only", default=None,
                      help="check and tune parts: only the cases whose name matches this regex")
  parser.add_argument("--before-matmul", default=None,
                      help="matmul part: also time the packed-matmul module at this path "
                           "(a frozen copy of the kernels) at its heuristic")
  parser.add_argument("--x-dtype", choices=("bfloat16", "float32"), default="bfloat16",
                      help="matmul part: x's dtype; the dense matmul it is timed against has "
                           "weights of that dtype too")
  parser.add_argument("--before-config", choices=("session5", "heuristic", "session10"),
                      default="session5",
                      help="matmul part: the config --before-matmul's kernels run at (session "
                           "5's heuristic, or today's); session10: today's kernels at session "
                           "10's configs (no --before-matmul needed)")
  parser.add_argument("--sweep", choices=("default", "interleave", "wgmma"), default="default",
                      help="matmul part, forward: the configs (interleave: dot tiles with the "
                           "code lanes joined, interleave_sweep_configs; wgmma: the Mosaic GPU "
                           "kernel's tiles and neighbours beside the Triton heuristic, Hopper "
                           "only, wgmma_sweep_configs)")
  parser.add_argument("--op", choices=("forward", "input_grad"), default="forward",
                      help="matmul part: the forward or the input gradient")
  parser.add_argument("--before-update", default=None,
                      help="update part: also time the counter-update module at this path "
                           "(a frozen copy of the kernels) at its heuristic")
  parser.add_argument("--before-elementwise", default=None,
                      help="decode part: also time the elementwise kernel module at this path "
                           "(a frozen copy)")
  parser.add_argument("--from-io-sweep", action="store_true",
                      help="from_io part: also the tile sweep at the first M")
  parser.add_argument("--before", action="store_true",
                      help="update part: also time main's kernels (benchmarks/baseline_ternary)")
  args = parser.parse_args(argv)
  args.samples = args.samples or (2 if args.quick else 10)
  args.inner = args.inner or (2 if args.quick else 8)
  if not args.quick and jax.default_backend() != "gpu":
    parser.error("the benchmark compiles Triton kernels and needs a GPU; use --quick")
  device = jax.devices()[0]
  print(f"jax {jax.__version__}, {device.device_kind} ({jax.default_backend()}), part "
        f"{args.part}, {'quick/interpret' if args.quick else 'compiled'}", flush=True)
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  path = out_dir / f"ternary_{args.part}.json"
  result: dict = {}
  record = {"jax": jax.__version__, "device": device.device_kind, "part": args.part,
            "quick": args.quick, "samples": args.samples, "inner": args.inner, "C": C,
            "hyper": HYPER, "budget_s": args.budget, "complete": False, "result": result}
  budget = Budget(args.budget, path, record)
  budget.save()
  error = _guard(PARTS[args.part], args, budget, result)
  record["complete"] = error is None
  if error is not None:
    record["error"] = error["error"]
    print(error["error"])
  budget.save()
  if budget.skipped:
    print(f"skipped for the budget ({len(budget.skipped)}): {budget.skipped}")
  print(f"wrote {path} ({record['wall_s']:.0f} s)", flush=True)
  return 1 if error is not None else 0


if __name__ == "__main__":
  sys.exit(main())
