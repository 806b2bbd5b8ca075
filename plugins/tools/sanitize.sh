#!/usr/bin/env bash
# Host tests of the memory pool and the plugin logic under sanitizers: ASan+UBSan, then TSan (the
# thread-safety and threaded stream-ordered-free tests), each in its own build dir. nvcc is not used.
#   plugins/tools/sanitize.sh [build-root]      (default: build/sanitize; ~80 s on 2 cores, ~7 s of it tests)
# Exits non-zero on the first failing build or test; a sanitizer report fails the test that raised it.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="${1:-build/sanitize}"
jobs="${VEO_JOBS:-2}"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
run() { # sanitizer, build targets, ctest filter
  local dir="$root/${1//,/-}"
  echo "== -fsanitize=$1 ($dir)"
  cmake -S "$here" -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVEO_SANITIZE="$1" \
    -DCMAKE_CUDA_COMPILER=NOTFOUND >/dev/null 2>&1
  cmake --build "$dir" -j"$jobs" --target $2 >/dev/null
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" -R "$3"
}
run address,undefined "testMemPool testMemPoolFences testMemPoolCuda testPluginConfig testAttentionTile" "."
# TSan only adds something where threads are: the pool's threaded tests.
run thread "testMemPool testMemPoolFences" "testMemPool(Fences)?\.(thread_safety|stream_ordered|waits_on|a_waited|cuda_special)"
