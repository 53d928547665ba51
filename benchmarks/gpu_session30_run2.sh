#!/bin/bash
# Session 30 run 2 (ready then, never run): the LM beside inference, the ES step of EGGROLL's
# layer and EGGROLL's benchmark, once MULTI_ROW_MEMBERS was on. It is session 31's run 2,
# which ran it (MULTI_ROW_MEMBERS has been on since), so this runs that script.
#   OUT=$OUT bash benchmarks/gpu_session30_run2.sh   (carry .peers)
exec bash "$(dirname "$0")/gpu_session31_run2.sh" "$@"
