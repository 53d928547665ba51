"""Benchmark of the ternary counter kernels (run on a GPU; ``--quick`` runs on CPU).

Cases, each timed as the median of ``--samples`` (>= 10) samples after a
warm-up; one sample is ``--inner`` back-to-back calls compiled into one
executable (state chained through in-place updates, or distinct inputs so
nothing is merged), so Python dispatch is not timed:

1. correctness: compiled kernels vs the pure-JAX reference on this device
   (codes off by one, scale / v / matmul deviations);
2. counter update throughput at 4096x4096 and 11008x4096 (f32 and bf16
   gradients), as bytes moved per second and as a fraction of the measured
   device-to-device copy bandwidth; plus a small sweep of tilings (each
   screened against the reference before it is timed);
3. ``counter_update_from_io`` against an XLA GEMM for ``grad_out^T x`` plus
   the fused ``counter_update``: time and compiled peak memory
   (``memory_analysis()``) at M = 4096 and 32768;
4. packed ternary matmul against a bf16 ``jnp`` matmul at decode (M = 1, 16)
   and prefill (M = 4096) shapes.

Every case catches its own exceptions (the traceback is printed and recorded).
Prints a table and writes ``bench_ternary.json`` (and a plot if matplotlib is
installed) to ``--out`` (default ``benchmarks/out``).

Run on the GPU machine::

    python benchmarks/bench_ternary.py --out benchmarks/out

and on a CPU (interpret mode, tiny shapes, checks that it runs)::

    python benchmarks/bench_ternary.py --quick
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

from jaxnoise.ops.ternary import config as config_lib
from jaxnoise.ops.ternary import pallas_triton as kernels
from jaxnoise.ops.ternary import reference

C = 11
HYPER = (0.05, 1e-3, 0.99, 1e-8)  # lr, lr_scale, rms_beta, rms_eps


# ----------------------------------------------------------------------------
# Timing.


def median_time(fn, args_fn, *, samples: int, warmup: int = 2) -> dict:
  """Median seconds of ``fn(*args_fn())`` over ``samples`` calls after ``warmup``.

  ``args_fn`` builds fresh arguments per call (outside the timed region) so
  donated buffers can be consumed.
  """
  for _ in range(warmup):
    jax.block_until_ready(fn(*args_fn()))
  times = []
  for _ in range(samples):
    args = args_fn()
    jax.block_until_ready(args)
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return {"median_s": statistics.median(times), "min_s": min(times), "samples": samples}


def peak_memory(fn, *args) -> dict:
  """Compiled memory analysis of ``jax.jit(fn)`` (bytes), or an empty dict."""
  compiled = jax.jit(fn).lower(*args).compile()
  analysis = compiled.memory_analysis()
  if analysis is None:
    return {}
  fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
            "temp_size_in_bytes")
  result = {name: int(getattr(analysis, name, 0) or 0) for name in fields}
  result["peak_bytes"] = (result["argument_size_in_bytes"] + result["output_size_in_bytes"]
                          - result["alias_size_in_bytes"] + result["temp_size_in_bytes"])
  return result


# ----------------------------------------------------------------------------
# Inputs.


def make_state(key, out_features, in_features):
  k1, k2 = jax.random.split(key)
  codes = jax.random.randint(k1, (out_features, in_features), 0, reference.n_codes(C),
                             jnp.int32).astype(jnp.uint8)
  packed = reference.pack_codes_reference(codes)
  scale = jax.random.uniform(k2, (out_features,), jnp.float32, 0.05, 1.0)
  v = jnp.full((out_features,), 0.5, jnp.float32)
  return packed, scale, v


def hyper_array():
  return jnp.asarray(HYPER, jnp.float32)


def chained_updates(update_fn, inner: int):
  """``inner`` updates in one executable, the state chained (in place) through them."""

  def run(packed, scale, v, *operands):
    hyper = hyper_array()
    for step in range(inner):
      seed = jnp.full((1,), step + 1, jnp.uint32)
      packed, scale, v, _ = update_fn(packed, scale, v, *operands, hyper, seed)
    return packed, scale, v

  return jax.jit(run, donate_argnums=(0, 1, 2))


# ----------------------------------------------------------------------------
# Cases.


def case_copy_bandwidth(args) -> dict:
  """Device-to-device copy bandwidth (read + write bytes per second), best of two forms."""
  n = (1 << 18) if args.quick else (1 << 28)  # f32 elements: 1 MiB / 1 GiB
  source = jnp.ones((n,), jnp.float32)
  results = {}
  copy = jax.jit(lambda xs: tuple(jnp.copy(x) for x in xs))
  scale = jax.jit(lambda xs: tuple(x * 2.0 for x in xs))
  inputs = tuple(source + i for i in range(min(args.inner, 4)))
  for name, fn in (("copy", copy), ("scale_by_2", scale)):
    timing = median_time(fn, lambda: (inputs,), samples=args.samples)
    per_call = timing["median_s"] / len(inputs)
    results[name] = {"seconds": per_call, "bytes_per_s": 2 * 4 * n / per_call}
  best = max(r["bytes_per_s"] for r in results.values())
  return {"bytes": 2 * 4 * n, "forms": results, "copy_bytes_per_s": best}


def case_correctness(args) -> dict:
  """Compiled kernels vs the reference on this device."""
  out_features, in_features, m_rows = (48, 4 * 37, 29) if args.quick else (4096, 4096, 512)
  key = jax.random.key(0)
  packed, scale, v = make_state(key, out_features, in_features)
  grad = jax.random.normal(jax.random.key(1), (out_features, in_features), jnp.float32)
  x = jax.random.normal(jax.random.key(2), (m_rows, in_features), jnp.bfloat16)
  grad_out = jax.random.normal(jax.random.key(3), (m_rows, out_features), jnp.bfloat16)
  hyper, seed = hyper_array(), jnp.full((1,), 12345, jnp.uint32)
  interpret = args.quick
  result = {}
  for lagged in (False, True):
    expected = jax.jit(functools.partial(reference.counter_update_reference, C=C,
                                         lagged=lagged))(packed, scale, v, grad, hyper, seed[0])
    actual = jax.jit(functools.partial(kernels.counter_update, C=C, lagged=lagged,
                                       interpret=interpret))(packed, scale, v, grad, hyper, seed)
    result[f"counter_update lagged={lagged}"] = compare_states(actual, expected, packed)
    expected = jax.jit(functools.partial(reference.counter_update_from_io_reference, C=C,
                                         lagged=lagged))(packed, scale, v, x, grad_out, hyper,
                                                         seed[0])
    actual = jax.jit(functools.partial(kernels.counter_update_from_io, C=C, lagged=lagged,
                                       interpret=interpret))(packed, scale, v, x, grad_out,
                                                             hyper, seed)
    result[f"counter_update_from_io lagged={lagged}"] = compare_states(actual, expected, packed)
  y = jax.jit(functools.partial(kernels.ternary_matmul, C=C, out_dtype=jnp.float32,
                                interpret=interpret))(x, packed, scale)
  y_ref = jax.jit(functools.partial(reference.ternary_matmul_reference, C=C,
                                    out_dtype=jnp.float32))(x, packed, scale)
  result["ternary_matmul bf16"] = {
      "max_abs_error": float(jnp.abs(y - y_ref).max()),
      "max_abs_value": float(jnp.abs(y_ref).max())}
  gx = jax.jit(functools.partial(kernels.ternary_matmul_input_grad, C=C, out_dtype=jnp.float32,
                                 interpret=interpret))(grad_out, packed, scale)
  gx_ref = reference.ternary_matmul_input_grad_reference(grad_out, packed, scale, C=C)
  result["ternary_matmul input grad bf16"] = {
      "max_abs_error": float(jnp.abs(gx - gx_ref).max()),
      "max_abs_value": float(jnp.abs(gx_ref).max())}
  return result


def compare_states(actual, expected, old_packed) -> dict:
  new_codes = np.asarray(reference.unpack_codes_reference(actual[0])).astype(np.int64)
  ref_codes = np.asarray(reference.unpack_codes_reference(expected[0])).astype(np.int64)
  old_codes = np.asarray(reference.unpack_codes_reference(old_packed)).astype(np.int64)
  diff = np.abs(new_codes - ref_codes)
  return {
      "codes": int(new_codes.size),
      "codes_changed_by_update": int((ref_codes != old_codes).sum()),
      "off_by_one": int((diff == 1).sum()),
      "off_by_more": int((diff > 1).sum()),
      "off_fraction": float((diff != 0).mean()),
      "within_spec_1e-4": bool((diff != 0).mean() <= 1e-4 and diff.max() <= 1),
      "scale_max_rel": float(np.max(np.abs(np.asarray(actual[1]) - np.asarray(expected[1]))
                                    / np.abs(np.asarray(expected[1])))),
      "v_max_rel": float(np.max(np.abs(np.asarray(actual[2]) - np.asarray(expected[2]))
                                / np.maximum(np.abs(np.asarray(expected[2])), 1e-30))),
      "skipped_rows": int(np.asarray(actual[3]).sum()),
  }


def update_bytes(out_features, in_features, grad_itemsize) -> int:
  """Bytes an update must move: the gradient, codes read + written, row state read + written."""
  return (out_features * in_features * grad_itemsize + 2 * (out_features * in_features * 3 // 4)
          + out_features * (2 * 4 + 2 * 4 + 4))


def case_update_throughput(args, shape, grad_dtype, copy_bytes_per_s, config=None) -> dict:
  out_features, in_features = shape
  interpret = args.quick
  grad = jax.random.normal(jax.random.key(4), shape, grad_dtype)
  update = functools.partial(kernels.counter_update, C=C, lagged=False, config=config,
                             interpret=interpret)
  run = chained_updates(update, args.inner)
  state_key = jax.random.key(5)
  timing = median_time(lambda p, s, v: run(p, s, v, grad),
                       lambda: make_state(state_key, out_features, in_features),
                       samples=args.samples)
  per_update = timing["median_s"] / args.inner
  moved = update_bytes(out_features, in_features, jnp.dtype(grad_dtype).itemsize)
  used = config or config_lib.CounterUpdateConfig.get_heuristics_config(shape, grad_dtype)
  return {"seconds": per_update, "bytes_moved": moved, "bytes_per_s": moved / per_update,
          "fraction_of_copy": (moved / per_update) / copy_bytes_per_s if copy_bytes_per_s else None,
          "config": repr(used)}


def sweep_configs(shape):
  """The heuristic (old default) first, then its bitwise / dense-gradient / multi-row variants."""
  return config_lib.CounterUpdateConfig.candidates(shape)


def case_update_sweep(args, shape, copy_bytes_per_s) -> dict:
  """A few tilings of the update, each screened against the reference, then timed."""
  out_features, in_features = shape
  packed, scale, v = make_state(jax.random.key(6), out_features, in_features)
  grad = jax.random.normal(jax.random.key(7), shape, jnp.float32)
  hyper, seed = hyper_array(), jnp.full((1,), 99, jnp.uint32)
  expected = jax.jit(functools.partial(reference.counter_update_reference, C=C, lagged=False))(
      packed, scale, v, grad, hyper, seed[0])
  rows = []
  for config in sweep_configs(shape)[: (2 if args.quick else None)]:
    try:
      actual = jax.jit(functools.partial(kernels.counter_update, C=C, lagged=False, config=config,
                                         interpret=args.quick))(packed, scale, v, grad, hyper,
                                                                seed)
      check = compare_states(actual, expected, packed)
      if not check["within_spec_1e-4"]:
        rows.append({"config": repr(config), "excluded": True, "check": check})
        continue
      timing = case_update_throughput(args, shape, jnp.float32, copy_bytes_per_s, config)
      rows.append({"config": repr(config), "excluded": False, **timing})
    except Exception as error:  # pylint: disable=broad-except
      rows.append({"config": repr(config), "error": f"{type(error).__name__}: {error}"})
  return {"candidates": rows}


def case_from_io(args, m_rows) -> dict:
  """Update from (x, grad_out) in the kernel vs XLA GEMM + fused update: time and memory."""
  out_features, in_features = (64, 128) if args.quick else (4096, 4096)
  dtype = jnp.bfloat16
  x = jax.random.normal(jax.random.key(8), (m_rows, in_features), dtype)
  grad_out = jax.random.normal(jax.random.key(9), (m_rows, out_features), dtype)
  interpret = args.quick
  inner = max(1, min(args.inner, 3))

  def io_update(packed, scale, v, x, grad_out, hyper, seed):
    return kernels.counter_update_from_io(packed, scale, v, x, grad_out, hyper, seed, C=C,
                                          lagged=False, interpret=interpret)

  def dense_update(packed, scale, v, x, grad_out, hyper, seed):
    grad = jnp.einsum("mo,mi->oi", grad_out, x, preferred_element_type=jnp.float32)
    return kernels.counter_update(packed, scale, v, grad, hyper, seed, C=C, lagged=False,
                                  interpret=interpret)

  result = {"shape": [m_rows, out_features, in_features], "dtype": "bfloat16"}
  state_key = jax.random.key(10)
  for name, fn in (("from_io_kernel", io_update), ("xla_gemm_plus_fused_update", dense_update)):
    run = chained_updates(fn, inner)
    timing = median_time(lambda p, s, v: run(p, s, v, x, grad_out),
                         lambda: make_state(state_key, out_features, in_features),
                         samples=args.samples)
    memory = peak_memory(lambda p, s, v, x, g: fn(p, s, v, x, g, hyper_array(),
                                                  jnp.ones((1,), jnp.uint32)),
                         *make_state(state_key, out_features, in_features), x, grad_out)
    result[name] = {"seconds": timing["median_s"] / inner, "memory": memory}
  io, dense = result["from_io_kernel"], result["xla_gemm_plus_fused_update"]
  result["time_ratio_io_over_dense"] = io["seconds"] / dense["seconds"]
  if io["memory"] and dense["memory"]:
    result["temp_bytes_io"] = io["memory"]["temp_size_in_bytes"]
    result["temp_bytes_dense"] = dense["memory"]["temp_size_in_bytes"]
  return result


def case_matmul(args, m_rows, shape, config=None) -> dict:
  """Packed ternary matmul (0.75 B/weight) vs a bf16 jnp matmul with a dense bf16 weight."""
  out_features, in_features = shape
  inner = args.inner
  packed, scale, _ = make_state(jax.random.key(11), out_features, in_features)
  weight = reference.ternary_decode_reference(packed, scale, C, jnp.bfloat16)
  xs = tuple(jax.random.normal(jax.random.key(20 + i), (m_rows, in_features), jnp.bfloat16)
             for i in range(inner))
  if config is not None:  # Screen the candidate against the reference before timing it.
    y = kernels.ternary_matmul(xs[0], packed, scale, C=C, out_dtype=jnp.float32,
                               config=config, interpret=args.quick)
    y_ref = reference.ternary_matmul_reference(xs[0], packed, scale, C=C,
                                               out_dtype=jnp.float32)
    error = float(jnp.abs(y - y_ref).max() / (jnp.abs(y_ref).max() + 1e-30))
    if not error < 1e-2:
      return {"config": repr(config), "excluded": True, "relative_error": error}
  packed_fn = jax.jit(lambda xs, packed, scale: tuple(
      kernels.ternary_matmul(x, packed, scale, C=C, out_dtype=jnp.bfloat16, config=config,
                             interpret=args.quick) for x in xs))
  dense_fn = jax.jit(lambda xs, weight: tuple(
      jnp.dot(x, weight.T, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
      for x in xs))
  packed_time = median_time(packed_fn, lambda: (xs, packed, scale), samples=args.samples)
  dense_time = median_time(dense_fn, lambda: (xs, weight), samples=args.samples)
  per_packed = packed_time["median_s"] / inner
  per_dense = dense_time["median_s"] / inner
  flops = 2 * m_rows * out_features * in_features
  return {"m": m_rows, "out": out_features, "in": in_features,
          "packed_seconds": per_packed, "bf16_seconds": per_dense,
          "speedup_vs_bf16": per_dense / per_packed,
          "packed_tflops": flops / per_packed / 1e12, "bf16_tflops": flops / per_dense / 1e12,
          "packed_weight_bytes_per_s": out_features * in_features * 0.75 / per_packed,
          "config": repr(config or config_lib.MatmulConfig.get_heuristics_config(
              (m_rows, out_features, in_features), jnp.bfloat16))}


MATMUL_SWEEP = {
    "decode": [config_lib.MatmulConfig(16, n, g, w, 3) for n, g, w in
               ((16, 64, 2), (32, 64, 4), (64, 64, 4), (32, 128, 4), (16, 128, 4))],
    "prefill": [config_lib.MatmulConfig(m, n, g, w, 3) for m, n, g, w in
                ((128, 128, 16, 8), (128, 128, 32, 8), (64, 128, 32, 4), (128, 64, 32, 4),
                 (64, 64, 32, 4))],
}


def case_matmul_sweep(args, m_rows, shape, kind) -> dict:
  """A few matmul tilings, each screened against the reference, then timed."""
  rows = []
  for config in MATMUL_SWEEP[kind][: (1 if args.quick else None)]:
    try:
      rows.append(case_matmul(args, m_rows, shape, config))
    except Exception as error:  # pylint: disable=broad-except
      rows.append({"config": repr(config), "error": f"{type(error).__name__}: {error}"})
  return {"candidates": rows}


# ----------------------------------------------------------------------------
# Driver.


_ONLY: tuple = ()


def run_case(results: dict, name: str, fn, *args, **kwargs):
  if _ONLY and not name.startswith(_ONLY):
    return None
  start = time.perf_counter()
  try:
    value = fn(*args, **kwargs)
    results[name] = {"ok": True, "result": value, "wall_s": time.perf_counter() - start}
  except Exception as error:  # pylint: disable=broad-except
    trace = traceback.format_exc()
    print(f"[{name}] FAILED: {type(error).__name__}: {error}\n{trace}", file=sys.stderr)
    results[name] = {"ok": False, "error": f"{type(error).__name__}: {error}",
                     "traceback": trace, "wall_s": time.perf_counter() - start}
  print(f"  {name}: {'ok' if results[name]['ok'] else 'FAILED'} "
        f"({results[name]['wall_s']:.1f} s)", flush=True)
  # One JSON line per case, so a run cut short still leaves its numbers.
  print("CASE " + json.dumps({name: {k: v for k, v in results[name].items() if k != "traceback"}},
                             default=str), flush=True)
  return results[name].get("result")


def format_table(results: dict) -> str:
  lines = []

  def row(*cells):
    lines.append("  ".join(str(c) for c in cells))

  row(f"{'case':<52}", f"{'time':>11}", "detail")
  for name, entry in results.items():
    if not entry["ok"]:
      row(f"{name:<52}", f"{'FAILED':>11}", entry["error"][:80])
      continue
    value = entry["result"]
    if name.startswith("update "):
      row(f"{name:<52}", f"{value['seconds'] * 1e6:>9.1f}us",
          f"{value['bytes_per_s'] / 1e12:.3f} TB/s = {100 * value['fraction_of_copy']:.1f}% "
          f"of copy")
    elif name.startswith("sweep matmul"):
      row(f"{name:<52}", f"{'':>11}", "")
      for candidate in value["candidates"]:
        if "packed_seconds" in candidate:
          row(f"  {candidate['config'][13:-1]:<50}",
              f"{candidate['packed_seconds'] * 1e6:>9.1f}us",
              f"speedup vs bf16 {candidate['speedup_vs_bf16']:.2f}x")
        else:
          row(f"  {candidate['config'][13:-1]:<50}", f"{'excluded':>11}",
              candidate.get("error", candidate.get("relative_error")))
    elif name.startswith("sweep"):
      row(f"{name:<52}", f"{'':>11}", "")
      for candidate in value["candidates"]:
        if "seconds" in candidate:
          row(f"  {candidate['config'][20:-1]:<50}", f"{candidate['seconds'] * 1e6:>9.1f}us",
              f"{100 * candidate['fraction_of_copy']:.1f}% of copy")
        else:
          row(f"  {candidate['config'][20:-1]:<50}", f"{'excluded':>11}",
              candidate.get("error", candidate.get("check")))
    elif name.startswith("from_io"):
      io, dense = value["from_io_kernel"], value["xla_gemm_plus_fused_update"]
      row(f"{name + ' in-kernel grad':<52}", f"{io['seconds'] * 1e3:>9.3f}ms",
          f"temp {io['memory'].get('temp_size_in_bytes', 0) / 2**20:.1f} MiB, "
          f"peak {io['memory'].get('peak_bytes', 0) / 2**20:.1f} MiB")
      row(f"{name + ' XLA GEMM + fused update':<52}", f"{dense['seconds'] * 1e3:>9.3f}ms",
          f"temp {dense['memory'].get('temp_size_in_bytes', 0) / 2**20:.1f} MiB, "
          f"peak {dense['memory'].get('peak_bytes', 0) / 2**20:.1f} MiB; io/dense time "
          f"{value['time_ratio_io_over_dense']:.2f}x")
    elif name.startswith("matmul"):
      row(f"{name:<52}", f"{value['packed_seconds'] * 1e6:>9.1f}us",
          f"bf16 jnp {value['bf16_seconds'] * 1e6:.1f}us, speedup "
          f"{value['speedup_vs_bf16']:.2f}x, {value['packed_tflops']:.1f} vs "
          f"{value['bf16_tflops']:.1f} TFLOP/s")
    elif name == "copy bandwidth":
      row(f"{name:<52}", f"{'':>11}", f"{value['copy_bytes_per_s'] / 1e12:.3f} TB/s")
    elif name == "correctness":
      for check, detail in value.items():
        if "off_by_one" in detail:
          row(f"  {check:<50}", f"{'':>11}",
              f"off-by-one {detail['off_by_one']}/{detail['codes']} "
              f"({detail['off_fraction']:.2e}), worse {detail['off_by_more']}, "
              f"scale rel {detail['scale_max_rel']:.1e}, v rel {detail['v_max_rel']:.1e}, "
              f"spec ok {detail['within_spec_1e-4']}")
        else:
          row(f"  {check:<50}", f"{'':>11}",
              f"max abs err {detail['max_abs_error']:.3g} (max |y| {detail['max_abs_value']:.3g})")
  return "\n".join(lines)


def plot(results: dict, path: pathlib.Path) -> None:
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  names, fractions = [], []
  for name, entry in results.items():
    if entry["ok"] and name.startswith("update "):
      names.append(name.replace("update ", ""))
      fractions.append(100 * entry["result"]["fraction_of_copy"])
  if not names:
    return
  figure, axis = plt.subplots(figsize=(7, 3))
  axis.barh(names, fractions)
  axis.axvline(80, color="k", linestyle="--", label="target 80%")
  axis.set_xlabel("counter update, % of copy bandwidth")
  axis.legend()
  figure.tight_layout()
  figure.savefig(path)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--quick", action="store_true",
                      help="tiny shapes through the Pallas interpreter (CPU check)")
  parser.add_argument("--samples", type=int, default=None, help="timed samples (>= 10 on GPU)")
  parser.add_argument("--inner", type=int, default=None, help="calls per sample")
  parser.add_argument("--only", default="",
                      help="comma-separated case-name prefixes (e.g. 'copy,sweep update')")
  args = parser.parse_args(argv)
  if args.samples is None:
    args.samples = 3 if args.quick else 15
  if args.inner is None:
    args.inner = 2 if args.quick else 10
  if not args.quick and jax.default_backend() != "gpu":
    parser.error("the full benchmark compiles Triton kernels and needs a GPU; use --quick")
  device = jax.devices()[0]
  print(f"jax {jax.__version__}, device {device.device_kind} ({jax.default_backend()}), "
        f"{'quick/interpret' if args.quick else 'compiled'}", flush=True)

  global _ONLY
  _ONLY = tuple(p.strip() for p in args.only.split(",") if p.strip())
  if _ONLY:
    _ONLY = _ONLY + ("copy",)
  results: dict = {}
  copy = run_case(results, "copy bandwidth", case_copy_bandwidth, args)
  copy_bytes_per_s = copy["copy_bytes_per_s"] if copy else None
  run_case(results, "correctness", case_correctness, args)
  update_shapes = [(64, 4 * 33), (40, 256)] if args.quick else [(4096, 4096), (11008, 4096)]
  for shape in update_shapes:
    for dtype in (jnp.float32, jnp.bfloat16):
      run_case(results, f"update {shape[0]}x{shape[1]} grad {jnp.dtype(dtype).name}",
               case_update_throughput, args, shape, dtype, copy_bytes_per_s)
  for m_rows in ((32, 48) if args.quick else (4096, 32768)):
    run_case(results, f"from_io M={m_rows}", case_from_io, args, m_rows)
  matmul_shapes = [(48, 64)] if args.quick else [(4096, 4096), (11008, 4096), (4096, 11008)]
  for shape in matmul_shapes:
    for m_rows in ((1, 16, 64) if args.quick else (1, 16, 4096)):
      run_case(results, f"matmul M={m_rows} {shape[0]}x{shape[1]} bf16", case_matmul, args,
               m_rows, shape)

  sweep_shapes = [(64, 4 * 33)] if args.quick else [(4096, 4096), (8192, 8192), (1536, 2304)]
  for shape in sweep_shapes:
    run_case(results, f"sweep update {shape[0]}x{shape[1]} f32", case_update_sweep, args, shape,
             copy_bytes_per_s)
  sweep_shape = matmul_shapes[0]
  for m_rows, kind in (((1, "decode"), (64, "prefill")) if args.quick
                       else ((1, "decode"), (4096, "prefill"))):
    run_case(results, f"sweep matmul M={m_rows} {sweep_shape[0]}x{sweep_shape[1]} bf16",
             case_matmul_sweep, args, m_rows, sweep_shape, kind)

  table = format_table(results)
  print()
  print(table)
  out_dir = pathlib.Path(args.out)
  out_dir.mkdir(parents=True, exist_ok=True)
  record = {"jax": jax.__version__, "device": device.device_kind,
            "backend": jax.default_backend(), "quick": args.quick, "samples": args.samples,
            "inner": args.inner, "C": C, "hyper": HYPER, "cases": results}
  (out_dir / "bench_ternary.json").write_text(json.dumps(record, indent=2, default=str))
  plot(results, out_dir / "bench_ternary.png")
  print(f"\nwrote {out_dir / 'bench_ternary.json'}")
  failed = [name for name, entry in results.items() if not entry["ok"]]
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
