#!/bin/bash
# Session 17 (one GPU), run 3:
# 1. The reduce-metric's compiled tests (whole and ragged tiles, fused multiply-add, every
#    flat op against the reference) and bench_reduce_metric.py with the final heuristic
#    (128-wide tiles up to 8192 parameters) beside session 16's frozen kernel module.
# 2. tune_fused_operands.py: the fused low-rank forward's operands kernel over its tiles
#    (issue 9: float32 rank 1 at 93.5-94.7% of inference).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_virtual_noise_kernels.py \
  -k "pallas and (reduce or flat_ops)" > "$OUT/reduce_tests.log" 2>&1; echo "pytest exit $?"
tail -3 "$OUT/reduce_tests.log"
OUT=$OUT timeout 120 python3 benchmarks/bench_reduce_metric.py --kinds binomial \
  --before .before/virtual_noise_pallas_triton_4cc70a8.py 2>&1 | quiet \
  | grep -E "reduce-metric|individuals  |bp256|before|pure JAX " | cut -c1-150
timeout 260 python3 benchmarks/tune_fused_operands.py --budget 170 --out "$OUT" 2>&1 | quiet \
  | grep -v "^{'dtype'" | cut -c1-200
python3 - "$OUT/tune_fused_operands.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["forwards"]:
  print(r["dtype"], r["rank"], r["config"], r.get("forward_ms"), r.get("operands_ms"),
        r.get("fraction_of_inference"), r["rel_err_vs_heuristic"])
PY
