// np: 4
/* bench/a2a.c - the all-to-all across hosts: dt's two-level exchange (dt_comm.h, "Across hosts")
   against its flat one and raw MPI_Alltoallv, in one run, from 16-byte to 1 MB blocks.

   Each rep (interleaved: flat, two levels, raw) is one dt_comm_alltoallv of equal blocks, as an
   embedding exchange with balanced ids, timed from a barrier to the slowest rank's return;
   medians of the reps. The last column is what dt's auto setting (desc.hier 0) takes at that
   size (two levels up to DT_COMM_A2A_HIER_MAX_BYTES a block, and at every size from
   DT_COMM_A2A_HIER_RANKS ranks a host). The hosts are the ranks' host
   names; on one machine with a single host name they are modelled (DT_BENCH_HOST_SIZE ranks a
   host, default 2), which measures the cost of the extra step in shared memory, not a network.

       mpirun --oversubscribe -np 4 build/bench/a2a           (./build.sh bench runs it)
       bash bench/hosts.sh a2a                                  (2 namespaced hosts, 1 gbit/s) */
#define _POSIX_C_SOURCE 200809L
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

#define REPS_MAX 200

static dt_ctx ctx;

static void die(const char *what) {
    fprintf(stderr, "bench/a2a: %s: %s\n", what, dt_ctx_error(&ctx));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* One timed call: 0 flat, 1 two levels, 2 raw MPI_Alltoallv; the slowest rank's seconds. */
static double once(dt_comm *w, int how, dt_tensor *out, const dt_tensor *in, const int64_t *counts, int *ic, int *id) {
    double t0, t, tmax;
    int n = dt_comm_size(w);
    MPI_Barrier(MPI_COMM_WORLD);
    t0 = now_s();
    if (how == 2) {
        if (MPI_Alltoallv(in->data, ic, id, MPI_FLOAT, out->data, ic, id, MPI_FLOAT, MPI_COMM_WORLD) != MPI_SUCCESS)
            die("MPI_Alltoallv");
    } else {
        if (dt_comm_set_hier(w, how ? 1 : -1) || dt_comm_alltoallv(w, out, counts, in, counts)) die("dt_comm_alltoallv");
    }
    t = now_s() - t0;
    MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    (void)n;
    return tmax;
}

int main(void) {
    dt_comm_desc d;
    dt_comm *w = NULL;
    int R, N, hs = 0, k, how, L, H;
    const char *env = getenv("DT_BENCH_HOST_SIZE");
    static const int64_t blocks[] = {16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576};
    dt_ctx_init(&ctx, NULL);
    memset(&d, 0, sizeof d);
    if (dt_comm_create_world(&ctx, &w, &d)) die("dt_comm_create_world");
    R = dt_comm_rank(w);
    N = dt_comm_size(w);
    if (env) hs = atoi(env);
    else if (dt_comm_hosts(w) < 2) hs = 2; /* one host name: model hosts of 2 ranks */
    if (hs) {
        dt_comm_free(w);
        d.host_size = hs;
        if (dt_comm_create_world(&ctx, &w, &d)) die("dt_comm_create_world with host_size");
    }
    H = dt_comm_hosts(w);
    L = dt_comm_ranks_per_host(w);
    if (R == 0) {
        printf("bench/a2a: alltoallv of equal blocks over %d ranks, %d hosts x %d ranks (%s), medians, the slowest "
               "rank's time\n", N, H, L, hs ? "modelled: one machine" : "by host name");
        if (H < 2 || L < 2)
            printf("  the two-level path needs >= 2 hosts with the same number (>= 2) of ranks on each: nothing to "
                   "compare\n");
        else
            printf("  %10s %8s %12s %12s %12s %9s %9s  %s\n", "block B", "reps", "flat us", "two-lvl us", "raw MPI us",
                   "two/flat", "flat/raw", "auto takes");
    }
    for (k = 0; H >= 2 && L >= 2 && k < (int)(sizeof blocks / sizeof blocks[0]); k++) {
        int64_t m = blocks[k] / 4, counts[256], i;
        int ic[256], id[256], reps = 0, r;
        double t[3][REPS_MAX], spent = 0, med[3];
        dt_tensor in, out;
        dt_tensor_desc td;
        if (N > 256) die("more than 256 ranks");
        memset(&td, 0, sizeof td);
        td.dtype = DT_F32;
        td.ndim = 1;
        td.shape[0] = m * N;
        if (dt_tensor_create(&ctx, &in, &td) || dt_tensor_create(&ctx, &out, &td)) die("dt_tensor_create");
        for (i = 0; i < m * N; i++) ((float *)in.data)[i] = (float)(R * 1000 + i % 1000);
        for (r = 0; r < N; r++) {
            counts[r] = m;
            ic[r] = (int)m;
            id[r] = (int)(r * m);
        }
        for (how = 0; how < 3; how++) (void)once(w, how, &out, &in, counts, ic, id); /* warm up */
        while (reps < REPS_MAX && (reps < 7 || spent < 1.5)) {
            for (how = 0; how < 3; how++) {
                t[how][reps] = once(w, how, &out, &in, counts, ic, id);
                spent += t[how][reps];
            }
            reps++;
            MPI_Bcast(&spent, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); /* every rank the same number of reps */
        }
        for (how = 0; how < 3; how++) med[how] = median(t[how], reps);
        if (R == 0)
            printf("  %10lld %8d %12.1f %12.1f %12.1f %8.2fx %8.2fx  %s\n", (long long)blocks[k], reps, med[0] * 1e6,
                   med[1] * 1e6, med[2] * 1e6, med[1] / med[0], med[0] / med[2],
                   blocks[k] <= DT_COMM_A2A_HIER_MAX_BYTES || L >= DT_COMM_A2A_HIER_RANKS ? "two levels" : "flat");
        dt_tensor_free(&ctx, &in);
        dt_tensor_free(&ctx, &out);
    }
    dt_comm_free(w);
    dt_ctx_shutdown(&ctx);
    return 0;
}
