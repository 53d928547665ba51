#!/bin/bash
# Session 14 (one H200), run 2: the operands kernel's configs inside the fused forward (x out of
# L2, as in use), bf16 and f32, ranks 1, 2 and 4, with the GEMM at 4 stages and grid width 1.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
timeout 420 python3 benchmarks/tune_low_rank.py --path fused --parts forward_operands \
  --budget 380 --out "$OUT" > "$OUT/tune_forward_operands.log" 2>&1
python3 - "$OUT/tune_fused_low_rank.json" <<'PY'
import json, sys
for c in json.load(open(sys.argv[1]))["cases"]:
  k = c.get("kernels_ms", {})
  print(c["dtype"][:4], c["rank"], c["num_warps"], c["block_reduce"], c["num_stages"],
        "*" if c["default"] else " ", "busy %.4f ops %.4f mosaic %.4f floor %.4f" % (
            c.get("busy_ms", 0), k.get("virtual_low_rank_fused_operands", 0),
            k.get("anonymous_mosaic_gpu_kernel", 0), c.get("floor_busy_ms") or 0),
        c.get("error", "")[:80])
PY
