"""Warps per program of the dense counter update, by gradient dtype, in device time.

    python3 benchmarks/probe_update_warps.py --out $OUT     # GPU
    python3 benchmarks/probe_update_warps.py --quick        # CPU: the configs agree

The heuristic (:meth:`CounterUpdateConfig.get_heuristics_config`) ignores the
gradient's dtype. Session 21's run 5 timed half its warps (4 instead of 8) at
8192x8192: bfloat16 99.5 against 107.9 us, float32 133.6 against 129.9. This
probe times the heuristic, half and twice its warps on bfloat16 gradients at
six shapes (square, LLM-like, ragged) and the heuristic against half its
warps on float32 at the large ones, each screened against the reference, as
a fraction of copy bandwidth (``bench_ternary.py``'s ``time_update``).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import pathlib
import sys
import types

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import bench_ternary as bench  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise.ops.ternary import config as config_lib  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton_update as kernels  # noqa: E402
from jaxnoise.ops.ternary import reference  # noqa: E402


def cases(quick: bool) -> list[tuple]:
  """``(shape, dtype, configs)``: the heuristic first."""
  bf16, f32 = jnp.bfloat16, jnp.float32
  if quick:
    plan = [((64, 16 * 33), bf16, (1, 2)), ((40, 4 * 37), f32, (1, 2))]
  else:
    big = ((8192, 8192), (4096, 4096), (11008, 4096), (4096, 11008))
    plan = [(shape, bf16, (1, 2, 0.5)) for shape in big + ((1000, 3996), (1536, 2304))]
    plan += [(shape, f32, (1, 2)) for shape in big[:3]]
  out = []
  for shape, dtype, divisors in plan:
    base = config_lib.CounterUpdateConfig.get_heuristics_config(shape, dtype)
    configs = [dataclasses.replace(base, num_warps=int(min(16, max(1, base.num_warps / d))))
               for d in divisors]
    out.append((shape, dtype, list(dict.fromkeys(configs))))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--quick", action="store_true", help="small shapes through the interpreter")
  args = parser.parse_args(argv)
  timing_args = types.SimpleNamespace(quick=args.quick, samples=3 if args.quick else 10,
                                      inner=1 if args.quick else 3)
  copy_bps = bench.copy_bandwidth(timing_args)
  print("copy " + ", ".join(f"{k} {v / 1e12:.3f} TB/s" for k, v in copy_bps.items()), flush=True)
  hyper, seed = bench.hyper_array(), jnp.full((1,), 99, jnp.uint32)
  results = {}
  for shape, dtype, configs in cases(args.quick):
    state = bench.make_state(jax.random.key(6), *shape)
    grad = jax.random.normal(jax.random.key(7), shape, dtype)
    expected = jax.jit(functools.partial(reference.counter_update_reference, C=bench.C,
                                         lagged=False))(*state, grad, hyper, seed[0])
    for rank, config in enumerate(configs):
      name = f"{shape[0]}x{shape[1]} {jnp.dtype(dtype).name} warps={config.num_warps}" + (
          " (heuristic)" if rank == 0 else "")
      fn = functools.partial(kernels.counter_update, C=bench.C, lagged=False, config=config,
                             interpret=args.quick)
      check = bench.compare_states(jax.jit(fn)(*state, grad, hyper, seed), expected, state[0])
      row = {"config": bench._short(config), "check": check}  # pylint: disable=protected-access
      if check["within_spec"]:
        row.update(bench.time_update(timing_args, fn, shape, dtype, copy_bps))
      results[name] = row
      device = row.get("device_s")
      print(f"{name:<44} {'OUT OF SPEC' if not check['within_spec'] else ''}"
            f"{row.get('seconds', float('nan')) * 1e6:8.1f} us wall"
            + (f"  {device * 1e6:8.1f} us device  {100 * row['device_fraction_of_copy']:5.1f}%"
               " of copy" if device else ""), flush=True)
  pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
  _harness.write_json(str(pathlib.Path(args.out) / "probe_update_warps.json"),
                      {"device": _harness.device_facts(), "copy_bytes_per_s": copy_bps,
                       "results": results})
  bad = [name for name, row in results.items() if not row["check"]["within_spec"]]
  if bad:
    raise SystemExit(f"out of spec: {bad}")


if __name__ == "__main__":
  main()
