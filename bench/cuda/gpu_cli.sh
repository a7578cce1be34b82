#!/bin/bash
# bench/cuda/gpu_cli.sh: the device-machine check of `strata ... --gpu`
# (issue 9): the same greedy text from the CPU and the GPU through the CLI,
# and llama-bench-style tg/pp figures for both, on generated models.
#   sh bench/cuda/gpu_cli.sh [STRATA]   (default build/cuda/strata; on the
#   device machine a prebuilt binary carried there: build/prebuilt/strata_cuda)
# Logs to $OUT (default ./gpu-out).
S=${1:-build/cuda/strata}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
ldd "$S" | grep "not found" && exit 1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
T=$(nproc)
$S mkmodel --preset small --type-experts q4_K --type-attn q8_0 -t "$T" -q -o /tmp/small.gguf || exit 1
P="The operations team restarted the backup service because"
for m in /tmp/small.gguf; do
    $S run -m $m -p "$P" -n 64 --temp 0 --ignore-eos -t "$T" >"$OUT/cpu.txt" 2>"$OUT/cpu.err"
    $S run -m $m -p "$P" -n 64 --temp 0 --ignore-eos --gpu >"$OUT/gpu.txt" 2>"$OUT/gpu.err"
    grep -E "backend|CUDA|GPU" "$OUT/gpu.err"
    if cmp -s "$OUT/cpu.txt" "$OUT/gpu.txt"; then echo "greedy text: identical ($(wc -c <"$OUT/cpu.txt") bytes)"
    else echo "greedy text: DIFFERS"; diff <(tr ' ' '\n' <"$OUT/cpu.txt") <(tr ' ' '\n' <"$OUT/gpu.txt") | head; fi
    $S run -m $m -p "$P" -n 8 --gpu --arena 1G 2>&1 | tail -1
    $S run -m $m -p "$P" -n 8 -ngl 3 2>&1 | tail -1
done
$S mkmodel --preset 30b-a3b -t "$T" -q -o /tmp/m30.gguf || exit 1
$S bench -m /tmp/m30.gguf -p 512 -n 128 -r 3 --gpu
$S bench -m /tmp/m30.gguf -p 64 -n 16 -r 2 -t "$T"
