#!/bin/bash
# Session 30 run 1 (one H100 or H200): the fused low-rank GEMM for members of 64k rows (the
# LM's sequences), first run on a GPU. (1) Compiled against the reference: multi-row members
# (every kind; the GEMM forming x B itself and not), one-row members, the split gradient;
# (2) the LM's ES step by kernel (profile_lm_step.py, bf16, pop 16,384, ranks 1 and 4):
#   member_dots  this tree: each pair's noise vectors hashed once per tile, x B formed by the
#                GEMM (one more wgmma per step and sign), the gradient's contraction split;
#   operands     the same with x B from the Triton operands kernel (--no-member-dots);
#   s29old       e8b27c5: such members take the Triton path, the gradient unsplit.
#   mkdir .s29old && git archive e8b27c5 jaxnoise benchmarks | tar -x -C .s29old
#   cp benchmarks/profile_lm_step.py benchmarks/bench_lm.py .s29old/benchmarks/
#   OUT=$OUT bash benchmarks/gpu_session30_run1.sh   (carry .s29old)
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 170 tests/test_low_rank.py \
  -k "multi_row_members or fused_forward_compiled or split_gradient"
for rank in 1 4; do
  for tag in member_dots operands s29old; do
    tree=.; flags="--multi-row-fused"
    [[ $tag == operands ]] && flags="--multi-row-fused --no-member-dots"
    [[ $tag == s29old ]] && tree=.s29old && flags=""
    (cd $tree && PYTHONPATH=. timeout 65 python3 benchmarks/profile_lm_step.py --dtype bfloat16 \
      --pop 16384 --rank $rank $flags --top 12 --out "$OUT/$tag" \
      > "$OUT/profile_${tag}_r$rank.log" 2>&1)
    echo "rank $rank $tag exit $?"; grep "^==" "$OUT/profile_${tag}_r$rank.log"
    grep -i "error" "$OUT/profile_${tag}_r$rank.log" | head -3 | cut -c1-200
  done
done
