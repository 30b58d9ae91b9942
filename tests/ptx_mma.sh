#!/usr/bin/env bash
# tests/ptx_mma.sh - the tensor cores are really reached: tests/cuda_emu/k_mma_kernels.cuh (the
# kernels tests/cuda_emu/k_mma.cpp runs on the emulator, users of kernels/dt_mma.cuh) builds with
# the kernels' nvcc flags (build.sh's DT_NVCC_FLAGS: sm_80 and sm_90, -Werror all-warnings), and
# its PTX for compute_80 and compute_90 holds mma.sync m16n8k16 with bf16 and with f16 inputs, and
# the 16-byte global loads (ld.global.v4) of its staging; and kernels/dt_flash.cu (the tensor-core
# attention): each of its kernels that multiplies holds mma.sync bf16, both ldmatrix forms (and no
# 16-bit shared loads) and cp.async with its wait, and it loads by 16 bytes;
# and kernels/dt_elementwise.cu: each elementwise kernel loads by 16 (or, from 16-bit, 8) bytes,
# as dt_reduce.cu's layernorm (forward, dx, dw/db), dt_softmax.cu's losses and dt_opt.cu's update do.
# tests/run.sh runs it (group ptx:dt_mma)
# where nvcc exists. One PASS/FAIL line per check; exit status non-zero iff one failed.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT" || exit 1
[ -n "${DT_NVCC:-}" ] || eval "$(bash ./build.sh env)"
[ -n "${DT_NVCC:-}" ] || { echo "SKIP ptx:dt_mma: nvcc not found"; exit 0; }
DT_NVCC_FLAGS=${DT_NVCC_FLAGS:-"-O2 -Werror all-warnings -gencode arch=compute_80,code=sm_80 \
    -gencode arch=compute_90,code=sm_90"}
out=build/ptx
src=tests/cuda_emu/k_mma_kernels.cuh
mkdir -p "$out"
failed=0
fail() { echo "FAIL $*"; failed=1; }

# shellcheck disable=SC2086 # DT_NVCC_FLAGS is a word list
if "$DT_NVCC" -c $DT_NVCC_FLAGS -I"$ROOT/kernels" -x cu "$src" -o "$out/k_mma_kernels.o" >"$out/build.log" 2>&1; then
    echo "PASS ptx:dt_mma:builds_with_kernel_flags"
else
    fail "ptx:dt_mma:builds_with_kernel_flags: $DT_NVCC -c $DT_NVCC_FLAGS $src (log: $out/build.log)"
    head -n 20 "$out/build.log" | sed 's/^/    | /'
fi
for arch in 80 90; do
    ptx=$out/k_mma_kernels.sm_$arch.ptx
    if ! "$DT_NVCC" -arch=compute_$arch -I"$ROOT/kernels" -x cu -ptx "$src" -o "$ptx" >"$out/ptx_$arch.log" 2>&1; then
        fail "ptx:dt_mma:sm_${arch}_ptx: nvcc -ptx failed (log: $out/ptx_$arch.log)"
        continue
    fi
    for t in bf16 f16; do
        n=$(grep -c "mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.$t\.$t\.f32" "$ptx")
        if [ "$n" -gt 0 ]; then echo "PASS ptx:dt_mma:sm_${arch}_mma_sync_m16n8k16_$t ($n in $ptx)"
        else fail "ptx:dt_mma:sm_${arch}_mma_sync_m16n8k16_$t: none in $ptx"; fi
    done
    n=$(grep -c "ld\.global\.v4\." "$ptx")
    if [ "$n" -gt 0 ]; then echo "PASS ptx:dt_mma:sm_${arch}_ld_global_v4 ($n in $ptx)"
    else fail "ptx:dt_mma:sm_${arch}_ld_global_v4: none in $ptx"; fi
    n=$(grep -c "cp\.async\.cg\.shared\.global" "$ptx")
    if [ "$n" -gt 0 ]; then echo "PASS ptx:dt_mma:sm_${arch}_cp_async ($n in $ptx)"
    else fail "ptx:dt_mma:sm_${arch}_cp_async: none in $ptx"; fi
    for form in x4 x4.trans; do
        n=$(grep -c "ldmatrix\.sync\.aligned\.m8n8\.$form\.shared\.b16" "$ptx")
        if [ "$n" -gt 0 ]; then echo "PASS ptx:dt_mma:sm_${arch}_ldmatrix_$form ($n in $ptx)"
        else fail "ptx:dt_mma:sm_${arch}_ldmatrix_$form: none in $ptx"; fi
    done
done

# kernels/dt_flash.cu, the attention gpt runs on the tensor cores: every kernel of it that
# multiplies (forward, dk/dv, dq at each head size) holds mma.sync bf16, and the tiles come in
# by 16-byte loads.
for arch in 80 90; do
    ptx=$out/dt_flash.sm_$arch.ptx
    if ! "$DT_NVCC" -arch=compute_$arch -I"$ROOT/kernels" -ptx kernels/dt_flash.cu -o "$ptx" \
        >"$out/flash_$arch.log" 2>&1; then
        fail "ptx:dt_flash:sm_${arch}_ptx: nvcc -ptx failed (log: $out/flash_$arch.log)"
        continue
    fi
    # per .entry, whether its body holds an mma (the prep pass has none: it only rounds dout)
    missing=$(awk '/^\.visible \.entry|^\.entry/ { if (name != "" && !mma) print name
                                                    name = $NF; sub(/\(.*/, "", name); mma = 0 }
                   /mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32/ { mma = 1 }
                   END { if (name != "" && !mma) print name }' "$ptx" | grep -v fl_prep)
    n=$(grep -c "mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32" "$ptx")
    if [ "$n" -gt 0 ] && [ -z "$missing" ]; then
        echo "PASS ptx:dt_flash:sm_${arch}_every_kernel_runs_mma_bf16 ($n in $ptx)"
    else fail "ptx:dt_flash:sm_${arch}_every_kernel_runs_mma_bf16: $n mma; kernels without: ${missing:-none}"; fi
    n=$(grep -c "ld\.global\.v4\." "$ptx")
    if [ "$n" -gt 0 ]; then echo "PASS ptx:dt_flash:sm_${arch}_ld_global_v4 ($n in $ptx)"
    else fail "ptx:dt_flash:sm_${arch}_ld_global_v4: none in $ptx"; fi
    # the B fragments by ldmatrix (K as B's transpose, V / dO / Q / K transposed on the way) in
    # every kernel that multiplies, and no 16-bit shared loads (what dt_mma_load_b makes)
    bad=$(awk '/^\.visible \.entry|^\.entry/ { if (name != "" && (!x4 || !tr || u16)) print name
                                                  name = $NF; sub(/\(.*/, "", name); x4 = tr = u16 = 0 }
               /ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16/ { x4 = 1 }
               /ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16/ { tr = 1 }
               /ld\.shared\.u16/ { u16 = 1 }
               END { if (name != "" && (!x4 || !tr || u16)) print name }' "$ptx" | grep -v fl_prep)
    n=$(grep -c "ldmatrix\.sync" "$ptx")
    if [ "$n" -gt 0 ] && [ -z "$bad" ]; then echo "PASS ptx:dt_flash:sm_${arch}_fragments_by_ldmatrix ($n in $ptx)"
    else fail "ptx:dt_flash:sm_${arch}_fragments_by_ldmatrix: $n ldmatrix; kernels without both forms or with" \
        "16-bit shared loads: ${bad:-none}"; fi
    # the streamed tiles by cp.async (in flight while the warps multiply), waited for by group
    bad=$(awk '/^\.visible \.entry|^\.entry/ { if (name != "" && (!cp || !w)) print name
                                                  name = $NF; sub(/\(.*/, "", name); cp = w = 0 }
               /cp\.async\.cg\.shared\.global/ { cp = 1 }
               /cp\.async\.wait_group/ { w = 1 }
               END { if (name != "" && (!cp || !w)) print name }' "$ptx" | grep -v fl_prep)
    n=$(grep -c "cp\.async\.cg\.shared\.global" "$ptx")
    if [ "$n" -gt 0 ] && [ -z "$bad" ]; then echo "PASS ptx:dt_flash:sm_${arch}_tiles_by_cp_async ($n in $ptx)"
    else fail "ptx:dt_flash:sm_${arch}_tiles_by_cp_async: $n cp.async; kernels without it or its wait: ${bad:-none}"; fi
done

# ptx_of FILE ARCH: nvcc -ptx of kernels/FILE.cu for compute_ARCH into $out/FILE.sm_ARCH.ptx, or a
# FAIL line and status 1.
ptx_of() {
    if ! "$DT_NVCC" -arch=compute_$2 -I"$ROOT/kernels" -ptx "kernels/$1.cu" -o "$out/$1.sm_$2.ptx" \
        >"$out/$1.sm_$2.log" 2>&1; then
        fail "ptx:$1:sm_${2}_ptx: nvcc -ptx failed (log: $out/$1.sm_$2.log)"
        return 1
    fi
}

# vector_loads NAME PTX KERNEL...: PASS NAME when each KERNEL (dt_k__KERNEL, its mangled name; a
# template's every instantiation) has a 16-byte (ld.global.v4) or 8-byte (.v2) load in PTX, else
# FAIL naming those without (or not found).
vector_loads() {
    local name=$1 ptx=$2 k ok counts missing=
    shift 2
    counts=$(awk '/^\.visible \.entry|^\.entry/ { if (name != "") print name, v
                                                   name = $NF; sub(/\(.*/, "", name); v = 0 }
                  /ld\.global(\.nc)?\.v[24]\./ { v++ }
                  END { if (name != "") print name, v }' "$ptx")
    for k in "$@"; do
        ok=$(echo "$counts" | awk -v p="dt_k__${k}P" -v t="dt_k__${k}I" \
            'index($1, p) || index($1, t) { n++; if ($2 == 0) z++ } END { print (n > 0 && z == 0) ? 1 : 0 }')
        [ "$ok" = 1 ] || missing+=" $k"
    done
    if [ -z "$missing" ]; then echo "PASS $name"; else fail "$name: none in$missing"; fi
}

# The check itself must fail on a kernel without vector loads (dt_softmax.cu's sum_stage1: the
# loss sums read 4 bytes at a time) and on a name the PTX does not hold.
vector_loads_fails_on() {
    local what=$1 out
    shift
    out=$(failed=0; vector_loads "planted" "$@")
    case $out in
        FAIL*) echo "PASS ptx:vector_loads:fails_on_$what" ;;
        *) fail "ptx:vector_loads:fails_on_$what: vector_loads said '$out'" ;;
    esac
}

# kernels/dt_elementwise.cu, the memory-bound kernels: each that moves a tensor's elements (bias
# add, relu, gelu, add, axpy, mul, the casts) loads by 16 bytes (ld.global.v4: a float4) or, on a
# 16-bit side of a cast, 8 (.v2: four bf16); the column sums, fill and the range check do not.
# kernels/dt_reduce.cu: layernorm's forward and its dx pass (both copies: the weights in shared
# memory or not) move rows by 16-byte loads, and so do dw/db's per-chunk partials and their sum.
# kernels/dt_softmax.cu: the softmax cross entropy's row passes (forward, backward) and the
# binary cross entropy's backward.
for arch in 80 90; do
    ptx_of dt_elementwise $arch &&
        vector_loads "ptx:dt_elementwise:sm_${arch}_vector_loads_in_every_elementwise_kernel" \
            "$out/dt_elementwise.sm_$arch.ptx" bias_add_fwd relu_fwd relu_bwd gelu_fwd gelu_bwd add axpy mul_fwd mul_bwd cast
    ptx_of dt_reduce $arch &&
        vector_loads "ptx:dt_reduce:sm_${arch}_layernorm_fwd_dx_dw_db_load_by_16_bytes" "$out/dt_reduce.sm_$arch.ptx" \
            layernorm_fwd layernorm_bwd_dx layernorm_bwd_dwdb_part layernorm_bwd_dwdb_sum
    ptx_of dt_softmax $arch || continue
    vector_loads "ptx:dt_softmax:sm_${arch}_losses_load_by_16_bytes" "$out/dt_softmax.sm_$arch.ptx" \
        softmax_xent_fwd softmax_xent_bwd bce_bwd
    vector_loads_fails_on "sm_${arch}_a_kernel_without_them" "$out/dt_softmax.sm_$arch.ptx" softmax_xent_fwd sum_stage1
    vector_loads_fails_on "sm_${arch}_a_name_not_there" "$out/dt_softmax.sm_$arch.ptx" layernorm_planted
done

# kernels/dt_opt.cu's update (every parameter's SGD / Adam / Adagrad in one launch): four
# elements a thread by 16-byte global loads and stores of the f32 weights, grads and state.
for arch in 80 90; do
    ptx=$out/dt_opt.sm_$arch.ptx
    ptx_of dt_opt $arch || continue
    n=$(awk '/^\.visible \.entry|^\.entry/ { on = index($0, "opt_update") > 0 }
             on && /ld\.global\.v4\.f32/ { l++ } on && /st\.global\.v4\.f32/ { s++ }
             END { print l + 0, s + 0 }' "$ptx")
    if [ "${n% *}" -gt 0 ] && [ "${n#* }" -gt 0 ]; then echo "PASS ptx:dt_opt:sm_${arch}_update_loads_and_stores_by_16_bytes ($n)"
    else fail "ptx:dt_opt:sm_${arch}_update_loads_and_stores_by_16_bytes: ld/st.global.v4 in dt_k__opt_update: $n"; fi
done
exit $failed
