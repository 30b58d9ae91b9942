/* examples/tutorial/3_zero2.c - step 3 of the README's course: 2_ddp.c at ZeRO stage 2. Each
   of the N ranks keeps the optimizer state and the gradients of 1/N of the rows of every tensor:
   a unit's gradient is reduce-scattered as soon as its backward is done, each rank updates its
   rows, and the parameters are all-gathered. That needs the full call order (below), which is
   the same at every stage: `3_zero2 3` runs stage 3 (FSDP: the parameters sharded too).

   model:  x [B, IN] -> fc1 [H, IN] -> relu -> fc2 [C, H] -> softmax cross entropy (mean over B)
   data:   sample i is a pure function of (SEED, i): x uniform in [-1, 1)^IN, the label the
           largest of C fixed random projections of x
   train:  SGD, the gradient clipped to norm 1 (so the global gradient norm matters)

   build:  mpicc -std=c99 -O2 -DDT_MPI -DDT_CBLAS -I. examples/tutorial/3_zero2.c -o 3_zero2 -lopenblas -lm
   run:    mpirun --oversubscribe -np 2 ./3_zero2    (as root: add --allow-run-as-root) */
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"
#include "../../dt_comm.h"
#include "../../dt_opt.h"
#include "../../dt_parallel.h"
#include <stdio.h>

enum { IN = 8, H = 32, C = 4, B = 32, STEPS = 20 };
#define SEED 1
#define LR 0.5
#define TRY(call) do { dt_status s_ = (call); if (s_) return s_; } while (0)
/* An error may be one rank's alone (the others would wait in their next collective until its
   timeout): dt_comm_abort ends every rank at once, with exit status 1. */
#define CHECK(call) do { if ((call) != DT_OK) { \
    fprintf(stderr, "rank %d: %s: %s\n", rank, #call, dt_ctx_error(&ctx)); dt_comm_abort(world, 1); } } while (0)

/* Samples first .. first + n - 1 into x [n, IN] and y [n]. */
static void make_batch(dt_tensor *x, dt_tensor *y, int64_t first, int64_t n) {
    float *xs = (float *)x->data;
    int32_t *ys = (int32_t *)y->data;
    for (int64_t r = 0; r < n; r++) {
        float best = -1e30f;
        for (int j = 0; j < IN; j++) xs[r * IN + j] = 2 * dt_rng_uniform(SEED, 1, (uint64_t)((first + r) * IN + j)) - 1;
        for (int k = 0; k < C; k++) {
            float s = 0;
            for (int j = 0; j < IN; j++) s += dt_rng_normal(SEED, 2, (uint64_t)(k * IN + j)) * xs[r * IN + j];
            if (s > best) { best = s; ys[r] = k; }
        }
    }
}

/* A weight [rows, cols] (He init) or, cols 0, a bias [rows] (zeros). Its values depend only on
   (SEED, name, element index). */
static dt_status add(dt_ctx *ctx, dt_params *ps, dt_param **p, const char *name, int64_t rows, int64_t cols) {
    dt_param_desc d = { .name = name, .shape = {rows, cols},
                        .init = { .kind = cols ? DT_INIT_SCALED_NORMAL : DT_INIT_ZEROS, .gain = 1.41421356, .seed = SEED } };
    return dt_params_add(ctx, ps, p, &d);
}

static dt_status tensor(dt_ctx *ctx, dt_tensor *t, dt_dtype dtype, int64_t rows, int64_t cols) {
    return dt_tensor_create(ctx, t, &(dt_tensor_desc){ .dtype = dtype, .shape = {rows, cols} });
}

typedef struct model { dt_param *w1, *b1, *w2, *b2; } model;
typedef struct acts { dt_tensor x, y, h, a, logits, dlogits, da, dh; } acts;

/* The call order dt_zero expects, at every stage (a call a stage does not need is a no-op):
     forward:   for each unit u = 0 .. U-1:  gather(u); forward of u; release(u)
     backward:  backward_begin; for u = U-1 .. 0:  gather(u); backward of u; grad_ready(u); release(u)
     then:      dt_zero_step
   Stage 3 holds only its rows between gather and release; stage 2 makes a unit's full-size
   gradient at its gather (after backward_begin) and reduce-scatters it at grad_ready. */
static dt_status forward(dt_ctx *ctx, dt_zero *z, model *m, acts *t, float *loss) {
    TRY(dt_zero_gather(z, 0));
    TRY(dt_linear_fwd(ctx, &t->h, &t->x, &m->w1->value, &m->b1->value));
    TRY(dt_relu_fwd(ctx, &t->a, &t->h));
    TRY(dt_zero_release(z, 0));
    TRY(dt_zero_gather(z, 1));
    TRY(dt_linear_fwd(ctx, &t->logits, &t->a, &m->w2->value, &m->b2->value));
    TRY(dt_zero_release(z, 1));
    return dt_softmax_xent_fwd(ctx, loss, NULL, &t->logits, &t->logits, &t->y, -1); /* probs in place */
}

/* The *_bwd ops accumulate (+=): the activation grads are zeroed first. */
static dt_status backward(dt_ctx *ctx, dt_zero *z, model *m, acts *t) {
    TRY(dt_tensor_fill(ctx, &t->dlogits, 0));
    TRY(dt_tensor_fill(ctx, &t->da, 0));
    TRY(dt_tensor_fill(ctx, &t->dh, 0));
    TRY(dt_zero_backward_begin(z));
    TRY(dt_zero_gather(z, 1));
    TRY(dt_softmax_xent_bwd(ctx, &t->dlogits, &t->logits, &t->y, -1, 1.0f));
    TRY(dt_linear_bwd(ctx, &t->da, &m->w2->grad, &m->b2->grad, &t->dlogits, &t->a, &m->w2->value));
    TRY(dt_zero_grad_ready(z, 1));
    TRY(dt_zero_release(z, 1));
    TRY(dt_zero_gather(z, 0));
    TRY(dt_relu_bwd(ctx, &t->dh, &t->da, &t->h));
    TRY(dt_linear_bwd(ctx, NULL, &m->w1->grad, &m->b1->grad, &t->dh, &t->x, &m->w1->value));
    TRY(dt_zero_grad_ready(z, 0));
    return dt_zero_release(z, 0);
}

int main(int argc, char **argv) {
    dt_ctx ctx;
    dt_comm *world = NULL;
    dt_layout *l;
    dt_params ps = {0};
    dt_arena *arena;
    dt_zero *z;
    model m;
    acts t = {0};
    int rank = 0, units[4] = {0, 0, 1, 1}; /* fc1.w, fc1.b: unit 0; fc2.w, fc2.b: unit 1 */
    int64_t first, n;
    int stage = argc > 1 ? argv[1][0] - '0' : 2; /* 0..3 */
    if (argc > 2 || stage < 0 || stage > 3 || (argc > 1 && argv[1][1])) {
        fprintf(stderr, "3_zero2 takes one optional argument, the ZeRO stage 0..3 (default 2); got '%s'\n", argv[argc - 1]);
        return 2;
    }
    if (dt_ctx_init(&ctx, NULL)) return 1;
    CHECK(dt_comm_create_world(&ctx, &world, NULL)); /* MPI_Init under mpirun */
    rank = dt_comm_rank(world);
    CHECK(dt_layout_create(world, &l, &(dt_layout_desc){0})); /* dp = the world size */
    CHECK(add(&ctx, &ps, &m.w1, "fc1.w", H, IN));
    CHECK(add(&ctx, &ps, &m.b1, "fc1.b", H, 0));
    CHECK(add(&ctx, &ps, &m.w2, "fc2.w", C, H));
    CHECK(add(&ctx, &ps, &m.b2, "fc2.b", C, 0));
    /* the parameters move into one flat buffer (grads in another), grouped into units */
    CHECK(dt_arena_create(&ctx, &arena, &ps, &(dt_arena_desc){ .units = units }));
    /* the optimizer lives inside; its comms (norm.shard_comm: dp) are filled in from the layout */
    CHECK(dt_zero_create(l, &z, arena, &(dt_zero_desc){ .stage = stage,
                         .opt = { .kind = DT_OPT_SGD, .lr = LR, .clip_norm = 1.0 } }));
    CHECK(dt_layout_batch_range(l, B, &first, &n)); /* this rank's samples of a global batch */
    CHECK(tensor(&ctx, &t.x, DT_F32, n, IN));
    CHECK(tensor(&ctx, &t.y, DT_I32, n, 0));
    CHECK(tensor(&ctx, &t.h, DT_F32, n, H));
    CHECK(tensor(&ctx, &t.a, DT_F32, n, H));
    CHECK(tensor(&ctx, &t.da, DT_F32, n, H));
    CHECK(tensor(&ctx, &t.dh, DT_F32, n, H));
    CHECK(tensor(&ctx, &t.logits, DT_F32, n, C));
    CHECK(tensor(&ctx, &t.dlogits, DT_F32, n, C));
    for (int step = 1; step <= STEPS; step++) {
        float loss;
        double global;
        make_batch(&t.x, &t.y, (int64_t)(step - 1) * B + first, n);
        CHECK(forward(&ctx, z, &m, &t, &loss));     /* the mean over this rank's n samples */
        CHECK(backward(&ctx, z, &m, &t));
        CHECK(dt_zero_step(z, NULL));            /* finish the syncs, step, all-gather, zero grads */
        global = loss;                           /* the global batch's loss: the mean of the ranks' */
        CHECK(dt_comm_allreduce_f64(l->dp_comm, &global, 1, DT_REDUCE_SUM));
        if (rank == 0) printf("step %2d loss %.9g\n", step, global / l->dp);
    }
    dt_tensor *all[] = {&t.x, &t.y, &t.h, &t.a, &t.logits, &t.dlogits, &t.da, &t.dh};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dt_tensor_free(&ctx, all[i]);
    dt_zero_free(z);
    dt_params_free(&ctx, &ps);
    dt_arena_free(arena);
    dt_layout_free(l);
    dt_comm_free(world); /* MPI is finalized at exit */
    dt_ctx_shutdown(&ctx);
    return 0;
}
