#!/bin/bash
# Session 27 run 1 (one H100 or H200; session 26's run 1 again, not run in sessions 26 and 27,
# which got no machine): session 26's three changes to the ES step of EGGROLL's layer (bf16,
# SGD), this tree (the library as at session 26's end, 2f30dc0) against .s26old's (29cf4d9,
# before session 26's changes). Set up here:
#   mkdir .s27 && cp -r jaxnoise benchmarks tests pyproject.toml .s27/ && rm -rf .s27/benchmarks/results
#   mkdir .s26old && git archive 29cf4d9 jaxnoise benchmarks | tar -x -C .s26old
#   rm -rf .s26old/benchmarks/results
#   cp benchmarks/probe_es_step.py .s26old/benchmarks/probe_es_step_s26.py
# then carry .s27 and .s26old and run `cd .s27 && OUT=$OUT bash benchmarks/gpu_session27_run1.sh`.
# - rank 1, the check after XLA's GEMM (predicted 544 MiB moved instead of 672);
# - rank 1, default tiles: the gradient rounded to bf16 as the tiles store it (576 MiB
#   instead of 1088);
# - rank 4, default tiles: the chunks' running sum in the tiles' epilogue (1280 MiB instead
#   of 3328).
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 200 tests/test_low_rank.py tests/test_optim_es.py \
  -k "out_dtype or weight_update_compiled or chunked or xla_gemm or finite"
probe() {
  local tag=$1 dir=$2 script=$3
  shift 3
  (cd "$dir" && PYTHONPATH=. timeout 150 python3 "benchmarks/$script" --skip-forms --floor "$@" \
    --out "$OUT/$tag" > "$OUT/$tag.log" 2>&1)
  echo "== $tag"
  quiet "$OUT/$tag.log" | grep -E "inference|evolution_strategy|^ [0-9]" | head -24
}
GEMM="bfloat16 evolution_strategy sgd (where|no check)$"
probe gemm_after . probe_es_step.py --only "$GEMM"
probe gemm_before ../.s26old probe_es_step_s26.py --only "$GEMM"
TILES="bfloat16 evolution_strategy default tiles sgd (where|no check)$"
probe tiles_after . probe_es_step.py --default-tiles --only "$TILES"
probe tiles_before ../.s26old probe_es_step_s26.py --default-tiles --only "$TILES"
TILES4="bfloat16 evolution_strategy default tiles r4 sgd (where|no check)$"
probe tiles_r4_after . probe_es_step.py --default-tiles --rank 4 --only "$TILES4"
probe tiles_r4_before ../.s26old probe_es_step_s26.py --default-tiles --rank 4 --only "$TILES4"
