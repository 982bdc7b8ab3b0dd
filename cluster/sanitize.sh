#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU path, and the whole test suite under
# it (unit suites, the mpirun suites, the CLI tests, the reader fuzzers): any heap overflow, use after
# free, leak or undefined behaviour fails the test that triggers it.
#
#   cluster/sanitize.sh                 # build into build-sanitize/ and run every test
#   cluster/sanitize.sh -R Fuzz         # extra arguments go to ctest
#
# HDF5: Debian 12's HDF5 1.10.8 itself reads past a heap block (H5Aexists -> H5O__attr_exists) on some
# damaged files the reader fuzzer writes; a ten-line C program opening the same file shows it, and HDF5
# 1.14.5 and 2.0 read that file cleanly. So this script builds HDF5 1.14.5 once, with ASan, from Debian's
# source tarball (checked against its SHA-256) into $build/_hdf5 and links the suite against it
# (2.5 minutes on an otherwise idle 2-core machine, then cached). HYDRA_SANITIZE_HDF5=system links the
# system HDF5 instead (the fuzzer's eval-set stream then reports HDF5's overflow);
# HYDRA_SANITIZE_HDF5=/prefix uses an installed one.
#
# HYDRA_SANITIZE_BUILD_DIR overrides the build folder. Open MPI, PMIx and HDF5 keep some allocations
# until exit by design; cluster/sanitize.supp lists those libraries for LeakSanitizer (a leak is ignored
# only when a frame of its stack lies in one of them), and dlclose is a no-op in this build so that their
# frames can be named (cluster/sanitize_keep_modules.c). Timeouts are scaled by 4: instrumented code is slower.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${HYDRA_SANITIZE_BUILD_DIR:-$root/build-sanitize}"
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
mkdir -p "$build"

hdf5_version=1.14.5
hdf5_tarball="hdf5_${hdf5_version}+repack.orig.tar.gz"
hdf5_sha256=71cdb04c151ef4e8a7f88907adfc4f3b75afd44e96fbd55775e1c9d7c4e7c112
# Builds HDF5's C library (no tools, filters, tests or language bindings) with ASan into $1.
build_hdf5() {
  local prefix=$1 work="$build/_hdf5/work"
  mkdir -p "$work"
  if [ ! -f "$work/$hdf5_tarball" ]; then
    echo "sanitize: downloading HDF5 $hdf5_version (Debian's source tarball) ..."
    curl -fsSL -o "$work/$hdf5_tarball.part" "http://deb.debian.org/debian/pool/main/h/hdf5/$hdf5_tarball"
    mv "$work/$hdf5_tarball.part" "$work/$hdf5_tarball"
  fi
  if ! echo "$hdf5_sha256  $work/$hdf5_tarball" | sha256sum -c --status; then
    echo "sanitize: $work/$hdf5_tarball does not have the expected SHA-256 ($hdf5_sha256); delete it to download again" >&2
    exit 1
  fi
  rm -rf "$work/src" "$work/build" && mkdir -p "$work/src"
  tar -xzf "$work/$hdf5_tarball" -C "$work/src" --strip-components=1
  echo "sanitize: building HDF5 $hdf5_version with AddressSanitizer (log: $work/build.log) ..."
  if ! { cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_INSTALL_PREFIX="$prefix" \
           -DBUILD_SHARED_LIBS=ON -DBUILD_STATIC_LIBS=OFF -DBUILD_TESTING=OFF -DHDF5_BUILD_TOOLS=OFF \
           -DHDF5_BUILD_EXAMPLES=OFF -DHDF5_BUILD_HL_LIB=OFF -DHDF5_BUILD_CPP_LIB=OFF -DHDF5_BUILD_FORTRAN=OFF \
           -DHDF5_BUILD_JAVA=OFF -DHDF5_BUILD_DOC=OFF -DHDF5_ENABLE_Z_LIB_SUPPORT=OFF -DHDF5_ENABLE_SZIP_SUPPORT=OFF \
           -DCMAKE_C_FLAGS="-fsanitize=address -fno-omit-frame-pointer" -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address \
         && cmake --build "$work/build" -j "$(nproc)" && cmake --install "$work/build"; } > "$work/build.log" 2>&1; then
    tail -20 "$work/build.log"
    echo "sanitize: building HDF5 failed (log: $work/build.log)" >&2
    exit 1
  fi
  rm -rf "$work/src" "$work/build"
}

hdf5_flags=()
case "${HYDRA_SANITIZE_HDF5:-build}" in
  system) hdf5_flags=(-UHDF5_ROOT -UHDF5_DIR) ;;
  build)
    prefix="$build/_hdf5/$hdf5_version"
    [ -f "$prefix/include/hdf5.h" ] || build_hdf5 "$prefix"
    hdf5_flags=(-DHDF5_ROOT="$prefix") ;;
  *) hdf5_flags=(-DHDF5_ROOT="$HYDRA_SANITIZE_HDF5") ;;
esac
# FindHDF5 caches what it found first: a different HDF5 needs a fresh configure.
wanted="${HYDRA_SANITIZE_HDF5:-build}"
if [ -f "$build/CMakeCache.txt" ] && [ "$(cat "$build/.hdf5_choice" 2>/dev/null)" != "$wanted" ]; then
  rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
fi
echo "$wanted" > "$build/.hdf5_choice"

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DHYDRA_CUDA=OFF -DHYDRA_TIMEOUT_SCALE=4 -DHYDRA_SANITIZE_KEEP_MODULES=ON \
  "${hdf5_flags[@]}" \
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
