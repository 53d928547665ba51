"""Reduce-metric layouts against pure JAX (issue 14), side by side in one run.

For each ``(pop, n_params)`` of SPEC section 5's reduce-metric target and each
kind: the pure-JAX path under XLA (jitted reference), the heuristic
``"rows"`` config (the old default), and the ``"individuals"`` layout with a
few tilings. Every kernel config is compared with the reference first
(largest relative deviation; above 1e-5 it is excluded, not timed). Medians
of 10 timed groups after warm-up, and device busy time (CUPTI kernel
durations, ``_harness.device_busy``) where PyTorch can record it.

Two pure-JAX formulations: the library's reference (a chunked ``lax.map``
over individuals) and ``vmap`` over individuals of one hash-abs-mean
(``bench_virtual_noise.py``'s, which XLA compiles to one reduction fusion).
Speedups are against the faster of the two.

    python benchmarks/bench_reduce_metric.py            # GPU; JSON under $OUT
    python benchmarks/bench_reduce_metric.py --quick    # CPU, interpret mode
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
from bench_virtual_noise import pure_jax_reduce_metric  # noqa: E402
import jaxnoise  # noqa: E402
from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402

SHAPES = ((65536, 4096), (1024, 1 << 20), (3000, 3_000_000))
QUICK_SHAPES = ((40, 300),)


def configs(pop: int, n_params: int, kind: str):
  rows = config_lib.reduce_metric_heuristics(n_params, pop)
  out = {"rows (old default)": rows}
  if kind == "rademacher":
    return out
  wide = config_lib.reduce_metric_individuals_heuristics(n_params, pop)
  out["individuals"] = wide
  out["individuals bp256"] = dataclasses.replace(wide, block_params=256)
  out["individuals bp512"] = dataclasses.replace(wide, block_params=512)
  out["individuals g16 w4"] = dataclasses.replace(wide, individuals_per_program=16, num_warps=4)
  out["individuals g64 w16"] = dataclasses.replace(wide, individuals_per_program=64,
                                                   num_warps=16)
  out["individuals 2x splits"] = dataclasses.replace(wide, param_splits=2 * wide.param_splits)
  # 16 values a thread instead of 32 (session 7: 184 registers a thread held one
  # program of 8 warps per SM, 12.5% occupancy).
  out["individuals bp128"] = dataclasses.replace(wide, block_params=128)
  out["individuals g16"] = dataclasses.replace(wide, individuals_per_program=16)
  out["individuals w16"] = dataclasses.replace(wide, num_warps=16)
  out["individuals g16 bp128 w4"] = dataclasses.replace(wide, individuals_per_program=16,
                                                        block_params=128, num_warps=4)
  return out


def bench_shape(pop, n_params, kind, *, implementation, offset, repeats, before=None,
                only_configs=None):
  center = jax.random.normal(jax.random.key(0), (n_params,), jnp.float32)
  seeds = jnp.arange(pop, dtype=jnp.uint32) * jnp.uint32(2654435761)
  op = functools.partial(jaxnoise.virtual_reduce_metric, sigma=0.1, offset=offset, kind=kind)
  reference = jax.jit(functools.partial(op, implementation="reference"))
  expected = np.asarray(reference(center, seeds), np.float64)
  vmapped = jax.jit(functools.partial(pure_jax_reduce_metric, sigma=0.1, offset=offset, kind=kind))
  baselines = {"reference (lax.map)": reference, "vmap (one fusion)": vmapped}
  walls, busys = {}, {}
  for name, fn in baselines.items():
    walls[name] = _harness.median_time(fn, center, seeds, repeats=repeats)
    busy = _harness.device_busy(fn, center, seeds)
    if busy:
      busys[name] = busy["busy_ms"] / 1e3
  pure_jax = min(walls.values())
  pure_busy = min(busys.values()) if busys else None
  values = pop * n_params
  result = {"pop": pop, "n_params": n_params, "kind": kind, "offset": offset,
            "pure_jax_s": pure_jax, "pure_jax_values_per_s": values / pure_jax,
            "pure_jax_forms_s": walls, "pure_jax_forms_busy_s": busys,
            "pure_jax_busy_s": pure_busy, "configs": {}}
  cases = {name: (config, None) for name, config in configs(pop, n_params, kind).items()
           if not only_configs or name in only_configs}
  if before is not None and "individuals" in cases:  # The frozen kernels, same config.
    cases["individuals (before)"] = (cases["individuals"][0], before)
  for name, (config, frozen) in cases.items():
    entry = {"config": repr(config)}
    try:
      if frozen is None:
        fn = jax.jit(functools.partial(op, implementation=implementation, config=config))
      else:
        fn = jax.jit(lambda c, s, frozen=frozen, config=config: frozen.reduce_metric(
            c, s, jnp.float32(0.1), offset, kind=noise_lib.get_kind(kind), antithetic=False,
            config=config, interpret=implementation == "interpret"))
      start = time.perf_counter()
      out = np.asarray(fn(center, seeds), np.float64)
      entry["first_call_s"] = time.perf_counter() - start
      deviation = float(np.abs(out - expected).max() / np.abs(expected).max())
      entry["deviation"] = deviation
      if not deviation <= 1e-5:
        entry["excluded"] = True
      else:
        seconds = _harness.median_time(fn, center, seeds, repeats=repeats)
        entry.update(seconds=seconds, values_per_s=values / seconds,
                     speedup_vs_pure_jax=pure_jax / seconds)
        busy = _harness.device_busy(fn, center, seeds)
        if busy and pure_busy:
          entry.update(busy_s=busy["busy_ms"] / 1e3,
                       busy_speedup_vs_pure_jax=pure_busy * 1e3 / busy["busy_ms"])
    except Exception as error:  # pylint: disable=broad-except
      entry["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    result["configs"][name] = entry
    line = (f"  {name:<24} {entry['seconds'] * 1e3:8.3f} ms  {entry['speedup_vs_pure_jax']:5.2f}x "
            f"pure JAX  busy {entry.get('busy_s', float('nan')) * 1e3:8.3f} ms "
            f"{entry.get('busy_speedup_vs_pure_jax', float('nan')):5.2f}x  "
            f"dev {entry['deviation']:.1e}" if "seconds" in entry else
            f"  {name:<24} {entry.get('error') or 'excluded, deviation %.3g' % entry['deviation']}")
    print(line, flush=True)
  return result


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--kinds", default="binomial,uniform")
  parser.add_argument("--offset", type=int, default=0)
  parser.add_argument("--configs", default="",
                      help='comma-separated config names to time (default: all), e.g. '
                           '"individuals,individuals g64 w16"')
  parser.add_argument("--before", default=None,
                      help="also time the reduce-metric kernel of this frozen copy of "
                           "jaxnoise/ops/virtual_noise/pallas_triton.py at the same config")
  args = parser.parse_args(argv)
  before = _harness.frozen_module(args.before) if args.before else None
  implementation = "interpret" if args.quick else "pallas"
  if not args.quick and jax.default_backend() != "gpu":
    parser.error("needs a GPU; use --quick on a CPU")
  repeats = 2 if args.quick else 10
  out_dir = pathlib.Path(os.environ.get("OUT", "benchmarks/out"))
  results = []
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
  for kind in args.kinds.split(","):
    for pop, n_params in (QUICK_SHAPES if args.quick else SHAPES):
      print(f"reduce-metric {kind} pop {pop} x {n_params} (offset {args.offset})", flush=True)
      results.append(bench_shape(pop, n_params, kind, implementation=implementation,
                                 offset=args.offset, repeats=repeats, before=before,
                                 only_configs=set(filter(None, args.configs.split(",")))))
      for form, seconds in results[-1]["pure_jax_forms_s"].items():
        busy = results[-1]["pure_jax_forms_busy_s"].get(form, float("nan"))
        print(f"  pure JAX {form:<22} {seconds * 1e3:8.3f} ms  busy {busy * 1e3:8.3f} ms",
              flush=True)
  out_dir.mkdir(parents=True, exist_ok=True)
  path = out_dir / "bench_reduce_metric.json"
  path.write_text(json.dumps({"environment": _harness.device_facts(), "cases": results}, indent=2,
                             default=str))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
