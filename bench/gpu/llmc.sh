#!/usr/bin/env bash
# bench/gpu/llmc.sh SRC build|run SHARD: llm.c's GPU trainer, the peer of ./build.sh gpu's GPT-2 124M.
#
# SRC is a checkout of https://github.com/karpathy/llm.c kept outside dt's history (a scratch
# folder: dt never vendors it). "build" compiles train_gpt2.cu as its Makefile does by default
# (bf16, no cuDNN, one GPU: -O3 --use_fast_math, cuBLAS and cuBLASLt, NVML) for this GPU's arch;
# "run" trains GPT-2 124M from a random init (-e d12) at dt's shape (B 8, T 1024) on SHARD, an
# llm.c-format token file (bench/gpu/mkshard.c writes one), for 30 steps, and prints
#   llmc_ms_per_step <median of steps 4..30>
#   llmc_tok_s <8192 tokens / that>
# Exit 0 with both lines, else non-zero with the reason.
set -uo pipefail
src=${1:?usage: llmc.sh SRC build|run SHARD}
what=${2:?usage: llmc.sh SRC build|run SHARD}
case $what in
    build)
        nvcc=${DT_NVCC:-nvcc}
        cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d '. ')
        cap=${cap:-90}
        # CUDA 13 takes a cudaMemLocation in cudaMemAdvise (llm.c's managed-memory fallback on an
        # out-of-memory, never reached at this size): the one call that does not build, adapted
        if "$nvcc" --version | grep -q 'release 1[3-9]'; then
            sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
                "$src/llmc/cuda_utils.cuh"
        fi
        # -DENABLE_BF16: the Makefile's default PRECISION; nvml.h decides NVML by itself
        cd "$src" && "$nvcc" --threads=0 -t=0 --use_fast_math -std=c++17 -O3 -DENABLE_BF16 \
            --generate-code "arch=compute_$cap,code=[compute_$cap,sm_$cap]" train_gpt2.cu \
            -lcublas -lcublasLt -lnvidia-ml -o train_gpt2cu
        ;;
    run)
        shard=${3:?usage: llmc.sh SRC run SHARD}
        [ -x "$src/train_gpt2cu" ] || { echo "llmc.sh: $src/train_gpt2cu is not built"; exit 1; }
        shard=$(cd "$(dirname "$shard")" && pwd)/$(basename "$shard")
        # -v/-s past the last step: no validation or sampling in the timed steps (-m 1: one
        # batch at step 0); -h 0: no HellaSwag
        (cd "$src" && timeout 120 ./train_gpt2cu -i "$shard" -j "$shard" -e d12 -b 8 -t 1024 -x 30 -v 1000 -m 1 \
            -s 1000 -h 0) >"$src/run.log" 2>&1
        rc=$?
        ms=$(awk '/^step +[0-9]+\/[0-9]+ \|/ { split($2, a, "/"); if (a[1] + 0 < 4) next
                    for (i = 2; i <= NF; i++) if ($i == "ms") print $(i - 1) }' "$src/run.log" | sort -g |
            awk '{ t[++n] = $1 } END { if (n) print n % 2 ? t[(n + 1) / 2] : (t[n / 2] + t[n / 2 + 1]) / 2 }')
        if [ -z "$ms" ]; then echo "llmc.sh: no step times (rc $rc): $(tail -n 3 "$src/run.log" | tr '\n' ' ')"; exit 1; fi
        echo "llmc_ms_per_step $ms"
        awk -v ms="$ms" 'BEGIN { printf("llmc_tok_s %.0f\n", 8192 * 1000 / ms) }'
        ;;
    *) echo "llmc.sh: unknown step '$what' (build or run)"; exit 2 ;;
esac
