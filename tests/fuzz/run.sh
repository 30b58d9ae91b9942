#!/usr/bin/env bash
# tests/fuzz/run.sh [SECONDS] - builds tests/fuzz/fuzz_tsv.c with clang's libFuzzer (ASan + UBSan)
# and fuzzes the Criteo TSV reader of examples/dlrm/dlrm_data.h for SECONDS (default 300),
# starting from tests/fuzz/corpus. New inputs go to build/fuzz/corpus (not the seed corpus);
# a crash is written to build/fuzz/crash-*. Needs clang with libFuzzer (Debian 12: clang-14,
# libclang-rt-14-dev). tests/test_fuzz_tsv_replay.c replays the seed corpus in tests/run.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
secs=${1:-300}
mkdir -p build/fuzz/corpus
clang -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I. \
    tests/fuzz/fuzz_tsv.c -o build/fuzz/fuzz_tsv -lm
exec build/fuzz/fuzz_tsv -max_total_time="$secs" -max_len=4096 -timeout=10 -print_final_stats=1 \
    -artifact_prefix=build/fuzz/ build/fuzz/corpus tests/fuzz/corpus
