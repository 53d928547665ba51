#!/bin/bash
# Session 13 (one H200), run 3: where the fused forward's wall clock goes (probe_dispatch.py, with
# XLA's command buffers on and off), then EGGROLL's benchmark at ranks 1, 2, 4 (binomial) in bf16
# and f32 with EGGROLL's code in the same run.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/dispatch" "$OUT/dispatch_no_cmdbuf" "$OUT/bench"
timeout 100 python3 benchmarks/probe_dispatch.py --out "$OUT/dispatch" > "$OUT/dispatch.log" 2>&1
grep '^{' "$OUT/dispatch.log" | cut -c1-200
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 100 python3 benchmarks/probe_dispatch.py \
  --out "$OUT/dispatch_no_cmdbuf" > "$OUT/dispatch_no_cmdbuf.log" 2>&1
grep '^{' "$OUT/dispatch_no_cmdbuf.log" | cut -c1-200
timeout 200 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --budget 180 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-150 | tail -24
