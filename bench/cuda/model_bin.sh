# Sourced by bench/cuda/{decode,tiered,profile}.sh: sets T to a
# test_cuda_model binary that starts on this machine — $T when given, else
# build/tests/test_cuda_model, else the carried static build
# build/prebuilt/test_cuda_model_static — or exits naming the script ($WHO).
T=${T:-}
for c in "$T" build/tests/test_cuda_model build/prebuilt/test_cuda_model_static; do
    [ -n "$c" ] && [ -x "$c" ] && "$c" --info </dev/null >/dev/null 2>&1 && { T=$c; break; }
    T=""
done
[ -n "$T" ] || { echo "${WHO:-bench}: no test_cuda_model binary starts (make cuda)"; exit 1; }
