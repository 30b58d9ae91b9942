/* examples/mlp/mlp.c - first steps with dt: a 3-layer MLP classifier trained with SGD on
   built-in synthetic data (labels from a fixed random "teacher" network, so there is a real
   non-linear function to learn and the accuracy says whether it was learnt).

   build:  ./build.sh            run:  build/examples/mlp --steps 1000 --batch 64
   flags:  --steps N --batch B --seed S --lr LR --hidden H --log metrics.jsonl

   Sample i is a pure function of (seed, i): any process can make any part of any batch,
   which is what lets the data-parallel version split a global batch exactly. */
#define DT_IMPLEMENTATION
#include "../../dt_tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { IN = 16, CLASSES = 4, TEACHER_H = 8 };
#define EVAL_BASE ((uint64_t)1 << 40) /* eval samples never overlap training ones */

typedef struct { int steps, batch, hidden; uint64_t seed; float lr; const char *log; } opts;

#define CHECK(call) do { dt_status s_ = (call); if (s_) { \
    fprintf(stderr, "mlp: %s failed: %s\n", #call, dt_ctx_error(ctx)); exit(1); } } while (0)

/* x ~ U[-1,1)^IN; y = argmax of a random 2-layer teacher, with weights fixed by the seed */
static void sample(uint64_t seed, uint64_t i, float *x, int32_t *y) {
    float h[TEACHER_H], best = -1e30f;
    int j, k;
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

typedef struct { dt_param *w1, *b1, *w2, *b2, *w3, *b3; } model;
typedef struct { dt_tensor x, h1, a1, h2, a2, logits, probs, y, dh1, da1, dh2, da2, dlogits; } acts;

static dt_param *add(dt_ctx *ctx, dt_params *ps, const char *name, int64_t d0, int64_t d1, uint64_t seed) {
    dt_param_desc d;
    dt_param *p;
    memset(&d, 0, sizeof d);
    d.name = name; d.shape[0] = d0; d.shape[1] = d1;
    d.init.kind = d1 ? DT_INIT_SCALED_NORMAL : DT_INIT_ZEROS; /* biases start at zero */
    d.init.gain = 1.41421356; /* He init for ReLU: std = sqrt(2 / fan_in) */
    d.init.seed = seed;
    d.no_decay = d1 == 0;
    if (dt_params_add(ctx, ps, &d, &p)) { fprintf(stderr, "mlp: %s\n", dt_ctx_error(ctx)); exit(1); }
    return p;
}

static void make(dt_ctx *ctx, dt_tensor *t, int64_t d0, int64_t d1, dt_dtype dt) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt; d.shape[0] = d0; d.shape[1] = d1;
    if (dt_tensor_create(ctx, t, &d)) { fprintf(stderr, "mlp: %s\n", dt_ctx_error(ctx)); exit(1); }
}

static void load_batch(acts *a, uint64_t seed, uint64_t first, int n) {
    int r;
    for (r = 0; r < n; r++) sample(seed, first + (uint64_t)r, (float *)a->x.data + r * IN, (int32_t *)a->y.data + r);
}

/* forward to the loss; returns accuracy on the batch */
static float forward(dt_ctx *ctx, model *m, acts *a, float *loss) {
    int64_t r, k, n = a->x.shape[0], correct = 0;
    CHECK(dt_linear_fwd(ctx, &a->h1, &a->x, &m->w1->value, &m->b1->value));
    CHECK(dt_relu_fwd(ctx, &a->a1, &a->h1));
    CHECK(dt_linear_fwd(ctx, &a->h2, &a->a1, &m->w2->value, &m->b2->value));
    CHECK(dt_relu_fwd(ctx, &a->a2, &a->h2));
    CHECK(dt_linear_fwd(ctx, &a->logits, &a->a2, &m->w3->value, &m->b3->value));
    CHECK(dt_softmax_xent_fwd(ctx, loss, NULL, &a->probs, &a->logits, &a->y, -1));
    for (r = 0; r < n; r++) {
        const float *p = (const float *)a->probs.data + r * CLASSES;
        int best = 0;
        for (k = 1; k < CLASSES; k++) if (p[k] > p[best]) best = (int)k;
        correct += best == ((int32_t *)a->y.data)[r];
    }
    return (float)correct / (float)n;
}

/* backward: every *_bwd accumulates, so the activation grads are zeroed first */
static void backward(dt_ctx *ctx, model *m, acts *a) {
    dt_tensor *g[4] = {&a->dh1, &a->da1, &a->dh2, &a->da2};
    int i;
    for (i = 0; i < 4; i++) dt_tensor_fill(ctx, g[i], 0.0);
    dt_tensor_fill(ctx, &a->dlogits, 0.0);
    CHECK(dt_softmax_xent_bwd(ctx, &a->dlogits, &a->probs, &a->y, -1, 1.0f));
    CHECK(dt_linear_bwd(ctx, &a->da2, &m->w3->grad, &m->b3->grad, &a->dlogits, &a->a2, &m->w3->value));
    CHECK(dt_relu_bwd(ctx, &a->dh2, &a->da2, &a->h2));
    CHECK(dt_linear_bwd(ctx, &a->da1, &m->w2->grad, &m->b2->grad, &a->dh2, &a->a1, &m->w2->value));
    CHECK(dt_relu_bwd(ctx, &a->dh1, &a->da1, &a->h1));
    CHECK(dt_linear_bwd(ctx, NULL, &m->w1->grad, &m->b1->grad, &a->dh1, &a->x, &m->w1->value));
}

static void alloc_acts(dt_ctx *ctx, acts *a, int n, int h) {
    make(ctx, &a->x, n, IN, DT_F32); make(ctx, &a->y, n, 0, DT_I32);
    make(ctx, &a->h1, n, h, DT_F32); make(ctx, &a->a1, n, h, DT_F32);
    make(ctx, &a->h2, n, h, DT_F32); make(ctx, &a->a2, n, h, DT_F32);
    make(ctx, &a->logits, n, CLASSES, DT_F32); make(ctx, &a->probs, n, CLASSES, DT_F32);
    make(ctx, &a->dh1, n, h, DT_F32); make(ctx, &a->da1, n, h, DT_F32);
    make(ctx, &a->dh2, n, h, DT_F32); make(ctx, &a->da2, n, h, DT_F32);
    make(ctx, &a->dlogits, n, CLASSES, DT_F32);
}

/* processor time: close to wall time for this single-threaded loop, and plain C99 */
static double now(void) { return (double)clock() / CLOCKS_PER_SEC; }

int main(int argc, char **argv) {
    opts o = {1000, 64, 64, 1, 0.2f, NULL};
    dt_ctx ctx_storage, *ctx = &ctx_storage;
    dt_params ps;
    model m;
    acts a, ev;
    FILE *log = NULL;
    float loss = 0, acc = 0;
    double t0;
    int i, step;
    for (i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--steps")) o.steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--batch")) o.batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hidden")) o.hidden = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seed")) o.seed = (uint64_t)strtoull(argv[i + 1], NULL, 10);
        else if (!strcmp(argv[i], "--lr")) o.lr = (float)atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--log")) o.log = argv[i + 1];
        else { fprintf(stderr, "mlp: unknown flag %s\n", argv[i]); return 2; }
    }
    if (i != argc || o.steps < 1 || o.batch < 1 || o.hidden < 1 || !(o.lr > 0)) {
        fprintf(stderr, "usage: mlp [--steps N>0] [--batch B>0] [--hidden H>0] [--seed S] [--lr LR>0] [--log F]\n");
        return 2;
    }
    dt_ctx_init(ctx, NULL);
    memset(&ps, 0, sizeof ps);
    m.w1 = add(ctx, &ps, "fc1.w", o.hidden, IN, o.seed); m.b1 = add(ctx, &ps, "fc1.b", o.hidden, 0, o.seed);
    m.w2 = add(ctx, &ps, "fc2.w", o.hidden, o.hidden, o.seed); m.b2 = add(ctx, &ps, "fc2.b", o.hidden, 0, o.seed);
    m.w3 = add(ctx, &ps, "fc3.w", CLASSES, o.hidden, o.seed); m.b3 = add(ctx, &ps, "fc3.b", CLASSES, 0, o.seed);
    alloc_acts(ctx, &a, o.batch, o.hidden);
    alloc_acts(ctx, &ev, 1024, o.hidden);
    if (o.log && !(log = fopen(o.log, "w"))) { fprintf(stderr, "mlp: cannot write %s\n", o.log); return 1; }
    printf("mlp: %lld params, %d steps of batch %d, lr %g, seed %llu\n", (long long)dt_params_numel(&ps), o.steps,
           o.batch, (double)o.lr, (unsigned long long)o.seed);
    t0 = now();
    for (step = 1; step <= o.steps; step++) {
        load_batch(&a, o.seed, (uint64_t)(step - 1) * (uint64_t)o.batch, o.batch);
        acc = forward(ctx, &m, &a, &loss);
        dt_params_zero_grad(ctx, &ps);
        backward(ctx, &m, &a);
        for (i = 0; i < ps.count; i++) CHECK(dt_axpy(ctx, &ps.items[i]->value, -o.lr, &ps.items[i]->grad)); /* SGD */
        if (step % 50 == 0 || step == o.steps) {
            double el = now() - t0, sps = (double)step * o.batch / (el > 0 ? el : 1e-9);
            printf("step %4d/%d  loss %.4f  acc %.3f  %.0f samples/s  eta %.1fs\n", step, o.steps, (double)loss,
                   (double)acc, sps, (o.steps - step) * o.batch / sps);
            if (log) fprintf(log, "{\"step\":%d,\"loss\":%.6f,\"acc\":%.4f,\"lr\":%g,\"samples_per_s\":%.1f}\n", step,
                             (double)loss, (double)acc, (double)o.lr, sps);
        }
    }
    load_batch(&ev, o.seed, EVAL_BASE, 1024);
    acc = forward(ctx, &m, &ev, &loss);
    printf("eval: loss %.4f  accuracy %.3f on 1024 held-out samples (chance %.3f)\n", (double)loss, (double)acc,
           1.0 / CLASSES);
    printf("loss %.6f\n", (double)loss);
    if (log) fclose(log);
    dt_params_free(ctx, &ps);
    dt_ctx_shutdown(ctx);
    return 0;
}
