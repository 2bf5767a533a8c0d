#!/usr/bin/env bash
# The test command: set up (scripts/setup.sh), then the C tests (plain and
# under ASan+UBSan), builds with one ISA's code each, pytest, then the C API
# fuzz again against the ASan+UBSan build. Exits non-zero on any failure.
# Extra arguments go to pytest (e.g. ./scripts/test.sh -k cross_entropy).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Ends the running section with its time and starts the next: what to look
# at when CI gets slow.
section() {
  if [ -n "${SECTION:-}" ]; then echo "   ($SECTION: $((SECONDS - SECTION_START)) s)"; fi
  SECTION="$1"
  SECTION_START=$SECONDS
  if [ -n "$1" ]; then echo "== $1"; fi
}
section "set-up"
bash scripts/setup.sh
export PATH="$ROOT/.venv/bin:$PATH"

section "C tests"
[ -f build/ctest/build.ninja ] || meson setup build/ctest --buildtype=release >/dev/null
meson test -C build/ctest --print-errorlogs

section "C tests under ASan+UBSan"
# float-cast-overflow is not part of -fsanitize=undefined: a NaN or an
# out-of-range float converted to an integer is undefined behaviour too.
[ -f build/asan/build.ninja ] || meson setup build/asan --buildtype=debug \
  -Db_sanitize=address,undefined -Db_lundef=false \
  -Dc_args=-fsanitize=float-cast-overflow -Dc_link_args=-fsanitize=float-cast-overflow >/dev/null
# halt_on_error: a UBSan finding fails the test instead of scrolling past.
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
  meson test -C build/asan --print-errorlogs

section "single-ISA builds (tests/test_clones.py compares their bits with the installed library's)"
# The installed library runs the one clone this CPU picks; these run the
# others' code: baseline, x86-64-v3 (AVX2+FMA) and x86-64-v4 (AVX-512, run
# only where the CPU has it).
for isa in baseline x86-64-v3 x86-64-v4; do
  march=$([ "$isa" = baseline ] && echo "" || echo "$isa")
  [ -f "build/$isa/build.ninja" ] || meson setup "build/$isa" --buildtype=release -Dclones=false -Dmarch="$march" >/dev/null
  ninja -C "build/$isa" >/dev/null
done
export CKP_ISA_LIBS="baseline=$ROOT/build/baseline/libckparity.so,x86-64-v3=$ROOT/build/x86-64-v3/libckparity.so,x86-64-v4=$ROOT/build/x86-64-v4/libckparity.so"

section "pytest"
cd "$ROOT/tests"
# --durations: the slowest tests, for keeping CI well under 15 minutes.
# pytest-xdist, a worker per core (at most 4), a test file whole to one worker
# (module fixtures build once): the suite's slow tests wait on subprocesses,
# so two workers on two cores took 407 s where one took 650. Passive OpenMP
# waits: two workers' torch threads would otherwise spin on each other's cores
# (with spinning, two workers ran slower than one). Neither changes a bit.
OMP_WAIT_POLICY=passive python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --durations=25 "$@"

section "C API fuzz and overlap matrix against the ASan+UBSan build"
# The sanitized library loads into an unsanitized Python with libasan
# preloaded; leak checking is off (Python and torch keep memory until exit).
LD_PRELOAD="$(gcc -print-file-name=libasan.so)" ASAN_OPTIONS=detect_leaks=0 \
  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 CKP_LIB="$ROOT/build/asan/libckparity.so" \
  python -m pytest -q -p no:cacheprovider test_fuzz_c_api.py test_overlaps.py
section ""
echo "== test.sh: ${SECONDS} s"
