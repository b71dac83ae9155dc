#!/usr/bin/env bash
# Instructions per call of the stack bench's variants, counted by callgrind
# (valgrind), which repeat exactly from run to run, unlike wall-clock time on a
# shared machine. Each variant makes N and 2N awaited calls; the difference,
# divided by N, is one call without the setup. User-space instructions only.
#
#   bash tower-steadfast/benches/count_instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
calls=${1:-2000}
bench=$(cargo bench -p tower-steadfast --bench stack --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*stack-[^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bench" ] || { echo "could not build the stack bench" >&2; exit 1; }

instructions() { # variant method calls
    BENCH_COUNT="$1,$2,$3" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bench" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_call() { # variant method
    local once twice
    once=$(instructions "$1" "$2" "$calls")
    twice=$(instructions "$1" "$2" $((2 * calls)))
    echo $(((twice - once) / calls))
}

printf '%-6s %6s %12s %12s %8s %8s %8s %8s\n' method bare dead_letter breaker retry stack "Σ layers" ratio
for method in GET POST; do
    bare=$(per_call bare "$method")
    over=()
    for variant in dead_letter breaker retry stack; do
        over+=($(($(per_call "$variant" "$method") - bare)))
    done
    sum=$((over[0] + over[1] + over[2]))
    ratio=$(awk -v a="${over[3]}" -v b="$sum" 'BEGIN { printf "%.2f", a / b }')
    printf '%-6s %6d %12d %12d %8d %8d %8d %8s\n' "$method" "$bare" "${over[@]}" "$sum" "$ratio"
done
echo "(bare: instructions per call; the others: overhead over bare)"
