#!/usr/bin/env bash
# bench/gpu/selftest.sh - what of `./build.sh gpu` can be checked without a GPU, in seconds (tests/run.sh,
# group gpu): one PASS/FAIL/SKIP line per behaviour. The builds themselves are `./build.sh gpu
# --build-only` (check gpu:build-only, beside this one in tests/run.sh).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
T=${DT_TEST_TMPDIR:-$(mktemp -d)}
mkdir -p "$T"

check() { # NAME OK DETAILS
    if [ "$2" = 1 ]; then echo "PASS $1"; else echo "FAIL $1: $3"; fi
}

./build.sh gpu --no-such-flag >"$T/arg.log" 2>&1
rc=$?
check gpu:unknown_argument_exits_2_naming_it "$([ $rc -eq 2 ] && grep -q "'--no-such-flag'" "$T/arg.log" && echo 1)" \
    "exit $rc, output: $(head -n 1 "$T/arg.log")"

if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "SKIP gpu:no_gpu_exits_3_within_30s: this machine has a GPU"
else
    t0=$SECONDS
    timeout 60 ./build.sh gpu >"$T/nogpu.log" 2>&1
    rc=$? secs=$((SECONDS - t0))
    check gpu:no_gpu_exits_3_within_30s "$([ $rc -eq 3 ] && [ $secs -le 30 ] && grep -q 'no GPU here' "$T/nogpu.log" && echo 1)" \
        "exit $rc after $secs s, output: $(head -n 1 "$T/nogpu.log")"
fi

bash bench/gpu/run.sh --dry-run >"$T/dry.log" 2>&1
rc=$?
check gpu:dry_run_summary_parses_made_up_logs "$([ $rc -eq 0 ] && grep -q '^| GPT-2 124M, f32, B 8, T 1024, --device cuda | 32768.0 tok/s, MFU 2.66%' build/gpu/dry/summary.md && echo 1)" \
    "exit $rc: $(tail -n 1 "$T/dry.log")"
check gpu:dry_run_summary_says_it_is_made_up "$(head -n 1 build/gpu/dry/summary.md 2>/dev/null | grep -q '^> DRY RUN' && echo 1)" \
    "first line: $(head -n 1 build/gpu/dry/summary.md 2>/dev/null)"

# the shard writer: llm.c's header and uint16 tokens below 50257; bad arguments named, exit 2
if ${DT_CC:-gcc} -std=c99 -O2 -Wall -Wextra -Werror bench/gpu/mkshard.c -o "$T/mkshard" >"$T/mkshard_build.log" 2>&1; then
    "$T/mkshard" "$T/s.bin" 1000 3
    rc=$?
    hdr=$(od -A n -t d4 -N 12 "$T/s.bin" 2>/dev/null | xargs)
    size=$(stat -c %s "$T/s.bin" 2>/dev/null)
    maxtok=$(od -A n -t u2 -j 1024 -v "$T/s.bin" 2>/dev/null | tr -s ' ' '\n' | sort -n | tail -n 1)
    check gpu:mkshard_writes_llmc_header_and_tokens "$([ $rc -eq 0 ] && [ "$hdr" = "20240520 1 1000" ] && [ "$size" = 3024 ] && [ "$maxtok" -lt 50257 ] && echo 1)" \
        "exit $rc, header '$hdr' (want '20240520 1 1000'), $size bytes (want 3024), largest token $maxtok"
    "$T/mkshard" "$T/t.bin" 1000 3 && cmp -s "$T/s.bin" "$T/t.bin"
    check gpu:mkshard_same_seed_same_bytes "$([ $? -eq 0 ] && echo 1)" "two runs with seed 3 differ"
    "$T/mkshard" "$T/u.bin" 0 >"$T/bad.log" 2>&1
    rc=$?
    check gpu:mkshard_bad_count_exits_2_naming_it "$([ $rc -eq 2 ] && grep -q "N_TOKENS is '0'" "$T/bad.log" && echo 1)" \
        "exit $rc: $(cat "$T/bad.log")"
else
    check gpu:mkshard_builds 0 "$(head -n 5 "$T/mkshard_build.log")"
fi
