#!/bin/bash
# (Never run as such: no machine came; run 2 took its HLO dump and run 3 its commands. See
# benchmarks/RESULTS.md, session 25.)
# Session 25 run 1 (one H100 or H200): why XLA (jax 0.11.2) keeps the per-entry finiteness
# check's reduction apart from the parameters' addition. The optimised HLO of the library's
# bf16 SGD step (EGGROLL's layer, rank 1), then the step with each form of
# probe_finite_check.FORMS as the check.
source "$(dirname "$0")/_gpu_run_preamble.sh"
XLA_FLAGS="--xla_dump_to=$OUT/xla --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_step" \
  timeout 100 python3 benchmarks/probe_es_step.py --skip-forms --floor \
  --only "bfloat16 evolution_strategy sgd where$" --out "$OUT/where" > "$OUT/where.log" 2>&1
quiet "$OUT/where.log" | grep -E "inference|evolution_strategy|^    " | head -14
ls "$OUT/xla" | grep -c . ; ls "$OUT/xla" | grep after_optimizations | head
timeout 240 python3 benchmarks/probe_es_step.py --finite-forms --only "bfloat16" \
  --out "$OUT/forms" > "$OUT/forms.log" 2>&1
quiet "$OUT/forms.log" | grep -E "evolution_strategy|^    " | head -40
