#!/usr/bin/env bash
# Session 4, one H200, issue 14: the compile-time fix confirmed (compile_bisect.py on the
# cases that decide it, then compile_probe.py), then the reduce-metric against both
# pure-JAX formulations in device time. About 5 minutes. Output under $OUT.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
ONLY="check,fwd uniform 2^32+5 old,fwd uniform 2^32+5 new,fwd normal 2^32+5 new,fwd binomial 2^32+5 new,fwd normal 0 old,fwd normal 0 new,module normal 2^32+5,module normal 0"
OUT="$R" timeout 200 python3 benchmarks/compile_bisect.py --timeout-s 40 --only "$ONLY" > "$R/compile_bisect.txt" 2>&1
grep -v "^\s*$" "$R/compile_bisect.txt" | grep -v Warning | cut -c1-200 | tail -14
OUT="$R" timeout 100 python3 benchmarks/compile_probe.py --budget-s 85 2>&1 | grep -v Warning > "$R/compile_probe.txt"
tail -50 "$R/compile_probe.txt" | cut -c1-160
OUT="$R" timeout 200 python3 benchmarks/bench_reduce_metric.py --kinds binomial > "$R/reduce_metric.txt" 2>&1
cat "$R/reduce_metric.txt" | cut -c1-160
tar czf "$OUT/results_single.tgz" -C "$R" .
