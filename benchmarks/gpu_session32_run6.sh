#!/bin/bash
# Session 32 run 6 (after run 5, which is session 31's run 5): the chained tiles on by default
# for members of several rows. (1) The lowering tests that failed on the GPU in run 5 (no
# traceback: pytest ran past its 150 s) and the chained compiled tests run 5 did not reach;
# (2) the LM beside inference with the new default (bench_lm.py, bf16, ranks 1 and 4).
#   OUT=$OUT bash benchmarks/gpu_session32_run6.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 120 python3 -m pytest -q --tb=short tests/test_low_rank.py \
  -k "pipelined_tiles_lower or pipelined_tiles_compiled" > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
grep -E "^(FAILED|ERROR|E )" "$OUT/tests.log" | head -12 | cut -c1-300
timeout 300 python3 benchmarks/bench_lm.py --dtype bfloat16 --ranks 1,4 \
  --pops 16384,65536 --budget 270 --case-budget 15 --out "$OUT/lm_bfloat16" \
  > "$OUT/lm_bfloat16.log" 2>&1
echo "lm exit $?"
quiet "$OUT/lm_bfloat16.log" | grep -v '^{' | grep -v "^\[skip" | tail -10
