#!/usr/bin/env bash
# Instructions per call, counted by callgrind (valgrind), which repeat exactly
# from run to run, unlike wall-clock time on a shared machine. Each case runs N
# and 2N calls; the difference, divided by N, is one call without the setup.
# User-space instructions only.
#
#   bash tower-retry-budget/benches/count_instructions.sh [N]               # the replay body
#   bash tower-retry-budget/benches/count_instructions.sh success_path [N]  # the awaited success path
#
# The replay body: the kernel's share of a loopback request (the syscalls) is
# not counted, so the loopback ratios overstate what the replay body costs.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }

mode=replay_body
if [ "${1:-}" = success_path ]; then
    mode=success_path
    shift
fi
calls=${1:-2000}
bench=$(cargo bench -p tower-retry-budget --bench "$mode" --no-run --message-format=json 2>/dev/null |
    sed -n "s/.*\"executable\":\"\([^\"]*${mode}[^\"]*\)\".*/\1/p" | tail -n 1)
[ -x "$bench" ] || { echo "could not build the $mode bench" >&2; exit 1; }

instructions() { # variable spec
    env "$1=$2" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bench" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}
per_call() { # variable spec-without-calls
    local once twice
    once=$(instructions "$1" "$2,$calls")
    twice=$(instructions "$1" "$2,$((2 * calls))")
    echo $(((twice - once) / calls))
}

if [ "$mode" = success_path ]; then
    bare=$(per_call SUCCESS_PATH_COUNT bare)
    printf '%-28s %10s %10s %22s\n' "case" "Ir/call" "overhead" "overhead / tower's"
    tower=$(($(per_call SUCCESS_PATH_COUNT tower) - bare))
    for case in bare ours tower resilience; do
        total=$(per_call SUCCESS_PATH_COUNT "$case")
        overhead=$((total - bare))
        ratio=$(awk -v a="$overhead" -v b="$tower" 'BEGIN { printf "%.2f", a / b }')
        printf '%-28s %10d %10d %22s\n' "$case" "$total" "$overhead" "$ratio"
    done
    exit 0
fi

printf '%-9s %-6s %14s %14s %8s\n' "service" "body" "plain Ir/call" "replay Ir/call" "ratio"
for place in memory loopback; do
    for kib in 1 64; do
        plain=$(per_call REPLAY_BODY_COUNT "$place,plain,$kib")
        replay=$(per_call REPLAY_BODY_COUNT "$place,replay,$kib")
        ratio=$(awk -v a="$replay" -v b="$plain" 'BEGIN { printf "%.3f", a / b }')
        printf '%-9s %-6s %14d %14d %8s\n' "$place" "${kib} KiB" "$plain" "$replay" "$ratio"
    done
done
