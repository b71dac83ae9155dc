# Shell helpers for the benches' count_instructions.sh scripts, sourced by
# them: instructions per call counted by callgrind (valgrind), which repeat
# exactly from run to run, unlike wall-clock time on a shared machine. Each
# case runs N and 2N calls; the difference, divided by N, is one call
# without the setup. User-space instructions only.

# bench_binary PACKAGE BENCH: builds the bench and prints its executable.
bench_binary() {
    command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; return 1; }
    local binary
    binary=$(cargo bench -p "$1" --bench "$2" --no-run --message-format=json 2>/dev/null |
        sed -n "s/.*\"executable\":\"\([^\"]*$2-[^\"]*\)\".*/\1/p" | tail -n 1)
    [ -x "$binary" ] || { echo "could not build the $2 bench" >&2; return 1; }
    echo "$binary"
}

# instructions VARIABLE SPEC: the instructions of one run of "$bench" with
# VARIABLE=SPEC in its environment.
instructions() {
    env "$1=$2" valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$bench" 2>&1 | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
}

# per_call VARIABLE SPEC: instructions per call, from runs of
# "SPEC,$calls" and "SPEC,2×$calls" calls.
per_call() {
    local once twice
    once=$(instructions "$1" "$2,$calls")
    twice=$(instructions "$1" "$2,$((2 * calls))")
    echo $(((twice - once) / calls))
}
