#!/usr/bin/env bash
# Instructions per call, counted by callgrind (see bench-support/callgrind.sh).
#
#   bash tower-retry-budget/benches/count_instructions.sh [N]               # the replay body
#   bash tower-retry-budget/benches/count_instructions.sh success_path [N]  # the awaited success path
#   bash tower-retry-budget/benches/count_instructions.sh http [N]          # the same over HTTP requests
#
# The replay body: the kernel's share of a loopback request (the syscalls) is
# not counted, so the loopback ratios overstate what the replay body costs.
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench-support/callgrind.sh

mode=replay_body
case "${1:-}" in
success_path) mode=success_path; shift ;;
http) mode=http_success_path; shift ;;
esac
calls=${1:-2000}
bench=$(bench_binary tower-retry-budget "$mode")

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

if [ "$mode" = http_success_path ]; then
    printf '%-6s %6s %10s %10s %18s\n' method bare ours tower "ours / tower's"
    for method in GET POST; do
        bare=$(per_call BENCH_COUNT "bare,$method")
        ours=$(($(per_call BENCH_COUNT "ours,$method") - bare))
        tower=$(($(per_call BENCH_COUNT "tower,$method") - bare))
        ratio=$(awk -v a="$ours" -v b="$tower" 'BEGIN { printf "%.2f", a / b }')
        printf '%-6s %6d %10d %10d %18s\n' "$method" "$bare" "$ours" "$tower" "$ratio"
    done
    echo "(bare: instructions per call; ours and tower: overhead over bare)"
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
