#!/usr/bin/env bash
# Instructions per call of the success_path bench's variants, counted by callgrind
# (valgrind), which repeat exactly from run to run, unlike wall-clock time on a
# shared machine. Each variant makes N and 2N awaited calls; the difference,
# divided by N, is one call without the setup. User-space instructions only.
#
#   bash tower-poison/benches/count_instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
calls=${1:-2000}
bench=$(cargo bench -p tower-poison --bench success_path --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*success_path-[^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bench" ] || { echo "could not build the success_path bench" >&2; exit 1; }

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


printf '%-6s %8s %12s %12s\n' method bare dead_letter for_server
for method in GET POST; do
    bare=$(per_call bare "$method")
    printf '%-6s %8d %12d %12d\n' "$method" "$bare" \
        $(($(per_call dead_letter "$method") - bare)) $(($(per_call for_server "$method") - bare))
done
echo "(bare: instructions per call; the others: overhead over bare)"
