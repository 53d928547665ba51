"""Device time of the LM's ES step and of batch inference, split by kernel (GPU).

The byte-level transformer of :mod:`lm_model` (``bench_lm.py``'s model), one
population: the ES step (ask, fused population forward, gradient estimate,
Adam) and batch inference of as many tokens, each profiled with CUPTI
(:func:`_harness.device_busy`); the kernels are grouped by name and the largest
printed, so the step's extra time over inference can be read per kernel.

    python benchmarks/profile_lm_step.py --dtype bfloat16 --pop 16384 --rank 1 --out OUT

Writes ``<out>/lm_profile_<dtype>_r<rank>.json``. Needs PyTorch with CUDA
(CUPTI); elsewhere it prints that there is nothing to profile.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import bench_lm  # noqa: E402
import lm_model  # noqa: E402


def profiles(config: lm_model.LMConfig, pop: int, rank: int | None, tokens_per_chunk: int,
             calls: int) -> dict:
  """``{"step": busy, "inference": busy}`` (:func:`_harness.device_busy` records) of
  ``bench_lm.py``'s step and floor, one sequence per member."""
  step, step_args, _, _ = bench_lm.es_step_setup(config, pop, rank, 1, tokens_per_chunk,
                                                 donate=False)  # re-callable
  population_loss, loss_args, _ = bench_lm.inference_setup(config, pop, 1, tokens_per_chunk)
  return {"step": _harness.device_busy(step, *step_args, calls=calls),
          "inference": _harness.device_busy(population_loss, *loss_args, calls=calls)}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
  parser.add_argument("--pop", type=int, default=16384)
  parser.add_argument("--rank", default="1", help="an integer, or full")
  parser.add_argument("--tokens-per-chunk", type=int, default=1 << 20)
  parser.add_argument("--calls", type=int, default=3)
  parser.add_argument("--top", type=int, default=25, help="kernels printed per profile")
  lm_model.add_route_arguments(parser)
  parser.add_argument("--out", default="benchmarks/out")
  args = parser.parse_args(argv)
  rank = None if args.rank == "full" else int(args.rank)
  lm_model.route_from_arguments(args)
  config = lm_model.LMConfig(dtype=args.dtype)
  result = profiles(config, args.pop, rank, args.tokens_per_chunk, args.calls)
  if result["step"] is None:
    print("no CUPTI (PyTorch with CUDA) on this machine: nothing to profile")
    return
  for name, busy in result.items():
    print(f"== {name}: {busy['busy_ms']:.2f} ms device, {len(busy['kernels'])} kernel names")
    for kernel, ms in sorted(busy["kernels"].items(), key=lambda kv: -kv[1])[:args.top]:
      print(f"  {ms:9.3f}  {kernel}")
  os.makedirs(args.out, exist_ok=True)
  _harness.write_json(os.path.join(args.out, f"lm_profile_{args.dtype}_r{args.rank}.json"),
                      {"facts": _harness.device_facts(), "pop": args.pop, **result})


if __name__ == "__main__":
  main()
