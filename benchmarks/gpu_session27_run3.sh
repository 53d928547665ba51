#!/bin/bash
# Session 27 run 3 (one H100 or H200; session 26's run 1 again, not run in sessions 26 and 27,
# which got no machine): session 26's three changes to the ES step of EGGROLL's layer (bf16,
# SGD), .s26's tree (2f30dc0) against .s26old's (29cf4d9). Set up as for run 1, and
#   mkdir .s26old && git archive 29cf4d9 jaxnoise benchmarks | tar -x -C .s26old
#   cp benchmarks/probe_es_step.py .s26old/benchmarks/probe_es_step_s26.py
# then carry .s27b, .s26, .s26old and run `cd .s27b && OUT=$OUT bash benchmarks/gpu_session27_run3.sh`.
# - rank 1, the check after XLA's GEMM (predicted 544 MiB moved instead of 672);
# - rank 1, default tiles: the gradient rounded to bf16 as the tiles store it (576 MiB
#   instead of 1088);
# - rank 4, default tiles: the chunks' running sum in the tiles' epilogue (1280 MiB instead
#   of 3328).
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
probe() {
  local tag=$1 dir=$2 script=$3
  shift 3
  (cd "$dir" && PYTHONPATH=. timeout 80 python3 "benchmarks/$script" --skip-forms --floor "$@" \
    --out "$OUT/$tag" > "$OUT/$tag.log" 2>&1)
  echo "== $tag"
  quiet "$OUT/$tag.log" | grep -E "inference|evolution_strategy|^ [0-9]" | head -12
}
GEMM="bfloat16 evolution_strategy sgd (where|no check)$"
probe gemm_after ../.s26 probe_es_step.py --only "$GEMM"
probe gemm_before ../.s26old probe_es_step_s26.py --only "$GEMM"
TILES="bfloat16 evolution_strategy default tiles sgd (where|no check)$"
probe tiles_after ../.s26 probe_es_step.py --default-tiles --only "$TILES"
probe tiles_before ../.s26old probe_es_step_s26.py --default-tiles --only "$TILES"
TILES4="bfloat16 evolution_strategy default tiles r4 sgd (where|no check)$"
probe tiles_r4_after ../.s26 probe_es_step.py --default-tiles --rank 4 --only "$TILES4"
probe tiles_r4_before ../.s26old probe_es_step_s26.py --default-tiles --rank 4 --only "$TILES4"
