#!/usr/bin/env bash
# Instructions per request of the replay body bench's cases, counted by
# callgrind (valgrind), which repeat exactly from run to run, unlike wall-clock
# time on a shared machine. Each case runs N and 2N calls; the difference,
# divided by N, is one call without the setup. User-space instructions only:
# the kernel's share of a loopback request (the syscalls) is not counted, so
# the loopback ratios overstate what the replay body costs.
#
#   bash tower-retry-budget/benches/count_instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
calls=${1:-2000}
bench=$(cargo bench -p tower-retry-budget --bench replay_body --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*replay_body[^"]*\)".*/\1/p' | tail -n 1)
[ -x "$bench" ] || { echo "could not build the replay_body bench" >&2; exit 1; }

instructions() { # place body kib calls
    REPLAY_BODY_COUNT="$1,$2,$3,$4" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bench" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_call() { # place body kib
    local once twice
    once=$(instructions "$1" "$2" "$3" "$calls")
    twice=$(instructions "$1" "$2" "$3" $((2 * calls)))
    echo $(((twice - once) / calls))
}

printf '%-9s %-6s %14s %14s %8s\n' "service" "body" "plain Ir/call" "replay Ir/call" "ratio"
for place in memory loopback; do
    for kib in 1 64; do
        plain=$(per_call "$place" plain "$kib")
        replay=$(per_call "$place" replay "$kib")
        ratio=$(awk -v a="$replay" -v b="$plain" 'BEGIN { printf "%.3f", a / b }')
        printf '%-9s %-6s %14d %14d %8s\n' "$place" "${kib} KiB" "$plain" "$replay" "$ratio"
    done
done
