#!/bin/bash
# Session 15 (one GPU), run 3: the new counter update was slower than main's at 8192^2 float32
# (run 2: 139.7 against 124.1 us) and faster elsewhere. Is it the inline-PTX truncation? Times
# main's frozen kernel, the new kernel, and the new kernel truncating with astype (a copy of
# the module with truncate_codes replaced), each beside the new heuristic, in device time.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/frozen" "$OUT/astype"
quiet() { grep -v Warn | grep -v _warn_once; }
variant=benchmarks/baseline_update/update_astype_tmp.py
sed -e 's/^    truncate_codes,$//' jaxnoise/ops/ternary/pallas_triton_update.py > $variant
cat >> $variant <<'PY'


def truncate_codes(value, interpret):
  del interpret
  return value.astype(jnp.int32).astype(jnp.uint32)
PY
for pair in "frozen benchmarks/baseline_update/update_7fbab3d.py" "astype $variant"; do
  set -- $pair
  timeout 150 python3 benchmarks/bench_ternary.py --part update --before-update "$2" \
    --budget 45 --out "$OUT/$1" > "$OUT/$1/bench.log" 2>&1; echo "$1 exit $?"
  quiet < "$OUT/$1/bench.log" | cut -c1-175 | head -12
done
