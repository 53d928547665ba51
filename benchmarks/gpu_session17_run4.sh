#!/bin/bash
# Session 17 (one GPU), run 4: EGGROLL's benchmark (1024 members x one (8192, 8192) layer)
# at ranks 1 and 4, binomial, with the fused forward's new rank-1 operands tiles (8192 wide,
# 8 warps), EGGROLL's public code beside it (carried in ../.peers, never committed).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 330 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|eggroll|jaxnoise" --skip "materialized|triton|fused" --budget 300 \
  --eggroll-path ../.peers --out "$OUT" > "$OUT/bench.log" 2>&1; echo "bench exit $?"
python3 - "$OUT/low_rank.json" <<'PY'
import json, sys
data = json.load(open(sys.argv[1]))
for r in data.get("results", data if isinstance(data, list) else []):
  print(r.get("case"), r.get("busy_ms"), r.get("busy_fraction_of_inference"),
        r.get("fraction_of_inference"), r.get("error", "")[:200])
PY
