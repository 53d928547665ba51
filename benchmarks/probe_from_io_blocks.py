"""Forms of ``counter_update_from_io`` by XLA's GEMM in row blocks, in device time.

    python3 benchmarks/probe_from_io_blocks.py --out $OUT     # GPU
    python3 benchmarks/probe_from_io_blocks.py --quick        # CPU: the forms agree

``FromIOConfig(xla_gemm_rows=R)`` forms ``R`` rows of the gradient at a time
with XLA's GEMM and updates those rows of the whole state in place with the
dense kernel (its ``row_block``). Session 21's run 1 sliced the state per
block instead and spent 30-156 µs in device-to-device copies of it; run 2
also timed a Python loop over the blocks and ``grad_out`` transposed once (no
faster, and more temporary memory: ``benchmarks/RESULTS.md``). This probe
times, on 4096x4096 bf16 at M = 4096, 1024 and 256, beside XLA's GEMM + the
fused update and the kernels' own GEMM (the heuristic), blocks of 512, 1024
and 2048 rows, each with its temporary memory and its kernels. Every form is
checked against the dense update first.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import bench_ternary as bench  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise.ops.ternary import config as config_lib  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton_update as kernels  # noqa: E402


def forms(m_rows: int, interpret: bool) -> dict:
  """Name -> ``fn(packed, scale, v, x, grad_out, hyper, seed)``."""
  C = bench.C

  def gemm_plus_update(packed, scale, v, x, grad_out, hyper, seed):
    grad = jnp.einsum("mo,mi->oi", grad_out, x, preferred_element_type=jnp.float32)
    return kernels.counter_update(packed, scale, v, grad, hyper, seed, C=C, lagged=False,
                                  interpret=interpret)

  from_io = functools.partial(kernels.counter_update_from_io, C=C, lagged=False,
                              interpret=interpret)
  out = {"gemm_plus_update": gemm_plus_update, "kernels (heuristic)": from_io}
  for rows in ((16,) if interpret else (512, 1024, 2048)):
    out[f"rows={rows}"] = functools.partial(
        from_io, config=config_lib.FromIOConfig(xla_gemm_rows=rows))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--quick", action="store_true", help="small shapes through the interpreter")
  args = parser.parse_args(argv)
  interpret = args.quick
  out_features, in_features = (40, 64) if args.quick else (4096, 4096)
  batches = (24,) if args.quick else (4096, 1024, 256)
  inner = 1 if args.quick else 3
  hyper = bench.hyper_array()
  results = {}
  for m_rows in batches:
    steps = [(jax.random.normal(jax.random.key(8 + 2 * i), (m_rows, in_features), jnp.bfloat16),
              jax.random.normal(jax.random.key(9 + 2 * i), (m_rows, out_features), jnp.bfloat16))
             for i in range(inner)]
    x, grad_out = steps[0]
    state = bench.make_state(jax.random.key(13), out_features, in_features)
    seed = jnp.full((1,), 7, jnp.uint32)
    expected = None
    base = None
    for name, fn in forms(m_rows, interpret).items():
      row = {}
      result = jax.jit(fn)(*state, x, grad_out, hyper, seed)
      if expected is None:
        expected = result
      else:
        row["check"] = bench.compare_states(result, expected, state[0])
      run = bench.chained(fn, inner, per_step=True)
      make = lambda: bench.make_state(jax.random.key(10), out_features, in_features)  # noqa: E731
      busy = _harness.device_busy(lambda p, s, v: run(p, s, v, steps),
                                  arg_sets=[make() for _ in range(4)])
      if busy is not None:
        row["device_us"] = busy["busy_ms"] * 1e3 / inner
        row["kernels_us"] = {k: round(t * 1e3 / inner, 1) for k, t in
                             sorted(busy["kernels"].items(), key=lambda kv: -kv[1])[:8]}
      row["memory"] = bench.memory(lambda p, s, v, x, g, fn=fn: fn(p, s, v, x, g, hyper, seed),
                                   *state, x, grad_out)
      if base is None:
        base = row.get("device_us")
      ratio = f" x{row['device_us'] / base:.2f}" if base and "device_us" in row else ""
      check = row.get("check", {})
      print(f"M={m_rows:5d} {name:28s} {row.get('device_us', float('nan')):8.1f} us{ratio}  "
            f"temp {row['memory'].get('temp_size_in_bytes', 0) / 2**20:6.1f} MiB  "
            f"off {check.get('off_by_one', '-')}/{check.get('off_by_more', '-')}"
            f"{'' if check.get('within_spec', True) else '  OUT OF SPEC'}", flush=True)
      results[f"M={m_rows} {name}"] = row
  pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
  _harness.write_json(str(pathlib.Path(args.out) / "probe_from_io_blocks.json"),
                      {"device": _harness.device_facts(), "results": results})
  bad = [k for k, r in results.items() if not r.get("check", {}).get("within_spec", True)]
  if bad:
    raise SystemExit(f"out of spec: {bad}")


if __name__ == "__main__":
  main()
