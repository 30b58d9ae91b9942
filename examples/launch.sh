#!/usr/bin/env bash
# examples/launch.sh - elastic restart: run a dt training command under mpirun across hosts and,
# when the run fails (a host died, a link was cut, a rank was killed: dt names it and the job
# ends), find the hosts that still answer and start again on them from the last complete
# checkpoint, which dt reshards to the smaller world. Up to --max-restarts times, never below
# --min-ranks; each restart is logged.
#
#   examples/launch.sh -H a:2,b:2 [--max-restarts N] [--min-ranks M] [--probe-timeout S]
#                      [--abort-grace S] [--mpirun "ARGS"] -- build/examples/gpt --ckpt DIR --ckpt-every K ...
#
# The command must take --ckpt DIR (given) and --resume (added on a restart when DIR holds a
# checkpoint). A host "answers" when mpirun starts `true` on it within --probe-timeout seconds
# (5); the restart uses the answering hosts with their slots. --mpirun passes options to every
# mpirun (the rsh agent, the TCP interfaces; the Open MPI keepalive options that end a job soon
# after a host's link dies are added by default: --mca oob_tcp_keepalive_time 5 ...). Exit
# status: the last run's (0 when training finished), 3 when too few ranks are left.
#
# mpirun does not always end when a rank aborts: its teardown message to a host whose link is
# gone waits on TCP's retransmission timer (some 15 minutes; keepalive only covers an idle link).
# So the launcher reads the job's output as it comes, and once a rank has said it failed (dt's
# "[rank N]: ... failed:", MPI_ABORT, or ORTE's "lost communication"), mpirun gets
# --abort-grace seconds (10) to end before the launcher kills it and goes on to the restart.
set -uo pipefail
hosts='' max_restarts=3 min_ranks=1 probe_timeout=5 abort_grace=10 extra=''
while [ $# -gt 0 ]; do
    case "$1" in
    -H | --hosts) hosts=$2; shift 2 ;;
    --max-restarts) max_restarts=$2; shift 2 ;;
    --min-ranks) min_ranks=$2; shift 2 ;;
    --probe-timeout) probe_timeout=$2; shift 2 ;;
    --abort-grace) abort_grace=$2; shift 2 ;;
    --mpirun) extra=$2; shift 2 ;;
    --) shift; break ;;
    *) echo "launch.sh: unknown option $1 (see its header)" >&2; exit 2 ;;
    esac
done
[ -n "$hosts" ] && [ $# -gt 0 ] || { echo "launch.sh: needs -H host:slots,... and -- a command" >&2; exit 2; }
for v in "max-restarts $max_restarts" "min-ranks $min_ranks" "probe-timeout $probe_timeout" "abort-grace $abort_grace"; do
    [[ ${v#* } =~ ^[0-9]+$ ]] || { echo "launch.sh: --${v% *} is '${v#* }'; expected a whole number" >&2; exit 2; }
done
ckpt=
prev=
for a in "$@"; do [ "$prev" = --ckpt ] && ckpt=$a; prev=$a; done
[ -n "$ckpt" ] || { echo "launch.sh: the command needs --ckpt DIR (a restart resumes from it)" >&2; exit 2; }
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
keepalive=(--mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3)

ranks_of() { local n=0 h; IFS=, read -ra hs <<<"$1"; for h in "${hs[@]}"; do n=$((n + ${h##*:})); done; echo $n; }
say() { echo "launch.sh: $*" >&2; }

# mpirun ARGS, its output copied to ours and to a log that is read as it grows; ends it
# --abort-grace seconds after a rank said it failed. Returns mpirun's status (137 when killed).
failed_line='\[rank [0-9]+\]: .* failed: |MPI_ABORT was invoked|lost communication with a remote daemon'
log=$(mktemp "${TMPDIR:-/tmp}/launch.XXXXXX")
trap 'rm -f "$log"; [ -n "${job:-}" ] && kill -KILL "$job" 2>/dev/null' EXIT
trap 'exit 130' INT TERM
children_of() { # the pids whose parent is $1 (from /proc: no procps needed)
    local p st
    for p in /proc/[0-9]*; do
        st=$(cat "$p/stat" 2>/dev/null) || continue
        st=${st##*) } # past the command name, which may hold spaces
        [ "$(echo "$st" | cut -d' ' -f2)" = "$1" ] && echo "${p#/proc/}"
    done
}
run_job() {
    local seen=0 failed_at='' size
    : >"$log"
    # shellcheck disable=SC2086
    mpirun "$@" > >(tee -a "$log") 2> >(tee -a "$log" >&2) &
    job=$!
    while kill -0 "$job" 2>/dev/null; do
        sleep 0.5
        if [ -z "$failed_at" ]; then
            size=$(stat -c %s "$log")
            if [ "$size" -gt "$seen" ] && tail -c +$((seen + 1)) "$log" | head -c $((size - seen)) | grep -qE "$failed_line"; then
                failed_at=$SECONDS
            fi
            seen=$size
        elif [ $((SECONDS - failed_at)) -ge "$abort_grace" ]; then
            say "a rank failed and mpirun has not ended after --abort-grace ${abort_grace}s: killing it"
            # its children too (the ssh or agent of each host: they hold our output open)
            # shellcheck disable=SC2046
            kill -KILL "$job" $(children_of "$job") 2>/dev/null
            break
        fi
    done
    wait "$job"
    local rc=$?
    job=
    return $rc
}

restarts=0
while :; do
    np=$(ranks_of "$hosts")
    resume=()
    if [ -e "$ckpt/latest" ]; then resume=(--resume); fi
    say "run $((restarts + 1)): $np ranks on $hosts${resume:+, resuming from $ckpt/$(cat "$ckpt/latest" 2>/dev/null)}"
    # shellcheck disable=SC2086
    run_job "${root[@]}" -H "$hosts" -np "$np" "${keepalive[@]}" $extra "$@" "${resume[@]}"
    rc=$?
    [ $rc -eq 0 ] && { say "training finished (run $((restarts + 1)), $np ranks)"; exit 0; }
    if [ $restarts -ge "$max_restarts" ]; then say "run failed (exit $rc) and --max-restarts $max_restarts is spent"; exit $rc; fi
    # which hosts still answer
    alive=
    IFS=, read -ra hs <<<"$hosts"
    for h in "${hs[@]}"; do
        # shellcheck disable=SC2086
        if timeout -k 2 "$probe_timeout" mpirun "${root[@]}" -H "${h%%:*}:1" -np 1 $extra true >/dev/null 2>&1; then
            alive+="${alive:+,}$h"
        else say "host ${h%%:*} does not answer: left out"; fi
    done
    [ -n "$alive" ] && [ "$(ranks_of "$alive")" -ge "$min_ranks" ] || {
        say "run failed (exit $rc); $(ranks_of "${alive:-x:0}") ranks answer, fewer than --min-ranks $min_ranks"; exit 3; }
    restarts=$((restarts + 1))
    say "restart $restarts after exit $rc: $(ranks_of "$alive") ranks on $alive"
    hosts=$alive
done
