#!/bin/bash
# Session 31 run 5 (ready, not run: the session's device time was spent): the fused GEMM's tiles
# chained into one pipeline per multiprocessor (LowRankLinearConfig.gemm_pipelined_tiles, built
# after run 4 without a GPU) and gemm_tile_n=64 (fixed after run 4). (1) Their compiled tests
# and the 64-row ones (with tile_n=64 cases); (2) the LM's layers with and without the chain
# (probe_lm_layers.py, bf16, ranks 1 and 4); (3) the LM's step by kernel, bands of 8 column
# tiles (the default since run 4), with and without the chain (profile_lm_step.py, rank 1).
#   OUT=$OUT bash benchmarks/gpu_session31_run5.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
timeout 150 python3 -m pytest -q tests/test_low_rank.py \
  -k "pipelined_tiles or multi_row_members" > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -8 | cut -c1-220
for rank in 1 4; do
  timeout 110 python3 benchmarks/probe_lm_layers.py --ranks $rank \
    --variants default,pipelined,width1,tile64 --out "$OUT/r$rank" \
    > "$OUT/lm_layers_r$rank.log" 2>&1
  echo "layers rank $rank exit $?"; grep -E "^rank" "$OUT/lm_layers_r$rank.log" | cut -c1-300
done
# The default's optimised HLO too (step and inference), to name the XLA fusions the profile
# lists (which of them the step adds over inference: 24 ms at rank 1 in run 1).
for flags in "" "--pipelined-tiles"; do
  name=${flags:-default}; name=${name#--}
  dump=""; [[ $name == default ]] && dump="--xla_dump_to=$OUT/hlo --xla_dump_hlo_module_re=jit_(step|population_loss)"
  XLA_FLAGS="$dump" timeout 90 python3 benchmarks/profile_lm_step.py --dtype bfloat16 \
    --pop 16384 --rank 1 $flags --top 8 --out "$OUT/$name" > "$OUT/profile_${name}_r1.log" 2>&1
  echo "$name exit $?"; grep "^==" "$OUT/profile_${name}_r1.log"
done
# Keep only the optimised modules (gzip) from the dump.
find "$OUT/hlo" -type f ! -name "*after_optimizations.txt" -delete 2>/dev/null
gzip -q "$OUT"/hlo/*.txt 2>/dev/null; ls "$OUT/hlo" 2>/dev/null | head
