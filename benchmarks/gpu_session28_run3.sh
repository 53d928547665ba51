#!/bin/bash
# Session 28 run 3 (one H100 or H200): the operands kernel (x_i B_i) with lane-wise running
# sums (no block reduction inside its loop; offline: 62 registers against 101 at rank 4,
# 16.7 SASS instructions per factor value against 18.2, no BAR.SYNC in the loop) against
# the tree before it (.s28old = 541ce76, `git archive 541ce76 jaxnoise benchmarks`), bf16,
# ranks 1 and 4, in one run; the fused forward's compiled tests first. Measured slower
# (RESULTS.md, session 28, run 7) and reverted: run it from a tree with
# results/2026-12-06-s28/operands_running_sums_on_541ce76.patch applied.
#   OUT=$OUT bash benchmarks/gpu_session28_run3.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 90 tests/test_low_rank.py -k "fused_forward_compiled_on_hopper and binomial"
for tree in . .s28old; do
  tag=$([ "$tree" = . ] && echo after || echo before)
  (cd "$tree" && PYTHONPATH=. timeout 75 python3 benchmarks/bench_low_rank.py --bench \
    --ranks 1,4 --kinds binomial --only "inference bfloat16|jaxnoise bfloat16" \
    --skip "materialized|triton|ahead=1|stages" --budget 60 --out "$OUT/$tag" \
    > "$OUT/$tag.log" 2>&1)
  echo "== $tag"
  python3 -c "
import json
for r in json.load(open('$OUT/$tag/low_rank.json'))['results']:
  print(r['case'], r.get('busy_ms'), {k: round(v, 4) for k, v in (r.get('busy_kernels_ms') or {}).items()})"
done
