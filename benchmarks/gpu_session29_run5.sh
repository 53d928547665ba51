#!/bin/bash
# Session 29 run 5 (one H100 or H200; not run: session 29's device time ran out): the fused
# low-rank GEMM for members of 64k rows (the LM's sequences). (1) Compiled against the
# reference: multi-row members, every kind, and one-row members (the operands kernel now
# writes per-row arrays, interpreted only); (2) the LM's ES step by kernel
# (profile_lm_step.py, bf16, pop 16,384, ranks 1 and 4) on this tree with
# mosaic_gpu_low_rank.MULTI_ROW_MEMBERS on and on .s29old (e8b27c5, which takes the Triton
# path there). If the tests pass and the step is faster, turn MULTI_ROW_MEMBERS on.
#   mkdir .s29old && git archive e8b27c5 jaxnoise benchmarks | tar -x -C .s29old
#   cp benchmarks/profile_lm_step.py benchmarks/bench_lm.py .s29old/benchmarks/
#   OUT=$OUT bash benchmarks/gpu_session29_run5.sh   (carry .s29old)
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 150 tests/test_low_rank.py -k "multi_row_members or fused_forward_compiled"
for rank in 1 4; do
  for tree in . .s29old; do
    tag=$([[ $tree == . ]] && echo column || echo ${tree#.})
    flag=$([[ $tree == . ]] && echo --multi-row-fused)
    (cd $tree && PYTHONPATH=. timeout 80 python3 benchmarks/profile_lm_step.py --dtype bfloat16 \
      --pop 16384 --rank $rank $flag --out "$OUT/$tag" > "$OUT/profile_${tag}_r$rank.log" 2>&1)
    echo "rank $rank $tag exit $?"; grep "^==" "$OUT/profile_${tag}_r$rank.log"
  done
done
