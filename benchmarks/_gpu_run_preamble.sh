# Sourced by benchmarks/gpu_sessionNN_runK.sh (session 24 on): the environment every GPU run
# uses, the card and driver in $OUT/gpu.txt, and `compiled_tests` (pytest on the GPU, its log
# in $OUT/tests.log, the last lines printed). Run scripts from a copy of the tree:
#   cd .sNN && OUT=$OUT bash benchmarks/gpu_sessionNN_runK.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv \
  > "$OUT/gpu.txt" 2>&1
python3 -c "import jax, jaxlib; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__)" \
  >> "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

# compiled_tests SECONDS PYTEST_ARGS...: the tests compiled on the GPU, stopping at the first
# failure.
compiled_tests() {
  local seconds=$1
  shift
  timeout "$seconds" python3 -m pytest -q -x "$@" > "$OUT/tests.log" 2>&1
  tail -3 "$OUT/tests.log"
}

# quiet LOG: the log without Triton's deprecation warnings, runs of spaces squeezed.
quiet() {
  grep -v "Warn\|_warn_once\|UserWarning" "$1" | sed 's/  */ /g' | cut -c1-190
}
