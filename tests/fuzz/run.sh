#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS] - builds tests/fuzz/fuzz_tsv.c with clang's libFuzzer (ASan + UBSan)
# and fuzzes the Criteo TSV reader of examples/dlrm/dlrm_data.h for SECONDS (default 300),
# starting from tests/fuzz/corpus. New inputs go to build/fuzz/corpus (not the seed corpus);
# a crash is written to build/fuzz/crash-*. Needs clang with libFuzzer (Debian 12: clang-14,
# libclang-rt-14-dev). tests/test_fuzz_tsv_replay.c replays the seed corpus in tests/run.sh.
# Then the file readers' targets, built and run the same way, SECONDS each:
#   plan       tests/fuzz/fuzz_plan.c       dt_plan.h's profile, machine and DLRM profile files
#   ckpt       tests/fuzz/fuzz_ckpt.c       dt_opt.h's dt_checkpoint_load (manifest + rank files)
#   gpt_shard  tests/fuzz/fuzz_gpt_shard.c  examples/gpt/gpt_data.h's llm.c shards and text
# each from tests/fuzz/corpus_<target>, new inputs to build/fuzz/corpus_<target>, a crash to
# build/fuzz/<target>-crash-*; tests/test_fuzz_files_replay.c replays their seed corpora.
# tests/fuzz/run.sh SECONDS TARGET... - only those (tsv, plan, ckpt, gpt_shard). The exit
# status is the first failing target's (a crash, a failed check, a sanitizer report).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
secs=${1:-300}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(tsv plan ckpt gpt_shard)

# fuzz TARGET MAX_LEN CORPUS ARTIFACT_PREFIX SEEDS: build it, then fuzz it for $secs seconds
# (called in an || list, where set -e is off: each step's failure is returned by hand)
fuzz() {
    local name=$1 max_len=$2 corpus=$3 prefix=$4 seeds=$5
    mkdir -p "$corpus" || return
    clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
        "tests/fuzz/fuzz_$name.c" -o "build/fuzz/fuzz_$name" -lm -lpthread || return
    "build/fuzz/fuzz_$name" -max_total_time="$secs" -max_len="$max_len" -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$prefix" "$corpus" "$seeds"
}

status=0
for t in "${targets[@]}"; do
    rc=0
    case $t in
        tsv) fuzz tsv 4096 build/fuzz/corpus build/fuzz/ tests/fuzz/corpus || rc=$? ;;
        plan | ckpt | gpt_shard)
            fuzz "$t" 8192 "build/fuzz/corpus_$t" "build/fuzz/$t-" "tests/fuzz/corpus_$t" || rc=$? ;;
        *) echo "tests/fuzz/run.sh: unknown target '$t' (tsv, plan, ckpt, gpt_shard)" >&2; rc=2 ;;
    esac
    [ $rc -ne 0 ] && [ $status -eq 0 ] && status=$rc
done
exit $status
