#!/usr/bin/env bash
# run_python_tests.sh — ctest `test_python`: pip-install the binding into a
# fresh venv against this build's libnvheap.a (NVHEAP_BUILD_DIR, see
# python/setup.py), then run python/tests with pytest in that venv.
#
#   run_python_tests.sh SOURCE_DIR BUILD_DIR PYTHON [pytest options...]
#
# Offline: the venv sees the system's setuptools, wheel and pytest
# (--system-site-packages) and pip installs with --no-index. The package is
# copied first, so the build writes nothing into the source tree.
set -euo pipefail
src=$1 build=$2 py=$3
shift 3
work=$build/tests/python/work

missing=()
"$py" -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
"$py" -c 'import setuptools' 2>/dev/null || missing+=(python3-setuptools)
"$py" -c 'import wheel' 2>/dev/null || missing+=(python3-wheel)
"$py" -c 'import pytest' 2>/dev/null || missing+=(python3-pytest)
"$py" -c 'import os, sys, sysconfig
sys.exit(not os.path.isfile(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
    2>/dev/null || missing+=(python3-dev)
if [ ${#missing[@]} -gt 0 ]; then
    echo "test_python: $py lacks what the test needs; install: apt-get install ${missing[*]}" \
         "(scripts/setup does)" >&2
    exit 1
fi

rm -rf "$work"
mkdir -p "$work/pkg"
(cd "$src/python" && tar cf - --exclude=build --exclude='*.egg-info' --exclude=__pycache__ \
    --exclude=tests .) | (cd "$work/pkg" && tar xf -)
"$py" -m venv --system-site-packages "$work/venv"
echo "== pip install $src/python (NVHEAP_BUILD_DIR=$build, $("$py" --version))"
NVHEAP_BUILD_DIR=$build "$work/venv/bin/python" -m pip install --quiet --no-index \
    --no-build-isolation --no-deps "$work/pkg"
cd "$work"
exec "$work/venv/bin/python" -m pytest -p no:cacheprovider -q -ra --rootdir "$src/python" \
    "$src/python/tests" "$@"
