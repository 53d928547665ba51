#!/bin/bash
# Session 26 run 1 (one H100 or H200; not run in session 26, which had no GPU): the ES step
# of EGGROLL's layer (SGD, bf16; rank 1, and rank 4 for the chunks) after session 26's three
# changes, against the tree before them (29cf4d9) in the same run:
#  - with the finiteness check, a barrier after XLA's GEMM (predicted offline: 544 MiB moved
#    instead of 672, about -0.035 ms on an H200, -0.05 on an H100);
#  - the default fixed-order tiles round the gradient to bf16 as they store it (576 MiB
#    instead of 1088);
#  - at rank 4 (two chunks) the tiles add each chunk to the running sum in their epilogue
#    (1280 MiB instead of 3328).
# Set up here, then carry .s26 (a copy of this tree) and .s26old:
#   mkdir .s26old && git archive 29cf4d9 jaxnoise benchmarks | tar -x -C .s26old
#   (29cf4d9: before all three changes)
#   cp benchmarks/probe_es_step.py .s26old/benchmarks/probe_es_step_s26.py
# PART=a: the tests and the GEMM probes; b: the tiles' probes; g: all probes, no tests
# (session 28 ran a, b, then g; each part fits one device call).
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")  # the probes below write from other folders
PART=${PART:-all}
[[ $PART == all || $PART == a ]] && compiled_tests 200 tests/test_low_rank.py tests/test_optim_es.py \
  -k "out_dtype or weight_update_compiled or chunked or xla_gemm or finite"
probe() {  # probe TAG DIR SCRIPT ARGS...: one probe_es_step run, its rows printed
  local tag=$1 dir=$2 script=$3
  shift 3
  (cd "$dir" && PYTHONPATH=. timeout 150 python3 "benchmarks/$script" --skip-forms --floor "$@" \
    --out "$OUT/$tag" > "$OUT/$tag.log" 2>&1)
  echo "== $tag"
  quiet "$OUT/$tag.log" | grep -E "inference|evolution_strategy|^ [0-9]" | head -24
}
GEMM="bfloat16 evolution_strategy sgd (where|no check)$"
TILES="bfloat16 evolution_strategy default tiles sgd (where|no check)$"
if [[ $PART == all || $PART == a || $PART == g ]]; then
probe gemm_after . probe_es_step.py --only "$GEMM"
probe gemm_before ../.s26old probe_es_step_s26.py --only "$GEMM"
fi
if [[ $PART == all || $PART == b || $PART == g ]]; then
probe tiles_after . probe_es_step.py --default-tiles --only "$TILES"
probe tiles_before ../.s26old probe_es_step_s26.py --default-tiles --only "$TILES"
TILES4="bfloat16 evolution_strategy default tiles r4 sgd (where|no check)$"
probe tiles_r4_after . probe_es_step.py --default-tiles --rank 4 --only "$TILES4"
probe tiles_r4_before ../.s26old probe_es_step_s26.py --default-tiles --rank 4 --only "$TILES4"
fi
