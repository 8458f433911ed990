#!/usr/bin/env bash
# preload_test.sh — real programs under libnvheap-cap.so (ctest cap_preload_*):
# each produces the same output with the preload as without it.
#
#   preload_test.sh CASE LIB CAP_PROG SCRATCH [BUILD_DIR]
#
# CASE: api threads forkexec fds bad python sort gcc sqlite3 memcached unit
# Every run gets its own NVHEAP_CAP_DIR (under SCRATCH), which must be empty
# afterwards: no heap file survives the process.
set -uo pipefail
case_=$1 lib=$2 prog=$3 scratch=$4 build=${5:-}
mkdir -p "$scratch"
work=$(mktemp -d "$scratch/$case_.XXXXXX")
capdir=$work/capdir
mkdir -p "$capdir"
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL ($case_): $*"; exit 1; }
pre() { NVHEAP_CAP_DIR=$capdir LD_PRELOAD=$lib "$@"; }
# same stdout and exit status with and without the preload
same() {
    local a b ra rb
    a=$("$@" 2>"$work/plain.err"); ra=$?
    b=$(pre "$@" 2>"$work/pre.err"); rb=$?
    [ "$ra" = "$rb" ] || fail "exit $ra without the preload, $rb with it: $* ($(tail -3 "$work/pre.err"))"
    [ "$a" = "$b" ] || fail "output differs under the preload: $*"
    [ "$ra" = 0 ] || fail "exit $ra: $*"
    echo "same: $* -> $(printf '%s' "$b" | tail -c 200 | tr '\n' ' ')"
}
check_dir_empty() {
    [ -z "$(ls -A "$capdir")" ] || fail "files left in NVHEAP_CAP_DIR: $(ls -A "$capdir")"
}
# the preload is really in use: the process maps a file of capdir
assert_mapped() {
    local out
    out=$(pre sh -c 'grep -c "$1" /proc/$$/maps' _ "$capdir")
    [ "${out:-0}" -ge 1 ] || fail "the preload does not map a file in $capdir"
}

case $case_ in
api|threads|forkexec)
    same "$prog" "$case_"
    ;;
fds)
    out=$(pre "$prog" fds "$capdir") || fail "$out"
    [ "$out" = "fds ok" ] || fail "$out"
    echo "$out"
    ;;
bad)
    for m in double interior large-double realloc-bad xdouble; do
        pre "$prog" "$m" >"$work/out" 2>"$work/err"; rc=$?
        [ $rc = 134 ] || fail "$m: exit $rc, expected SIGABRT (134)"
        case $m in
            *double) want="double free detected" ;;
            realloc-bad) want="realloc(): invalid pointer" ;;
            *) want="free(): invalid pointer" ;;
        esac
        grep -q "$want" "$work/err" || fail "$m: stderr lacks '$want': $(cat "$work/err")"
        NVHEAP_CAP_ABORT=0 pre "$prog" "$m" >"$work/out" 2>"$work/err"; rc=$?
        grep -q "$want" "$work/err" || fail "$m (ABORT=0): stderr lacks '$want'"
        if [ $m != realloc-bad ]; then
            [ $rc = 0 ] && grep -q survived "$work/out" || fail "$m (ABORT=0): exit $rc"
        fi
        echo "$m: $(head -1 "$work/err")"
    done
    ;;
python)
    assert_mapped
    cat >"$work/w.py" <<'PY'
import random
random.seed(7)
d = {}
l = []
for i in range(300000):
    k = "k%d" % random.randrange(100000)
    d[k] = [i, str(i) * (i % 7), {"x": i}]
    if i % 3 == 0:
        l.append(bytearray(i % 5000))
    if i % 5 == 0 and l:
        l.pop(random.randrange(len(l)))
    if i % 11 == 0:
        d.pop("k%d" % random.randrange(100000), None)
s = sum(len(k) + v[0] + len(v[1]) for k, v in d.items()) + sum(len(b) for b in l)
print(len(d), len(l), s)
PY
    same python3 "$work/w.py"
    ;;
sort)
    awk 'BEGIN { x = 1; for (i = 0; i < 1100000; i++) { x = (x * 1103515245 + 12345) % 2147483648; printf "%d line %d %x\n", x, i, x * 7 } }' >"$work/in.txt"
    [ "$(stat -c %s "$work/in.txt")" -gt 20000000 ] || fail "input too small"
    same sh -c "sort '$work/in.txt' | md5sum"
    same sh -c "sort -n -k1,1 -S 4M '$work/in.txt' | md5sum"
    ;;
gcc)
    cat >"$work/t.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
struct node { int v; struct node *next; };
static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
int main(void) {
    int a[1000]; unsigned x = 1;
    for (int i = 0; i < 1000; i++) { x = x * 1103515245u + 12345u; a[i] = (int)(x >> 8) % 10000; }
    qsort(a, 1000, sizeof a[0], cmp);
    struct node *h = NULL;
    for (int i = 0; i < 1000; i++) { struct node *n = malloc(sizeof *n); n->v = a[i]; n->next = h; h = n; }
    long s = 0; for (struct node *n = h; n; n = n->next) s = s * 31 + n->v;
    printf("%ld\n", s);
    return 0;
}
C
    gcc -O2 -c "$work/t.c" -o "$work/plain.o" || fail "gcc without preload"
    pre gcc -O2 -c "$work/t.c" -o "$work/pre.o" || fail "gcc under the preload"
    cmp "$work/plain.o" "$work/pre.o" || fail "object files differ"
    pre gcc -O2 "$work/t.c" -o "$work/t" || fail "gcc link under the preload"
    same "$work/t"
    ;;
sqlite3)
    command -v sqlite3 >/dev/null || { echo "sqlite3 not installed: skipped"; exit 77; }
    cat >"$work/w.sql" <<'SQL'
CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER, blob BLOB);
WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 40000)
INSERT INTO t SELECT i, 'key' || (i * 7919 % 40000), i * 31 % 1000, zeroblob(i % 300) FROM c;
CREATE INDEX tk ON t(k);
UPDATE t SET v = v + 1 WHERE id % 3 = 0;
DELETE FROM t WHERE id % 7 = 0;
SELECT count(*), sum(v), sum(length(blob)) FROM t;
SELECT k, v FROM t WHERE k BETWEEN 'key100' AND 'key101' ORDER BY k LIMIT 5;
SELECT v % 10, count(*), avg(id) FROM t GROUP BY v % 10 ORDER BY 1;
SQL
    same sh -c "sqlite3 :memory: < '$work/w.sql'"
    rm -f "$work/db1" "$work/db2"
    a=$(sqlite3 "$work/db1" <"$work/w.sql") || fail "sqlite3 file db"
    b=$(pre sqlite3 "$work/db2" <"$work/w.sql") || fail "sqlite3 file db under the preload"
    [ "$a" = "$b" ] || fail "file db output differs"
    ;;
memcached)
    command -v memcached >/dev/null || { echo "memcached not installed: skipped"; exit 77; }
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    NVHEAP_CAP_DIR=$capdir LD_PRELOAD=$lib memcached -u "$(id -un)" -l 127.0.0.1 -p "$port" -U 0 -m 64 -t 2 &
    mc=$!
    trap 'kill $mc 2>/dev/null; wait $mc 2>/dev/null; rm -rf "$work"' EXIT
    grep -q "$capdir" /proc/$mc/maps 2>/dev/null || sleep 0.5
    grep -q "$capdir" /proc/$mc/maps || fail "memcached does not map a heap file"
    out=$(python3 - "$port" <<'PY'
import socket, sys, time, hashlib
port = int(sys.argv[1])
for _ in range(50):
    try:
        s = socket.create_connection(("127.0.0.1", port)); break
    except OSError:
        time.sleep(0.1)
f = s.makefile("rwb")
h = hashlib.md5()
for i in range(3000):
    v = (b"%d-" % i) * (1 + i % 200)
    f.write(b"set k%d 0 0 %d\r\n%s\r\n" % (i, len(v), v)); f.flush()
    assert f.readline() == b"STORED\r\n"
for i in range(0, 3000, 3):
    f.write(b"get k%d\r\n" % i); f.flush()
    line = f.readline()
    n = int(line.split()[3])
    data = f.read(n + 2)[:-2]
    assert f.readline() == b"END\r\n"
    assert data == (b"%d-" % i) * (1 + i % 200), i
    h.update(data)
print("memcached ok", h.hexdigest())
PY
) || fail "memcached client: $out"
    echo "$out"
    if command -v memcslap >/dev/null; then
        memcslap --servers=127.0.0.1:"$port" --concurrency=2 --execute-number=2000 >"$work/slap" 2>&1 \
            || fail "memcslap: $(tail -3 "$work/slap")"
        tail -2 "$work/slap"
    fi
    kill -0 $mc || fail "memcached died"
    ;;
unit)
    [ -n "$build" ] || fail "no build dir"
    for t in alloc/test_alloc_basic alloc/test_alloc_threads tx/test_tx_basic btree/test_btree_basic \
             hashmap/test_hashmap_basic group/test_group_api pool/test_pool_basic cap/test_cap_unit; do
        exe=$build/tests/$t
        [ -x "$exe" ] || { echo "missing $t: skipped"; continue; }
        NVHEAP_TEST_DIR=$work/t pre "$exe" >"$work/unit.out" 2>&1 || fail "$t under the preload: $(tail -5 "$work/unit.out")"
        echo "$t: $(grep -E 'PASSED|FAILED' "$work/unit.out" | head -1)"
    done
    ;;
*)
    fail "unknown case"
    ;;
esac
check_dir_empty
echo "PASS $case_"
