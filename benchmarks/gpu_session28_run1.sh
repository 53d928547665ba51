#!/bin/bash
# Session 28 run 1 (one H100 or H200): the fused GEMM with rank components hashed in its main
# loop (LowRankLinearConfig.gemm_noise_ahead). (1) Compiled: every kind, against the epilogue's
# sum bit for bit and the reference; (2) EGGROLL's layer, binomial, ranks 1 and 4, bf16 and
# f32: the default (epilogue hashing) beside ahead=1 and ahead=4 in one run.
#   OUT=$OUT bash benchmarks/gpu_session28_run1.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 200 tests/test_low_rank.py -k "noise_ahead_compiled or fused_forward_compiled"
timeout 330 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise" --skip "materialized|triton" --budget 300 --out "$OUT" \
  > "$OUT/bench.log" 2>&1
echo "bench exit $?"
quiet "$OUT/bench.log" | tail -40
