/* examples/tutorial/1_single.c - step 1 of the README's course: a small MLP trained on one
   process. Steps 2-5 train this same model on the same data from the same seed on several
   processes, and print the same losses (within fp32 rounding).

   model:  x [B, IN] -> fc1 [H, IN] -> relu -> fc2 [C, H] -> softmax cross entropy (mean over B)
   data:   sample i is a pure function of (SEED, i): x uniform in [-1, 1)^IN, the label the
           largest of C fixed random projections of x
   train:  SGD, the gradient clipped to norm 1 (so the global gradient norm matters)

   build:  mpicc -std=c99 -O2 -DDT_MPI -DDT_CBLAS -I. examples/tutorial/1_single.c -o 1_single \
               -lopenblas -lm          (dt_opt.h needs dt_comm.h; no process is started here)
   run:    ./1_single */
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"
#include "../../dt_comm.h"
#include "../../dt_opt.h"
#include <stdio.h>

enum { IN = 8, H = 32, C = 4, B = 32, STEPS = 20 };
#define SEED 1
#define LR 0.5
#define TRY(call) do { dt_status s_ = (call); if (s_) return s_; } while (0)
#define CHECK(call) do { if ((call) != DT_OK) { \
    fprintf(stderr, "%s: %s\n", #call, dt_ctx_error(&ctx)); return 1; } } while (0)

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

static dt_status forward(dt_ctx *ctx, model *m, acts *t, float *loss) {
    TRY(dt_linear_fwd(ctx, &t->h, &t->x, &m->w1->value, &m->b1->value));
    TRY(dt_relu_fwd(ctx, &t->a, &t->h));
    TRY(dt_linear_fwd(ctx, &t->logits, &t->a, &m->w2->value, &m->b2->value));
    return dt_softmax_xent_fwd(ctx, loss, NULL, &t->logits, &t->logits, &t->y, -1); /* probs in place */
}

/* The *_bwd ops accumulate (+=): the activation grads are zeroed first. */
static dt_status backward(dt_ctx *ctx, model *m, acts *t) {
    TRY(dt_tensor_fill(ctx, &t->dlogits, 0));
    TRY(dt_tensor_fill(ctx, &t->da, 0));
    TRY(dt_tensor_fill(ctx, &t->dh, 0));
    TRY(dt_softmax_xent_bwd(ctx, &t->dlogits, &t->logits, &t->y, -1, 1.0f));
    TRY(dt_linear_bwd(ctx, &t->da, &m->w2->grad, &m->b2->grad, &t->dlogits, &t->a, &m->w2->value));
    TRY(dt_relu_bwd(ctx, &t->dh, &t->da, &t->h));
    return dt_linear_bwd(ctx, NULL, &m->w1->grad, &m->b1->grad, &t->dh, &t->x, &m->w1->value);
}

int main(int argc, char **argv) {
    dt_ctx ctx;
    dt_params ps = {0};
    model m;
    acts t = {0};
    dt_optimizer *opt;
    if (argc > 1) { fprintf(stderr, "1_single takes no arguments, got '%s'\n", argv[1]); return 2; }
    CHECK(dt_ctx_init(&ctx, NULL));
    CHECK(add(&ctx, &ps, &m.w1, "fc1.w", H, IN));
    CHECK(add(&ctx, &ps, &m.b1, "fc1.b", H, 0));
    CHECK(add(&ctx, &ps, &m.w2, "fc2.w", C, H));
    CHECK(add(&ctx, &ps, &m.b2, "fc2.b", C, 0));
    CHECK(dt_opt_create(&ctx, &opt, &ps, &(dt_opt_desc){ .kind = DT_OPT_SGD, .lr = LR, .clip_norm = 1.0 }));
    CHECK(tensor(&ctx, &t.x, DT_F32, B, IN));
    CHECK(tensor(&ctx, &t.y, DT_I32, B, 0));
    CHECK(tensor(&ctx, &t.h, DT_F32, B, H));
    CHECK(tensor(&ctx, &t.a, DT_F32, B, H));
    CHECK(tensor(&ctx, &t.da, DT_F32, B, H));
    CHECK(tensor(&ctx, &t.dh, DT_F32, B, H));
    CHECK(tensor(&ctx, &t.logits, DT_F32, B, C));
    CHECK(tensor(&ctx, &t.dlogits, DT_F32, B, C));
    for (int step = 1; step <= STEPS; step++) {
        float loss;
        make_batch(&t.x, &t.y, (int64_t)(step - 1) * B, B); /* global batch s: samples [(s-1)B, sB) */
        CHECK(forward(&ctx, &m, &t, &loss));
        dt_params_zero_grad(&ctx, &ps);
        CHECK(backward(&ctx, &m, &t));
        CHECK(dt_opt_step(opt, NULL));
        printf("step %2d loss %.9g\n", step, loss);
    }
    dt_tensor *all[] = {&t.x, &t.y, &t.h, &t.a, &t.logits, &t.dlogits, &t.da, &t.dh};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) dt_tensor_free(&ctx, all[i]);
    dt_opt_free(opt);
    dt_params_free(&ctx, &ps);
    dt_ctx_shutdown(&ctx);
    return 0;
}
