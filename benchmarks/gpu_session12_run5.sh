#!/bin/bash
# Session 12 (one H200), run 5: the merged fused forward. The low-rank tests compiled on the GPU;
# EGGROLL's benchmark at ranks 1, 2, 4 in bf16 (heuristic: fused up to rank 4, rademacher rank 4
# on Triton) against the Triton path and EGGROLL's code; one ES step of the layer through
# evolution_strategy (SGD, with and without the finiteness check); the fused compiled checks.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/check" "$OUT/bench" "$OUT/es"
timeout 80 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log"
timeout 170 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4 --kinds binomial,rademacher \
  --only "inference bfloat16|jaxnoise bfloat16|eggroll bfloat16" --budget 150 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-140 | tail -24
timeout 70 python3 benchmarks/probe_es_step.py --skip-forms --only "bfloat16 .*sgd (where|no check)$" \
  --out "$OUT/es" > "$OUT/es.log" 2>&1
grep -v Warn "$OUT/es.log" | grep -v _warn_once | tail -24
timeout 120 python3 benchmarks/bench_low_rank.py --check --only "fused check" --budget 100 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
grep -v Warn "$OUT/check.log" | grep -v _warn_once | cut -c1-200 | tail -17
