// np: 4
/* bench/zero.c - data parallel and ZeRO stages 0-3 of dt_parallel.h on one model, in one run:
   memory per rank beside the stage's formula, and how much collective time hides behind
   compute, two ways: from the timeline (dt_trace_overlap: the part of each collective's
   post-to-completion span under a compute span) and from the clock (exposed = step time -
   compute time, the time the step spends waiting for the network). The peers are the same
   stage without its overlap: stage 0 with one bucket for the whole model (launched after the
   backward) against a bucket per unit, stage 3 without prefetch against with it.

       mpirun --oversubscribe -np 4 build/bench/zero            (./build.sh bench runs it)

   The model: U = 6 units, each a [H, H] linear layer (H = 384) with its bias and a ReLU, a
   batch of 64 rows per rank, f32, AdamW. Compute spans wrap only the matmuls of each unit's
   forward and backward, never a call that waits. Open MPI without a progress thread moves
   dt's posted collectives only inside dt calls (dt_comm_test in grad_ready, the waits), so the
   timeline's overlap is an upper bound of what the wire overlapped; "exposed" is what it cost. */
#define _POSIX_C_SOURCE 200809L
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "bench.h"

#define U 6
#define H 384
#define B 64
#define STEPS 6

static dt_ctx C;
static dt_comm *world;
static int R, NW;

static void die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", R, what, dt_ctx_error(&C));
    exit(1);
}
#define OK(x) do { if ((x) != DT_OK) die(#x); } while (0)

static void t2(dt_tensor *t, int64_t a, int64_t b) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = a;
    d.shape[1] = b;
    OK(dt_tensor_create(&C, t, &d));
}

typedef struct result {
    double step_ms, compute_ms, comm_ms, over_ms;
    dt_zero_memory mem;
    char formula[96]; /* mem.formula points into the dt_zero, freed at the end of run() */
} result;

static result run(int stage, int64_t bucket_bytes, int prefetch) {
    dt_params ps;
    dt_arena *a;
    dt_layout *l;
    dt_zero *z;
    dt_trace *tr;
    dt_zero_desc zd;
    dt_arena_desc ad;
    dt_tensor x[U + 1], h[U], dx, dh;
    int units[2 * U], u, s, i;
    double steps[STEPS], comp[STEPS], c0 = 0, o0 = 0, c1, o1;
    result res;
    memset(&ps, 0, sizeof ps);
    for (i = 0; i < 2 * U; i++) {
        dt_param_desc d;
        char nm[16];
        memset(&d, 0, sizeof d);
        snprintf(nm, sizeof nm, "l%d.%s", i / 2, i % 2 ? "b" : "w");
        d.name = nm;
        d.shape[0] = H;
        d.shape[1] = i % 2 ? 0 : H;
        d.init.kind = i % 2 ? DT_INIT_ZEROS : DT_INIT_SCALED_NORMAL;
        d.init.seed = 1;
        OK(dt_params_add(&C, &ps, NULL, &d));
        units[i] = i / 2;
    }
    memset(&ad, 0, sizeof ad);
    ad.units = units;
    OK(dt_arena_create(&C, &a, &ps, &ad));
    OK(dt_layout_create(world, &l, NULL));
    memset(&zd, 0, sizeof zd);
    zd.stage = stage;
    zd.bucket_bytes = bucket_bytes;
    zd.prefetch = prefetch;
    zd.opt.kind = DT_OPT_ADAMW;
    OK(dt_zero_create(l, &z, a, &zd));
    for (u = 0; u <= U; u++) t2(&x[u], B, H);
    for (u = 0; u < U; u++) t2(&h[u], B, H);
    t2(&dx, B, H);
    t2(&dh, B, H);
    for (i = 0; i < B * H; i++) ((float *)x[0].data)[i] = dt_rng_normal(3, (uint64_t)R, (uint64_t)i);
    OK(dt_trace_create(world, &tr));
    OK(dt_trace_attach(tr, l->dp_comm));
    for (s = 0; s < STEPS; s++) {
        double t0, compute = 0, q;
        OK(dt_comm_barrier(world));
        if (s == 1) OK(dt_trace_overlap(tr, &c0, &o0)); /* step 0 warms up */
        t0 = now_s();
        for (u = 0; u < U; u++) {
            dt_param *w = ps.items[2 * u], *b;
            OK(dt_zero_gather(z, u));
            w = ps.items[2 * u];
            b = ps.items[2 * u + 1];
            q = now_s();
            dt_trace_begin(tr, "forward");
            OK(dt_linear_fwd(&C, &h[u], &x[u], &w->value, &b->value));
            OK(dt_relu_fwd(&C, &x[u + 1], &h[u]));
            dt_trace_end(tr);
            compute += now_s() - q;
            OK(dt_zero_release(z, u));
        }
        OK(dt_tensor_fill(&C, &dx, 1.0 / B));
        OK(dt_zero_backward_begin(z));
        for (u = U - 1; u >= 0; u--) {
            dt_param *w, *b;
            OK(dt_zero_gather(z, u));
            w = ps.items[2 * u];
            b = ps.items[2 * u + 1];
            q = now_s();
            dt_trace_begin(tr, "backward");
            OK(dt_tensor_fill(&C, &dh, 0));
            OK(dt_relu_bwd(&C, &dh, &dx, &h[u]));
            OK(dt_tensor_fill(&C, &dx, 0));
            OK(dt_linear_bwd(&C, &dx, &w->grad, &b->grad, &dh, &x[u], &w->value));
            dt_trace_end(tr);
            compute += now_s() - q;
            OK(dt_zero_grad_ready(z, u));
            OK(dt_zero_release(z, u));
        }
        OK(dt_zero_step(z, NULL));
        steps[s] = now_s() - t0;
        comp[s] = compute;
    }
    OK(dt_trace_overlap(tr, &c1, &o1));
    OK(dt_zero_memory_get(z, &res.mem));
    snprintf(res.formula, sizeof res.formula, "%s", res.mem.formula);
    res.mem.formula = res.formula;
    res.step_ms = 1e3 * median(steps + 1, STEPS - 1);
    res.compute_ms = 1e3 * median(comp + 1, STEPS - 1);
    res.comm_ms = 1e3 * (c1 - c0) / (STEPS - 1);
    res.over_ms = 1e3 * (o1 - o0) / (STEPS - 1);
    dt_trace_free(tr);
    for (u = 0; u <= U; u++) dt_tensor_free(&C, &x[u]);
    for (u = 0; u < U; u++) dt_tensor_free(&C, &h[u]);
    dt_tensor_free(&C, &dx);
    dt_tensor_free(&C, &dh);
    dt_zero_free(z);
    dt_layout_free(l);
    dt_arena_free(a);
    dt_params_free(&C, &ps);
    return res;
}

int main(void) {
    static const struct { int stage; int64_t bucket; int prefetch; const char *what; } V[] = {
        {0, (int64_t)1 << 30, 0, "DDP, one bucket"},
        {0, (int64_t)(H * H + H) * 4, 0, "DDP, bucket/unit"},
        {1, 0, 0, "ZeRO-1"},
        {2, 0, 0, "ZeRO-2"},
        {3, 0, -1, "ZeRO-3, no prefetch"},
        {3, 0, 0, "ZeRO-3, prefetch"},
    };
    result r[6];
    int v;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) die("dt_comm_create_world");
    R = dt_comm_rank(world);
    NW = dt_comm_size(world);
    for (v = 0; v < 6; v++) {
        r[v] = run(V[v].stage, V[v].bucket, V[v].prefetch);
        r[v].mem.formula = r[v].formula; /* the struct moved */
    }
    if (R == 0) {
        printf("bench/zero: %d ranks (dp), %d units of [%d, %d] + bias, batch %d rows per rank, f32, AdamW; rank 0's "
               "medians of %d steps\n", NW, U, H, H, B, STEPS - 1);
        printf("(comm ms: the sum of the collectives' post-to-completion spans, which run concurrently, so it can "
               "exceed the step)\n");
        printf("%-21s %8s %8s %8s %9s %8s %9s %9s %15s  %s\n", "variant", "step ms", "comp ms", "exposed", "comm ms",
               "overlap", "held MB", "peak MB", "formula", "formula MB");
        for (v = 0; v < 6; v++)
            printf("%-21s %8.2f %8.2f %8.2f %9.2f %7.0f%% %9.3f %9.3f %15s  %.3f (held/formula %.3f)\n", V[v].what,
                   r[v].step_ms, r[v].compute_ms, r[v].step_ms - r[v].compute_ms, r[v].comm_ms,
                   r[v].comm_ms > 0 ? 100 * r[v].over_ms / r[v].comm_ms : 0, r[v].mem.total_bytes / 1e6,
                   r[v].mem.peak_bytes / 1e6, r[v].mem.formula, r[v].mem.formula_bytes / 1e6,
                   r[v].mem.total_bytes / r[v].mem.formula_bytes);
        printf("ratio: exposed time of DDP bucket/unit vs one bucket %.2fx, ZeRO-3 prefetch vs none %.2fx "
               "(< 1: the overlap pays)\n",
               (r[1].step_ms - r[1].compute_ms) / (r[0].step_ms - r[0].compute_ms),
               (r[5].step_ms - r[5].compute_ms) / (r[4].step_ms - r[4].compute_ms));
    }
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return 0;
}
