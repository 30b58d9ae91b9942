#!/usr/bin/env bash
# bench/hosts.sh - dt's collectives across 2 hosts made as network namespaces with 1 gbit/s links
# (as root, after ./build.sh). The machinery is tests/multihost.sh's (its "bench" parts, which
# the suite never runs).
#   bash bench/hosts.sh        the host-aware all-reduce against the flat one (gpt dp 4 over 2
#                              hosts x 2 ranks): bytes between hosts a step, step time and its
#                              share in collectives, 3 interleaved rounds; DT_BENCH_MODEL="gpt
#                              flags" changes the model
#   bash bench/hosts.sh a2a    the all-to-all: build/bench/a2a (flat, two levels, raw MPI) over
#                              2 hosts x 2 and x 4 ranks
#   bash bench/hosts.sh hidden gpt dp 4 over 2 hosts x 2 ranks with --trace at growing batches:
#                              the share of the collectives' time hidden behind compute
case "${1:-}" in
    "") exec env DT_MULTIHOST_ONLY=bench bash "$(dirname "$0")/../tests/multihost.sh" ;;
    a2a) exec env DT_MULTIHOST_ONLY=bench_a2a bash "$(dirname "$0")/../tests/multihost.sh" ;;
    hidden) exec env DT_MULTIHOST_ONLY=bench_hidden bash "$(dirname "$0")/../tests/multihost.sh" ;;
    *) echo "bench/hosts.sh: unknown part '$1' (none: the all-reduce; a2a: the all-to-all; hidden)" >&2; exit 2 ;;
esac
