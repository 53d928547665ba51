#!/bin/bash
# Session 28 run 2 (one H100 or H200): run 1 again after the per-pair vectors of the
# codes-ahead epilogue were hoisted before the main loop (run 1 reloaded them for every
# chunk), with the default at 3 stages beside it (what ahead=4 gets at rank 4).
#   OUT=$OUT bash benchmarks/gpu_session28_run2.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 150 tests/test_low_rank.py -k "noise_ahead_compiled and (binomial or uniform)"
timeout 200 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise" --skip "materialized|triton" --budget 180 --out "$OUT" \
  > "$OUT/bench.log" 2>&1
echo "bench exit $?"
quiet "$OUT/bench.log" | tail -18
python3 -c "
import json
for r in json.load(open('$OUT/low_rank.json'))['results']:
  print(r['case'], r.get('busy_ms'), {k: round(v, 4) for k, v in (r.get('busy_kernels_ms') or {}).items()})"
