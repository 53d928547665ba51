#!/bin/bash
# Session 24 run 5 (one H100 or H200): the ES step (EGGROLL's layer, SGD, rank 1, bf16) with
# the finiteness check per update entry (this tree) against the
# check before the update (../.s23, commit 422dbb2) and no check, in one run. Set up here:
#   mkdir .s23 && git archive 422dbb2 jaxnoise benchmarks | tar -x -C .s23
# and carry both .s24 (a copy of this tree) and .s23.
source "$(dirname "$0")/_gpu_run_preamble.sh"
ONLY="bfloat16 evolution_strategy sgd (where|no check)$"
timeout 100 python3 benchmarks/probe_es_step.py --skip-forms --floor --only "$ONLY" \
  --out "$OUT/per_entry" > "$OUT/per_entry.log" 2>&1
quiet "$OUT/per_entry.log" | grep -E "inference|evolution_strategy|^    " | head -30
(cd ../.s23 && PYTHONPATH=. timeout 90 python3 benchmarks/probe_es_step.py --skip-forms --floor \
  --only "bfloat16 evolution_strategy sgd where$" --out "$OUT/before" > "$OUT/before.log" 2>&1)
quiet "$OUT/before.log" | grep -E "inference|evolution_strategy|^    " | head -16
timeout 90 python3 -m pytest -q tests/test_reliability.py tests/test_optim_es.py -k "finite or drop or zeroes" \
  > "$OUT/tests.log" 2>&1; tail -2 "$OUT/tests.log"
