#!/bin/bash
# Session 30 run 1 (one H100 or H200): the fused low-rank GEMM for members of 64k rows (the
# LM's sequences), first run on a GPU. (1) Compiled against the reference: multi-row members,
# every kind, and one-row members; (2) the LM's ES step by kernel (profile_lm_step.py, bf16,
# pop 16,384, ranks 1 and 4) on three trees: this one (each pair's noise vectors hashed once
# per tile, one value a thread, through shared memory), .s30a (f3f8b62: hashed per 64-column
# chunk in the accumulator's column layout, by the 32 threads holding each column) and
# .s29old (e8b27c5: such members take the Triton path). This tree also splits the gradient
# estimate's contraction for layers of few tiles (LowRankGradientConfig.splits_for; kernel
# "virtual_low_rank_gradient_split", against "virtual_low_rank_gradient" in the others).
#   mkdir .s29old && git archive e8b27c5 jaxnoise benchmarks | tar -x -C .s29old
#   cp benchmarks/profile_lm_step.py benchmarks/bench_lm.py .s29old/benchmarks/
#   mkdir .s30a && git archive f3f8b62 jaxnoise benchmarks | tar -x -C .s30a
#   OUT=$OUT bash benchmarks/gpu_session30_run1.sh   (carry .s29old and .s30a)
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 150 tests/test_low_rank.py -k "multi_row_members or fused_forward_compiled or split_gradient"
for rank in 1 4; do
  for tree in . .s30a .s29old; do
    tag=$([[ $tree == . ]] && echo once || echo ${tree#.})
    flag=$([[ $tree == .s29old ]] || echo --multi-row-fused)
    (cd $tree && PYTHONPATH=. timeout 70 python3 benchmarks/profile_lm_step.py --dtype bfloat16 \
      --pop 16384 --rank $rank $flag --out "$OUT/$tag" > "$OUT/profile_${tag}_r$rank.log" 2>&1)
    echo "rank $rank $tag exit $?"; grep "^==" "$OUT/profile_${tag}_r$rank.log"
    grep -i "low_rank\|mosaic\|error" "$OUT/profile_${tag}_r$rank.log" | head -4 | cut -c1-150
  done
done
