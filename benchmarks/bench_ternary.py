"""Benchmark of the ternary counter kernels, before (main's kernels) and after, in one run.

Parts (``--part``, each writes ``ternary_<part>.json`` to ``--out`` and prints a table):

* ``check``: every current kernel compiled on this device against the pure-JAX
  reference (codes off by one and worse, scale / v / matmul deviations).
* ``update``: :func:`counter_update` as bytes moved per second and as a
  fraction of the measured copy bandwidth, at (4096, 4096), (8192, 8192),
  (1536, 2304) and a ragged (1000, 3996): the old kernels at their old default
  (``before``), the new kernels at the new default (``after``, float32 and
  bfloat16 gradients), then a sweep of the new candidates (each screened
  against the reference first).
* ``matmul``: ``ternary_matmul`` against a bf16 ``jnp`` matmul with a dense
  bf16 weight and against decode-then-matmul (XLA decode of the codes + ``jnp``
  matmul), at M = 1, 4, 16, 256, 1024 on 4096x4096 and 8192x8192; ``before``
  (old kernel, old default) and ``after`` (new default); then a sweep of the
  new candidates at a few (M, shape). Each call in a timed group reads a
  different copy of the weights (the packed copies alone cover twice the L2
  cache), so small-M numbers are DRAM-bound as in a model's decode step.
* ``from_io``: :func:`counter_update_from_io` against an XLA GEMM
  (``grad_out^T x``) plus the fused update, before and after, with each
  compiled executable's temporary memory (``memory_analysis()``).

Timing: median of ``--samples`` groups after a warm-up; a group is
``--inner`` calls compiled into one executable (state chained through in-place
updates, or distinct inputs), so dispatch is not timed. Each part stops
starting new cases once ``--budget`` seconds are spent (the rest are listed as
skipped), so an outer ``timeout`` never cuts a JSON file.

GPU::

    python benchmarks/bench_ternary.py --part update --out $OUT

CPU (interpret mode, tiny shapes; checks that it runs)::

    python benchmarks/bench_ternary.py --part check --quick
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
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
  """Wall-clock budget of a part: cases past it are skipped (and listed)."""

  def __init__(self, seconds: float):
    self.end = time.perf_counter() + seconds
    self.skipped: list[str] = []

  def allows(self, name: str) -> bool:
    if time.perf_counter() < self.end:
      return True
    self.skipped.append(name)
    return False


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
# Part: compiled correctness of every new kernel.


def part_check(args, budget) -> dict:
  interpret = args.quick
  out = {}
  hyper, seed = hyper_array(), jnp.full((1,), 12345, jnp.uint32)
  update_shapes = [((48, 4 * 37), jnp.float32), ((40, 16 * 9), jnp.bfloat16)] if args.quick \
      else [((4096, 4096), jnp.float32), ((1000, 3996), jnp.bfloat16), ((1536, 2304), jnp.float32),
            ((64, 40000), jnp.float32)]
  for (shape, dtype) in update_shapes:
    for lagged in (False, True):
      name = f"counter_update {shape[0]}x{shape[1]} {jnp.dtype(dtype).name} lagged={lagged}"
      if not budget.allows(name):
        continue
      packed, scale, v = make_state(jax.random.key(0), *shape)
      grad = jax.random.normal(jax.random.key(1), shape, dtype)
      expected = jax.jit(functools.partial(reference.counter_update_reference, C=C,
                                           lagged=lagged))(packed, scale, v, grad, hyper, seed[0])
      actual = jax.jit(functools.partial(update_kernels.counter_update, C=C, lagged=lagged,
                                         interpret=interpret))(packed, scale, v, grad, hyper,
                                                               seed)
      out[name] = compare_states(actual, expected, packed)
  io_shape = (29, 48, 4 * 37) if args.quick else (512, 1024, 1024)
  for dtype in (jnp.bfloat16, jnp.float32):
    name = f"counter_update_from_io M={io_shape[0]} {io_shape[1]}x{io_shape[2]} " \
           f"{jnp.dtype(dtype).name}"
    if not budget.allows(name):
      continue
    m_rows, out_features, in_features = io_shape
    packed, scale, v = make_state(jax.random.key(2), out_features, in_features)
    x = jax.random.normal(jax.random.key(3), (m_rows, in_features), dtype)
    grad_out = jax.random.normal(jax.random.key(4), (m_rows, out_features), dtype)
    expected = jax.jit(functools.partial(reference.counter_update_from_io_reference, C=C,
                                         lagged=True))(packed, scale, v, x, grad_out, hyper,
                                                       seed[0])
    actual = jax.jit(functools.partial(update_kernels.counter_update_from_io, C=C, lagged=True,
                                       interpret=interpret))(packed, scale, v, x, grad_out,
                                                             hyper, seed)
    out[name] = compare_states(actual, expected, packed)
  matmul_cases = [(1, 48, 16 * 5), (3, 40, 4 * 13)] if args.quick else [
      (1, 4096, 4096), (16, 8192, 8192), (256, 4096, 4096), (1000, 1000, 3996)]
  for m_rows, out_features, in_features in matmul_cases:
    packed, scale, _ = make_state(jax.random.key(5), out_features, in_features)
    for dtype in (jnp.bfloat16, jnp.float32):
      x = jax.random.normal(jax.random.key(6), (m_rows, in_features), dtype)
      y_ref = jax.jit(functools.partial(reference.ternary_matmul_reference, C=C,
                                        out_dtype=jnp.float32))(x, packed, scale)
      shape = (m_rows, out_features, in_features)
      # The heuristic and the other methods here; the sweep screens every candidate.
      configs = [config_lib.MatmulConfig.get_heuristics_config(shape, dtype)]
      if dtype == jnp.bfloat16:
        configs += [c for c in config_lib.MatmulConfig.candidates(shape, dtype)
                    if c.method != configs[0].method]
        configs.append(config_lib.MatmulConfig(method="decode"))
        configs = list(dict.fromkeys(configs))
      for config in configs:
        name = f"ternary_matmul M={m_rows} {out_features}x{in_features} " \
               f"{jnp.dtype(dtype).name} {_short(config)}"
        if not budget.allows(name):
          continue
        y = jax.jit(functools.partial(matmul_kernels.ternary_matmul, C=C, out_dtype=jnp.float32,
                                      config=config, interpret=interpret))(x, packed, scale)
        out[name] = relative_error(y, y_ref)
    name = f"ternary_decode {out_features}x{in_features}"
    if budget.allows(name):
      weight = jax.jit(functools.partial(elementwise.ternary_decode, C=C, dtype=jnp.bfloat16,
                                         interpret=interpret))(packed, scale)
      expected = reference.ternary_decode_reference(packed, scale, C, jnp.bfloat16)
      out[name] = {"mismatches": int(jnp.sum(weight != expected))}
    name = f"ternary_matmul input grad {out_features}x{in_features}"
    if budget.allows(name):
      grad_y = jax.random.normal(jax.random.key(7), (m_rows, out_features), jnp.bfloat16)
      gx = jax.jit(functools.partial(matmul_kernels.ternary_matmul_input_grad, C=C,
                                     out_dtype=jnp.float32, interpret=interpret))(
                                         grad_y, packed, scale)
      out[name] = relative_error(gx, reference.ternary_matmul_input_grad_reference(
          grad_y, packed, scale, C=C))
  return out


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


def chained(update_fn, inner: int):
  """``inner`` updates in one executable, the state chained (in place) through them."""

  def run(packed, scale, v, *operands):
    hyper = hyper_array()
    for step in range(inner):
      seed = jnp.full((1,), step + 1, jnp.uint32)
      packed, scale, v, _ = update_fn(packed, scale, v, *operands, hyper, seed)
    return packed, scale, v

  return jax.jit(run, donate_argnums=(0, 1, 2))


def copy_bandwidth(args) -> float:
  """Device-to-device copy bandwidth (read + write bytes per second), best of two forms."""
  n = (1 << 18) if args.quick else (1 << 28)
  inputs = tuple(jnp.ones((n,), jnp.float32) + i for i in range(4))
  best = 0.0
  for fn in (jax.jit(lambda xs: tuple(jnp.copy(x) for x in xs)),
             jax.jit(lambda xs: tuple(x * 2.0 for x in xs))):
    seconds = median_time(fn, lambda: (inputs,), samples=args.samples)["median_s"] / len(inputs)
    best = max(best, 2 * 4 * n / seconds)
  return best


def time_update(args, update_fn, shape, dtype, copy_bps) -> dict:
  grad = jax.random.normal(jax.random.key(4), shape, dtype)
  run = chained(update_fn, args.inner)
  key = jax.random.key(5)
  timing = median_time(lambda p, s, v: run(p, s, v, grad), lambda: make_state(key, *shape),
                       samples=args.samples)
  seconds = timing["median_s"] / args.inner
  moved = update_bytes(*shape, jnp.dtype(dtype).itemsize)
  return {"seconds": seconds, "bytes_per_s": moved / seconds,
          "fraction_of_copy": moved / seconds / copy_bps}


def part_update(args, budget) -> dict:
  interpret = args.quick
  copy_bps = copy_bandwidth(args)
  out = {"copy_bytes_per_s": copy_bps, "cases": {}}
  shapes = [(64, 4 * 33), (40, 16 * 9)] if args.quick else \
      [(4096, 4096), (8192, 8192), (1536, 2304), (1000, 3996)]
  hyper, seed = hyper_array(), jnp.full((1,), 99, jnp.uint32)
  rows = out["cases"]
  for shape in shapes:
    tag = f"{shape[0]}x{shape[1]}"
    new = functools.partial(update_kernels.counter_update, C=C, lagged=False,
                            interpret=interpret)
    plans = [(f"{tag} f32 before", None, jnp.float32),
             (f"{tag} f32 after", new, jnp.float32),
             (f"{tag} bf16 before", None, jnp.bfloat16),
             (f"{tag} bf16 after", new, jnp.bfloat16)]
    for name, fn, dtype in plans:
      if not budget.allows(name):
        continue
      if fn is None:
        fn = functools.partial(_baseline().counter_update, C=C, lagged=False,
                               interpret=interpret)
      rows[name] = _guard(time_update, args, fn, shape, dtype, copy_bps)
  for shape in shapes:
    tag = f"{shape[0]}x{shape[1]}"
    packed, scale, v = make_state(jax.random.key(6), *shape)
    grad = jax.random.normal(jax.random.key(7), shape, jnp.float32)
    expected = jax.jit(functools.partial(reference.counter_update_reference, C=C, lagged=False))(
        packed, scale, v, grad, hyper, seed[0])
    candidates = config_lib.CounterUpdateConfig.candidates(shape)
    for config in candidates[: (2 if args.quick else None)]:
      name = f"sweep {tag} f32 {_short(config)}"
      if not budget.allows(name):
        continue

      def screened(config=config):
        fn = functools.partial(update_kernels.counter_update, C=C, lagged=False, config=config,
                               interpret=interpret)
        check = compare_states(jax.jit(fn)(packed, scale, v, grad, hyper, seed), expected,
                               packed)
        if not check["within_spec"]:
          return {"excluded": True, "check": check}
        return {**time_update(args, fn, shape, jnp.float32, copy_bps),
                "off_fraction": check["off_fraction"]}

      rows[name] = _guard(screened)
  return out


# ----------------------------------------------------------------------------
# Part: packed matmul.


def _copies(packed_bytes: int, quick: bool) -> int:
  """Weight copies per timed group: the packed ones alone cover twice the L2 cache."""
  return 1 if quick else max(1, min(8, -(-2 * L2_BYTES // packed_bytes)))


def part_matmul(args, budget) -> dict:
  interpret = args.quick
  shapes = [(48, 16 * 5)] if args.quick else [(4096, 4096), (8192, 8192)]
  batches = (1, 4, 16, 32) if args.quick else (1, 4, 16, 256, 1024)
  out = {"cases": {}, "sweeps": {}}
  for out_features, in_features in shapes:
    n_copies = _copies(out_features * in_features * 3 // 4, args.quick)
    packs = [make_state(jax.random.key(10 + i), out_features, in_features)[:2]
             for i in range(n_copies)]
    dense = [reference.ternary_decode_reference(p, s, C, jnp.bfloat16) for p, s in packs]
    for m_rows in batches:
      tag = f"M={m_rows} {out_features}x{in_features}"
      if not budget.allows(tag):
        continue
      xs = [jax.random.normal(jax.random.key(100 + i), (m_rows, in_features), jnp.bfloat16)
            for i in range(args.inner)]
      flops = 2.0 * m_rows * out_features * in_features

      def group(call):
        def run(xs, weights):
          return [call(x, *weights[i % n_copies]) for i, x in enumerate(xs)]
        jitted = jax.jit(run)
        return lambda weights: median_time(jitted, lambda: (xs, weights),
                                           samples=args.samples)["median_s"] / args.inner

      config = config_lib.MatmulConfig.get_heuristics_config(
          (m_rows, out_features, in_features), jnp.bfloat16)
      forms = {
          "bf16_matmul": (lambda x, w: jnp.dot(x, w.T, preferred_element_type=jnp.float32)
                          .astype(jnp.bfloat16), [(w,) for w in dense]),
          "xla_decode_then_matmul": (
              lambda x, p, s: jnp.dot(x, reference.ternary_decode_reference(
                  p, s, C, jnp.bfloat16).T, preferred_element_type=jnp.float32)
              .astype(jnp.bfloat16), packs),
          "before": (lambda x, p, s: _baseline().ternary_matmul(
              x, p, s, C=C, out_dtype=jnp.bfloat16, interpret=interpret), packs),
          "after": (lambda x, p, s: matmul_kernels.ternary_matmul(
              x, p, s, C=C, out_dtype=jnp.bfloat16, interpret=interpret), packs),
          "after_decode_method": (lambda x, p, s: matmul_kernels.ternary_matmul(
              x, p, s, C=C, out_dtype=jnp.bfloat16, interpret=interpret,
              config=config_lib.MatmulConfig(method="decode")), packs),
      }
      if m_rows <= 16:
        del forms["after_decode_method"]  # a dense temporary never pays at decode sizes
      row = {"flops": flops, "weight_copies": n_copies, "after_config": _short(config)}
      for name, (call, weights) in forms.items():
        row[name] = _guard(lambda call=call, weights=weights: {"seconds": group(call)(weights)})
      base = row["bf16_matmul"].get("seconds")
      for name in forms:
        seconds = row[name].get("seconds")
        if seconds and base:
          row[name]["speedup_vs_bf16"] = base / seconds
          row[name]["tflops"] = flops / seconds / 1e12
      out["cases"][tag] = row
  sweep_cases = [(1, 48, 16 * 5)] if args.quick else [
      (1, 8192, 8192), (16, 8192, 8192), (256, 4096, 4096), (1024, 8192, 8192), (4, 4096, 4096)]
  for m_rows, out_features, in_features in sweep_cases:
    tag = f"M={m_rows} {out_features}x{in_features}"
    shape = (m_rows, out_features, in_features)
    n_copies = _copies(out_features * in_features * 3 // 4, args.quick)
    packs = [make_state(jax.random.key(20 + i), out_features, in_features)[:2]
             for i in range(n_copies)]
    xs = [jax.random.normal(jax.random.key(200 + i), (m_rows, in_features), jnp.bfloat16)
          for i in range(args.inner)]
    y_ref = reference.ternary_matmul_reference(xs[0], *packs[0], C=C, out_dtype=jnp.float32)
    rows = {}
    for config in config_lib.MatmulConfig.candidates(shape)[: (2 if args.quick else None)]:
      name = _short(config)
      if not budget.allows(f"sweep {tag} {name}"):
        continue

      def screened(config=config):
        call = functools.partial(matmul_kernels.ternary_matmul, C=C, out_dtype=jnp.bfloat16,
                                 config=config, interpret=interpret)
        error = relative_error(jax.jit(functools.partial(call, out_dtype=jnp.float32))(
            xs[0], *packs[0]), y_ref)["relative"]
        if not error < 1e-2:
          return {"excluded": True, "relative_error": error}
        jitted = jax.jit(lambda xs, weights: [call(x, *weights[i % n_copies])
                                              for i, x in enumerate(xs)])
        seconds = median_time(jitted, lambda: (xs, packs),
                              samples=args.samples)["median_s"] / args.inner
        return {"seconds": seconds, "relative_error": error}

      rows[name] = _guard(screened)
    out["sweeps"][tag] = rows
  return out


# ----------------------------------------------------------------------------
# Part: update from (x, grad_out).


def part_from_io(args, budget) -> dict:
  interpret = args.quick
  out_features, in_features = (64, 16 * 8) if args.quick else (4096, 4096)
  out = {"cases": {}}
  for m_rows in ((32, 64) if args.quick else (4096, 1024, 256)):
    tag = f"M={m_rows} {out_features}x{in_features} bf16"
    if not budget.allows(tag):
      continue
    x = jax.random.normal(jax.random.key(8), (m_rows, in_features), jnp.bfloat16)
    grad_out = jax.random.normal(jax.random.key(9), (m_rows, out_features), jnp.bfloat16)
    inner = max(1, min(args.inner, 3))

    def gemm_plus(update):
      def fn(packed, scale, v, x, grad_out, hyper, seed):
        grad = jnp.einsum("mo,mi->oi", grad_out, x, preferred_element_type=jnp.float32)
        return update(packed, scale, v, grad, hyper, seed, C=C, lagged=False,
                      interpret=interpret)
      return fn

    forms = {
        "after_from_io": functools.partial(update_kernels.counter_update_from_io, C=C,
                                           lagged=False, interpret=interpret),
        "after_gemm_plus_update": gemm_plus(update_kernels.counter_update),
        "before_from_io": lambda *a: _baseline().counter_update_from_io(
            *a, C=C, lagged=False, interpret=interpret),
        "before_gemm_plus_update": gemm_plus(lambda *a, **k: _baseline().counter_update(*a, **k)),
    }
    row = {}
    state_key = jax.random.key(10)
    for name, fn in forms.items():
      def measure(fn=fn):
        run = chained(fn, inner)
        timing = median_time(lambda p, s, v: run(p, s, v, x, grad_out),
                             lambda: make_state(state_key, out_features, in_features),
                             samples=max(3, args.samples // 2))
        mem = memory(lambda p, s, v, x, g: fn(p, s, v, x, g, hyper_array(),
                                               jnp.ones((1,), jnp.uint32)),
                     *make_state(state_key, out_features, in_features), x, grad_out)
        return {"seconds": timing["median_s"] / inner, "memory": mem}

      row[name] = _guard(measure)
    dense = row["after_gemm_plus_update"].get("seconds")
    for name in forms:
      if row[name].get("seconds") and dense:
        row[name]["time_vs_after_gemm_plus_update"] = row[name]["seconds"] / dense
    out["cases"][tag] = row
  # Sweep of the new kernel's tilings at one batch (each screened first).
  m_rows = 32 if args.quick else 1024
  x = jax.random.normal(jax.random.key(11), (m_rows, in_features), jnp.bfloat16)
  grad_out = jax.random.normal(jax.random.key(12), (m_rows, out_features), jnp.bfloat16)
  packed, scale, v = make_state(jax.random.key(13), out_features, in_features)
  hyper, seed = hyper_array(), jnp.full((1,), 7, jnp.uint32)
  expected = jax.jit(functools.partial(reference.counter_update_from_io_reference, C=C,
                                       lagged=False))(packed, scale, v, x, grad_out, hyper,
                                                      seed[0])
  sweep = out["sweep"] = {"shape": [m_rows, out_features, in_features], "candidates": {}}
  shape = (m_rows, out_features, in_features)
  for config in config_lib.FromIOConfig.candidates(shape)[: (1 if args.quick else None)]:
    name = _short(config)
    if not budget.allows(f"sweep from_io {name}"):
      continue

    def screened(config=config):
      fn = functools.partial(update_kernels.counter_update_from_io, C=C, lagged=False,
                             config=config, interpret=interpret)
      check = compare_states(jax.jit(fn)(packed, scale, v, x, grad_out, hyper, seed), expected,
                             packed)
      if not check["within_spec"]:
        return {"excluded": True, "check": check}
      run = chained(fn, 2)
      key = jax.random.key(14)
      timing = median_time(lambda p, s, v: run(p, s, v, x, grad_out),
                           lambda: make_state(key, out_features, in_features),
                           samples=max(3, args.samples // 2))
      return {"seconds": timing["median_s"] / 2, "off_fraction": check["off_fraction"]}

    sweep["candidates"][name] = _guard(screened)
  return out


# ----------------------------------------------------------------------------
# Driver.


def _guard(fn, *args, **kwargs) -> dict:
  """``fn(...)``, or ``{"error": ...}`` (the traceback goes to stderr)."""
  try:
    return fn(*args, **kwargs)
  except Exception as error:  # pylint: disable=broad-except
    traceback.print_exc()
    return {"error": f"{type(error).__name__}: {str(error)[:400]}"}


def format_table(part: str, result: dict) -> str:
  lines = []
  if part == "check":
    for name, row in result.items():
      if "off_by_one" in row:
        lines.append(f"{name:<70} off-by-one {row['off_by_one']}/{row['codes']} "
                     f"({row['off_fraction']:.1e}) worse {row['off_by_more']} scale rel "
                     f"{row['scale_max_rel']:.1e} v rel {row['v_max_rel']:.1e} "
                     f"spec ok {row['within_spec']}")
      elif "relative" in row:
        lines.append(f"{name:<70} max abs err {row['max_abs_error']:.3g} "
                     f"(max |y| {row['max_abs_value']:.3g}, rel {row['relative']:.1e})")
      else:
        lines.append(f"{name:<70} {row}")
  elif part == "update":
    lines.append(f"copy bandwidth {result['copy_bytes_per_s'] / 1e12:.3f} TB/s")
    for name, row in result["cases"].items():
      if "seconds" in row:
        lines.append(f"{name:<90} {row['seconds'] * 1e6:9.1f} us  "
                     f"{100 * row['fraction_of_copy']:5.1f}% of copy")
      else:
        lines.append(f"{name:<90} {row}")
  elif part == "matmul":
    for tag, row in result["cases"].items():
      cells = []
      for name in ("bf16_matmul", "xla_decode_then_matmul", "before", "after",
                   "after_decode_method"):
        cell = row.get(name, {})
        if "seconds" in cell:
          cells.append(f"{name} {cell['seconds'] * 1e6:.1f}us "
                       f"({cell.get('speedup_vs_bf16', 0):.2f}x)")
        elif cell:
          cells.append(f"{name} {cell.get('error', 'n/a')[:40]}")
      lines.append(f"{tag:<22} " + " | ".join(cells) + f"  [after: {row['after_config']}]")
    for tag, rows in result["sweeps"].items():
      lines.append(f"sweep {tag}")
      for name, row in rows.items():
        detail = f"{row['seconds'] * 1e6:9.1f} us" if "seconds" in row else str(row)[:80]
        lines.append(f"  {name:<100} {detail}")
  elif part == "from_io":
    for tag, row in result["cases"].items():
      for name, cell in row.items():
        if "seconds" in cell:
          temp = cell.get("memory", {}).get("temp_size_in_bytes", 0) / 2**20
          lines.append(f"{tag:<24} {name:<26} {cell['seconds'] * 1e3:8.3f} ms  temp "
                       f"{temp:8.1f} MiB  x{cell.get('time_vs_after_gemm_plus_update', 0):.2f}")
        else:
          lines.append(f"{tag:<24} {name:<26} {cell}")
    sweep = result.get("sweep", {})
    if sweep:
      lines.append(f"sweep from_io M,out,in={sweep['shape']}")
      for name, row in sweep["candidates"].items():
        detail = f"{row['seconds'] * 1e3:8.3f} ms" if "seconds" in row else str(row)[:80]
        lines.append(f"  {name:<100} {detail}")
  return "\n".join(lines)


PARTS = {"check": part_check, "update": part_update, "matmul": part_matmul,
         "from_io": part_from_io}


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
  args = parser.parse_args(argv)
  args.samples = args.samples or (2 if args.quick else 10)
  args.inner = args.inner or (2 if args.quick else 8)
  if not args.quick and jax.default_backend() != "gpu":
    parser.error("the benchmark compiles Triton kernels and needs a GPU; use --quick")
  device = jax.devices()[0]
  print(f"jax {jax.__version__}, {device.device_kind} ({jax.default_backend()}), part "
        f"{args.part}, {'quick/interpret' if args.quick else 'compiled'}", flush=True)
  budget = Budget(args.budget)
  start = time.perf_counter()
  result = _guard(PARTS[args.part], args, budget)
  record = {"jax": jax.__version__, "device": device.device_kind, "part": args.part,
            "quick": args.quick, "samples": args.samples, "inner": args.inner, "C": C,
            "hyper": HYPER, "wall_s": time.perf_counter() - start,
            "skipped_for_budget": budget.skipped, "result": result}
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  path = out_dir / f"ternary_{args.part}.json"
  path.write_text(json.dumps(record, indent=2, default=str))
  print(format_table(args.part, result) if "error" not in result else result["error"])
  if budget.skipped:
    print(f"skipped for the budget: {budget.skipped}")
  print(f"wrote {path} ({record['wall_s']:.0f} s)")
  return 1 if "error" in result else 0


if __name__ == "__main__":
  sys.exit(main())
