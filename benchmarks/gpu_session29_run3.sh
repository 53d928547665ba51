#!/bin/bash
# Session 29 run 3 (the same card as run 2): the byte-level transformer LM's ES step (4 layers,
# d_model 512, context 64, one sequence per member, Adam) at populations 16,384 to 262,144,
# ranks 1 and 4 and full rank, float32 and bfloat16 layers, each beside batch inference of as
# many tokens (bench_lm.py's new floor).
#   OUT=$OUT bash benchmarks/gpu_session29_run3.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
for dtype in bfloat16 float32; do
  timeout 270 python3 benchmarks/bench_lm.py --dtype "$dtype" --ranks 1,4,full \
    --pops 16384,65536,262144 --budget 230 --case-budget 15 --out "$OUT/lm_$dtype" \
    > "$OUT/lm_$dtype.log" 2>&1
  echo "lm $dtype exit $?"
  quiet "$OUT/lm_$dtype.log" | grep -v '^{' | grep -v "^\[skip" | tail -14
done
