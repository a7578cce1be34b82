#!/bin/sh
# session 26 device call 2: ncu of k_attn_rows (why 5000 cycles a tile?);
# cand (main + k_attn_rows) vs bq (+ mmq-unpack-batched + mmq-q80-raw, init
# fixed for s_xr's static shared memory).
OUT=${OUT:-dev26b-out}; mkdir -p "$OUT"
B=/tmp/sb; mkdir -p $B
for t in test_cuda_layer test_cuda_model; do xz -dc build/prebuilt/bin/$t.xz >$B/$t; done
xz -dc build/prebuilt/ab/bq.xz >$B/tcm_bq; xz -dc build/prebuilt/ab/tcl-nb4.xz >$B/tcl_nb4; xz -dc build/prebuilt/ab/mv-bq.xz >$B/tc_bq; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
el() { echo "t=$(( $(date +%s) - t0 ))"; }
S="--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis"
timeout 90 ncu -k regex:k_attn_rows -c 2 $S $B/test_cuda_layer --bench-rows 0 192 >$OUT/ncu-rows0.log 2>&1; echo "ncu rc $?"
timeout 90 ncu -k regex:k_attn_rows -c 1 $S $B/test_cuda_layer --bench-rows 3840 256 >$OUT/ncu-rows3840.log 2>&1; echo "ncu rc $?"
for r in 1 2; do for v in test_cuda_layer tcl_nb4; do echo "$v"; timeout 40 $B/$v --bench-rows 2>&1 | grep bench; done; done
grep -E "k_attn_rows|Duration|Achieved Occupancy|Theoretical Occupancy|Block Limit|Issued Warp|No Eligible|Warp Cycles Per Issued|Registers Per|Dynamic Shared" $OUT/ncu-rows0.log | head -40
el
timeout 100 $B/tc_bq >$OUT/tc_bq.log 2>&1; echo "tc_bq rc $? $(grep -c bit-identical $OUT/tc_bq.log) identical; $(grep -E 'passed' $OUT/tc_bq.log | tail -1)"; grep -E "FAIL|failed:" $OUT/tc_bq.log | head -3
Q=/tmp/q4km.gguf
$B/test_cuda_model --mkmodel $Q 30b-a3b Q4_K_M | tail -1
for m in /tmp/strata-30b-a3b.gguf $Q; do
  for v in test_cuda_model tcm_bq test_cuda_model tcm_bq; do
    echo "$v $(basename $m .gguf) mm: $(timeout 60 $B/$v --profile-chunk $m 192 1 2>&1 | grep -E '^profile:.*rows|rror' | head -2)"; done
done
el
rm -f $Q
[ $(( $(date +%s) - t0 )) -gt 200 ] && exit 0
$B/test_cuda_model --mkmodel /tmp/q80.gguf 30b-a3b Q8_0 | tail -1
for v in test_cuda_model tcm_bq test_cuda_model tcm_bq; do
  [ $(( $(date +%s) - t0 )) -gt 260 ] && break
  echo "$v q80 mm: $(timeout 50 $B/$v --profile-chunk /tmp/q80.gguf 192 1 2>&1 | grep -E '^profile:.*rows|rror' | head -2)"; done
el
