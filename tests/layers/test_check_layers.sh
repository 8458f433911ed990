#!/usr/bin/env bash
# test_check_layers.sh — negative tests of scripts/check-layers: each case
# breaks the rule in a scratch copy and expects the check to fail, naming the
# file and what it reaches; the untouched copy must pass.
#
#   test_check_layers.sh PROJECT_DIR SCRATCH_DIR OBJECT...
set -uo pipefail
root=$1 scratch=$2
shift 2
check=$root/scripts/check-layers
fails=0

# expect_fail NAME PATTERN ARGS...: the check exits 1 and prints PATTERN
expect_fail() {
    local name=$1 pattern=$2
    shift 2
    local out rc
    out=$(bash "$check" "$@" 2>&1); rc=$?
    if [ $rc -ne 1 ] || ! grep -qF -- "$pattern" <<<"$out"; then
        echo "FAIL $name: exit $rc, expected 1 and \"$pattern\" in:"; echo "$out"
        fails=$((fails + 1))
    else
        echo "ok   $name: $(grep -F -- "$pattern" <<<"$out" | head -1)"
    fi
}

fresh() {                       # a scratch copy of src/
    rm -rf "$scratch"
    mkdir -p "$scratch"
    cp -r "$root/src" "$scratch/src"
}

# 0. the copy itself passes (the failures below come from the injections)
fresh
if ! bash "$check" --src "$scratch/src" >/dev/null; then
    echo "FAIL copy: the untouched copy of src/ does not pass"
    fails=$((fails + 1))
fi

# 1. a lower layer includes a higher layer's header
fresh
sed -i '0,/^#include/s//#include "..\/tx\/tx.h"\n#include/' "$scratch/src/pool/pool.c"
expect_fail include-up 'src/pool/pool.c:' --src "$scratch/src"
expect_fail include-up-names-header '"../tx/tx.h" of layer '"'"'tx'"'" --src "$scratch/src"

# 2. a header included through the src/ include path ("alloc/alloc.h")
fresh
sed -i '0,/^#include/s//#include "alloc\/alloc.h"\n#include/' "$scratch/src/persist/flush.c"
expect_fail include-up-src-path 'src/persist/flush.c:' --src "$scratch/src"

# 3. two layers of one row (persist, protect) may not include each other
fresh
sed -i '0,/^#include/s//#include "..\/protect\/protect.h"\n#include/' "$scratch/src/persist/flush.c"
expect_fail include-same-row 'on the same row' --src "$scratch/src"

# 4. a folder that is not in the layer table
fresh
mkdir -p "$scratch/src/newlayer"
echo '#include "../common/internal.h"' > "$scratch/src/newlayer/x.c"
expect_fail unknown-layer 'src/newlayer/ is not in the layer table' --src "$scratch/src"

# 5. symbols: an object that calls up (the open/close sequence's object
#    placed in the pool layer uses the allocator's nvh_heap_open_)
fresh
objs=()
seq_obj=""
for o in "$@"; do
    case "$o" in
        */src/lifecycle/lifecycle.c.o) seq_obj=$o ;;
        *) objs+=("$o") ;;
    esac
done
if [ -z "$seq_obj" ]; then
    echo "FAIL symbols: lifecycle.c.o not among the objects given"
    fails=$((fails + 1))
else
    mkdir -p "$scratch/obj/src/pool"
    cp "$seq_obj" "$scratch/obj/src/pool/lifecycle.c.o"
    expect_fail symbol-up "pool/lifecycle.c.o: layer 'pool' uses nvh_heap_open_ of layer 'alloc'" \
        --src "$scratch/src" "${objs[@]}" "$scratch/obj/src/pool/lifecycle.c.o"
fi

rm -rf "$scratch"
if [ $fails -ne 0 ]; then
    echo "$fails case(s) failed"
    exit 1
fi
echo "all cases failed as they should"
