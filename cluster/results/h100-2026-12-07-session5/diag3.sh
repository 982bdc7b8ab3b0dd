set -u
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p /tmp/dg && tar -C /tmp/dg -xJf .device/diag.tar.xz
which compute-sanitizer || ls /usr/local/cuda/bin | head -50
CS=$(which compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 200 mpirun --bind-to none -np 2 $CS --tool memcheck --show-backtrace host --print-limit 20 /tmp/dg/tests/test_parallel_gpu --gtest_filter='GpuGenerate.GraphSegments*' > $OUT/sanitizer.log 2>&1
echo "rc $?"
grep -n -m 20 -A12 "Program hit\|API error\|========= " $OUT/sanitizer.log | head -150
