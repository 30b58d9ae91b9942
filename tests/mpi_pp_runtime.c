// np: 1 2 4
/* tests/mpi_pp_runtime.c - the pipeline runtime (dt_pp_run) trains exactly as one process does.
   The model: an MLP of L = 9 layers (linear D -> D, then GELU), loss 0.5 |y - t|^2 averaged over
   a global batch of 16, split over the p v virtual stages by dt_pp_split (uneven: 9 layers over
   2, 4 or 8 parts). Every schedule (GPipe, 1F1B, interleaved with v 2, ZB-H1 with the backward
   split into dt_linear_bwd's input half (dw NULL) and weight half (dx NULL)) runs at pp = world,
   and at np 4 also under dp 2 x pp 2 (each dp replica its own pipeline, DDP over dp through
   dt_zero stage 0 whose buckets are launched from the runtime's grads_done hook; and once with
   ZeRO-1), m = 4
   micro-batches, 3 steps of AdamW with clipping (the norm sums over the stages). The losses, the
   grad norms and every weight equal a single-process run computed in the same program on a
   private world by plain loops over the whole batch (no runtime), within 1e-5 relative. The
   activations in flight on each stage equal the simulator's count for the same schedule and
   never exceed the schedule's bound, and the stage sends and receives exactly its list's
   messages; the runtime's buffers are made by the first step and reused by the later ones (no
   bytes more after a later step; dt_layout_free frees them); the grads_done hook runs once per chunk
   and step; the timeline holds the run's compute and its messages. GPipe runs take their
   activation shapes from dt_pp_model.acts (one per boundary). Bad configurations are named
   errors, and a list edited on one stage is refused by every rank. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

/* a failed call returns its status (the library's own TRY is private to its implementation) */
#define PP_TRY(x) do { dt_status pp_s_ = (x); if (pp_s_) return pp_s_; } while (0)

static dt_ctx C;
static dt_comm *world, *self;
static int W, R;

#define L 9
#define D 8
#define GB 16
#define M 4
#define STEPS 3
#define MAXV 8 /* virtual stages at most (p 4 x v 2) */

static void die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", R, what, dt_ctx_error(&C));
    exit(2);
}
#define OK(x) do { if ((x) != DT_OK) die(#x); } while (0)

static void tensor2(dt_tensor *t, int64_t a, int64_t b) {
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.shape[0] = a;
    d.shape[1] = b;
    d.ndim = 2;
    OK(dt_tensor_create(&C, t, &d));
}

/* sample g of the whole run (step s, global index s * GB + j): input and target */
static void fill_batch(dt_tensor *x, dt_tensor *t, int64_t g0, int64_t n) {
    int64_t i, k;
    for (i = 0; i < n; i++)
        for (k = 0; k < D; k++) {
            if (x) ((float *)x->data)[i * D + k] = dt_rng_normal(5, 1, (uint64_t)((g0 + i) * D + k));
            if (t) ((float *)t->data)[i * D + k] = 0.5f * dt_rng_normal(5, 2, (uint64_t)((g0 + i) * D + k));
        }
}

/* The parameters of layers [lo, hi) (all: 0, L), one unit per layer, through dt_zero stage 0. */
typedef struct net {
    dt_layout *l;
    dt_params ps;
    dt_param *w[L], *b[L]; /* NULL for the layers of other stages */
    dt_arena *arena;
    dt_zero *z;
    int unit[L];           /* this stage's unit of layer j */
} net;

static void net_init(net *n, dt_comm *comm, int dp, int pp, int v, int stage) {
    dt_layout_desc ld;
    dt_arena_desc ad;
    dt_zero_desc zd;
    int units[2 * L], first[MAXV + 1], j, c, cnt = 0, u = 0;
    memset(n, 0, sizeof *n);
    memset(&ld, 0, sizeof ld);
    ld.dp = dp, ld.pp = pp;
    OK(dt_layout_create(comm, &n->l, &ld));
    OK(dt_pp_split(&C, first, L, pp * v));
    for (c = 0; c < v; c++) { /* this stage's chunks in order: units non-decreasing */
        int k = c * pp + n->l->pp_rank;
        for (j = first[k]; j < first[k + 1]; j++, u++) {
            dt_param_desc d;
            char name[32];
            memset(&d, 0, sizeof d);
            d.name = name;
            d.init.seed = 3;
            snprintf(name, sizeof name, "l%d.w", j);
            d.shape[0] = D, d.shape[1] = D;
            d.init.kind = DT_INIT_NORMAL;
            d.init.std = 0.5;
            OK(dt_params_add(&C, &n->ps, &n->w[j], &d));
            snprintf(name, sizeof name, "l%d.b", j);
            d.shape[1] = 0;
            d.no_decay = 1;
            d.init.std = 0.1;
            OK(dt_params_add(&C, &n->ps, &n->b[j], &d));
            n->unit[j] = u;
            units[cnt++] = u;
            units[cnt++] = u;
        }
    }
    memset(&ad, 0, sizeof ad);
    ad.units = units;
    OK(dt_arena_create(&C, &n->arena, &n->ps, &ad));
    memset(&zd, 0, sizeof zd);
    zd.stage = stage;
    zd.bucket_bytes = 64; /* a bucket per layer: each launched from grads_done */
    zd.opt.kind = DT_OPT_ADAMW;
    zd.opt.lr = 0.02;
    zd.opt.clip_norm = 0.05;
    OK(dt_zero_create(n->l, &n->z, n->arena, &zd));
}

static void net_free(net *n) {
    dt_zero_free(n->z);
    dt_arena_free(n->arena);
    dt_params_free(&C, &n->ps);
    dt_layout_free(n->l);
}

/* ---- the reference: every layer, the whole batch, plain loops */

static void reference(double *loss, double *norm, float *wout) {
    net n;
    int s, j;
    dt_tensor x[L + 1], h[L], t, dx, dh;
    net_init(&n, self, 1, 1, 1, 0);
    for (s = 0; s < STEPS; s++) {
        float seed = 0;
        double sum = 0;
        dt_opt_step_info info;
        OK(dt_zero_micro_begin(n.z, &seed, 0));
        OK(dt_zero_backward_begin(n.z)); /* (the grads below are written straight into the arena) */
        for (j = 0; j <= L; j++) tensor2(&x[j], GB, D);
        for (j = 0; j < L; j++) tensor2(&h[j], GB, D);
        tensor2(&t, GB, D);
        fill_batch(&x[0], &t, (int64_t)s * GB, GB);
        for (j = 0; j < L; j++) {
            OK(dt_linear_fwd(&C, &h[j], &x[j], &n.w[j]->value, &n.b[j]->value));
            OK(dt_gelu_fwd(&C, &x[j + 1], &h[j]));
        }
        tensor2(&dx, GB, D);
        for (j = 0; j < GB * D; j++) {
            float d = ((float *)x[L].data)[j] - ((float *)t.data)[j];
            sum += 0.5 * (double)d * d;
            ((float *)dx.data)[j] = seed * d / GB;
        }
        loss[s] = sum / GB;
        for (j = L - 1; j >= 0; j--) {
            dt_tensor dprev;
            tensor2(&dh, GB, D);
            tensor2(&dprev, GB, D);
            OK(dt_gelu_bwd(&C, &dh, &dx, &h[j]));
            OK(dt_linear_bwd(&C, j ? &dprev : NULL, &n.w[j]->grad, &n.b[j]->grad, &dh, &x[j], &n.w[j]->value));
            dt_tensor_free(&C, &dh);
            dt_tensor_free(&C, &dx);
            dx = dprev;
        }
        dt_tensor_free(&C, &dx);
        OK(dt_zero_step(n.z, &info));
        norm[s] = info.grad_norm;
        for (j = 0; j <= L; j++) dt_tensor_free(&C, &x[j]);
        for (j = 0; j < L; j++) dt_tensor_free(&C, &h[j]);
        dt_tensor_free(&C, &t);
    }
    for (j = 0; j < L; j++) {
        memcpy(wout + j * (D * D + D), n.w[j]->value.data, sizeof(float) * D * D);
        memcpy(wout + j * (D * D + D) + D * D, n.b[j]->value.data, sizeof(float) * D);
    }
    net_free(&n);
}

/* ---- the pipelined model: dt_pp_model's callbacks */

typedef struct saved {     /* what the backward of one (chunk, micro) needs */
    const dt_tensor *x0;   /* the chunk's input: the runtime's buffer (kept valid until BW) or data */
    dt_tensor data, y;     /* first virtual stage: its input; last: the target, then dloss */
    dt_tensor a[L], h[L], dh[L];
    int live;
} saved;

typedef struct ppm {
    net n;
    int p, v, st, first[MAXV + 1];
    int64_t nb, g0;        /* samples per micro-batch; this step's first sample of this dp rank */
    float seed;
    double loss_sum;
    saved sv[2 * M];       /* [chunk * M + micro] */
    int fail_micro;        /* forward of this micro fails (error test); -1 = none */
} ppm;

static void chunk_layers(const ppm *m, int c, int *lo, int *hi) {
    int k = c * m->p + m->st;
    *lo = m->first[k], *hi = m->first[k + 1];
}

static dt_status m_forward(void *user, int c, int i, dt_tensor *out, const dt_tensor *in) {
    ppm *m = (ppm *)user;
    saved *s = &m->sv[c * M + i];
    int lo, hi, j, k = c * m->p + m->st;
    const dt_tensor *x;
    if (i == m->fail_micro) return dt_ctx_set_error(&C, DT_ERR_RANGE, "m_forward: micro %d fails on purpose", i);
    chunk_layers(m, c, &lo, &hi);
    if (s->live) return dt_ctx_set_error(&C, DT_ERR_STATE, "m_forward: (chunk %d, micro %d) twice", c, i);
    s->live = 1;
    if (!in) {
        tensor2(&s->data, m->nb, D);
        fill_batch(&s->data, NULL, m->g0 + i * m->nb, m->nb);
        x = &s->data;
    } else {
        x = in;
    }
    s->x0 = x;
    for (j = lo; j < hi; j++) {
        tensor2(&s->h[j], m->nb, D);
        tensor2(&s->a[j], m->nb, D);
        PP_TRY(dt_linear_fwd(&C, &s->h[j], j == lo ? x : &s->a[j - 1], &m->n.w[j]->value, &m->n.b[j]->value));
        PP_TRY(dt_gelu_fwd(&C, &s->a[j], &s->h[j]));
    }
    if (out) return dt_tensor_copy(&C, out, &s->a[hi - 1]);
    if (k != m->p * m->v - 1) return dt_ctx_set_error(&C, DT_ERR_STATE, "m_forward: no out before the last stage");
    { /* the loss: this micro-batch's share of the global mean */
        dt_tensor t;
        int64_t e;
        tensor2(&t, m->nb, D);
        tensor2(&s->y, m->nb, D);
        fill_batch(NULL, &t, m->g0 + i * m->nb, m->nb);
        for (e = 0; e < m->nb * D; e++) {
            float d = ((float *)s->a[hi - 1].data)[e] - ((float *)t.data)[e];
            m->loss_sum += 0.5 * (double)d * d;
            /* the mean over this rank's batch: DDP averages the dp ranks' grads */
            ((float *)s->y.data)[e] = m->seed * d / (float)(m->nb * M);
        }
        dt_tensor_free(&C, &t);
    }
    return DT_OK;
}

static void saved_free(ppm *m, saved *s, int lo, int hi) {
    int j;
    (void)m;
    for (j = lo; j < hi; j++) {
        dt_tensor_free(&C, &s->h[j]);
        dt_tensor_free(&C, &s->a[j]);
        dt_tensor_free(&C, &s->dh[j]);
    }
    dt_tensor_free(&C, &s->data);
    dt_tensor_free(&C, &s->y);
    s->live = 0;
}

static dt_status m_backward(void *user, int c, int i, dt_tensor *din, const dt_tensor *dout, dt_pp_part part) {
    ppm *m = (ppm *)user;
    saved *s = &m->sv[c * M + i];
    int lo, hi, j;
    dt_tensor cur, prev;
    chunk_layers(m, c, &lo, &hi);
    if (!s->live) return dt_ctx_set_error(&C, DT_ERR_STATE, "m_backward: (chunk %d, micro %d) before its forward", c, i);
    if (!dout) dout = &s->y;
    if (part != DT_PP_PART_WEIGHT) {
        memset(&cur, 0, sizeof cur);
        for (j = hi - 1; j >= lo; j--) {
            const dt_tensor *g = j == hi - 1 ? dout : &cur;
            dt_tensor *dx = j > lo ? &prev : din;
            tensor2(&s->dh[j], m->nb, D);
            if (j > lo) tensor2(&prev, m->nb, D);
            PP_TRY(dt_gelu_bwd(&C, &s->dh[j], g, &s->h[j]));
            if (part == DT_PP_PART_INPUT) /* BI: dt_linear_bwd's input half */
                PP_TRY(dt_linear_bwd(&C, dx, NULL, NULL, &s->dh[j], j == lo ? s->x0 : &s->a[j - 1],
                                         &m->n.w[j]->value));
            else
                PP_TRY(dt_linear_bwd(&C, dx, &m->n.w[j]->grad, &m->n.b[j]->grad, &s->dh[j],
                                         j == lo ? s->x0 : &s->a[j - 1], &m->n.w[j]->value));
            dt_tensor_free(&C, &cur);
            if (j > lo) cur = prev;
        }
        if (part == DT_PP_PART_INPUT) return DT_OK; /* dh kept for BW */
    } else {
        for (j = hi - 1; j >= lo; j--) /* BW: the weight half, from the saved dh and inputs */
            PP_TRY(dt_linear_bwd(&C, NULL, &m->n.w[j]->grad, &m->n.b[j]->grad, &s->dh[j],
                                     j == lo ? s->x0 : &s->a[j - 1], &m->n.w[j]->value));
    }
    saved_free(m, s, lo, hi);
    return DT_OK;
}

static int grads_done_calls;
static dt_status m_grads_done(void *user, int c) {
    ppm *m = (ppm *)user;
    int lo, hi, j;
    chunk_layers(m, c, &lo, &hi);
    grads_done_calls++;
    for (j = hi - 1; j >= lo; j--) PP_TRY(dt_zero_grad_ready(m->n.z, m->n.unit[j]));
    return DT_OK;
}

static void ppm_init(ppm *m, dt_pp_model *pm, int dp, int pp, int v, int stage) {
    memset(m, 0, sizeof *m);
    net_init(&m->n, world, dp, pp, v, stage);
    m->p = pp, m->v = v, m->st = m->n.l->pp_rank;
    m->nb = GB / (dp * M);
    m->fail_micro = -1;
    OK(dt_pp_split(&C, m->first, L, pp * v));
    memset(pm, 0, sizeof *pm);
    pm->user = m;
    pm->forward = m_forward;
    pm->backward = m_backward;
    pm->grads_done = m_grads_done;
    pm->act.shape[0] = m->nb;
    pm->act.shape[1] = D;
}

static void check_close(const char *name, const double *got, const double *want, int n) {
    int i, bad = -1;
    for (i = 0; i < n && bad < 0; i++)
        if (!(fabs(got[i] - want[i]) <= 1e-7 + 1e-5 * fabs(want[i]))) bad = i;
    dt_test_check_all(name, bad < 0, "[%d]: got %.9g, want %.9g", bad, bad >= 0 ? got[bad] : 0,
                      bad >= 0 ? want[bad] : 0);
}

static double ref_loss[STEPS], ref_norm[STEPS];
static float ref_w[L * (D * D + D)];

/* 3 steps of one configuration against the reference. */
static void equivalence(dt_pp_kind kind, int dp, int pp, int v, int zero, int traced) {
    ppm m;
    dt_pp_model pm;
    dt_pp_desc sd;
    dt_pp_schedule *s = NULL;
    dt_pp_stats sim;
    dt_pp_run_stats rs;
    dt_pp_run_desc rd;
    dt_trace *tr = NULL;
    double loss[STEPS], norm[STEPS];
    int step, j, bad = -1, peak_ok = 1, freed_ok = 1, max_peak = 0, n_msg = 0;
    dt_tensor_desc acts[2 * MAXV];
    size_t before = 0, leaked = 0;
    char tag[64], name[128];
    float got = 0, want = 0;
    snprintf(tag, sizeof tag, "%s_dp%d_pp%d%s%s", dt_pp_kind_name(kind), dp, pp, v > 1 ? "_v2" : "",
             zero ? "_zero1" : "");
    ppm_init(&m, &pm, dp, pp, v, zero);
    memset(&sd, 0, sizeof sd);
    sd.kind = kind, sd.stages = pp, sd.micro = M, sd.chunks = v, sd.n_layers = L;
    OK(dt_pp_schedule_create(&C, &s, &sd));
    OK(dt_pp_schedule_simulate(s, &sim, NULL)); /* s->peak: the count the runtime must meet */
    for (j = 0; j < s->count[m.st]; j++) n_msg += s->actions[m.st][j].op >= DT_PP_SEND_ACT;
    if (kind == DT_PP_GPIPE) { /* the per-boundary shapes (all the same here) instead of act */
        for (j = 0; j + 1 < pp * v; j++) acts[j] = pm.act;
        pm.acts = acts;
    }
    if (traced) OK(dt_trace_create(world, &tr));
    memset(&rd, 0, sizeof rd);
    rd.trace = tr;
    grads_done_calls = 0;
    for (step = 0; step < STEPS; step++) {
        dt_opt_step_info info;
        int64_t first, count;
        OK(dt_layout_batch_range(m.n.l, GB, &first, &count));
        m.g0 = (int64_t)step * GB + first;
        m.loss_sum = 0;
        OK(dt_zero_micro_begin(m.n.z, &m.seed, 0));
        OK(dt_zero_backward_begin(m.n.z));
        before = C.bytes_in_use;
        OK(dt_pp_run(m.n.l, &rs, s, &pm, &rd));
        if (rs.peak != s->peak[m.st] || rs.peak > rs.bound || rs.bound != s->bound[m.st] || rs.messages != n_msg)
            peak_ok = 0;
        if (rs.peak > max_peak) max_peak = rs.peak;
        OK(dt_zero_step(m.n.z, &info)); /* (the buckets grads_done launched are in flight until here) */
        /* the first run makes the pool (kept in the layout until dt_layout_free); later runs
           reuse it and allocate nothing */
        if (!traced && step > 0 && C.bytes_in_use != before) freed_ok = 0, leaked = C.bytes_in_use - before;
        norm[step] = info.grad_norm;
        OK(dt_comm_allreduce_f64(world, &m.loss_sum, 1, DT_REDUCE_SUM)); /* only last stages add */
        loss[step] = m.loss_sum / GB;
    }
    snprintf(name, sizeof name, "%s_losses_equal_single_process", tag);
    check_close(name, loss, ref_loss, STEPS);
    snprintf(name, sizeof name, "%s_grad_norms_equal_single_process", tag);
    check_close(name, norm, ref_norm, STEPS);
    for (j = 0; j < L && bad < 0; j++) {
        int e;
        if (!m.n.w[j]) continue;
        for (e = 0; e < D * D + D && bad < 0; e++) {
            float g = e < D * D ? ((float *)m.n.w[j]->value.data)[e] : ((float *)m.n.b[j]->value.data)[e - D * D];
            float w = ref_w[j * (D * D + D) + e];
            if (!(fabsf(g - w) <= 1e-6f + 1e-5f * fabsf(w))) bad = j, got = g, want = w;
        }
    }
    snprintf(name, sizeof name, "%s_weights_equal_single_process", tag);
    dt_test_check_all(name, bad < 0, "layer %d: got %.9g, want %.9g", bad, got, want);
    snprintf(name, sizeof name, "%s_in_flight_and_messages_as_scheduled", tag);
    dt_test_check_all(name, peak_ok, "stage %d: runtime peak %d, simulator %d, bound %d (runtime says %d); messages "
                      "%lld, the list's %d", m.st, rs.peak, s->peak[m.st], s->bound[m.st], rs.bound,
                      (long long)rs.messages, n_msg);
    snprintf(name, sizeof name, "%s_buffers_reused_after_the_first_step", tag); /* (a trace grows: not checked there) */
    dt_test_check_all(name, freed_ok, "stage %d: %zu bytes more after a later run", m.st, leaked);
    snprintf(name, sizeof name, "%s_grads_done_once_per_chunk_per_step", tag);
    dt_test_check_all(name, grads_done_calls == v * STEPS, "stage %d: %d calls, want %d", m.st, grads_done_calls,
                      v * STEPS);
    if (traced) {
        double comm = 0, over = 0;
        OK(dt_trace_overlap(tr, &comm, &over));
        snprintf(name, sizeof name, "%s_timeline_has_compute_and_messages", tag);
        dt_test_check_all(name, rs.busy > 0 && rs.busy <= rs.last - rs.first + 1e-9 && rs.busy <= rs.seconds &&
                          (pp == 1 ? comm == 0 : comm > 0) && rs.compute_seconds > 0,
                          "busy %.3g s in [%.3g, %.3g] (%.3g s wide), run %.3g s, messages %.3g s", rs.busy,
                          rs.first, rs.last, rs.last - rs.first, rs.seconds, comm);
        dt_trace_free(tr);
    }
    if (R == 0)
        printf("%s: loss %.6f -> %.6f, stage 0 peak %d of bound %d, buffers peak %zu bytes\n", tag, loss[0],
               loss[STEPS - 1], rs.peak, rs.bound, rs.peak_buffer_bytes);
    dt_pp_schedule_free(s);
    net_free(&m.n);
}

static dt_status run_with(ppm *m, dt_pp_model *pm, dt_pp_kind kind, int stages, int micro, int v) {
    dt_pp_desc sd;
    dt_pp_schedule *s = NULL;
    dt_status st;
    (void)m;
    memset(&sd, 0, sizeof sd);
    sd.kind = kind, sd.stages = stages, sd.micro = micro, sd.chunks = v;
    st = dt_pp_schedule_create(&C, &s, &sd);
    if (!st) st = dt_pp_run(m->n.l, NULL, s, pm, NULL);
    dt_pp_schedule_free(s);
    return st;
}

static void bad_input(void) {
    ppm m;
    dt_pp_model pm, bad;
    dt_pp_desc sd;
    dt_pp_schedule *s = NULL;
    int first[MAXV + 2], i;
    dt_status st;
    float seed;
    size_t before;
    char msg[DT_ERROR_MAX];
    ppm_init(&m, &pm, 1, W, 1, 0);
    /* a schedule for another number of stages than the layout's pp */
    st = run_with(&m, &pm, DT_PP_1F1B, W + 1, M, 1);
    dt_test_check_all("schedule_stages_differing_from_layout_pp_is_named",
                      st == DT_ERR_ARG && strstr(dt_ctx_error(&C), "layout's pp is"), "status %d: %.120s", (int)st,
                      dt_ctx_error(&C));
    /* more stages than layers: the split and the schedule both refuse */
    st = dt_pp_split(&C, first, 3, 4);
    dt_test_error("more_stages_than_layers_is_named_by_split", st, dt_ctx_error(&C), "n_layers = 3 is fewer than");
    memset(&sd, 0, sizeof sd);
    sd.kind = DT_PP_GPIPE, sd.stages = 4, sd.micro = M, sd.n_layers = 3;
    st = dt_pp_schedule_create(&C, &s, &sd);
    dt_test_error("more_stages_than_layers_is_named_by_schedule", st, dt_ctx_error(&C), "desc->n_layers = 3");
    /* interleaved with fewer micro-batches than stages */
    memset(&sd, 0, sizeof sd);
    sd.kind = DT_PP_INTERLEAVED, sd.stages = 4, sd.micro = 2, sd.chunks = 2;
    st = dt_pp_schedule_create(&C, &s, &sd);
    dt_test_error("interleaved_micro_fewer_than_stages_is_named", st, dt_ctx_error(&C), "desc->micro = 2 is fewer");
    /* the model's fields */
    bad = pm;
    bad.backward = NULL;
    st = run_with(&m, &bad, DT_PP_1F1B, W, M, 1);
    dt_test_error("null_backward_is_named", st, dt_ctx_error(&C), "m->backward is NULL");
    bad = pm;
    bad.act.shape[1] = -3;
    bad.act.ndim = 2;
    st = run_with(&m, &bad, DT_PP_INTERLEAVED, W, M, 2); /* v 2: a boundary even at pp 1 */
    dt_test_error("negative_activation_dim_is_named", st, dt_ctx_error(&C), "[4, -3");
    {
        dt_tensor_desc acts[MAXV];
        for (i = 0; i < MAXV; i++) acts[i] = pm.act;
        acts[W > 1 ? W - 1 : 0].shape[0] = -1; /* the boundary after virtual stage W - 1 (of 2 W) */
        bad = pm;
        bad.acts = acts;
        st = run_with(&m, &bad, DT_PP_INTERLEAVED, W, M, 2);
        snprintf(msg, sizeof msg, "virtual stage %d sends (m->acts[k]) has shape [-1", W > 1 ? W - 1 : 0);
        dt_test_error("negative_dim_in_acts_names_the_boundary", st, dt_ctx_error(&C), msg);
    }
    st = dt_pp_run(m.n.l, NULL, NULL, &pm, NULL);
    dt_test_error("null_schedule_is_named", st, dt_ctx_error(&C), "s (the schedule) is NULL");
    /* an action edited on the last stage's list: every rank refuses the run, naming it, before
       anything is sent (not only the rank that would run it, while the others wait on it) */
    memset(&sd, 0, sizeof sd);
    sd.kind = DT_PP_1F1B, sd.stages = W, sd.micro = M;
    if (dt_pp_schedule_create(&C, &s, &sd) == DT_OK) {
        s->actions[W - 1][0].chunk = 4096;
        st = dt_pp_run(m.n.l, NULL, s, &pm, NULL);
        snprintf(msg, sizeof msg, "dt_pp_run: fields: stage %d, action 0 (", W - 1);
        dt_test_check_all("edited_action_on_one_stage_is_named_on_every_rank",
                          st == DT_ERR_ARG && strstr(dt_ctx_error(&C), msg) &&
                          strstr(dt_ctx_error(&C), "chunk = 4096, expected 0 .. 0"),
                          "status %d: %.160s", (int)st, dt_ctx_error(&C));
        dt_pp_schedule_free(s);
        s = NULL;
    }
    net_free(&m.n);

    /* a callback's error on one stage alone: at pp 1 (a private world), where nothing waits on it */
    before = C.bytes_in_use;
    {
        dt_comm *keep = world;
        world = self;
        ppm_init(&m, &pm, 1, 1, 1, 0);
        world = keep;
    }
    OK(dt_zero_micro_begin(m.n.z, &seed, 0));
    OK(dt_zero_backward_begin(m.n.z));
    m.seed = seed;
    m.fail_micro = 2;
    st = run_with(&m, &pm, DT_PP_1F1B, 1, M, 1);
    snprintf(msg, sizeof msg, "%s", dt_ctx_error(&C));
    dt_test_check_all("callback_error_names_the_action", st == DT_ERR_RANGE && strstr(msg, "F chunk 0 micro 2") &&
                      strstr(msg, "fails on purpose"), "status %d: %.140s", (int)st, msg);
    for (i = 0; i < 2 * M; i++)
        if (m.sv[i].live) saved_free(&m, &m.sv[i], 0, L);
    net_free(&m.n); /* the runtime's pool stays in the layout after a failed run too, until its free */
    dt_test_check_all("failed_run_at_pp1_gives_its_buffers_back_with_the_layout", C.bytes_in_use == before,
                      "%zu bytes more", C.bytes_in_use - before);
}

int main(void) {
    static const dt_pp_kind KINDS[4] = {DT_PP_GPIPE, DT_PP_1F1B, DT_PP_INTERLEAVED, DT_PP_ZB_H1};
    int k;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);
    OK(dt_comm_split(world, &self, R, 0));
    reference(ref_loss, ref_norm, ref_w);
    if (R == 0) printf("reference: losses %.6f %.6f %.6f, grad norms %.4f %.4f %.4f (clip 0.05)\n", ref_loss[0],
                       ref_loss[1], ref_loss[2], ref_norm[0], ref_norm[1], ref_norm[2]);
    dt_test_check_all("reference_clips", ref_norm[0] > 0.05, "grad norm %g <= clip 0.05: clipping untested",
                      ref_norm[0]);
    for (k = 0; k < 4; k++) equivalence(KINDS[k], 1, W, KINDS[k] == DT_PP_INTERLEAVED ? 2 : 1, 0, k == 1);
    if (W == 4) {
        for (k = 0; k < 4; k++) equivalence(KINDS[k], 2, 2, KINDS[k] == DT_PP_INTERLEAVED ? 2 : 1, 0, k == 3);
        equivalence(DT_PP_INTERLEAVED, 2, 2, 2, 1, 0); /* ZeRO-1: the shards' optimizer, reduce-scatter at the step */
    }
    bad_input();
    {
        int rc = dt_test_finish();
        dt_comm_free(self);
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
