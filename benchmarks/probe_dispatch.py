"""Host time of the fused low-rank forward: wall clock against device time, per call.

    python3 benchmarks/probe_dispatch.py --out $OUT                       # GPU
    XLA_FLAGS=--xla_gpu_enable_command_buffer= python3 benchmarks/probe_dispatch.py --out $OUT

Session 13 found that on EGGROLL's layer (1024 members, one bf16 row each,
(8192, 8192), rank 1) the fused Mosaic GPU forward took 0.184 ms of device
time but 0.38 ms of wall clock per call in ``bench_low_rank.py`` (three
calls queued per timed group), where the Triton path took 0.19 and 0.23 ms.
This probe separates where the wall clock goes, for XLA's GEMM, JAX's own
Mosaic GPU GEMM (``hopper_matmul_mgpu``), the fused forward and the Triton
path:

* ``issue_ms``: host time to issue one call (20 calls queued, not waited on);
* ``blocking_ms``: one call and a wait, each time;
* ``queued_ms``: 20 calls queued, then one wait, per call;
* ``busy_ms``: device time (CUPTI kernel durations);
* the same for 8 calls chained inside one ``jit`` (one executable), per call.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402

_CHAIN = 8


def _wall(fn, *args, calls: int = 20, groups: int = 7) -> dict:
  jax.block_until_ready(fn(*args))
  issue, queued, blocking = [], [], []
  for _ in range(groups):
    t0 = time.perf_counter()
    outs = [fn(*args) for _ in range(calls)]
    t1 = time.perf_counter()
    jax.block_until_ready(outs)
    t2 = time.perf_counter()
    issue.append((t1 - t0) / calls)
    queued.append((t2 - t0) / calls)
    del outs
    t0 = time.perf_counter()
    for _ in range(5):
      jax.block_until_ready(fn(*args))
    blocking.append((time.perf_counter() - t0) / 5)
  busy = _harness.device_busy(fn, *args, calls=10)
  return {"issue_ms": 1e3 * statistics.median(issue),
          "queued_ms": 1e3 * statistics.median(queued),
          "blocking_ms": 1e3 * statistics.median(blocking),
          "busy_ms": None if busy is None else busy["busy_ms"],
          "kernels": None if busy is None else busy["kernels"]}


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--pop", type=int, default=1024)
  parser.add_argument("--features", type=int, default=8192)
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  pop, d = args.pop, args.features
  keys = jax.random.split(jax.random.key(0), 2)
  x = jax.random.normal(keys[0], (pop, 1, d), jnp.bfloat16)
  w = (jax.random.normal(keys[1], (d, d)) / np.sqrt(d)).astype(jnp.bfloat16)
  seeds = jaxnoise.draw_seeds(jax.random.key(1), pop, antithetic=True)
  default = config_lib.low_rank_linear_heuristics(1, d, d, 1, "binomial")

  def op(config):
    def forward(x, w):
      return jaxnoise.virtual_perturbed_linear(
          x, w, None, seeds, 0.01, 0, kind="binomial", antithetic=True, rank=1,
          out_dtype=jnp.bfloat16, config=config)
    return forward

  def gemm(x, w):
    return jnp.einsum("pbk,ok->pbo", x, w)

  fns = {"xla gemm": gemm,
         "fused": op(dataclasses.replace(default, fused_gemm=True)),
         "triton": op(dataclasses.replace(default, fused_gemm=False))}
  try:
    from jax.experimental.pallas.ops.gpu import hopper_matmul_mgpu as hopper  # pylint: disable=g-import-not-at-top
    config = hopper.TuningConfig(tile_m=128, tile_n=128, tile_k=64, max_concurrent_steps=4,
                                 grid_tile_width=4, wg_dimension=hopper.MatmulDimension.N)
    w_t = jnp.asarray(w.T)
    fns["jax mosaic gemm"] = lambda x, w: hopper.matmul(x[:, 0], w_t, c=None, config=config)
  except Exception as e:  # pylint: disable=broad-except
    print("hopper_matmul_mgpu unavailable:", repr(e)[:300])

  results = {"facts": _harness.device_facts(), "xla_flags": os.environ.get("XLA_FLAGS", ""),
             "cases": {}}
  for name, fn in fns.items():
    def chained(x, w, fn=fn):
      for _ in range(_CHAIN):
        x = fn(x, w).reshape(x.shape)
      return x
    for label, call in ((name, jax.jit(fn)), (f"{name} x{_CHAIN} in one jit", jax.jit(chained))):
      try:
        record = _wall(call, x, w)
        if label.endswith("jit"):
          record = {k: (v / _CHAIN if isinstance(v, float) else v) for k, v in record.items()}
          record["per"] = "call inside the chain"
      except Exception as e:  # pylint: disable=broad-except
        record = {"error": repr(e)[:400]}
      results["cases"][label] = record
      print(json.dumps({"case": label, **{k: v for k, v in record.items() if k != "kernels"}}),
            flush=True)
  _harness.write_json(os.path.join(args.out, "probe_dispatch.json"), results)


if __name__ == "__main__":
  main()
