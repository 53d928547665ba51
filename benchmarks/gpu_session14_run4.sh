#!/bin/bash
# Session 14 (one H200), run 4: the fused forward's noise added a column group per pipeline step
# (while the products are in flight) and the pipeline kept running between tiles, against the
# epilogue-only kernel (module switches), bf16 and f32 at ranks 1 and 4; the compiled tests of
# the fused path with the new default; EGGROLL's benchmark at ranks 1 and 4
# with the new default. Both changes were slower or no faster and were removed after this run,
# with tune_low_rank.py's "variants" part that switched them (benchmarks/RESULTS.md, session 14).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/bench"
timeout 180 python3 benchmarks/tune_low_rank.py --path fused --parts variants --budget 150 \
  --out "$OUT" > "$OUT/tune_variants.log" 2>&1
python3 - "$OUT/tune_fused_low_rank.json" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
  k = c.get("kernels_ms", {})
  print(c["dtype"][:4], c["rank"], "inter" if c["interleaved_noise"] else "epi  ",
        "steady" if c["steady_pipeline"] else "restart", c["noise_groups"],
        "busy %.4f frac %.4f mosaic %.4f ops %.4f floor %.4f diff %.1e" % (
            c.get("busy_ms", 0), c.get("busy_fraction", 0),
            k.get("anonymous_mosaic_gpu_kernel", 0), k.get("virtual_low_rank_fused_operands", 0),
            c.get("floor_busy_ms") or 0, c.get("max_rel_diff_vs_triton_path", -1)),
        c.get("error", "")[:200])
PY
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest_fused.log" 2>&1
tail -3 "$OUT/pytest_fused.log"
timeout 120 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|step|triton|fused" --budget 100 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-150 | tail -24
