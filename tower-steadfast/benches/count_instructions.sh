#!/usr/bin/env bash
# Instructions per call of the stack bench's variants, counted by callgrind
# (see bench-support/callgrind.sh).
#
#   bash tower-steadfast/benches/count_instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench-support/callgrind.sh
calls=${1:-2000}
bench=$(bench_binary tower-steadfast stack)

printf '%-6s %6s %12s %12s %8s %8s %8s %8s\n' method bare dead_letter breaker retry stack "Σ layers" ratio
for method in GET POST; do
    bare=$(per_call BENCH_COUNT "bare,$method")
    over=()
    for variant in dead_letter breaker retry stack; do
        over+=($(($(per_call BENCH_COUNT "$variant,$method") - bare)))
    done
    sum=$((over[0] + over[1] + over[2]))
    ratio=$(awk -v a="${over[3]}" -v b="$sum" 'BEGIN { printf "%.2f", a / b }')
    printf '%-6s %6d %12d %12d %8d %8d %8d %8s\n' "$method" "$bare" "${over[@]}" "$sum" "$ratio"
done
echo "(bare: instructions per call; the others: overhead over bare)"
