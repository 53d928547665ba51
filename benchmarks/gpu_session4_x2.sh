#!/usr/bin/env bash
# Session 4 on two H200s (issue 11, scale-out): bit-exactness of the sharded update, the
# low-rank gradient's tile kernel against cuBLAS, scaling (MLP, transformer LM), and deep
# MLPs (the largest for one GPU; one that fits only sharded, whose one-GPU run must OOM).
#   bash benchmarks/gpu_session4_x2.sh        (from the repository root, $OUT set)
# Every part has its own timeout (sum 400 s) and writes JSON after each case, so a part
# that is cut short keeps what it measured. Results: $OUT/session4.tgz and $OUT/summary.txt.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="${TMPDIR:-/tmp}/session4_results"; rm -rf "$R"; mkdir -p "$R"  # only two files go to $OUT
S="$OUT/summary.txt"
start=$(date +%s)
{ nvidia-smi -L; python3 -c "import jax; print('jax', jax.__version__, jax.devices())"; } > "$S" 2>&1
part() {  # part NAME SECONDS COMMAND...: run with a timeout, log, note the exit status
  local name=$1 seconds=$2; shift 2
  local t0=$(date +%s)
  timeout "$seconds" "$@" > "$R/$name.txt" 2>&1
  local status=$?
  echo "== $name: exit $status after $(( $(date +%s) - t0 )) s" | tee -a "$S"
  grep -v '^{' "$R/$name.txt" | grep -E '^(case|---|[a-z].*  )' | cut -c1-230 | tail -24 | tee -a "$S"
}
# 1. Low-rank gradient: Pallas tile kernel vs one cuBLAS GEMM, rows of a shard bit-exact (GPU 0).
CUDA_VISIBLE_DEVICES=0 part low_rank_gradient 40 \
  python3 benchmarks/bench_low_rank_gradient.py --budget 30 --out "$R"
# 2. Bit-exactness on both GPUs: sharded update (and parameters after apply) vs one GPU,
#    784-1024-256-10 MLP, full rank and rank 1, SGD and Adam (update_max_abs_diff, bit_exact).
part exact 60 python3 benchmarks/bench_scaling.py --cases exact --exact-pop 16384 \
  --budget 50 --out "$R/exact"
# 3. MLP scaling at 65,536 and 262,144 (1 GPU replicated; 2 GPUs sharded, fsdp_eval).
part mlp 60 python3 benchmarks/bench_scaling.py --cases mlp --modes replicated,sharded,fsdp_eval \
  --budget 45 --out "$R/mlp"
# 4. Transformer LM, rank 1, populations 16,384 and 65,536, on 1 and 2 GPUs.
part lm 90 python3 benchmarks/bench_scaling.py --cases lm --lm-pops 16384,65536 \
  --budget 75 --out "$R/lm"
# 5. Deep MLPs (32768-wide float32 layers, SGD, pop 8): sizes from XLA's memory analysis.
XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 part deep 150 python3 benchmarks/bench_scaling.py \
  --cases deep --budget 135 --out "$R/deep"
grep -h -o '"case": "[^"]*"\|"bit_exact": [a-z]*\|"update_max_abs_diff": [^,]*\|"params_max_abs_diff": [^,]*' \
  "$R/exact/scaling.json" 2>/dev/null | paste -sd' ' | sed 's/"case"/\n"case"/g' | tee -a "$S"
echo "total $(( $(date +%s) - start )) s" | tee -a "$S"
tar czf "$OUT/session4.tgz" -C "$R" .
