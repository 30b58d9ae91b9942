// np: 1 2 4
/* tests/mpi_parallel_zero.c - data parallel and ZeRO stages 0-3 of dt_parallel.h equal the
   single-process run. The model: a 3-layer MLP (3 -> 5 -> 3 -> 2, ReLU) whose output is scaled
   by a parameter of its first unit (a tied unit: gathered twice in the forward and twice in
   the backward, as GPT's embedding is), loss 0.5 |y - t|^2 averaged over the batch; parameters
   of several shapes, among them [3, 5] (3 rows do not divide 4 ranks), 1-D biases and a [2]
   vector (empty shards on ranks 2-3 at np 4). Each rank reads its samples of a global batch of
   8 through dt_layout_batch_range. For every stage x accumulation (1, 2) x dtype (f32, bf16
   with f32 master weights), 4 steps of AdamW with clipping give the losses and the weights of
   a single-process stage-0 run computed in the same program on a private world (within 1e-5
   relative). A checkpoint saved at ZeRO-3 on N ranks resumes at ZeRO-0 on one rank and at
   ZeRO-1 on N ranks, and one saved at ZeRO-0 on one rank resumes at ZeRO-3 on N, each equal to
   the uninterrupted run. Memory per rank for a model of big units is within 10% of the
   stage's formula; at stages 2-3 the peak above it is derived by hand to the byte (at most
   DT_ZERO_RS_IN_FLIGHT reduce-scatters in flight, none across a micro-step). Bad arguments are named, and so is each mistake in the call order (no
   dt_zero_backward_begin, dt_zero_grad_ready twice, dt_zero_step before every unit is ready) at
   every stage; a ZeRO-3 load after a prefetch waits for it. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;
static dt_comm *world, *self;
static int W, R;

#define NPAR 7
#define GB 8
#define STEPS 4
static const char *pname[NPAR] = {"l1.w", "l1.b", "out.s", "l2.w", "l2.b", "l3.w", "l3.b"};
static const int64_t pshape[NPAR][2] = {{5, 3}, {5, 0}, {2, 0}, {3, 5}, {3, 0}, {2, 3}, {2, 0}};
static const int punit[NPAR] = {0, 0, 0, 1, 1, 2, 2};

typedef struct model {
    dt_params ps;
    dt_param *p[NPAR];
    dt_tensor w32[NPAR];  /* f32 working copies of bf16 values */
    dt_arena *arena;
    dt_layout *l;
    dt_zero *z;
    dt_dtype dtype;
} model;

static void die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", R, what, dt_ctx_error(&C));
    exit(2);
}
#define OK(x) do { if ((x) != DT_OK) die(#x); } while (0)

static void model_init(model *m, dt_comm *comm, dt_dtype dtype, int stage, int accum) {
    dt_arena_desc ad;
    dt_zero_desc zd;
    int i;
    memset(m, 0, sizeof *m);
    m->dtype = dtype;
    for (i = 0; i < NPAR; i++) {
        dt_param_desc d;
        memset(&d, 0, sizeof d);
        d.name = pname[i];
        d.dtype = dtype;
        d.shape[0] = pshape[i][0];
        d.shape[1] = pshape[i][1];
        d.no_decay = pshape[i][1] == 0;
        d.init.seed = 11;
        if (i == 2) { d.init.kind = DT_INIT_UNIFORM; d.init.low = 0.5; d.init.high = 1.5; }
        else if (d.no_decay) { d.init.kind = DT_INIT_NORMAL; d.init.std = 0.1; }
        else d.init.kind = DT_INIT_SCALED_NORMAL;
        OK(dt_params_add(&C, &m->ps, &m->p[i], &d));
        if (dtype != DT_F32) OK(dt_tensor_create_like(&C, &m->w32[i], &m->p[i]->value, DT_F32, DT_CPU));
    }
    OK(dt_layout_create(comm, &m->l, NULL));
    memset(&ad, 0, sizeof ad);
    ad.units = punit;
    OK(dt_arena_create(&C, &m->arena, &m->ps, &ad));
    memset(&zd, 0, sizeof zd);
    zd.stage = stage;
    zd.bucket_bytes = 64; /* several buckets even for this small model */
    zd.opt.kind = DT_OPT_ADAMW;
    zd.opt.lr = 0.05;
    zd.opt.clip_norm = 0.5;
    zd.opt.accum_steps = accum;
    OK(dt_zero_create(m->l, &m->z, m->arena, &zd));
}

static void model_free(model *m) {
    int i;
    dt_zero_free(m->z);
    dt_arena_free(m->arena);
    dt_params_free(&C, &m->ps);
    for (i = 0; i < NPAR; i++) dt_tensor_free(&C, &m->w32[i]);
    dt_layout_free(m->l);
}

/* The f32 value of parameter i (present: after its unit's gather). */
static const dt_tensor *wv(model *m, int i) {
    if (m->dtype == DT_F32) return &m->p[i]->value;
    OK(dt_tensor_cast(&C, &m->w32[i], &m->p[i]->value));
    return &m->w32[i];
}

static void tensor2(dt_tensor *t, int64_t a, int64_t b) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = a;
    d.shape[1] = b;
    d.ndim = 2;
    OK(dt_tensor_create(&C, t, &d));
}

/* Forward and backward of samples [first, first + n): returns the mean loss; grads += seed x
   d(loss)/d(params), through the ZeRO call order. */
static double fwd_bwd(model *m, int64_t first, int64_t n, float seed) {
    dt_tensor x, t, h1, a1, h2, a2, y3, dy, dy3, da2, dh2, da1, dh1;
    dt_zero *z = m->z;
    const float *s;
    double loss = 0;
    int64_t i, k;
    tensor2(&x, n, 3); tensor2(&t, n, 2); tensor2(&h1, n, 5); tensor2(&a1, n, 5); tensor2(&h2, n, 3);
    tensor2(&a2, n, 3); tensor2(&y3, n, 2); tensor2(&dy, n, 2); tensor2(&dy3, n, 2); tensor2(&da2, n, 3);
    tensor2(&dh2, n, 3); tensor2(&da1, n, 5); tensor2(&dh1, n, 5);
    for (i = 0; i < n; i++) {
        for (k = 0; k < 3; k++) ((float *)x.data)[i * 3 + k] = dt_rng_normal(7, 1, (uint64_t)((first + i) * 3 + k));
        for (k = 0; k < 2; k++) ((float *)t.data)[i * 2 + k] = dt_rng_normal(7, 2, (uint64_t)((first + i) * 2 + k));
    }
    OK(dt_zero_gather(z, 0));
    OK(dt_linear_fwd(&C, &h1, &x, wv(m, 0), wv(m, 1)));
    OK(dt_relu_fwd(&C, &a1, &h1));
    OK(dt_zero_release(z, 0));
    OK(dt_zero_gather(z, 1));
    OK(dt_linear_fwd(&C, &h2, &a1, wv(m, 3), wv(m, 4)));
    OK(dt_relu_fwd(&C, &a2, &h2));
    OK(dt_zero_release(z, 1));
    OK(dt_zero_gather(z, 2));
    OK(dt_linear_fwd(&C, &y3, &a2, wv(m, 5), wv(m, 6)));
    OK(dt_zero_release(z, 2));
    OK(dt_zero_gather(z, 0)); /* the tied use: y = y3 * s */
    s = (const float *)wv(m, 2)->data;
    for (i = 0; i < n; i++)
        for (k = 0; k < 2; k++) {
            float y = ((float *)y3.data)[i * 2 + k] * s[k], d = y - ((float *)t.data)[i * 2 + k];
            loss += 0.5 * (double)d * d;
            ((float *)dy.data)[i * 2 + k] = seed * d / (float)n;
        }
    OK(dt_zero_release(z, 0));
    loss /= (double)n;

    OK(dt_zero_backward_begin(z));
    OK(dt_zero_gather(z, 0));
    s = (const float *)wv(m, 2)->data;
    for (k = 0; k < 2; k++) {
        float gs = 0;
        for (i = 0; i < n; i++) gs += ((float *)dy.data)[i * 2 + k] * ((float *)y3.data)[i * 2 + k];
        ((float *)m->p[2]->grad.data)[k] += gs;
    }
    for (i = 0; i < 2 * n; i++) ((float *)dy3.data)[i] = ((float *)dy.data)[i] * s[i % 2];
    OK(dt_zero_release(z, 0)); /* no grad_ready: unit 0 is used again below */
    OK(dt_zero_gather(z, 2));
    OK(dt_linear_bwd(&C, &da2, &m->p[5]->grad, &m->p[6]->grad, &dy3, &a2, wv(m, 5)));
    OK(dt_zero_grad_ready(z, 2));
    OK(dt_zero_release(z, 2));
    OK(dt_relu_bwd(&C, &dh2, &da2, &h2));
    OK(dt_zero_gather(z, 1));
    OK(dt_linear_bwd(&C, &da1, &m->p[3]->grad, &m->p[4]->grad, &dh2, &a1, wv(m, 3)));
    OK(dt_zero_grad_ready(z, 1));
    OK(dt_zero_release(z, 1));
    OK(dt_relu_bwd(&C, &dh1, &da1, &h1));
    OK(dt_zero_gather(z, 0));
    OK(dt_linear_bwd(&C, NULL, &m->p[0]->grad, &m->p[1]->grad, &dh1, &x, wv(m, 0)));
    OK(dt_zero_grad_ready(z, 0));
    OK(dt_zero_release(z, 0));
    dt_tensor_free(&C, &x); dt_tensor_free(&C, &t); dt_tensor_free(&C, &h1); dt_tensor_free(&C, &a1);
    dt_tensor_free(&C, &h2); dt_tensor_free(&C, &a2); dt_tensor_free(&C, &y3); dt_tensor_free(&C, &dy);
    dt_tensor_free(&C, &dy3); dt_tensor_free(&C, &da2); dt_tensor_free(&C, &dh2); dt_tensor_free(&C, &da1);
    dt_tensor_free(&C, &dh1);
    return loss;
}

/* Steps [s0, s1): losses[s] = the mean loss of global batch s over every sample, norms[s] the
   grad norm before clipping (Adam with clipping hides a scale error of the grads; the norm
   does not). */
static double norms[STEPS];
static void train(model *m, int s0, int s1, double *losses, double *max_norm) {
    int s, micro, A = m->z ? dt_zero_optimizer(m->z)->desc.accum_steps : 1;
    for (s = s0; s < s1; s++) {
        int64_t first, count;
        double sum = 0;
        dt_opt_step_info info;
        OK(dt_layout_batch_range(m->l, GB, &first, &count));
        for (micro = 0; micro < A; micro++) {
            float seed = 0;
            int64_t mb = count / A;
            OK(dt_zero_micro_begin(m->z, &seed, micro));
            sum += fwd_bwd(m, (int64_t)s * GB + first + micro * mb, mb, seed) * (double)mb;
        }
        OK(dt_zero_step(m->z, &info));
        if (max_norm && info.grad_norm > *max_norm) *max_norm = info.grad_norm;
        norms[s] = info.grad_norm;
        OK(dt_comm_allreduce_f64(m->l->dp_comm, &sum, 1, DT_REDUCE_SUM));
        losses[s] = sum / GB;
    }
}

/* Every weight, whole, as f32 (collective over the dp group at stage 3). */
static int gather_weights(model *m, float *out) {
    int i, u, n = 0;
    for (u = 0; u < 3; u++) {
        OK(dt_zero_gather(m->z, u));
        for (i = 0; i < NPAR; i++) {
            int64_t k;
            if (punit[i] != u) continue;
            for (k = 0; k < m->p[i]->value.numel; k++)
                out[n + k] = m->dtype == DT_F32 ? ((float *)m->p[i]->value.data)[k]
                                                : dt_bf16_to_f32(((uint16_t *)m->p[i]->value.data)[k]);
            n += (int)m->p[i]->value.numel;
        }
        OK(dt_zero_release(m->z, u));
    }
    return n;
}

/* PASS iff every |got - want| <= 1e-6 + 1e-5 |want| on every rank. */
static void check_close(const char *name, const double *got, const double *want, int n) {
    int i, bad = -1;
    for (i = 0; i < n && bad < 0; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-6 + 1e-5 * fabs(want[i]))) bad = i;
    dt_test_check_all(name, bad < 0, "[%d]: got %.9g, want %.9g", bad, bad >= 0 ? got[bad] : 0, bad >= 0 ? want[bad] : 0);
}
static void check_closef(const char *name, const float *got, const float *want, int n) {
    int i, bad = -1;
    for (i = 0; i < n && bad < 0; i++)
        if (!(fabsf(got[i] - want[i]) <= 1e-6f + 1e-5f * fabsf(want[i]))) bad = i;
    dt_test_check_all(name, bad < 0, "weight [%d]: got %.9g, want %.9g", bad, bad >= 0 ? got[bad] : 0,
                      bad >= 0 ? want[bad] : 0);
}

static void equivalence(void) {
    int di, stage, accum;
    for (di = 0; di < 2; di++) {
        dt_dtype dt = di ? DT_BF16 : DT_F32;
        model ref, m;
        double lref[STEPS], l[STEPS], norm = 0, nref[STEPS];
        float wref[64], w[64];
        int nw;
        char name[96];
        model_init(&ref, self, dt, 0, 1);
        train(&ref, 0, STEPS, lref, &norm);
        nw = gather_weights(&ref, wref);
        model_free(&ref);
        memcpy(nref, norms, sizeof nref);
        if (R == 0) printf("reference (%s): losses %.6f %.6f %.6f %.6f, largest grad norm %.4f (clip 0.5)\n",
                           dt_dtype_name(dt), lref[0], lref[1], lref[2], lref[3], norm);
        snprintf(name, sizeof name, "reference_%s_clips", dt_dtype_name(dt));
        dt_test_check_all(name, norm > 0.5, "largest grad norm %g <= clip 0.5: clipping untested", norm);
        for (stage = 0; stage <= 3; stage++)
            for (accum = 1; accum <= 2; accum++) {
                model_init(&m, world, dt, stage, accum);
                train(&m, 0, STEPS, l, NULL);
                gather_weights(&m, w);
                snprintf(name, sizeof name, "zero%d_accum%d_%s_losses_equal_single_process", stage, accum,
                         dt_dtype_name(dt));
                check_close(name, l, lref, STEPS);
                snprintf(name, sizeof name, "zero%d_accum%d_%s_grad_norms_equal_single_process", stage, accum,
                         dt_dtype_name(dt));
                check_close(name, norms, nref, STEPS);
                snprintf(name, sizeof name, "zero%d_accum%d_%s_weights_equal_single_process", stage, accum,
                         dt_dtype_name(dt));
                check_closef(name, w, wref, nw);
                model_free(&m);
            }
    }
}

static void checkpoints(void) {
    model ref, m;
    double lref[STEPS], l[STEPS];
    float wref[64], w[64];
    char dir1[512], dir2[512];
    dt_checkpoint_desc cd;
    dt_train_state ts;
    int nw;
    dt_status st;
    snprintf(dir1, sizeof dir1, "%s/zero3_np%d", dt_test_tmpdir(), W);
    snprintf(dir2, sizeof dir2, "%s/zero0_np1", dt_test_tmpdir());
    model_init(&ref, self, DT_F32, 0, 1);
    train(&ref, 0, STEPS, lref, NULL);
    nw = gather_weights(&ref, wref);
    model_free(&ref);

    /* ZeRO-3 on N: 2 steps, save, 2 more (the uninterrupted run) */
    model_init(&m, world, DT_F32, 3, 1);
    train(&m, 0, 2, l, NULL);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir1;
    memset(&ts, 0, sizeof ts);
    ts.step = 2;
    st = dt_zero_checkpoint_save(m.z, &ts, &cd);
    dt_test_check_all("zero3_checkpoint_save", st == DT_OK, "%.150s", dt_ctx_error(&C));
    train(&m, 2, STEPS, l, NULL);
    gather_weights(&m, w);
    model_free(&m);
    check_close("zero3_uninterrupted_losses_equal_single_process", l, lref, STEPS);

    /* ... resumed at ZeRO-0 on one rank (each rank alone, on its private world) */
    memset(l, 0, sizeof l);
    model_init(&m, self, DT_F32, 0, 1);
    memset(&ts, 0, sizeof ts);
    st = dt_zero_checkpoint_load(m.z, &ts, &cd);
    dt_test_check_all("zero3_checkpoint_loads_at_zero0_np1", st == DT_OK && ts.step == 2, "step %lld: %.150s",
                      (long long)ts.step, dt_ctx_error(&C));
    train(&m, 2, STEPS, l, NULL);
    gather_weights(&m, w);
    model_free(&m);
    check_close("zero3_npN_resumed_at_zero0_np1_losses_equal", l + 2, lref + 2, 2);
    check_closef("zero3_npN_resumed_at_zero0_np1_weights_equal", w, wref, nw);

    /* ... and at ZeRO-1 on N ranks */
    memset(l, 0, sizeof l);
    model_init(&m, world, DT_F32, 1, 1);
    st = dt_zero_checkpoint_load(m.z, &ts, &cd);
    dt_test_check_all("zero3_checkpoint_loads_at_zero1_npN", st == DT_OK, "%.150s", dt_ctx_error(&C));
    train(&m, 2, STEPS, l, NULL);
    gather_weights(&m, w);
    model_free(&m);
    check_close("zero3_npN_resumed_at_zero1_npN_losses_equal", l + 2, lref + 2, 2);
    check_closef("zero3_npN_resumed_at_zero1_npN_weights_equal", w, wref, nw);

    /* the other way: saved at ZeRO-0 on one rank (rank 0), resumed at ZeRO-3 on N */
    if (R == 0) {
        model_init(&m, self, DT_F32, 0, 1);
        train(&m, 0, 2, l, NULL);
        cd.dir = dir2;
        ts.step = 2;
        OK(dt_zero_checkpoint_save(m.z, &ts, &cd));
        model_free(&m);
    }
    OK(dt_comm_barrier(world));
    cd.dir = dir2;
    memset(l, 0, sizeof l);
    model_init(&m, world, DT_F32, 3, 1);
    st = dt_zero_checkpoint_load(m.z, &ts, &cd);
    dt_test_check_all("zero0_np1_checkpoint_loads_at_zero3_npN", st == DT_OK, "%.150s", dt_ctx_error(&C));
    train(&m, 2, STEPS, l, NULL);
    gather_weights(&m, w);
    check_close("zero0_np1_resumed_at_zero3_npN_losses_equal", l + 2, lref + 2, 2);
    check_closef("zero0_np1_resumed_at_zero3_npN_weights_equal", w, wref, nw);
    /* a load while a unit is gathered is refused */
    OK(dt_zero_gather(m.z, 1));
    st = dt_zero_checkpoint_load(m.z, &ts, &cd);
    if (R == 0) dt_test_error("load_while_gathered_is_named", st, dt_ctx_error(&C), "unit 1 is gathered");
    OK(dt_zero_release(m.z, 1));
    model_free(&m);
}

/* Memory after a step of a model of 3 big units ([250, 200] weight and [250] bias each). */
static void memory(void) {
    int di, stage, u, i;
    if (R == 0) printf("memory per rank after a step, N = dp = %d (AdamW; dt's grads are f32, so DeepSpeed's 16-bit-grad "
                       "formulas become these):\n  stage dtype     psi   held MB  peak MB  formula            formula MB  held/formula\n", W);
    for (di = 0; di < 2; di++)
        for (stage = 0; stage <= 3; stage++) {
            dt_params ps;
            dt_arena *a;
            dt_layout *l;
            dt_zero *z;
            dt_zero_desc zd;
            dt_zero_memory mem;
            dt_arena_desc ad;
            int units[6] = {0, 0, 1, 1, 2, 2};
            char name[96];
            double ratio;
            memset(&ps, 0, sizeof ps);
            for (i = 0; i < 6; i++) {
                dt_param_desc d;
                char nm[16];
                memset(&d, 0, sizeof d);
                snprintf(nm, sizeof nm, "p%d", i);
                d.name = nm;
                d.dtype = di ? DT_BF16 : DT_F32;
                d.shape[0] = 250;
                d.shape[1] = i % 2 ? 0 : 200;
                OK(dt_params_add(&C, &ps, NULL, &d));
            }
            memset(&ad, 0, sizeof ad);
            ad.units = units;
            OK(dt_arena_create(&C, &a, &ps, &ad));
            OK(dt_layout_create(world, &l, NULL));
            memset(&zd, 0, sizeof zd);
            zd.stage = stage;
            OK(dt_zero_create(l, &z, a, &zd));
            OK(dt_zero_backward_begin(z));
            for (u = 2; u >= 0; u--) {
                OK(dt_zero_gather(z, u));
                for (i = 2 * u; i < 2 * u + 2; i++) OK(dt_tensor_fill(&C, &ps.items[i]->grad, 1e-3));
                OK(dt_zero_grad_ready(z, u));
                OK(dt_zero_release(z, u));
            }
            OK(dt_zero_step(z, NULL));
            OK(dt_zero_memory_get(z, &mem));
            ratio = (double)mem.total_bytes / mem.formula_bytes;
            if (R == 0)
                printf("  %5d %-5s %7lld %9.3f %8.3f  %-18s %9.3f  %.3f\n", stage, di ? "bf16" : "f32",
                       (long long)mem.psi, mem.total_bytes / 1e6, mem.peak_bytes / 1e6, mem.formula, mem.formula_bytes / 1e6,
                       ratio);
            snprintf(name, sizeof name, "zero%d_%s_memory_within_10pct_of_formula", stage, di ? "bf16" : "f32");
            dt_test_check_all(name, fabs(ratio - 1) <= 0.1 && mem.peak_bytes >= mem.total_bytes,
                              "held %zu bytes, formula %s = %.0f (ratio %.3f), peak %zu", mem.total_bytes, mem.formula,
                              mem.formula_bytes, ratio, mem.peak_bytes);
            dt_zero_free(z);
            dt_layout_free(l);
            dt_arena_free(a);
            dt_params_free(&C, &ps);
        }
}

/* Stages 2-3 hold at most DT_ZERO_RS_IN_FLIGHT reduce-scatters, finished in the order posted, and
   none across a micro-step: the peak is exact and the same with accumulation. U units of one
   [12, 100] f32 param each (n elements; 12 rows divide 1-4 ranks, so no padding), AdamW, two
   steps (the optimizer's state exists from the first): peak - held after the step is
     stage 2: at a unit's grad_ready, its full grads (4n) and D reduce-scatters of 4n (N + 1) / N
              (the packed grads and this rank's block), D = min(DT_ZERO_RS_IN_FLIGHT, U)
     stage 3: also the unit's gathered values (4n) and the next one's prefetch (4n; none after unit 0)
   the largest over the units: at unit u, min(D, U - u) in flight.
   With every reduce-scatter left in flight until the step (as before the bound) stage 2 held U. */
static void in_flight(void) {
    enum { U = 5 };
    int stage, accum, u, step, micro;
    for (stage = 2; stage <= 3; stage++)
        for (accum = 1; accum <= 2; accum++) {
            dt_params ps;
            dt_arena *a;
            dt_layout *l;
            dt_zero *z;
            dt_zero_desc zd;
            dt_zero_memory mem;
            dt_arena_desc ad;
            int units[U];
            char name[96];
            double n = 12 * 100, N = W, D = DT_ZERO_RS_IN_FLIGHT < U ? DT_ZERO_RS_IN_FLIGHT : U, want, got;
            memset(&ps, 0, sizeof ps);
            for (u = 0; u < U; u++) {
                dt_param_desc d;
                char nm[16];
                memset(&d, 0, sizeof d);
                snprintf(nm, sizeof nm, "p%d", u);
                d.name = nm;
                d.shape[0] = 12;
                d.shape[1] = 100;
                OK(dt_params_add(&C, &ps, NULL, &d));
                units[u] = u;
            }
            memset(&ad, 0, sizeof ad);
            ad.units = units;
            OK(dt_arena_create(&C, &a, &ps, &ad));
            OK(dt_layout_create(world, &l, NULL));
            memset(&zd, 0, sizeof zd);
            zd.stage = stage;
            zd.opt.kind = DT_OPT_ADAMW;
            zd.opt.lr = 1e-3;
            zd.opt.accum_steps = accum;
            OK(dt_zero_create(l, &z, a, &zd));
            for (step = 0; step < 2; step++) {
                for (micro = 0; micro < accum; micro++) {
                    OK(dt_zero_micro_begin(z, NULL, micro));
                    for (u = 0; u < U; u++) { OK(dt_zero_gather(z, u)); OK(dt_zero_release(z, u)); }
                    OK(dt_zero_backward_begin(z));
                    for (u = U - 1; u >= 0; u--) {
                        OK(dt_zero_gather(z, u));
                        OK(dt_tensor_fill(&C, &ps.items[u]->grad, 1e-3f * (float)(u + 1)));
                        OK(dt_zero_grad_ready(z, u));
                        OK(dt_zero_release(z, u));
                    }
                }
                OK(dt_zero_step(z, NULL));
            }
            OK(dt_zero_memory_get(z, &mem));
            for (want = 0, u = 0; u < U; u++) { /* at unit u's grad_ready; the backward posts U-1 .. 0 */
                double inflight = U - u < D ? U - u : D;
                double at = 4 * n + inflight * 4 * n * (N + 1) / N + (stage == 3 ? 4 * n + (u > 0 ? 4 * n : 0) : 0);
                if (at > want) want = at;
            }
            got = (double)mem.peak_bytes - (double)mem.total_bytes;
            if (R == 0) printf("  stage %d accum %d: peak above the held %.0f bytes, derived %.0f\n", stage, accum, got, want);
            snprintf(name, sizeof name, "zero%d_accum%d_peak_holds_%d_reduce_scatters", stage, accum, (int)D);
            dt_test_check_all(name, got == want, "peak %zu - held %zu = %.0f bytes, derived %.0f (D = %.0f, N = %.0f)",
                              mem.peak_bytes, mem.total_bytes, got, want, D, N);
            dt_zero_free(z);
            dt_layout_free(l);
            dt_arena_free(a);
            dt_params_free(&C, &ps);
        }
}

static void bad_input(void) {
    model m;
    dt_zero *z = NULL;
    dt_zero_desc zd;
    dt_status st;
    float seed;
    model_init(&m, world, DT_F32, 2, 1);
    st = dt_zero_gather(m.z, 3);
    if (R == 0) dt_test_error("gather_unit_out_of_range_is_named", st, dt_ctx_error(&C), "unit = 3");
    st = dt_zero_release(m.z, -1);
    if (R == 0) dt_test_error("release_negative_unit_is_named", st, dt_ctx_error(&C), "unit = -1");
    st = dt_zero_micro_begin(m.z, &seed, 1);
    if (R == 0) dt_test_error("micro_out_of_range_is_named", st, dt_ctx_error(&C), "micro = 1");
    st = dt_zero_create(m.l, &z, m.arena, NULL);
    if (R == 0) dt_test_error("second_zero_on_a_stage2_arena_is_named", st, dt_ctx_error(&C), "already used");
    model_free(&m);
    model_init(&m, world, DT_F32, 0, 1);
    memset(&zd, 0, sizeof zd);
    zd.stage = 4;
    st = dt_zero_create(m.l, &z, m.arena, &zd);
    if (R == 0) dt_test_error("stage_4_is_named", st, dt_ctx_error(&C), "desc.stage = 4");
    zd.stage = 1;
    zd.prefetch = 2;
    st = dt_zero_create(m.l, &z, m.arena, &zd);
    if (R == 0) dt_test_error("prefetch_2_is_named", st, dt_ctx_error(&C), "desc.prefetch = 2");
    zd.prefetch = 0;
    zd.bucket_bytes = -1;
    st = dt_zero_create(m.l, &z, m.arena, &zd);
    if (R == 0) dt_test_error("negative_bucket_bytes_is_named", st, dt_ctx_error(&C), "desc.bucket_bytes = -1");
    st = dt_zero_create(m.l, NULL, m.arena, NULL);
    if (R == 0) dt_test_error("zero_null_out_is_named", st, dt_ctx_error(&C), "out is NULL");
    st = dt_zero_create(m.l, &z, NULL, NULL);
    if (R == 0) dt_test_error("zero_null_arena_is_named", st, dt_ctx_error(&C), "a is NULL");
    if (R == 0) DT_TEST_CHECK("zero_null_layout_is_arg_error", dt_zero_create(NULL, &z, m.arena, NULL) == DT_ERR_ARG &&
                              dt_zero_step(NULL, NULL) == DT_ERR_ARG && dt_zero_optimizer(NULL) == NULL);
    model_free(&m);
    dt_zero_free(NULL);
}

/* PASS when st is DT_ERR_STATE with a message naming `want` (every rank makes the same calls). */
static void state_error(const char *name, int stage, dt_status st, const char *want) {
    char full[128];
    snprintf(full, sizeof full, "%s_at_stage_%d", name, stage);
    dt_test_check_all(full, st == DT_ERR_STATE && strstr(dt_ctx_error(&C), want) != NULL, "status %d, message "
                      "\"%.120s\", want DT_ERR_STATE naming \"%s\"", (int)st, dt_ctx_error(&C), want);
}

/* The call order (micro_begin, backward_begin, gather / grad_ready / release per unit, step):
   each mistake is named at every stage, where stages 2-3 would otherwise fail later and
   elsewhere (a backward without backward_begin has no grads to write) and stages 0-1 not at all. */
static void call_order(void) {
    int stage;
    for (stage = 0; stage <= 3; stage++) {
        model m;
        float seed;
        dt_status st;
        /* no dt_zero_backward_begin */
        model_init(&m, world, DT_F32, stage, 1);
        OK(dt_zero_micro_begin(m.z, &seed, 0));
        OK(dt_zero_gather(m.z, 2));
        st = dt_zero_grad_ready(m.z, 2);
        state_error("grad_ready_without_backward_begin_is_named", stage, st, "no dt_zero_backward_begin");
        OK(dt_zero_release(m.z, 2));
        st = dt_zero_step(m.z, NULL);
        state_error("step_without_backward_begin_is_named", stage, st, "no dt_zero_backward_begin");
        model_free(&m);
        if (stage >= 2) { /* a backward op without dt_zero_backward_begin: the grads do not exist yet */
            model_init(&m, world, DT_F32, stage, 1);
            OK(dt_zero_micro_begin(m.z, &seed, 0));
            OK(dt_zero_gather(m.z, 2));
            st = dt_axpy(&C, &m.p[5]->grad, 1.0f, &m.p[5]->value); /* l3.w's grad += (a backward's write) */
            state_error("backward_op_without_backward_begin_names_it", stage, st, "dt_zero_backward_begin");
            OK(dt_zero_release(m.z, 2));
            model_free(&m);
        }
        /* dt_zero_grad_ready twice for a unit */
        model_init(&m, world, DT_F32, stage, 1);
        OK(dt_zero_micro_begin(m.z, &seed, 0));
        OK(dt_zero_backward_begin(m.z));
        OK(dt_zero_gather(m.z, 2));
        OK(dt_zero_grad_ready(m.z, 2));
        OK(dt_zero_release(m.z, 2));
        st = dt_zero_grad_ready(m.z, 2);
        state_error("grad_ready_twice_is_named", stage, st, "unit 2 is ready already");
        if (stage >= 1) { /* a unit used again is gathered again: then its second grad_ready is right */
            OK(dt_zero_gather(m.z, 2));
            st = dt_zero_grad_ready(m.z, 2);
            dt_test_check_all(stage == 1 ? "grad_ready_after_a_second_gather_is_ok_at_stage_1" : stage == 2 ?
                              "grad_ready_after_a_second_gather_is_ok_at_stage_2" :
                              "grad_ready_after_a_second_gather_is_ok_at_stage_3", st == DT_OK, "status %d: %.120s",
                              (int)st, dt_ctx_error(&C));
            OK(dt_zero_release(m.z, 2));
        }
        model_free(&m);
        /* dt_zero_step when only some units are ready */
        model_init(&m, world, DT_F32, stage, 1);
        OK(dt_zero_micro_begin(m.z, &seed, 0));
        OK(dt_zero_backward_begin(m.z));
        OK(dt_zero_gather(m.z, 2));
        OK(dt_zero_grad_ready(m.z, 2));
        OK(dt_zero_release(m.z, 2));
        st = dt_zero_step(m.z, NULL);
        state_error("step_before_every_unit_is_ready_is_named", stage, st, "unit 0 had no dt_zero_grad_ready");
        model_free(&m);
    }
}

/* ZeRO-3 prefetches the unit after the one gathered: a load after gather(0) + release(0) finds
   unit 1 posted but not gathered. The load waits for it and drops it; a unit really gathered
   is still refused. */
static void load_after_prefetch(void) {
    model m;
    double l[STEPS];
    char dir[512];
    dt_checkpoint_desc cd;
    dt_train_state ts;
    dt_status st;
    snprintf(dir, sizeof dir, "%s/zero3_prefetch_np%d", dt_test_tmpdir(), W);
    model_init(&m, world, DT_F32, 3, 1);
    train(&m, 0, 1, l, NULL);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    memset(&ts, 0, sizeof ts);
    ts.step = 1;
    OK(dt_zero_checkpoint_save(m.z, &ts, &cd));
    OK(dt_zero_gather(m.z, 0));
    OK(dt_zero_release(m.z, 0));
    st = dt_zero_checkpoint_load(m.z, &ts, &cd);
    dt_test_check_all("zero3_load_after_a_prefetch_waits_for_it", st == DT_OK && ts.step == 1, "status %d: %.150s",
                      (int)st, dt_ctx_error(&C));
    train(&m, 1, 2, l, NULL); /* and trains on */
    OK(dt_zero_gather(m.z, 0));
    st = dt_zero_checkpoint_load(m.z, &ts, &cd);
    dt_test_check_all("zero3_load_with_a_unit_gathered_is_named", st == DT_ERR_STATE &&
                      strstr(dt_ctx_error(&C), "unit 0 is gathered") != NULL, "status %d: %.150s", (int)st,
                      dt_ctx_error(&C));
    OK(dt_zero_release(m.z, 0));
    model_free(&m);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);
    OK(dt_comm_split(world, &self, R, 0));
    equivalence();
    checkpoints();
    memory();
    in_flight();
    bad_input();
    call_order();
    load_after_prefetch();
    {
        int rc = dt_test_finish();
        dt_comm_free(self);
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
