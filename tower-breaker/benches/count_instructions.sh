#!/usr/bin/env bash
# Instructions per awaited call on the closed path, counted by callgrind
# (see bench-support/callgrind.sh).
#
#   bash tower-breaker/benches/count_instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench-support/callgrind.sh
calls=${1:-20000}
bench=$(bench_binary tower-breaker closed_path)

bare=$(per_call CLOSED_PATH_COUNT bare)
failsafe=$(($(per_call CLOSED_PATH_COUNT failsafe) - bare))
printf '%-18s %10s %10s %22s\n' case Ir/call overhead "overhead / failsafe's"
for case in bare consecutive count_window time_window failsafe tower_resilience; do
    total=$(per_call CLOSED_PATH_COUNT "$case")
    overhead=$((total - bare))
    ratio=$(awk -v a="$overhead" -v b="$failsafe" 'BEGIN { printf "%.2f", a / b }')
    printf '%-18s %10d %10d %22s\n' "$case" "$total" "$overhead" "$ratio"
done
