#!/bin/bash
# Session 29 run 1 (one H100 or H200): two pipeline steps' wgmmas in flight in the fused
# low-rank GEMM (LowRankLinearConfig.gemm_steps_in_flight=2, each input buffer released a step
# later). (1) Compiled: every kind, equal bit for bit to one step in flight and to the
# reference; (2) EGGROLL's layer, binomial, ranks 1 and 4, bf16 and f32: in_flight 1 and 2,
# each with and without the codes hashed ahead, beside EGGROLL's code (carried as .peers).
#   git apply benchmarks/results/2026-12-06-s29/gemm_steps_in_flight_on_e8b27c5.patch  (reverted after)
#   OUT=$OUT bash benchmarks/gpu_session29_run1.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 200 tests/test_low_rank.py -k "two_steps_in_flight or fused_forward_compiled"
timeout 340 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|triton" --budget 310 \
  --eggroll-path .peers --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
quiet "$OUT/bench.log" | grep -v '^{' | tail -40
