#!/bin/sh
# session 26 device call 3: k_attn_rows v2 (tiles converted to f32 once a CTA,
# zero-filled rows, the combine's factors once a slice): v2a (<= 80 registers,
# 3 CTAs an SM) and v2b (no bound) against main: correctness, --bench-rows,
# a 192-row chunk (--profile-chunk M 192 2).
# Prepare here: build main and a tree with attn-rows-f32.patch applied (v2a) and
# one with it and `__launch_bounds__(256)` for `(256, 3)` on k_attn_rows (v2b)
# (make BUILD=build/cu cuda in each); link each with bench/cuda/link_static.sh
# TREE DIR and xz its test_cuda_layer / test_cuda_model to
# build/prebuilt/NAME-tcl.xz / NAME-tcm.xz (v2b's tcm is not needed: the
# carry limit is 64 MiB with the tree); run on the device from the repo root
# with carry build/prebuilt.
OUT=${OUT:-dev26c-out}; mkdir -p "$OUT"
B=/tmp/sb; mkdir -p $B
for f in build/prebuilt/*.xz; do xz -dc $f >$B/$(basename $f .xz); done; chmod +x $B/*
nvidia-smi --query-gpu=name --format=csv,noheader
for v in v2a v2b; do timeout 60 $B/$v-tcl attention >$OUT/$v-attn.log 2>&1; echo "$v attention rc $? $(grep -c 'bit-identical' $OUT/$v-attn.log) identical; $(grep passed $OUT/$v-attn.log)"; grep -E "first diff|FAIL" $OUT/$v-attn.log | head -4; done
for r in 1 2; do for v in main v2a v2b; do echo "$v"; timeout 40 $B/$v-tcl --bench-rows 2>&1 | grep bench | sed 's/(32\/4 heads, d 128, f16): //'; done; done
for v in main v2a main v2a; do echo "$v $(timeout 60 $B/$v-tcm --profile-chunk /tmp/strata-30b-a3b.gguf 192 2 2>&1 | grep -E '^profile:.*rows|rror' | head -2)"; done
