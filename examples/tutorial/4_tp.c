/* examples/tutorial/4_tp.c - step 4 of the README's course: 1_single.c's model, data and seed,
   tensor parallel over all ranks (Megatron-LM): fc1 is column-parallel (rank k holds rows
   [k H/tp, (k+1) H/tp) of fc1.w and fc1.b), fc2 row-parallel (the matching columns of fc2.w;
   fc2.b whole), so the MLP needs one all-reduce forward and one backward. `4_tp --sp` adds
   sequence parallelism: the batch rows outside the two linears are split over the ranks too
   (the all-reduces become all-gather + reduce-scatter). The losses equal 1_single's within fp32
   rounding, at any number of ranks that divides H (and B, with --sp).

   build:  mpicc -std=c99 -O2 -DDT_MPI -DDT_CBLAS -I. examples/tutorial/4_tp.c -o 4_tp -lopenblas -lm
   run:    mpirun --oversubscribe -np 2 ./4_tp [--sp]     (as root: add --allow-run-as-root) */
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"
#include "../../dt_comm.h"
#include "../../dt_opt.h"
#include "../../dt_parallel.h"
#include <stdio.h>
#include <string.h>

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

/* This rank's part of a weight [rows, cols] (He init) or, cols 0, of a bias [rows] (zeros), cut
   as `kind`: its values are those of its slice of the whole tensor, as in 1_single. */
static dt_status add(dt_layout *l, dt_params *ps, dt_param **p, const char *name, dt_tp_kind kind,
                     int64_t rows, int64_t cols) {
    dt_param_desc d = { .name = name,
                        .init = { .kind = cols ? DT_INIT_SCALED_NORMAL : DT_INIT_ZEROS, .gain = 1.41421356, .seed = SEED } };
    TRY(dt_tp_param_desc(l, &d, kind, rows, cols)); /* shape, global_shape, start */
    return dt_params_add(l->ctx, ps, p, &d);
}

static dt_status tensor(dt_ctx *ctx, dt_tensor *t, dt_dtype dtype, int64_t rows, int64_t cols) {
    return dt_tensor_create(ctx, t, &(dt_tensor_desc){ .dtype = dtype, .shape = {rows, cols} });
}

typedef struct model { dt_param *w1, *b1, *w2, *b2; } model;
/* x [n, IN] and y [n]: the whole batch (n = B), or with sp this rank's rows (n = B/tp);
   xbuf [B, IN]: x's rows of every rank (sp); h, a [B, H/tp]; logits [n, C]; out_all [B, C] */
typedef struct acts { dt_tensor x, y, xbuf, h, a, logits, out_all, dlogits, da, dh; } acts;

static dt_status forward(dt_layout *l, model *m, acts *t, int sp, float *loss) {
    TRY(dt_tp_column_linear_fwd(l, &t->h, sp ? &t->xbuf : NULL, &t->x, &m->w1->value, &m->b1->value, sp));
    TRY(dt_relu_fwd(l->ctx, &t->a, &t->h)); /* elementwise: on this rank's columns, no communication */
    TRY(dt_tp_row_linear_fwd(l, &t->logits, sp ? &t->out_all : NULL, &t->a, &m->w2->value, &m->b2->value, sp));
    return dt_softmax_xent_fwd(l->ctx, loss, NULL, &t->logits, &t->logits, &t->y, -1); /* mean over n rows */
}

/* dloss: 1, or 1/tp with sp (each rank's loss is the mean over its B/tp rows). */
static dt_status backward(dt_layout *l, model *m, acts *t, int sp, float dloss) {
    TRY(dt_tensor_fill(l->ctx, &t->dlogits, 0));
    TRY(dt_tensor_fill(l->ctx, &t->da, 0));
    TRY(dt_tensor_fill(l->ctx, &t->dh, 0));
    TRY(dt_softmax_xent_bwd(l->ctx, &t->dlogits, &t->logits, &t->y, -1, dloss));
    TRY(dt_tp_row_linear_bwd(l, &t->da, &m->w2->grad, &m->b2->grad, sp ? &t->out_all : NULL, &t->dlogits, &t->a,
                             &m->w2->value, sp));
    TRY(dt_relu_bwd(l->ctx, &t->dh, &t->da, &t->h));
    TRY(dt_tp_column_linear_bwd(l, NULL, &m->w1->grad, &m->b1->grad, NULL, &t->dh, sp ? &t->xbuf : &t->x,
                                &m->w1->value, sp));
    /* with sp, fc2.b saw only this rank's rows: sum its partial gradients over tp */
    return sp ? dt_tp_allreduce(l, &m->b2->grad) : DT_OK;
}

int main(int argc, char **argv) {
    dt_ctx ctx;
    dt_comm *world = NULL;
    dt_layout *l;
    dt_params ps = {0};
    dt_optimizer *opt;
    model m;
    acts t = {0};
    int rank = 0, sp = argc > 1 && !strcmp(argv[1], "--sp");
    if (argc > 1 + sp) { fprintf(stderr, "4_tp takes one optional argument, --sp; got '%s'\n", argv[1 + sp]); return 2; }
    if (dt_ctx_init(&ctx, NULL)) return 1;
    CHECK(dt_comm_create_world(&ctx, &world, NULL));
    rank = dt_comm_rank(world);
    CHECK(dt_layout_create(world, &l, &(dt_layout_desc){ .tp = dt_comm_size(world) }));
    CHECK(add(l, &ps, &m.w1, "fc1.w", DT_TP_COLUMN, H, IN));
    CHECK(add(l, &ps, &m.b1, "fc1.b", DT_TP_COLUMN, H, 0));
    CHECK(add(l, &ps, &m.w2, "fc2.w", DT_TP_ROW, C, H));
    CHECK(add(l, &ps, &m.b2, "fc2.b", DT_TP_REPLICATED, C, 0));
    /* clipping needs the norm of the whole model: the sharded parameters' squares are summed over
       norm.shard_comm, the replicated fc2.b counted once */
    CHECK(dt_opt_create(&ctx, &opt, &ps, &(dt_opt_desc){ .kind = DT_OPT_SGD, .lr = LR, .clip_norm = 1.0,
                        .comm = world, .norm = { .shard_comm = l->tp_comm } }));
    int64_t n = sp ? B / l->tp : B, first = sp ? l->tp_rank * n : 0, hl = m.w1->value.shape[0]; /* H/tp */
    CHECK(tensor(&ctx, &t.x, DT_F32, n, IN));
    CHECK(tensor(&ctx, &t.y, DT_I32, n, 0));
    CHECK(tensor(&ctx, &t.xbuf, DT_F32, B, IN));
    CHECK(tensor(&ctx, &t.h, DT_F32, B, hl));
    CHECK(tensor(&ctx, &t.a, DT_F32, B, hl));
    CHECK(tensor(&ctx, &t.da, DT_F32, B, hl));
    CHECK(tensor(&ctx, &t.dh, DT_F32, B, hl));
    CHECK(tensor(&ctx, &t.logits, DT_F32, n, C));
    CHECK(tensor(&ctx, &t.dlogits, DT_F32, n, C));
    CHECK(tensor(&ctx, &t.out_all, DT_F32, B, C));
    for (int step = 1; step <= STEPS; step++) {
        float loss;
        double global;
        make_batch(&t.x, &t.y, (int64_t)(step - 1) * B + first, n);
        CHECK(forward(l, &m, &t, sp, &loss));
        dt_params_zero_grad(&ctx, &ps);
        CHECK(backward(l, &m, &t, sp, sp ? 1.0f / (float)l->tp : 1.0f));
        CHECK(dt_opt_step(opt, NULL));
        global = sp ? loss / l->tp : loss; /* sp: the mean of the ranks' losses; else the same on all */
        if (sp) CHECK(dt_comm_allreduce_f64(l->tp_comm, &global, 1, DT_REDUCE_SUM));
        if (rank == 0) printf("step %2d loss %.9g\n", step, global);
    }
    dt_tensor *all[] = {&t.x, &t.y, &t.xbuf, &t.h, &t.a, &t.logits, &t.out_all, &t.dlogits, &t.da, &t.dh};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dt_tensor_free(&ctx, all[i]);
    dt_opt_free(opt);
    dt_params_free(&ctx, &ps);
    dt_layout_free(l);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return 0;
}
