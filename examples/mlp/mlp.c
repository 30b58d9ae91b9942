/* examples/mlp/mlp.c - first steps with dt: a 3-layer MLP classifier trained with SGD on
   built-in synthetic data whose labels come from a fixed random "teacher" network (a real
   non-linear function, so the accuracy says whether it was learnt), on one rank or many.

   run:   build/examples/mlp --steps 1000 --batch 64          (built by ./build.sh)
          mpirun -np 4 build/examples/mlp --steps 1000 --batch 64
   flags: --steps N --batch B --seed S --lr LR --hidden H --log metrics.jsonl --device cpu|cuda
          (a bad one is named with its value and what it wants, exit 2)

   --device cuda (a build with -DDT_CUDA, linked with the objects of kernels/): the parameters,
   activations and grads live on the GPU and every op runs there; the batch is made on the host
   and copied over each step, and the probabilities come back for the accuracy. The losses are
   the CPU run's within fp32 rounding (tests/cuda_emu/k_mlp.cpp runs this on the CPU emulator).

   Samples and initial weights are pure functions of the seed, so every rank starts from the
   same model and makes exactly its slice of each global batch. The bucketer averages each
   layer's grads over the ranks as soon as backward is done with it; every rank then takes the
   same SGD step, matching the 1-rank run within fp32 rounding (tests/mpi_mlp_dp.c). */
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"
#include "../../dt_comm.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <errno.h>

#ifndef MLP_EVAL_N
#define MLP_EVAL_N 1024 /* held-out samples; tests/cuda_emu/k_mlp.cpp takes fewer (emulated grids stay small) */
#endif
enum { IN = 16, CLASSES = 4, TEACHER_H = 8, EVAL_N = MLP_EVAL_N };
#define EVAL_BASE ((uint64_t)1 << 40) /* eval samples never overlap training ones */
typedef struct { int steps, batch, hidden; uint64_t seed; float lr; const char *log; int quiet; } opts;
/* dt_comm_abort, not exit: an error one rank alone sees ends every rank now, not at the others'
   next collective's timeout */
#define CHECK(call) do { dt_status s_ = (call); if (s_) { \
    fprintf(stderr, "mlp: %s failed: %s\n", #call, dt_ctx_error(ctx)); dt_comm_abort(NULL, 1); } } while (0)

typedef struct { dt_param *w1, *b1, *w2, *b2, *w3, *b3; } model; /* fc1 -> relu -> fc2 -> relu -> fc3 */
typedef struct { dt_tensor x, h1, a1, h2, a2, logits, probs, y, dh1, da1, dh2, da2, dlogits;
                 dt_tensor hx, hy, hp; /* host sides of x, y, probs: the same tensors on the cpu */
               } acts;

static dt_param *add(dt_ctx *ctx, dt_params *ps, const char *name, int64_t d0, int64_t d1, uint64_t seed) {
    dt_param_desc d;
    dt_param *p;
    memset(&d, 0, sizeof d); /* not = {0}: this file also builds as C++ (the emulator's CUDA build) */
    d.name = name; d.shape[0] = d0; d.shape[1] = d1;
    d.init.kind = d1 ? DT_INIT_SCALED_NORMAL : DT_INIT_ZEROS; /* biases start at zero */
    d.init.gain = 1.41421356; /* He init for ReLU: std = sqrt(2 / fan_in) */
    d.init.seed = seed; d.no_decay = d1 == 0;
    CHECK(dt_params_add(ctx, ps, &p, &d));
    return p;
}

/* samples first .. first + n - 1 into x and y (made in hx, hy, then copied to the device): x ~
   U[-1,1)^IN, y = the argmax of a random 2-layer ReLU "teacher" whose weights are fixed by the seed */
static void load_batch(dt_ctx *ctx, acts *a, uint64_t seed, uint64_t first, int n) {
    int r, j, k;
    for (r = 0; r < n; r++) {
        uint64_t i = first + (uint64_t)r;
        float *x = (float *)a->hx.data + r * IN, h[TEACHER_H], best = -1e30f;
        int32_t *y = (int32_t *)a->hy.data + r;
        for (j = 0; j < IN; j++) x[j] = 2.0f * dt_rng_uniform(seed, 1, i * IN + j) - 1.0f;
        for (k = 0; k < TEACHER_H; k++) {
            float s = 0;
            for (j = 0; j < IN; j++) s += dt_rng_normal(seed, 2, (uint64_t)(k * IN + j)) * x[j];
            h[k] = s > 0 ? s : 0;
        }
        for (*y = 0, k = 0; k < CLASSES; k++) {
            float s = 0;
            for (j = 0; j < TEACHER_H; j++) s += dt_rng_normal(seed, 3, (uint64_t)(k * TEACHER_H + j)) * h[j];
            if (s > best) { best = s; *y = k; }
        }
    }
    if (a->x.device == DT_CUDA_DEVICE) { CHECK(dt_tensor_copy(ctx, &a->x, &a->hx)); CHECK(dt_tensor_copy(ctx, &a->y, &a->hy)); }
}

/* forward to the loss (mean over these rows); returns how many rows were classified right */
static int64_t forward(dt_ctx *ctx, model *m, acts *a, float *loss) {
    int64_t r, k, n = a->x.shape[0], correct = 0;
    CHECK(dt_linear_fwd(ctx, &a->h1, &a->x, &m->w1->value, &m->b1->value));
    CHECK(dt_relu_fwd(ctx, &a->a1, &a->h1));
    CHECK(dt_linear_fwd(ctx, &a->h2, &a->a1, &m->w2->value, &m->b2->value));
    CHECK(dt_relu_fwd(ctx, &a->a2, &a->h2));
    CHECK(dt_linear_fwd(ctx, &a->logits, &a->a2, &m->w3->value, &m->b3->value));
    CHECK(dt_softmax_xent_fwd(ctx, loss, NULL, &a->probs, &a->logits, &a->y, -1));
    if (a->probs.device == DT_CUDA_DEVICE) CHECK(dt_tensor_copy(ctx, &a->hp, &a->probs));
    for (r = 0; r < n; r++) {
        const float *p = (const float *)a->hp.data + r * CLASSES;
        int best = 0;
        for (k = 1; k < CLASSES; k++) if (p[k] > p[best]) best = (int)k;
        correct += best == ((int32_t *)a->hy.data)[r];
    }
    return correct;
}

/* backward: every *_bwd accumulates, so the activation grads are zeroed first. A layer's
   grads are final, and marked ready for the bucketer, as soon as its linear_bwd returns. */
static void backward(dt_ctx *ctx, model *m, acts *a, float dloss, dt_bucketer *bk) {
    dt_tensor *g[5] = {&a->dh1, &a->da1, &a->dh2, &a->da2, &a->dlogits};
    int i;
    for (i = 0; i < 5; i++) dt_tensor_fill(ctx, g[i], 0.0);
    CHECK(dt_softmax_xent_bwd(ctx, &a->dlogits, &a->probs, &a->y, -1, dloss));
    CHECK(dt_linear_bwd(ctx, &a->da2, &m->w3->grad, &m->b3->grad, &a->dlogits, &a->a2, &m->w3->value));
    CHECK(dt_bucketer_mark_ready(bk, m->w3)); CHECK(dt_bucketer_mark_ready(bk, m->b3));
    CHECK(dt_relu_bwd(ctx, &a->dh2, &a->da2, &a->h2));
    CHECK(dt_linear_bwd(ctx, &a->da1, &m->w2->grad, &m->b2->grad, &a->dh2, &a->a1, &m->w2->value));
    CHECK(dt_bucketer_mark_ready(bk, m->w2)); CHECK(dt_bucketer_mark_ready(bk, m->b2));
    CHECK(dt_relu_bwd(ctx, &a->dh1, &a->da1, &a->h1));
    CHECK(dt_linear_bwd(ctx, NULL, &m->w1->grad, &m->b1->grad, &a->dh1, &a->x, &m->w1->value));
    CHECK(dt_bucketer_mark_ready(bk, m->w1)); CHECK(dt_bucketer_mark_ready(bk, m->b1));
}

/* n > 0: creates n rows of each ([n, cols] f32 activations and grads, [n] i32 labels) on the
   ctx's device, and on cuda the host sides hx, hy, hp; 0 frees */
static void acts_make(dt_ctx *ctx, acts *a, int n, int h) {
    dt_tensor *t[16] = {&a->x, &a->h1, &a->a1, &a->h2, &a->a2, &a->logits, &a->probs, &a->y,
                        &a->dh1, &a->da1, &a->dh2, &a->da2, &a->dlogits, &a->hx, &a->hy, &a->hp};
    int64_t cols[16] = {IN, h, h, h, h, CLASSES, CLASSES, 0, h, h, h, h, CLASSES, IN, 0, CLASSES};
    int i, cuda = ctx->device == DT_CUDA_DEVICE;
    for (i = 0; i < (cuda ? 16 : 13); i++) {
        dt_tensor_desc d;
        memset(&d, 0, sizeof d);
        d.dtype = t[i] == &a->y || t[i] == &a->hy ? DT_I32 : DT_F32; d.shape[0] = n; d.shape[1] = cols[i];
        d.device = i >= 13 ? DT_CPU : DT_DEVICE_DEFAULT;
        if (n) CHECK(dt_tensor_create(ctx, t[i], &d)); else dt_tensor_free(ctx, t[i]);
    }
    if (n && !cuda) { a->hx = a->x; a->hy = a->y; a->hp = a->probs; a->hx.owns = a->hy.owns = a->hp.owns = 0; }
}

#define NOW() ((double)clock() / CLOCKS_PER_SEC) /* CPU time: the wall time of this 1-thread loop */

/* Trains the model (made here, into ps and m) on comm, one rank or many. Rank r of n takes
   rows [off, off + nr) of each global batch. losses[s], when not NULL, receives the loss of
   global batch s + 1. Returns the eval loss on held-out samples. */
static float train(dt_ctx *ctx, dt_comm *comm, const opts *o, dt_params *ps, model *m, float *losses) {
    int rank = dt_comm_rank(comm), n = dt_comm_size(comm), step, i;
    int nr = o->batch / n + (rank < o->batch % n), off = rank * (o->batch / n) + (rank < o->batch % n ? rank : o->batch % n);
    /* softmax_xent takes the mean over this rank's nr rows and the bucketer the mean over the
       ranks; scaling by nr * n / batch makes that the mean over the global batch */
    float dloss = (float)nr * (float)n / (float)o->batch, loss = 0;
    double stats[2], t0;
    dt_bucketer *bk = NULL; dt_comm_stat cs;
    FILE *log = NULL;
    acts a, ev;
    m->w1 = add(ctx, ps, "fc1.w", o->hidden, IN, o->seed); m->b1 = add(ctx, ps, "fc1.b", o->hidden, 0, o->seed);
    m->w2 = add(ctx, ps, "fc2.w", o->hidden, o->hidden, o->seed); m->b2 = add(ctx, ps, "fc2.b", o->hidden, 0, o->seed);
    m->w3 = add(ctx, ps, "fc3.w", CLASSES, o->hidden, o->seed); m->b3 = add(ctx, ps, "fc3.b", CLASSES, 0, o->seed);
    CHECK(dt_bucketer_create(comm, &bk, ps, NULL));
    acts_make(ctx, &a, nr, o->hidden);
    if (rank == 0 && o->log && !(log = fopen(o->log, "w"))) { fprintf(stderr, "mlp: cannot write %s\n", o->log); dt_comm_abort(comm, 1); }
    if (rank == 0 && !o->quiet)
        printf("mlp: %lld params, %d steps of batch %d on %d rank%s (%d rows each%s), lr %g, seed %llu\n",
               (long long)dt_params_numel(ps), o->steps, o->batch, n, n > 1 ? "s" : "", nr, o->batch % n ? " or so" : "",
               (double)o->lr, (unsigned long long)o->seed);
    t0 = NOW();
    for (step = 1; step <= o->steps; step++) {
        load_batch(ctx, &a, o->seed, (uint64_t)(step - 1) * (uint64_t)o->batch + (uint64_t)off, nr);
        stats[1] = (double)forward(ctx, m, &a, &loss);
        dt_params_zero_grad(ctx, ps);
        backward(ctx, m, &a, dloss, bk);
        CHECK(dt_bucketer_finish(bk)); /* every rank now holds the global-batch gradient */
        for (i = 0; i < ps->count; i++) CHECK(dt_axpy(ctx, &ps->items[i]->value, -o->lr, &ps->items[i]->grad)); /* SGD */
        stats[0] = (double)loss * nr; /* global loss and accuracy: sums over the ranks' rows */
        CHECK(dt_comm_allreduce_f64(comm, stats, 2, DT_REDUCE_SUM));
        if (losses) losses[step - 1] = (float)(stats[0] / o->batch);
        if (rank == 0 && !o->quiet && (step % 50 == 0 || step == o->steps)) {
            double el = NOW() - t0, sps = (double)step * o->batch / (el > 0 ? el : 1e-9);
            printf("step %4d/%d  loss %.4f  acc %.3f  %.0f samples/s  eta %.1fs\n", step, o->steps,
                   stats[0] / o->batch, stats[1] / o->batch, sps, (o->steps - step) * o->batch / sps);
            if (log && dt_comm_stats(comm, &cs, DT_COLL_ALLREDUCE) == DT_OK) /* cs.seconds: in all-reduces */
                fprintf(log, "{\"step\":%d,\"loss\":%.6f,\"acc\":%.4f,\"lr\":%g,\"samples_per_s\":%.1f,"
                        "\"comm_s\":%.6f}\n", step, stats[0] / o->batch, stats[1] / o->batch, (double)o->lr, sps,
                        cs.seconds);
        }
    }
    if (log) fclose(log);
    acts_make(ctx, &ev, EVAL_N, o->hidden); /* weights are the same on every rank: each evaluates */
    load_batch(ctx, &ev, o->seed, EVAL_BASE, EVAL_N);
    stats[1] = (double)forward(ctx, m, &ev, &loss);
    if (rank == 0 && !o->quiet)
        printf("eval: loss %.4f  accuracy %.3f on %d held-out samples (chance %.3f)\nfinal: loss %.9g\n",
               (double)loss, stats[1] / EVAL_N, EVAL_N, 1.0 / CLASSES, (double)loss);
    acts_make(ctx, &a, 0, 0); acts_make(ctx, &ev, 0, 0);
    dt_bucketer_free(bk);
    return loss;
}

#ifndef MLP_NO_MAIN /* tests/mpi_mlp_dp.c includes this file for train() */
#define USAGE "usage: mlp [--steps N] [--batch B>=ranks] [--hidden H] [--seed S] [--lr LR] [--log F] [--device cpu|cuda]\n"
static void bad(const char *flag, const char *v, const char *wants) {
    fprintf(stderr, "mlp: %s wants %s, got %s%s%s\n" USAGE, flag, wants, v ? "'" : "", v ? v : "nothing", v ? "'" : "");
    exit(2);
}
/* A flag's value, all of it (atoi took "12abc" as 12, "1e30" as 1), an integer unless real, in [lo, hi]. */
static double arg(const char *flag, const char *v, double lo, double hi, int real) {
    char *end = NULL, wants[96];
    double x = v ? (errno = 0, real ? strtod(v, &end) : (double)strtoll(v, &end, 10)) : 0;
    if (v && *v && !*end && errno != ERANGE && x >= lo && x <= hi) return x;
    snprintf(wants, sizeof wants, real ? "a number in [%g, %g]" : "an integer in [%.0f, %.0f]", lo, hi);
    bad(flag, v, wants);
    return 0;
}

int main(int argc, char **argv) {
    opts o = {1000, 64, 64, 1, 0.2f, NULL, 0};
    dt_ctx ctx_storage, *ctx = &ctx_storage;
    dt_ctx_desc cd;
    dt_comm *world = NULL;
    dt_params ps;
    model m;
    int i;
    dt_blas_rerun(argv); /* OpenBLAS's kernels fit the CPU: dt_tensor.h, dt_blas_note */
    memset(&cd, 0, sizeof cd);
    memset(&ps, 0, sizeof ps);
    for (i = 1; i < argc; i += 2) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { fputs(USAGE, stdout); return 0; }
        else if (!strcmp(a, "--steps")) o.steps = (int)arg(a, v, 1, 1e9, 0);
        else if (!strcmp(a, "--batch")) o.batch = (int)arg(a, v, 1, 1 << 24, 0);
        else if (!strcmp(a, "--hidden")) o.hidden = (int)arg(a, v, 1, 1 << 16, 0);
        else if (!strcmp(a, "--seed")) o.seed = (uint64_t)arg(a, v, 0, 9007199254740992.0, 0); /* 2^53: exact in a double */
        else if (!strcmp(a, "--lr")) o.lr = (float)arg(a, v, 0, 100, 1);
        else if (!strcmp(a, "--log")) { if (!v) bad(a, v, "a file"); o.log = v; }
        else if (!strcmp(a, "--device") && v && !strcmp(v, "cpu")) cd.device = DT_CPU;
        else if (!strcmp(a, "--device") && v && !strcmp(v, "cuda")) cd.device = DT_CUDA_DEVICE;
        else if (!strcmp(a, "--device")) bad(a, v, "cpu or cuda");
        else { fprintf(stderr, "mlp: unknown flag '%s'\n" USAGE, a); return 2; }
    }
    { /* one GPU per rank of a host (NCCL wants distinct devices): the launcher's local rank */
        const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
        cd.cuda_device = lr && *lr ? atoi(lr) : 0;
    }
    if (dt_ctx_init(ctx, &cd)) { fprintf(stderr, "mlp: %s\n", dt_ctx_error(ctx)); return 1; }
    CHECK(dt_comm_create_world(ctx, &world, NULL)); /* MPI_Init under mpirun; else a world of one */
    if (o.batch < dt_comm_size(world)) {
        if (dt_comm_rank(world) == 0)
            fprintf(stderr, "mlp: --batch wants a row for each of the %d ranks, got '%d'\n", dt_comm_size(world), o.batch);
        dt_comm_free(world); return 2;
    }
    train(ctx, world, &o, &ps, &m, NULL);
    dt_params_free(ctx, &ps);
    dt_comm_free(world); /* MPI is finalized at exit */
    dt_ctx_shutdown(ctx);
    return 0;
}
#endif
