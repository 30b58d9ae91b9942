#!/usr/bin/env bash
# tests/ptx_mma.sh - the tensor cores are really reached: tests/cuda_emu/k_mma_kernels.cuh (the
# kernels tests/cuda_emu/k_mma.cpp runs on the emulator, users of kernels/dt_mma.cuh) builds with
# the kernels' nvcc flags (build.sh's DT_NVCC_FLAGS: sm_80 and sm_90, -Werror all-warnings), and
# its PTX for compute_80 and compute_90 holds mma.sync m16n8k16 with bf16 and with f16 inputs, and
# the 16-byte global loads (ld.global.v4) of its staging; and kernels/dt_flash.cu (the tensor-core
# attention): each of its kernels that multiplies holds mma.sync bf16, and it loads by 16 bytes.
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
done
exit $failed
