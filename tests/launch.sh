#!/usr/bin/env bash
# tests/launch.sh - examples/launch.sh (elastic restart) against a stand-in mpirun, so each path
# runs the same way on every machine (tests/multihost.sh runs it for real, as root):
#   - a rank says it failed and mpirun then hangs (as when its teardown message waits on a dead
#     link): the launcher kills mpirun --abort-grace seconds later, probes the hosts, leaves out
#     the one that does not answer and restarts on the other with --resume;
#   - a plain non-zero exit restarts at once; --max-restarts ends it with that exit status;
#   - no host answers, or fewer ranks than --min-ranks: exit 3, said why;
#   - bad options (a grace that is not a number, no --ckpt, no -H): exit 2 naming the option.
# The stand-in reads its plan from $FAKE_PLAN (one line per mpirun start: hang | fail | ok) and
# takes a host as dead when its name is in $FAKE_DEAD. Ends with "N passed, N failed".
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
passed=0 failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1: $2"; failed=$((failed + 1)); }
TMP=${DT_TEST_TMPDIR:-$(mktemp -d)}
bin=$TMP/bin
mkdir -p "$bin"
cat >"$bin/mpirun" <<'EOF'
#!/usr/bin/env bash
# stand-in mpirun: -H hosts -np N ... CMD ARGS
hosts='' np='' args=("$@")
while [ $# -gt 0 ]; do
    case "$1" in
    -H) hosts=$2; shift 2 ;;
    -np) np=$2; shift 2 ;;
    --mca) shift 3 ;;
    --allow-run-as-root) shift ;;
    *) break ;;
    esac
done
if [ "$1" = true ]; then # the launcher's probe of one host
    case " $FAKE_DEAD " in *" ${hosts%%:*} "*) sleep 600 ;; esac
    exit 0
fi
n=$(($(cat "$FAKE_STATE" 2>/dev/null || echo 0) + 1))
echo $n >"$FAKE_STATE"
echo "run $n: -H $hosts -np $np: ${args[*]}" >>"$FAKE_CALLS"
ckpt='' prev=''
for a in "$@"; do [ "$prev" = --ckpt ] && ckpt=$a; prev=$a; done
case "$(sed -n "${n}p" "$FAKE_PLAN")" in
hang)
    mkdir -p "$ckpt" && echo step_00000010 >"$ckpt/latest"
    echo "step 10/20 loss 3.0"
    echo "gpt [rank 1]: dt_zero_step(...) failed: dt_comm_iallreduce: ... did not complete within 8 s" >&2
    exec sleep 600 ;;
fail) echo "gpt [rank 0]: dt_step failed: something" >&2; exit 1 ;;
*) echo "final: loss 2.5"; exit 0 ;;
esac
EOF
chmod +x "$bin/mpirun"
export PATH="$bin:$PATH" FAKE_STATE FAKE_CALLS FAKE_PLAN FAKE_DEAD

# launch NAME PLAN DEAD LAUNCH_ARGS...: runs the launcher, leaves $out, $calls, $rc and $secs
launch() {
    local name=$1 plan=$2 dead=$3 t0=$SECONDS
    shift 3
    FAKE_STATE=$TMP/$name.state FAKE_CALLS=$TMP/$name.calls FAKE_PLAN=$TMP/$name.plan FAKE_DEAD=$dead
    rm -f "$FAKE_STATE" "$FAKE_CALLS"
    rm -rf "$TMP/$name.ckpt"
    printf '%s\n' $plan >"$FAKE_PLAN"
    out=$TMP/$name.out
    timeout -k 5 60 bash examples/launch.sh "$@" >"$out" 2>&1
    rc=$?
    secs=$((SECONDS - t0))
    calls=$(cat "$FAKE_CALLS" 2>/dev/null)
}
GPT="build/examples/gpt --steps 20"

# a rank fails, mpirun hangs; host b does not answer the probe
launch hang "hang ok" b -H a:2,b:2 --abort-grace 2 --probe-timeout 2 -- $GPT --ckpt "$TMP/hang.ckpt"
if [ $rc -eq 0 ] && grep -q "has not ended after --abort-grace 2s: killing it" "$out" &&
    grep -q "host b does not answer: left out" "$out" && grep -q "restart 1 after exit 137: 2 ranks on a:2" "$out" &&
    echo "$calls" | grep -q "^run 2: -H a:2 -np 2: .*--ckpt $TMP/hang.ckpt --resume$" && [ $secs -lt 30 ]; then
    pass "hung_mpirun_is_killed_after_the_grace_and_the_run_restarts_on_the_live_host [${secs}s]"
else fail hung_mpirun_is_killed_after_the_grace_and_the_run_restarts_on_the_live_host "exit $rc after ${secs}s; calls: $calls; log: $(tr '\n' ' ' <"$out")"; fi
if grep -q "step 10/20 loss 3.0" "$out" && grep -q "^final: loss 2.5" "$out"; then pass the_jobs_output_reaches_the_launchers
else fail the_jobs_output_reaches_the_launchers "$(tr '\n' ' ' <"$out")"; fi

# a plain failure restarts at once (no checkpoint yet: no --resume), up to --max-restarts
launch fail2 "fail fail fail" "" -H a:1,b:1 --max-restarts 2 -- $GPT --ckpt "$TMP/fail2.ckpt"
if [ $rc -eq 1 ] && [ "$(echo "$calls" | grep -c '^run')" = 3 ] && ! echo "$calls" | grep -q -- --resume &&
    grep -q -- "--max-restarts 2 is spent" "$out"; then
    pass "max_restarts_ends_with_the_runs_exit_status [3 runs]"
else fail max_restarts_ends_with_the_runs_exit_status "exit $rc; calls: $calls; log: $(tr '\n' ' ' <"$out")"; fi

# no host answers; too few ranks
launch dead "fail" "a b" -H a:2,b:2 --probe-timeout 1 -- $GPT --ckpt "$TMP/dead.ckpt"
if [ $rc -eq 3 ] && grep -q "0 ranks answer, fewer than --min-ranks 1" "$out"; then pass no_host_answering_exits_3
else fail no_host_answering_exits_3 "exit $rc; $(tr '\n' ' ' <"$out")"; fi
launch few "fail" "b" -H a:2,b:2 --min-ranks 3 --probe-timeout 1 -- $GPT --ckpt "$TMP/few.ckpt"
if [ $rc -eq 3 ] && grep -q "2 ranks answer, fewer than --min-ranks 3" "$out"; then pass fewer_ranks_than_min_ranks_exits_3
else fail fewer_ranks_than_min_ranks_exits_3 "exit $rc; $(tr '\n' ' ' <"$out")"; fi

# bad options are named
for c in "grace|--abort-grace x|--abort-grace is 'x'; expected a whole number" \
    "restarts|--max-restarts -1|--max-restarts is '-1'; expected a whole number" \
    "ckpt|NOCKPT|the command needs --ckpt DIR" \
    "hosts|NOHOSTS|needs -H host:slots"; do
    IFS='|' read -r name opt want <<<"$c"
    case "$opt" in
    NOCKPT) launch "bad_$name" ok "" -H a:1 -- $GPT ;;
    NOHOSTS) launch "bad_$name" ok "" -- $GPT --ckpt x ;;
    *) # shellcheck disable=SC2086
        launch "bad_$name" ok "" -H a:1 $opt -- $GPT --ckpt x ;;
    esac
    if [ $rc -eq 2 ] && grep -qF -- "$want" "$out" && [ -z "$calls" ]; then pass "bad_option_${name}_is_named"
    else fail "bad_option_${name}_is_named" "exit $rc, wanted '$want': $(tr '\n' ' ' <"$out")"; fi
done

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
