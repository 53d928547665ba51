#!/bin/bash
# Ran on the tree of commit 4268266 (gemm_delay_release was removed after this run).
# Session 32 run 7: the fused GEMM's buffers released a step late (gemm_delay_release, new,
# off): (1) its compiled tests and the lowering tests of the chain's spy (mended after run 5);
# (2) the LM's 512x512 and 2048x512 layers: the default (chained tiles), plain, delayed;
# (3) EGGROLL's benchmark, bf16, ranks 1 and 4: default against delayed.
#   OUT=$OUT bash benchmarks/gpu_session32_run7.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 100 python3 -m pytest -q --tb=short tests/test_low_rank.py \
  -k "delay_release or pipelined_tiles_lower" > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
grep -E "^(FAILED|ERROR|E )" "$OUT/tests.log" | head -12 | cut -c1-300
timeout 120 python3 benchmarks/probe_lm_layers.py --ranks 1 --shapes 512x512,2048x512b \
  --variants default,plain,delay --out "$OUT/r1" > "$OUT/lm_layers_r1.log" 2>&1
echo "layers exit $?"; grep -E "^rank" "$OUT/lm_layers_r1.log" | cut -c1-300
timeout 130 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise" --skip "materialized|triton|ahead|stages|float32" \
  --budget 110 --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
quiet "$OUT/bench.log" | grep -v '^{' | tail -12
