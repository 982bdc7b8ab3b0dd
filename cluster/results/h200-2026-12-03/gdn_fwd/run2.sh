#!/usr/bin/env bash
# GDN forward device job 2 (gdn4 branch), run from the repository root on the device:
#   bash .device/gdn4/run2.sh OUT
# new = gdn4's hydra/test_cuda (.device/gdn4/bins.tar.xz) with its default state kernel (transposed
# state), v1 = the same binary with HYDRA_GDN_STATE=v1 (the first wgmma kernel), main = main's hydra.
set -u
OUT=$1
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
L=/tmp/gdnlogs; rm -rf $L; mkdir -p $L /tmp/b /tmp/m
tar -C /tmp/b -xJf .device/gdn4/bins.tar.xz
tar -C /tmp/m -xJf .device/main/bins.tar.xz
t0=$(date +%s)
st() { echo "$1 rc=$2 $(( $(date +%s) - t0 ))s" >> $L/status.txt; }
finish() {
  for f in $L/fwd_*.log $L/bwd_*.log $L/sweep_*.log; do
    [ -f "$f" ] || continue
    echo "== $(basename $f): $(grep -ho '"ms":[0-9.]*' $f | head -1) $(grep -ho 'backward alone [0-9.]* ms' $f | head -1) $(grep -ho 'GDN check[^,]*failed.*' $f | head -1)"
    grep -h "stages:" $f | tail -2
  done > $L/summary.txt 2>/dev/null
  for f in $L/test_*.log; do echo "== $(basename $f): $(grep -h '^\[  \(PASSED\|FAILED\) \|tests ran' $f | tr '\n' ' ')"; done >> $L/summary.txt 2>/dev/null
  cat $L/anchors.jsonl >> $L/summary.txt 2>/dev/null
  cat $L/status.txt >> $L/summary.txt
  cp $L/summary.txt $OUT/summary.tmp && mv $OUT/summary.tmp $OUT/summary.txt
  tar -C /tmp -czf $OUT/logs.tmp gdnlogs && mv $OUT/logs.tmp $OUT/logs.tgz
}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader > $L/gpu.txt 2>&1
hung() { [ $1 -eq 124 ] || [ $1 -eq 137 ]; }
# 1. tests: the new kernel (GDN forward first: a hang means a deadlock), then v1 as the fallback
timeout -k 5 60 /tmp/b/test_cuda --gtest_filter='CudaOps.ChunkedDeltaRule*' > $L/test_new_gdn_fwd.log 2>&1; rc=$?; st test_new_gdn_fwd $rc
new=1; hung $rc && new=0
if [ $new = 1 ]; then
  timeout -k 5 150 /tmp/b/test_cuda > $L/test_new_all.log 2>&1; st test_new_all $?
else
  timeout -k 5 60 compute-sanitizer --tool memcheck /tmp/b/test_cuda --gtest_filter='CudaOps.ChunkedDeltaRule*' > $L/test_new_sanitizer.log 2>&1; st sanitizer $?
fi
HYDRA_GDN_STATE=v1 timeout -k 5 90 /tmp/b/test_cuda --gtest_filter='CudaOps.ChunkedDeltaRule*:CudaDeltaRuleBackward.*:CudaBackward.*' > $L/test_v1_gdn.log 2>&1; st test_v1_gdn $?
finish
# 2. forward benches: new, v1, main (plain: the figures)
bench() {  # name bin T [env...]
  local name=$1 bin=$2 t=$3; shift 3
  env "$@" timeout -k 5 45 $bin bench --op gdn --seq-len $t --heads 14 --repeat 5 --json-out $L/$name.jsonl > $L/$name.log 2>&1
  st $name $?
}
for t in 32768 131072 524288; do
  [ $new = 1 ] && bench fwd_new_$t /tmp/b/hydra $t
  bench fwd_v1_$t /tmp/b/hydra $t HYDRA_GDN_STATE=v1
  bench fwd_main_$t /tmp/m/hydra $t
done
finish
# 3. the anchor (fla 0.6.0), same job
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl > $L/pip.log 2>&1
PYTHONPATH=/tmp/site timeout -k 5 150 python3 cluster/bench/anchors.py --warmup 2 --repeat 5 --attention '' \
  --gdn 32768x14,131072x14,524288x14 > $L/anchors.jsonl 2> $L/anchors.err
st anchors $?
finish
# 4. stage times (new, main), a second plain run of new (spread)
for t in 32768 131072 524288; do
  [ $new = 1 ] && bench fwd_new_${t}_profile /tmp/b/hydra $t HYDRA_GDN_PROFILE=1
  [ $new = 1 ] && bench fwd_new_${t}_again /tmp/b/hydra $t
  bench fwd_main_${t}_profile /tmp/m/hydra $t HYDRA_GDN_PROFILE=1
done
finish
# 5. the backward (shares prepare and the state pass): must not get slower
for t in 131072 524288; do
  for w in new main; do
    [ $w = new ] && [ $new = 0 ] && continue
    b=/tmp/b/hydra; [ $w = main ] && b=/tmp/m/hydra
    timeout -k 5 60 $b bench --op gdn-bwd --seq-len $t --heads 14 --repeat 5 > $L/bwd_${w}_$t.log 2>&1; st bwd_${w}_$t $?
    [ $t = 524288 ] && { HYDRA_GDN_PROFILE=1 timeout -k 5 60 $b bench --op gdn-bwd --seq-len $t --heads 14 --repeat 3 > $L/bwd_${w}_${t}_profile.log 2>&1; st bwd_${w}_${t}_profile $?; }
  done
done
finish
# 6. segment sweep of the new kernel (stage times)
if [ $new = 1 ]; then
  for s in 5 7 12 14 18; do bench sweep_524288_s$s /tmp/b/hydra 524288 HYDRA_GDN_SEGMENTS=$s HYDRA_GDN_PROFILE=1; done
  for s in 5 12 14; do bench sweep_131072_s$s /tmp/b/hydra 131072 HYDRA_GDN_SEGMENTS=$s HYDRA_GDN_PROFILE=1; done
  for s in 4 6 12 14; do bench sweep_32768_s$s /tmp/b/hydra 32768 HYDRA_GDN_SEGMENTS=$s HYDRA_GDN_PROFILE=1; done
fi
finish
echo done >> $L/status.txt
finish
# 7. if time is left: hardware counters of the new state kernels at 32K
if [ $new = 1 ]; then
  timeout -k 5 40 ncu --clock-control none -k regex:gdn_state_kernel -c 2 --section SpeedOfLight --section WarpStateStats \
    /tmp/b/hydra bench --op gdn --seq-len 32768 --heads 14 --repeat 1 --warmup 0 > $L/ncu_state.log 2>&1; st ncu $?
  finish
fi
cat $L/summary.txt
