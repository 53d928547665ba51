#!/bin/bash
# Session 18 (one H200), run 2: t from clamped adds in the decode kernel and in the packed
# matmul's input gradient (no integer-to-float conversion): compiled checks and tests; the
# decode against a copy and against the frozen kernels of 7f6ffc6 (BEFORE_ELEMENTWISE, from
# `git show 7f6ffc6:jaxnoise/ops/ternary/pallas_triton.py`); the input gradient at M = 1-16
# against a dense bf16 `g @ w` and 7f6ffc6's matmul module (BEFORE_MATMUL, its unused
# `unit_buckets` import removed; from 2 rows both call today's decode). The input gradient
# on clamped adds was slower and was reverted after this run. Then EGGROLL's benchmark at
# ranks 1 and 4 beside EGGROLL's code (carried as ../.peers).
# cd .s18 && OUT=$OUT bash benchmarks/gpu_session18_run2.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
BEFORE_ELEMENTWISE=${BEFORE_ELEMENTWISE:-before_elementwise.py}
BEFORE_MATMUL=${BEFORE_MATMUL:-before_matmul2.py}
timeout 100 python3 benchmarks/bench_ternary.py --part check --only "matmul|decode" --budget 80 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 120 python3 -m pytest -q tests/test_ternary_ops.py \
  -k "pallas and (matmul or fma or decode or input_grad)" > "$OUT/tests.log" 2>&1
timeout 80 python3 benchmarks/bench_ternary.py --part decode --budget 60 \
  --before-elementwise "$BEFORE_ELEMENTWISE" --out "$OUT/decode" > "$OUT/decode.log" 2>&1
timeout 120 python3 benchmarks/bench_ternary.py --part matmul --op input_grad --batches 1,2,4,16 \
  --budget 95 --before-matmul "$BEFORE_MATMUL" --before-config heuristic \
  --out "$OUT/input_grad" > "$OUT/input_grad.log" 2>&1
timeout 200 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|step" --budget 170 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
echo "checks ok: $(grep -c 'ok True' "$OUT/check.log")"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -8
tail -3 "$OUT/tests.log"
grep -v Warn "$OUT/decode.log" | cut -c1-170
grep -v Warn "$OUT/input_grad.log" | sed 's/  */ /g' | cut -c1-170 | head -60
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-150 | tail -30
