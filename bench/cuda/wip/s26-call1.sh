#!/bin/sh
# session 26 device call: k_attn_rows (test_cuda_layer attention, --bench-rows,
# test_cuda_model), the review refactor (test_cuda), and cand vs bq
# (cand + mmq-unpack-batched + mmq-q80-raw) prefill chunks.
OUT=${OUT:-dev26-out}; mkdir -p "$OUT"
B=/tmp/sb; mkdir -p $B
for t in test_cuda test_cuda_layer test_cuda_model; do xz -dc build/prebuilt/bin/$t.xz >$B/$t; done
xz -dc build/prebuilt/ab/bq.xz >$B/tcm_bq; xz -dc build/prebuilt/ab/mv-bq.xz >$B/tc_bq; chmod +x $B/*
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
t0=$(date +%s)
el() { echo "t=$(( $(date +%s) - t0 ))"; }
timeout 150 $B/test_cuda_layer attention >$OUT/tcl_attn.log 2>&1; echo "tcl attention rc $?"
grep -E "attention rows|first diff|passed|FAIL" $OUT/tcl_attn.log | tail -18
timeout 60 $B/test_cuda_layer --bench-rows 2>&1 | tee $OUT/bench_rows.log | grep bench
el
for v in test_cuda tc_bq; do timeout 100 $B/$v >$OUT/$v.log 2>&1; echo "$v rc $? $(grep -c bit-identical $OUT/$v.log) identical; $(grep -E 'passed' $OUT/$v.log | tail -1)"; grep FAIL $OUT/$v.log | head -3; done
el
Q=/tmp/q4km.gguf
$B/test_cuda_model --mkmodel $Q 30b-a3b Q4_K_M | tail -1
for m in /tmp/strata-30b-a3b.gguf $Q; do
  echo "cand $(basename $m .gguf) attn: $(timeout 60 $B/test_cuda_model --profile-chunk $m 192 2 2>&1 | grep -E '^profile:.*rows|rror' | head -2)"
done
el
timeout 150 $B/test_cuda_model >$OUT/tcm.log 2>&1; echo "tcm rc $?"; grep -E "passed|FAIL|prompt" $OUT/tcm.log | tail -6
el
for m in /tmp/strata-30b-a3b.gguf $Q; do
  for v in test_cuda_model tcm_bq test_cuda_model tcm_bq; do
    echo "$v $(basename $m .gguf) mm: $(timeout 60 $B/$v --profile-chunk $m 192 1 2>&1 | grep -E '^profile:.*rows|rror' | head -2)"; done
done
el
rm -f $Q
[ $(( $(date +%s) - t0 )) -gt 430 ] && exit 0
$B/test_cuda_model --mkmodel /tmp/q80.gguf 30b-a3b Q8_0 | tail -1
for v in test_cuda_model tcm_bq test_cuda_model tcm_bq; do
  [ $(( $(date +%s) - t0 )) -gt 530 ] && break
  echo "$v q80 mm: $(timeout 50 $B/$v --profile-chunk /tmp/q80.gguf 192 1 2>&1 | grep -E '^profile:.*rows|rror' | head -2)"; done
el
