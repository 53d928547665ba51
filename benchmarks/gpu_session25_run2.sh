#!/bin/bash
# Session 25 run 2 (one H100 or H200), from a copy of this tree (.s25) with session 24's
# tree (.s24, commit 62a0d7f) and EGGROLL's noiser files (.peers) carried beside it:
# 1. the fused low-rank forward's compiled tests (the epilogue's popc bit count, the operands
#    kernel split over programs);
# 2. tune_fused_operands.py over operand_components (None = session 24's one program per
#    pair) at ranks 2 and 4;
# 3. EGGROLL's benchmark at ranks 1 and 4, this tree against .s24 (SWAR epilogue, one
#    program per pair), EGGROLL's code beside it;
# 4. the per-entry finiteness check's HLO and the check's forms (run 1's script).
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 150 tests/test_low_rank.py -k "hopper or compiled or gpu"
timeout 150 python3 benchmarks/tune_fused_operands.py --ranks 4,2 --budget 110 \
  --grid "operand_components=None,1,2;block_reduce=2048,4096,8192;num_warps=4,8;num_stages=1" \
  --out "$OUT/tune" > "$OUT/tune.log" 2>&1
quiet "$OUT/tune.log" | grep -v "^{" | head -40; grep "^{" "$OUT/tune.log" | cut -c1-260
for tree in . ../.s24; do
  name=$(basename "$(cd $tree && pwd)")
  (cd $tree && PYTHONPATH=. timeout 150 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 \
    --kinds binomial --only "inference|jaxnoise|eggroll" --skip "materialized|step" --budget 120 \
    --eggroll-path ../.peers --out "$OUT/bench_$name" > "$OUT/bench_$name.log" 2>&1)
  echo "== $name"; quiet "$OUT/bench_$name.log" | grep -v "^{" | tail -14
done
OUT=$OUT/finite bash benchmarks/gpu_session25_run1.sh 2>&1 | tail -40
