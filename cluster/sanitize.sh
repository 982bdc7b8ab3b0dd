#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU path, and the whole test suite under
# it (unit suites, the mpirun suites, the CLI tests, the reader fuzzers): any heap overflow, use after
# free, leak or undefined behaviour fails the test that triggers it.
#
#   cluster/sanitize.sh                 # build into build-sanitize/ and run every test
#   cluster/sanitize.sh -R Fuzz         # extra arguments go to ctest
#
# HYDRA_SANITIZE_BUILD_DIR overrides the build folder. Open MPI, PMIx and HDF5 keep some allocations
# until exit by design; cluster/sanitize.supp lists those libraries for LeakSanitizer (a leak is ignored
# only when a frame of its stack lies in one of them), and dlclose is a no-op in this build so that their
# frames can be named (cluster/sanitize_keep_modules.c). Timeouts are scaled by 4: instrumented code is slower.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HYDRA_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHYDRA_CUDA=OFF -DHYDRA_TIMEOUT_SCALE=4 -DHYDRA_SANITIZE_KEEP_MODULES=ON \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" \
  >/dev/null
cmake --build "$build" -j "$(nproc)"
# abort_on_error: a report ends the process with SIGABRT, so the CLI tests that expect a clean exit
# code see it too. fast_unwind_on_malloc=0: allocation stacks are unwound with DWARF, not frame
# pointers, so a leak allocated inside libc (vasprintf) on behalf of Open MPI still shows its caller
# and the suppressions can match it. The environment reaches the ranks that mpirun starts on this host.
# allocator_may_return_null=1: an impossible size asked of malloc returns NULL, as it does outside
# ASan (HDF5 asks for petabytes when a fuzzed heap header says so, and reports the failure).
# use_tls=0: LeakSanitizer's scan of dynamic TLS crashes its tracer on this glibc (the DTLS block of
# a dlopen'ed Open MPI module has a bogus address); not scanning TLS can only add reports.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:check_initialization_order=1:strict_init_order=1:fast_unwind_on_malloc=0:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$root/cluster/sanitize.supp:print_suppressions=0:use_tls=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
cd "$build"
ctest --output-on-failure -j "$(nproc)" "$@"
