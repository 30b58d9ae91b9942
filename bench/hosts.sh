#!/usr/bin/env bash
# bench/hosts.sh - the host-aware all-reduce against the flat one across 2 hosts made as network
# namespaces with 1 gbit/s links (as root, after ./build.sh): bytes between hosts a step, step
# time and its share in collectives, 3 interleaved rounds. The machinery is tests/multihost.sh's
# (its "bench" part, which the suite never runs). DT_BENCH_MODEL="gpt flags" changes the model.
exec env DT_MULTIHOST_ONLY=bench bash "$(dirname "$0")/../tests/multihost.sh"
