#!/usr/bin/env bash
# tests/fresh_debian.sh - the README's two commands on a fresh Debian 12, as a new user meets
# them. For each APT setting, recommended packages on (a desktop) and off (container images):
#   - a `debootstrap --variant=minbase bookworm` root (the base is built once and cached as
#     build/fresh/base-bookworm-minbase.tar), with this repository's committed HEAD cloned into
#     it, for root (/root/dt) and for a user "dt" who is not root (/home/dt/dt);
#   - fresh:<apt>:user_is_told_what_to_run  the user runs ./build.sh demo before any package is
#     there: it must stop (non-zero) with the apt-get line to run as root, and su -c '...';
#   - fresh:<apt>:demo   as root, ./build.sh demo installs the packages, builds, trains DLRM on
#     one process and on 4 ranks and compares them: exit status 0 and its verdict lines;
#   - fresh:<apt>:test   as root, ./build.sh test must end "N passed, 0 failed, N skipped";
#   - fresh:<apt>:user_demo  the user's ./build.sh demo, once root has installed the packages.
# One PASS/FAIL/SKIP line per check (tests/run.sh counts them, DT_TEST_FRESH=1 ./build.sh test),
# then "N passed, N failed, N skipped". Logs: build/fresh/<apt>/*.log. A root whose checks all
# passed is removed; a failed one stays in build/fresh/<apt>/root for a look (chroot into it).
#
#   bash tests/fresh_debian.sh [recommends_on] [recommends_off]     (as root; default: both)
#
# Needs root (debootstrap, mount, chroot; SKIP otherwise), a Debian mirror (DT_FRESH_MIRROR,
# default http://deb.debian.org/debian), debootstrap (installed with apt-get when missing),
# about 1.5 GB under build/fresh and, on 2 cores, some 45 minutes per APT setting (the whole
# suite runs in each; 2026-12-06: demo 284 s, the user's demo 182 s). Uncommitted
# changes are not tested: the roots get `git clone` of HEAD. Downloaded .deb files are kept in
# build/fresh/apt-archives for the next root (each root still installs them itself).
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
cd "$ROOT" || exit 1

SUITE=bookworm
MIRROR=${DT_FRESH_MIRROR:-http://deb.debian.org/debian}
W=$ROOT/build/fresh
BASE=$W/base-$SUITE-minbase.tar
VARIANTS=("$@")
[ ${#VARIANTS[@]} -gt 0 ] || VARIANTS=(recommends_on recommends_off)
IN_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
PROXY=()
for v in http_proxy https_proxy no_proxy; do [ -n "${!v:-}" ] && PROXY+=("$v=${!v}"); done

npass=0 nfail=0 nskip=0
report() {
    echo "$1"
    case $1 in
        PASS*) npass=$((npass + 1)) ;;
        FAIL*) nfail=$((nfail + 1)) ;;
        SKIP*) nskip=$((nskip + 1)) ;;
    esac
}
note() { echo "fresh_debian.sh: $*"; }
finish() {
    echo "$npass passed, $nfail failed, $nskip skipped"
    [ $nfail -eq 0 ]
    exit
}

# --- mounts: every one is undone on exit, whatever ends the script --------------------------

R=          # the root in use (physical path)
MOUNTS=()   # what this script mounted there, in order

# kill_rooted_under DIR: ends the processes whose root directory is DIR or lies under it (an
# mpirun that a timeout cut short, or what a killed earlier run left): this script started
# them in its roots, and they would keep its mounts busy.
kill_rooted_under() {
    local p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        [[ $r/ == "$1"/* ]] && kill -9 "${p#/proc/}" 2>/dev/null
    done
    return 0
}

unmount_all() {
    local i m
    [ ${#MOUNTS[@]} -gt 0 ] || return 0
    [ -z "$R" ] || kill_rooted_under "$R"
    for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
        m=${MOUNTS[i]}
        umount "$m" 2>/dev/null || umount -l "$m" || echo "fresh_debian.sh: could not unmount $m" >&2
    done
    MOUNTS=()
}
trap unmount_all EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

mount_at() { # MOUNT-ARGS... TARGET
    mount "$@" || return 1
    MOUNTS+=("${!#}")
}

# Removes a root, unless something is still mounted under it (a bind mount of /dev would take
# the host's devices with it); never leaves the root's file system.
remove_tree() {
    local d=$1
    [ -e "$d" ] || return 0
    if awk -v d="$d/" 'index($2 "/", d) == 1 { found = 1 } END { exit !found }' /proc/self/mounts; then
        echo "fresh_debian.sh: something is still mounted under $d; not removing it" >&2
        return 1
    fi
    rm -rf --one-file-system "$d"
}

# in_root SECONDS USER COMMAND: runs COMMAND with bash in ~/dt inside R, as root or as the user
# dt, with a clean environment (nothing of this machine's, DT_TEST_FRESH included). It runs in
# the background and the script waits for it, so that a TERM (tests/run.sh's timeout) reaches
# the traps at once: they end what runs inside R and unmount.
in_root() {
    local secs=$1 who=$2 cmd=$3 spec=() home=/root
    if [ "$who" != root ]; then
        spec=(--userspec="$DT_UID:$DT_GID" --groups="$DT_GID")
        home=/home/dt
    fi
    timeout -k 10 "$secs" chroot "${spec[@]}" "$R" env -i HOME="$home" USER="$who" LOGNAME="$who" \
        PATH="$IN_PATH" LANG=C.UTF-8 "${PROXY[@]}" bash -c "cd ~/dt && $cmd" </dev/null 9>&- &
    wait $!
}

# --- setup -------------------------------------------------------------------------------------

if [ "$(id -u)" -ne 0 ]; then
    report "SKIP fresh: needs root (debootstrap, mount, chroot)"
    finish
fi
mkdir -p "$W" || exit 1
# the lock (fd 9) is not handed to the commands run in the roots: should this script be killed
# outright, what it left running must not keep the next run out
exec 9>"$W/lock"
if ! flock -n 9; then
    report "FAIL fresh:setup: another tests/fresh_debian.sh is running in $W"
    finish
fi
# what a run killed outright (SIGKILL: no trap) left under build/fresh: processes in its roots,
# then its mounts, deepest first
kill_rooted_under "$W"
awk -v d="$W/" 'index($2, d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    note "unmounting $m, left by an earlier run"
    umount "$m" 2>/dev/null || umount -l "$m"
done
if ! git -C "$ROOT" rev-parse --verify -q HEAD >/dev/null; then
    report "FAIL fresh:setup: $ROOT is not a git checkout with a commit (the roots get git clone of HEAD)"
    finish
fi
[ -z "$(git -C "$ROOT" status --porcelain)" ] || note "uncommitted changes are not tested (the roots get HEAD)"
note "testing $(git -C "$ROOT" log -1 --format='%h %s')"

if ! command -v debootstrap >/dev/null; then
    note "installing debootstrap (log: $W/debootstrap-install.log)"
    if ! { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y debootstrap; } >"$W/debootstrap-install.log" 2>&1; then
        report "FAIL fresh:setup: apt-get install debootstrap failed (log: $W/debootstrap-install.log)"
        finish
    fi
fi

if [ ! -s "$BASE" ]; then
    t0=$SECONDS
    note "debootstrap --variant=minbase $SUITE $MIRROR (log: $W/debootstrap.log)"
    remove_tree "$W/base.tmp" || finish
    # the .deb files debootstrap leaves are cleaned away, as on an installed machine
    debootstrap --variant=minbase "$SUITE" "$W/base.tmp" "$MIRROR" >"$W/debootstrap.log" 2>&1 9>&- &
    if wait $! &&
        chroot "$W/base.tmp" apt-get clean &&
        tar --numeric-owner -C "$W/base.tmp" -cpf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"; then
        remove_tree "$W/base.tmp"
        note "base root made in $((SECONDS - t0)) s: $BASE"
    else
        rm -f "$BASE.tmp"
        report "FAIL fresh:setup: debootstrap --variant=minbase $SUITE failed (log: $W/debootstrap.log)"
        finish
    fi
else
    note "base root: $BASE (cached; remove it to debootstrap again)"
fi

# --- one APT setting ---------------------------------------------------------------------------

# prepare_root VARIANT RECOMMENDS: a fresh root from the base, mounted, the clones in place.
prepare_root() {
    local v=$1 rec=$2 d=$W/$1 m
    unmount_all
    remove_tree "$d/root" || return 1
    mkdir -p "$d/root" || return 1
    R=$(cd "$d/root" && pwd -P)
    tar --numeric-owner -C "$R" -xpf "$BASE" || return 1
    cp -L /etc/resolv.conf "$R/etc/resolv.conf" || return 1
    # the /etc/hosts an installed system has (debootstrap writes none): without the host's name
    # in it, MPI's start asks DNS for it and waits 5 s per mpirun, and the drivers of a hundred
    # runs time out (as they did here on 2026-12-06)
    printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n' "$(hostname)" >"$R/etc/hosts" || return 1
    printf 'APT::Install-Recommends "%s";\n' "$rec" >"$R/etc/apt/apt.conf.d/99dt-fresh-recommends" || return 1
    # mpirun needs /proc, /dev/shm (shared-memory transport) and ptys; ASan needs /proc
    mount_at -t proc proc "$R/proc" || return 1
    for m in /dev /dev/pts /dev/shm; do mount_at --bind "$m" "$R$m" || return 1; done
    mkdir -p "$W/apt-archives/partial" || return 1
    mount_at --bind "$W/apt-archives" "$R/var/cache/apt/archives" || return 1
    git clone -q "$ROOT" "$R/root/dt" || return 1
    chroot "$R" useradd -m -s /bin/bash dt || return 1
    DT_UID=$(chroot "$R" id -u dt) && DT_GID=$(chroot "$R" id -g dt) || return 1
    git clone -q "$ROOT" "$R/home/dt/dt" && chown -R "$DT_UID:$DT_GID" "$R/home/dt/dt"
}

# The demo's verdict lines (the early steps' agreement, the AUCs) and its last line, on one line.
demo_verdict() {
    grep -q '^final: loss [^ ]* auc ' "$1" || return 0
    grep -E '^  (steps 1-[0-9]+|held-out AUC):' "$1" | sed 's/^ *//' | tr '\n' ' ' | sed 's/ $//'
}

run_variant() {
    local v=$1 rec d=$W/$1 log rc t0 line failed=$nfail
    case $v in
        recommends_on) rec=true ;;
        recommends_off) rec=false ;;
        *) report "FAIL fresh:$v: unknown APT setting (recommends_on, recommends_off)"; return ;;
    esac
    mkdir -p "$d" && rm -f "$d"/*.log
    note "$v: a fresh root in $d/root (APT::Install-Recommends \"$rec\")"
    if ! prepare_root "$v" "$rec" >"$d/prepare.log" 2>&1; then
        report "FAIL fresh:$v:setup: could not make the root (log: $d/prepare.log)"
        sed 's/^/    | /' "$d/prepare.log" | tail -n 5
        unmount_all
        return
    fi

    # 1. a user who is not root, before the packages are there
    log=$d/user_before.log
    in_root 600 dt './build.sh demo' >"$log" 2>&1
    rc=$?
    line=$(grep -m1 "su -c 'apt-get update" "$log" | sed 's/^ *//')
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q '^ *apt-get update && .*apt-get install -y ' "$log" && [ -n "$line" ]; then
        report "PASS fresh:$v:user_is_told_what_to_run: exit $rc; $line"
    else
        report "FAIL fresh:$v:user_is_told_what_to_run: exit status $rc, and no apt-get line to run as root with su -c (log: $log)"
    fi

    # 2. the README's first command, as root: installs, builds, trains
    log=$d/demo.log
    t0=$SECONDS
    in_root 2400 root './build.sh demo' >"$log" 2>&1
    rc=$?
    line=$(demo_verdict "$log")
    if [ $rc -eq 0 ] && [ -n "$line" ]; then
        report "PASS fresh:$v:demo: $((SECONDS - t0)) s; $line"
    else
        report "FAIL fresh:$v:demo: exit status $rc$([ $rc -eq 124 ] && echo ' (timed out)') (log: $log)"
        tail -n 15 "$log" | sed 's/^/    | /'
    fi

    # 3. the second command, as root: every test this root can run
    log=$d/test.log
    t0=$SECONDS
    in_root 3600 root './build.sh test' >"$log" 2>&1
    rc=$?
    line=$(tail -n 1 "$log")
    if [ $rc -eq 0 ] && [[ $line =~ ^[0-9]+\ passed,\ 0\ failed ]]; then
        report "PASS fresh:$v:test: $((SECONDS - t0)) s; $line"
    else
        report "FAIL fresh:$v:test: exit status $rc$([ $rc -eq 124 ] && echo ' (timed out)'), last line \"$line\" (log: $log)"
        sed -n '/^== failures/,$p' "$log" | head -n 20 | sed 's/^/    | /'
    fi

    # 4. the user again, now that root has installed the packages
    log=$d/user_after.log
    t0=$SECONDS
    in_root 1200 dt './build.sh demo' >"$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && [ -n "$(demo_verdict "$log")" ]; then
        report "PASS fresh:$v:user_demo: $((SECONDS - t0)) s"
    else
        report "FAIL fresh:$v:user_demo: exit status $rc (log: $log)"
        tail -n 15 "$log" | sed 's/^/    | /'
    fi

    unmount_all
    if [ $nfail -eq $failed ]; then
        remove_tree "$R"
    else
        note "$v: the root stays in $R for a look"
    fi
    R=
}

for v in "${VARIANTS[@]}"; do run_variant "$v"; done
finish
