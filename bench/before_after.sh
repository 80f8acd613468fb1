#!/bin/sh
# Before/after for the profiling notes: dtlaunch as of REV (default: the revision before the
# start-up fixes) vs this checkout, side by side in one run. Then rebuild RESULTS.md.
set -e
REV=${1:-8d230ac}
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
"$PY" launch_overhead.py --hosts 2 --reps 9 --only pre-flight --baseline "$REV" --out before_after_launch.md
"$PY" doctor_fanout.py --hosts 1,32 --latency-hosts '' --reps 5 --baseline "$REV" --out before_after_doctor.md --png ''
"$PY" run_all.py --report-only
