#!/usr/bin/env bash
# Builds the fuzz targets with the stable toolchain and runs each in turn.
#
#   bash fuzz/run.sh smoke [SECONDS]     each target for SECONDS (default 10)
#   bash fuzz/run.sh long [RUNS]         each target for RUNS inputs (default 10000000)
#   bash fuzz/run.sh MODE ARG TARGET...  only the named targets
#
# No cargo-fuzz and no nightly: cargo builds the libfuzzer-sys targets with
# the coverage instrumentation cargo-fuzz would ask rustc for (stable flags),
# without a sanitizer (AddressSanitizer needs nightly; the targets are safe
# Rust, and overflow checks and debug assertions are on in the fuzz profile).
# New inputs go to fuzz/target-corpus/ (not committed); fuzz/corpus/ holds
# the committed starting inputs and is only read. A crash is written to
# fuzz/artifacts/.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# A relative CARGO_TARGET_DIR is taken from where the script was started.
if [ -n "${CARGO_TARGET_DIR:-}" ]; then
    mkdir -p "$CARGO_TARGET_DIR"
    CARGO_TARGET_DIR="$(cd "$CARGO_TARGET_DIR" && pwd)"
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/target}"
cd "$here"

mode="${1:-smoke}"
[ $# -gt 0 ] && shift
amount=""
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then
    amount="$1"
    shift
fi
case "$mode" in
smoke) limit="-max_total_time=${amount:-10}" ;;
long) limit="-runs=${amount:-10000000}" ;;
*)
    echo "usage: $0 smoke [SECONDS] [TARGET...] | long [RUNS] [TARGET...]" >&2
    exit 2
    ;;
esac

targets=(retry_after grpc_pushback backoff_from json_path duration idempotency_key
    config_json config_yaml config_toml dead_letter_entry entry_id)
if [ $# -gt 0 ]; then targets=("$@"); fi

host="$(rustc -vV | sed -n 's/^host: //p')"
# `--target` keeps these flags off build scripts and proc macros.
export RUSTFLAGS="-Cpasses=sancov-module \
-Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
-Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares \
-Cllvm-args=-sanitizer-coverage-stack-depth \
-Cllvm-args=-simplifycfg-branch-fold-threshold=0 \
--cfg fuzzing -Cforce-frame-pointers=yes"

started=$(date +%s)
echo "building ${#targets[@]} fuzz targets (${host}, ${CARGO_TARGET_DIR})"
bins=()
for target in "${targets[@]}"; do bins+=(--bin "$target"); done
nice -n 10 cargo build --release --locked --target "$host" "${bins[@]}"
echo "built in $(($(date +%s) - started)) s"

failed=0
summary=()
for target in "${targets[@]}"; do
    mkdir -p "target-corpus/$target" "artifacts/$target" "corpus/$target"
    log="artifacts/$target/last-run.log"
    begun=$(date +%s)
    status=ok
    # Structured inputs (configuration files, stored entries) get their
    # tokens as a dictionary, and their full length from the start: with
    # libFuzzer's default length control a mutated starting input is cut to
    # a few dozen bytes for a long while, and stops being JSON, YAML or TOML.
    options=()
    case "$target" in
    config_*) options=(-dict=dict/config.dict -len_control=0 -max_len=1024) ;;
    dead_letter_entry) options=(-dict=dict/dead_letter_entry.dict -len_control=0 -max_len=1024) ;;
    esac
    # `-timeout`: an input taking 10 s is a hang; `-rss_limit_mb`: the
    # machine is shared.
    if ! nice -n 10 "$CARGO_TARGET_DIR/$host/release/$target" \
        "target-corpus/$target" "corpus/$target" \
        "$limit" "${options[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="artifacts/$target/" >"$log" 2>&1; then
        status=FAILED
        failed=1
    fi
    seconds=$(($(date +%s) - begun))
    runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    line="$(printf '%-18s %12s runs %6s s  %s' "$target" "${runs:-?}" "$seconds" "$status")"
    echo "$line"
    summary+=("$line")
    if [ "$status" != ok ]; then
        grep -E 'panicked|ERROR|SUMMARY|Test unit written' "$log" | head -20 || true
        echo "(full log: fuzz/$log)"
    fi
done

echo
echo "fuzz $mode: ${#targets[@]} targets in $(($(date +%s) - started)) s"
printf '%s\n' "${summary[@]}"
exit "$failed"
