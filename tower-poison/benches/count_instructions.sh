#!/usr/bin/env bash
# Instructions per call of the success_path bench's variants, counted by
# callgrind (see bench-support/callgrind.sh).
#
#   bash tower-poison/benches/count_instructions.sh [N]
set -euo pipefail
cd "$(dirname "$0")/../.."
source bench-support/callgrind.sh
calls=${1:-2000}
bench=$(bench_binary tower-poison success_path)

printf '%-6s %8s %12s %12s\n' method bare dead_letter for_server
for method in GET POST; do
    bare=$(per_call BENCH_COUNT "bare,$method")
    printf '%-6s %8d %12d %12d\n' "$method" "$bare" \
        $(($(per_call BENCH_COUNT "dead_letter,$method") - bare)) \
        $(($(per_call BENCH_COUNT "for_server,$method") - bare))
done
echo "(bare: instructions per call; the others: overhead over bare)"
