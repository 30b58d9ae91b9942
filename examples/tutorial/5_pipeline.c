/* examples/tutorial/5_pipeline.c - step 5 of the README's course: 1_single.c's model, data and
   seed, as a pipeline over all ranks: stage 0 holds fc1 (and relu), the last stage fc2 and the
   loss. Each global batch is cut into M micro-batches; dt_pp_run executes a 1F1B schedule,
   calling forward() and backward() below and sending the activations [MB, H] forward and their
   gradients back. With one rank, one stage holds everything. The losses equal 1_single's within
   fp32 rounding (the micro-batches' gradients are summed in another order).

   build:  mpicc -std=c99 -O2 -DDT_MPI -DDT_CBLAS -I. examples/tutorial/5_pipeline.c -o 5_pipeline \
               -lopenblas -lm
   run:    mpirun --oversubscribe -np 2 ./5_pipeline     (as root: add --allow-run-as-root) */
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"
#include "../../dt_comm.h"
#include "../../dt_opt.h"
#include "../../dt_parallel.h"
#include <stdio.h>

enum { IN = 8, H = 32, C = 4, B = 32, STEPS = 20, M = 2, MB = B / M }; /* M micro-batches of MB */
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

/* What the callbacks share. A micro-batch's activations live from its forward to its backward;
   1F1B has at most min(stages, M) in flight, kept here simply one set per micro-batch. */
typedef struct stage {
    dt_layout *l;
    dt_param *w1, *b1, *w2, *b2;      /* fc1 on the first stage, fc2 on the last */
    int first, last;                  /* this stage is the first / the last */
    int64_t step;
    dt_tensor x[M], y[M], h[M], a[M], logits[M], dlogits, da, dh;
    double loss_sum;                  /* the last stage: this step's micro-batch losses */
} stage;

/* out = this stage's part of the model applied to in (the first stage reads its own data). */
static dt_status forward(void *user, int chunk, int i, dt_tensor *out, const dt_tensor *in) {
    stage *p = (stage *)user;
    dt_ctx *ctx = p->l->ctx;
    float loss;
    (void)chunk;
    make_batch(&p->x[i], &p->y[i], p->step * B + (int64_t)i * MB, MB); /* the same samples as 1_single */
    if (p->first) {
        TRY(dt_linear_fwd(ctx, &p->h[i], &p->x[i], &p->w1->value, &p->b1->value));
        TRY(dt_relu_fwd(ctx, &p->a[i], &p->h[i]));
    } else {
        TRY(dt_tensor_copy(ctx, &p->a[i], in));
    }
    if (!p->last) return dt_tensor_copy(ctx, out, &p->a[i]); /* sent to the next stage */
    TRY(dt_linear_fwd(ctx, &p->logits[i], &p->a[i], &p->w2->value, &p->b2->value));
    TRY(dt_softmax_xent_fwd(ctx, &loss, NULL, &p->logits[i], &p->logits[i], &p->y[i], -1));
    p->loss_sum += loss;
    return DT_OK;
}

/* din += d(loss)/d(in) from dout (the gradient the next stage sent), and the weight gradients. */
static dt_status backward(void *user, int chunk, int i, dt_tensor *din, const dt_tensor *dout, dt_pp_part part) {
    stage *p = (stage *)user;
    dt_ctx *ctx = p->l->ctx;
    (void)chunk; (void)part; /* 1F1B runs whole backwards (part FULL) */
    TRY(dt_tensor_fill(ctx, &p->da, 0));
    if (p->last) {
        /* each micro-batch's loss is a mean over MB rows: 1/M makes the sum the global mean */
        TRY(dt_tensor_fill(ctx, &p->dlogits, 0));
        TRY(dt_softmax_xent_bwd(ctx, &p->dlogits, &p->logits[i], &p->y[i], -1, 1.0f / M));
        TRY(dt_linear_bwd(ctx, &p->da, &p->w2->grad, &p->b2->grad, &p->dlogits, &p->a[i], &p->w2->value));
    } else {
        TRY(dt_tensor_copy(ctx, &p->da, dout));
    }
    if (!p->first) return dt_tensor_copy(ctx, din, &p->da); /* sent back to the stage before */
    TRY(dt_tensor_fill(ctx, &p->dh, 0));
    TRY(dt_relu_bwd(ctx, &p->dh, &p->da, &p->h[i]));
    return dt_linear_bwd(ctx, NULL, &p->w1->grad, &p->b1->grad, &p->dh, &p->x[i], &p->w1->value);
}

int main(int argc, char **argv) {
    dt_ctx ctx;
    dt_comm *world = NULL;
    dt_params ps = {0};
    dt_optimizer *opt;
    dt_pp_schedule *sched;
    stage p = {0};
    int rank = 0;
    if (argc > 1) { fprintf(stderr, "5_pipeline takes no arguments, got '%s'\n", argv[1]); return 2; }
    if (dt_ctx_init(&ctx, NULL)) return 1;
    CHECK(dt_comm_create_world(&ctx, &world, NULL));
    rank = dt_comm_rank(world);
    CHECK(dt_layout_create(world, &p.l, &(dt_layout_desc){ .pp = dt_comm_size(world) }));
    p.first = p.l->pp_rank == 0;
    p.last = p.l->pp_rank == p.l->pp - 1;
    if (p.first) CHECK(add(&ctx, &ps, &p.w1, "fc1.w", H, IN));
    if (p.first) CHECK(add(&ctx, &ps, &p.b1, "fc1.b", H, 0));
    if (p.last) CHECK(add(&ctx, &ps, &p.w2, "fc2.w", C, H));
    if (p.last) CHECK(add(&ctx, &ps, &p.b2, "fc2.b", C, 0));
    /* the stages hold disjoint parameters: the clipping norm sums over norm.stage_comm */
    CHECK(dt_opt_create(&ctx, &opt, &ps, &(dt_opt_desc){ .kind = DT_OPT_SGD, .lr = LR, .clip_norm = 1.0,
                        .comm = world, .norm = { .stage_comm = p.l->pp_comm } }));
    CHECK(dt_pp_schedule_create(&ctx, &sched, &(dt_pp_desc){ .kind = DT_PP_1F1B, .stages = p.l->pp, .micro = M }));
    dt_pp_model pm = { .user = &p, .forward = forward, .backward = backward, .act = { .shape = {MB, H} } };
    for (int i = 0; i < M; i++) {
        CHECK(tensor(&ctx, &p.x[i], DT_F32, MB, IN));
        CHECK(tensor(&ctx, &p.y[i], DT_I32, MB, 0));
        CHECK(tensor(&ctx, &p.h[i], DT_F32, MB, H));
        CHECK(tensor(&ctx, &p.a[i], DT_F32, MB, H));
        CHECK(tensor(&ctx, &p.logits[i], DT_F32, MB, C));
    }
    CHECK(tensor(&ctx, &p.dlogits, DT_F32, MB, C));
    CHECK(tensor(&ctx, &p.da, DT_F32, MB, H));
    CHECK(tensor(&ctx, &p.dh, DT_F32, MB, H));
    for (int step = 1; step <= STEPS; step++) {
        double global;
        p.step = step - 1;
        p.loss_sum = 0;
        dt_params_zero_grad(&ctx, &ps);
        CHECK(dt_pp_run(p.l, NULL, sched, &pm, NULL)); /* every micro-batch's forward and backward */
        CHECK(dt_opt_step(opt, NULL));
        global = p.last ? p.loss_sum / M : 0; /* only the last stage has the loss */
        CHECK(dt_comm_allreduce_f64(p.l->pp_comm, &global, 1, DT_REDUCE_SUM));
        if (rank == 0) printf("step %2d loss %.9g\n", step, global);
    }
    for (int i = 0; i < M; i++) {
        dt_tensor_free(&ctx, &p.x[i]); dt_tensor_free(&ctx, &p.y[i]); dt_tensor_free(&ctx, &p.h[i]);
        dt_tensor_free(&ctx, &p.a[i]); dt_tensor_free(&ctx, &p.logits[i]);
    }
    dt_tensor_free(&ctx, &p.dlogits); dt_tensor_free(&ctx, &p.da); dt_tensor_free(&ctx, &p.dh);
    dt_pp_schedule_free(sched);
    dt_opt_free(opt);
    dt_params_free(&ctx, &ps);
    dt_layout_free(p.l);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return 0;
}
