#!/bin/sh
# bench_guard.sh — bench_tx's steady-state guard (bench/bench_tx.c,
# measure_rounds): a chunk of a timed run during which the thread was switched
# out does not count, and a subject whose runs were mostly disturbed makes
# `--strict` fail. The disturbance is injected (NVH_BENCH_TX_DISTURB: a 1 ms
# sleep inside every other / every chunk of one subject).
#   bench_guard.sh BENCH_TX SCRATCH_DIR
set -u
bench=$1
dir=$2
mkdir -p "$dir" || exit 1
case_=latency/empty-dur

# 1. Every other chunk disturbed: those chunks are left out, so the figure is
#    far below the one over all chunks (which carries a 1 ms sleep per chunk).
out=$(NVH_BENCH_TX_DISTURB=nvheap:half "$bench" --only "$case_" --runs 3 --time 8 --json \
      --dir "$dir" 2>/dev/null)
metric() {
    printf '%s\n' "$out" | grep "\"subject\": \"nvheap\", \"metric\": \"$1\"" |
        sed 's/.*"value": \([0-9.e+-]*\).*/\1/'
}
ns=$(metric ns_per_op)
all=$(metric all_ns_per_op)
if [ -z "$ns" ] || [ -z "$all" ]; then
    echo "FAIL: no ns_per_op / all_ns_per_op for nvheap in $case_"
    printf '%s\n' "$out"
    exit 1
fi
if ! awk -v a="$ns" -v b="$all" 'BEGIN { exit !(a * 4 < b) }'; then
    echo "FAIL: disturbed chunks counted: ns_per_op $ns, over all chunks $all"
    exit 1
fi
echo "ok: half the chunks disturbed: ns_per_op $ns (all chunks: $all)"

# 2. Every chunk disturbed: --strict must fail and name the case and subject.
err=$(NVH_BENCH_TX_DISTURB=nvheap:all "$bench" --only "$case_" --runs 1 --time 4 --strict \
      --dir "$dir" 2>&1 >/dev/null)
rc=$?
if [ $rc -eq 0 ]; then
    echo "FAIL: --strict passed although every chunk of nvheap was disturbed"
    exit 1
fi
case $err in
    *"$case_ nvheap:"*"not valid"*) ;;
    *) echo "FAIL: the error does not name the case and subject:"; printf '%s\n' "$err"; exit 1 ;;
esac
echo "ok: every chunk disturbed: --strict failed (status $rc)"
case $err in
    *"$case_ pmdk:"*"not valid"*)
        echo "FAIL: the undisturbed peer was reported too:"; printf '%s\n' "$err"; exit 1 ;;
esac

