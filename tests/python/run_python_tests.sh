#!/usr/bin/env bash
# run_python_tests.sh — ctest `test_python`: pip-install the binding into a
# fresh venv against this build's libnvheap.a (python/build-venv), then run
# python/tests with pytest in that venv.
#
#   run_python_tests.sh SOURCE_DIR BUILD_DIR PYTHON [pytest options...]
set -euo pipefail
src=$1 build=$2 py=$3
shift 3
work=$build/tests/python/work

if ! "$py" -c 'import pytest' 2>/dev/null; then
    echo "test_python: $py has no pytest; install: apt-get install python3-pytest" \
         "(scripts/setup does)" >&2
    exit 1
fi
rm -rf "$work"
mkdir -p "$work"
echo "== python/build-venv $build (pip install, $("$py" --version))"
# The extension builds warning-free, as the rest of the tree (-Werror).
CFLAGS="${CFLAGS:-} -Werror" "$src/python/build-venv" "$build" "$work/venv" "$py"
cd "$work"
exec "$work/venv/bin/python" -m pytest -p no:cacheprovider -q -ra --rootdir "$src/python" \
    "$src/python/tests" "$@"
