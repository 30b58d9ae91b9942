// np: 1 2 4
/* tests/mpi_parallel_tp.c - Megatron tensor and sequence parallel layers of dt_parallel.h
   against the whole layer computed with dt_tensor.h ops on one rank, in the same program.

   For each layout (tp = the world size; tp = 2 x dp = 2 at np 4; tp = 1 x dp = world at np > 1)
   and each of sp = 0 and 1, every rank computes the full reference itself (the weights are
   initialised with dt_tensor_init from the logical shape, the shards from global_shape / start
   given by dt_tp_param_desc, so a shard is the slice of the full tensor) and compares its own
   part of every output and every grad: 1e-5 relative (atol 1e-6 of the array's largest value)
   for tp > 1, bitwise for tp = 1 (which must be the plain op). Checked:
     - column- and row-parallel linear, forward and backward (grads accumulate onto 0.25);
     - a Megatron MLP block (layernorm, column, GELU, row, residual) and an attention block
       (layernorm, qkv column-parallel with heads split over tp and the weight laid out as
       [3, C, C], dt_attention on the local heads, output projection row-parallel, residual),
       end to end, with the layernorm and row-parallel bias grads summed over tp under sp; the
       MLP block run twice is bitwise repeatable;
     - the vocab-parallel embedding (ids on every shard, repeated; bitwise: one contribution per
       row) and ids out of range (DT_ERR_RANGE);
     - the vocab-parallel cross entropy against dt_softmax_xent_fwd/_bwd on the gathered real
       columns (padding columns hold large logits and must be ignored, ignore_index rows
       skipped, a rank whose shard is only padding), bitwise the same loss on every rank, and its
       gradient (written over what dlogits held: 0 on padding columns) against central finite
       differences of a double-precision loss;
     - bad inputs named (wrong shard shapes, N not divisible by tp under sp, sp = 2, missing
       scratch, vocab_start and vocab out of place, targets out of range, bad param kinds). */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

static dt_ctx C;
static int world_rank;

#define CK(x) do { dt_status s_ = (x); if (s_) { \
    fprintf(stderr, "[rank %d] %s:%d: %s -> %s: %s\n", world_rank, __FILE__, __LINE__, #x, dt_status_name(s_), \
            dt_ctx_error(&C)); \
    MPI_Abort(MPI_COMM_WORLD, 1); } } while (0)

/* Sizes: N = B*T rows (divisible by 1, 2, 4), widths divisible by 4. */
enum { B = 2, T = 4, N = B * T, CH = 8, HID = 16, NHEAD = 4, V = 10, VP = 12 };

/* ---- tensors of one test, freed together */

static dt_tensor *pool[256];
static int npool;

static dt_tensor *mk4(int ndim, int64_t s0, int64_t s1, int64_t s2, int64_t s3) {
    dt_tensor_desc d;
    dt_tensor *t = (dt_tensor *)calloc(1, sizeof *t);
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32;
    d.ndim = ndim;
    d.shape[0] = s0; d.shape[1] = s1; d.shape[2] = s2; d.shape[3] = s3;
    CK(dt_tensor_create(&C, t, &d));
    pool[npool++] = t;
    return t;
}
static dt_tensor *mk(int ndim, int64_t s0, int64_t s1, int64_t s2) { return mk4(ndim, s0, s1, s2, 0); }
static dt_tensor *m2(int64_t r, int64_t c) { return mk(2, r, c, 0); }
static dt_tensor *m1(int64_t n) { return mk(1, n, 0, 0); }
static void free_pool(void) {
    while (npool) { dt_tensor_free(&C, pool[--npool]); free(pool[npool]); }
}
static float *F(const dt_tensor *t) { return (float *)t->data; }

static void init(dt_tensor *t, const char *name, double mean, double std, const dt_param_desc *shard) {
    dt_init_desc in;
    memset(&in, 0, sizeof in);
    in.kind = DT_INIT_NORMAL;
    in.seed = 1234;
    in.name = name;
    in.mean = mean;
    in.std = std;
    if (shard) {
        memcpy(in.global_shape, shard->global_shape, sizeof in.global_shape);
        memcpy(in.start, shard->start, sizeof in.start);
    }
    CK(dt_tensor_init(&C, t, &in));
}
/* A whole [r, c] (c = 0: [r]) tensor, initialised. */
static dt_tensor *full(const char *name, int64_t r, int64_t c, double mean, double std) {
    dt_tensor *t = c ? m2(r, c) : m1(r);
    init(t, name, mean, std, NULL);
    return t;
}
/* This tp rank's shard of the [r, c] parameter `name`, cut as `kind`. */
static dt_tensor *shard(dt_layout *l, dt_tp_kind kind, const char *name, int64_t r, int64_t c, double mean, double std) {
    dt_param_desc d;
    dt_tensor *t;
    memset(&d, 0, sizeof d);
    CK(dt_tp_param_desc(l, &d, kind, r, c));
    t = mk(d.ndim, d.shape[0], d.shape[1], d.shape[2]);
    init(t, name, mean, std, &d);
    return t;
}
static dt_tensor *fill(dt_tensor *t, double v) { CK(dt_tensor_fill(&C, t, v)); return t; }
/* A [rows, cols] view of t. */
static dt_tensor *as2(const dt_tensor *t, int64_t r, int64_t c) {
    dt_tensor *v = (dt_tensor *)calloc(1, sizeof *v);
    int64_t s[2];
    s[0] = r; s[1] = c;
    CK(dt_tensor_reshape(&C, v, t, 2, s));
    pool[npool++] = v; /* a view: dt_tensor_free leaves its memory alone */
    return v;
}
/* Columns [c0, c0 + n) of the [R, W] tensor src, as a new [R, n] tensor. */
static dt_tensor *cols(const dt_tensor *src, int64_t c0, int64_t n) {
    int64_t R = src->shape[0], W = src->shape[src->ndim - 1], r;
    dt_tensor *t = m2(R, n);
    for (r = 0; r < R; r++) memcpy(F(t) + r * n, F(src) + r * W + c0, sizeof(float) * (size_t)n);
    return t;
}
/* Rows [r0, r0 + n) of the [R, W] tensor src, as a new [n, W] tensor. */
static dt_tensor *rows(const dt_tensor *src, int64_t r0, int64_t n) {
    int64_t W = src->shape[src->ndim - 1];
    dt_tensor *t = m2(n, W);
    memcpy(F(t), F(src) + r0 * W, sizeof(float) * (size_t)(n * W));
    return t;
}
static dt_tensor *copy(const dt_tensor *src) {
    dt_tensor *t = mk(src->ndim, src->shape[0], src->shape[1], src->shape[2]);
    CK(dt_tensor_copy(&C, t, src));
    return t;
}

/* ---- comparisons (collective over the world) */

static char cfg[64];           /* "tp2_dp2_sp1" */
static double worst_rel;       /* largest relative difference seen under tp > 1 */

static const char *nm(const char *what) {
    static char buf[160];
    snprintf(buf, sizeof buf, "%s_%s", what, cfg);
    return buf;
}

/* got vs want, n values: exact when tol = 0, else |g - w| <= tol (|w| + 0.1 max|want|). */
static int cmp(const char *what, const float *got, const float *want, int64_t n, double tol) {
    int64_t i, bad = -1;
    double scale = 0, worst = 0;
    for (i = 0; i < n; i++) if (fabs(want[i]) > scale) scale = fabs(want[i]);
    for (i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]), lim = tol * (fabs(want[i]) + 0.1 * scale);
        double rel = d / (fabs(want[i]) + 0.1 * scale + 1e-30);
        if (rel > worst) worst = rel;
        if (tol == 0 ? memcmp(&got[i], &want[i], sizeof(float)) != 0 : !(d <= lim)) { if (bad < 0) bad = i; }
    }
    if (tol > 0 && worst > worst_rel) worst_rel = worst;
    return dt_test_check_all(nm(what), bad < 0, "[%lld] got %.9g, want %.9g (tol %g relative; worst %.3g)",
                             (long long)bad, bad >= 0 ? (double)got[bad] : 0.0, bad >= 0 ? (double)want[bad] : 0.0,
                             tol, worst);
}
static int cmpt(const char *what, const dt_tensor *got, const dt_tensor *want, double tol) {
    if (got->numel != want->numel)
        return dt_test_check_all(nm(what), 0, "numel %lld vs %lld", (long long)got->numel, (long long)want->numel);
    return cmp(what, F(got), F(want), got->numel, tol);
}
static void expect_err(const char *what, dt_status st, dt_status want, const char *must) {
    const char *msg = dt_ctx_error(&C);
    dt_test_check_all(nm(what), st == want && strstr(msg, must) != NULL, "status %s (want %s), message \"%.100s\" "
                      "(want it to mention \"%s\")", dt_status_name(st), dt_status_name(want), msg, must);
}

/* ---- the layers one by one */

static void test_column(dt_layout *l, int sp, double tol) {
    const int64_t O = 12, In = 6, tp = l->tp, k = l->tp_rank, Ol = O / tp, nl = N / tp;
    dt_tensor *X = full("col.x", N, In, 0, 1), *W = full("col.w", O, In, 0, 0.5), *b = full("col.b", O, 0, 0, 0.5);
    dt_tensor *dY = full("col.dy", N, O, 0, 1), *Y = m2(N, O);
    dt_tensor *dX = fill(m2(N, In), 0.25), *dW = fill(m2(O, In), 0.25), *db = fill(m1(O), 0.25);
    dt_tensor *w = shard(l, DT_TP_COLUMN, "col.w", O, In, 0, 0.5), *bs = shard(l, DT_TP_COLUMN, "col.b", O, 0, 0, 0.5);
    dt_tensor *x = sp ? rows(X, k * nl, nl) : X, *xbuf = m2(N, In), *y = m2(N, Ol), *dy = cols(dY, k * Ol, Ol);
    dt_tensor *dx = fill(m2(sp ? nl : N, In), 0.25), *dw = fill(m2(Ol, In), 0.25), *dbs = fill(m1(Ol), 0.25);
    CK(dt_linear_fwd(&C, Y, X, W, b));
    CK(dt_linear_bwd(&C, dX, dW, db, dY, X, W));
    CK(dt_tp_column_linear_fwd(l, y, sp ? xbuf : NULL, x, w, bs, sp));
    cmpt("column_linear_fwd_matches_single_rank", y, cols(Y, k * Ol, Ol), tol);
    CK(dt_tp_column_linear_bwd(l, dx, dw, dbs, m2(N, In), dy, sp ? xbuf : x, w, sp));
    cmpt("column_linear_bwd_dx_matches_single_rank", dx, sp ? rows(dX, k * nl, nl) : dX, tol);
    cmpt("column_linear_bwd_dw_matches_single_rank", dw, rows(dW, k * Ol, Ol), tol);
    cmp("column_linear_bwd_dbias_matches_single_rank", F(dbs), F(db) + k * Ol, Ol, tol);

    /* bad inputs: the same on every rank, so no rank is left in a collective */
    expect_err("column_linear_out_of_full_width_is_named", dt_tp_column_linear_fwd(l, m2(N, Ol + 1),
               sp ? xbuf : NULL, x, w, bs, sp), DT_ERR_SHAPE, "out shape");
    expect_err("column_linear_sp2_is_named", dt_tp_column_linear_fwd(l, y, xbuf, x, w, bs, 2), DT_ERR_ARG, "sp = 2");
    if (sp)
        expect_err("column_linear_sp_without_xbuf_is_named", dt_tp_column_linear_fwd(l, y, NULL, x, w, bs, 1),
                   DT_ERR_ARG, "xbuf is NULL");
    expect_err("column_linear_bwd_without_dxbuf_is_named", tp > 1 ? dt_tp_column_linear_bwd(l, dx, dw, dbs, NULL, dy,
               sp ? xbuf : x, w, sp) : dt_tp_column_linear_bwd(l, dx, dw, dbs, m2(N + 1, In), dy, sp ? xbuf : x, w, sp),
               tp > 1 ? DT_ERR_ARG : DT_ERR_SHAPE, "dxbuf");
    expect_err("column_linear_bwd_dxbuf_on_the_input_is_named", dt_tp_column_linear_bwd(l, dx, dw, dbs, xbuf, dy,
               xbuf, w, sp), DT_ERR_ARG, "dxbuf shares memory with xbuf_or_x");
    free_pool();
}

static void test_row(dt_layout *l, int sp, double tol) {
    const int64_t O = 6, In = 12, tp = l->tp, k = l->tp_rank, Il = In / tp, nl = N / tp;
    dt_tensor *X = full("row.x", N, In, 0, 1), *W = full("row.w", O, In, 0, 0.5), *b = full("row.b", O, 0, 0, 0.5);
    dt_tensor *dY = full("row.dy", N, O, 0, 1), *Y = m2(N, O);
    dt_tensor *dX = fill(m2(N, In), 0.25), *dW = fill(m2(O, In), 0.25), *db = fill(m1(O), 0.25);
    dt_tensor *w = shard(l, DT_TP_ROW, "row.w", O, In, 0, 0.5), *bs = shard(l, DT_TP_REPLICATED, "row.b", O, 0, 0, 0.5);
    dt_tensor *x = cols(X, k * Il, Il), *y = m2(sp ? nl : N, O), *partial = m2(N, O);
    dt_tensor *dy = sp ? rows(dY, k * nl, nl) : dY;
    /* under sp the bias grad is partial per rank: start each at 0.25 / tp so that the sum starts at 0.25 */
    dt_tensor *dx = fill(m2(N, Il), 0.25), *dw = fill(m2(O, Il), 0.25), *dbs = fill(m1(O), sp ? 0.25 / tp : 0.25);
    CK(dt_linear_fwd(&C, Y, X, W, b));
    CK(dt_linear_bwd(&C, dX, dW, db, dY, X, W));
    CK(dt_tp_row_linear_fwd(l, y, sp ? partial : NULL, x, w, bs, sp));
    cmpt("row_linear_fwd_matches_single_rank", y, sp ? rows(Y, k * nl, nl) : Y, tol);
    if (!sp && tp > 1) { /* the all-reduced output is bitwise the same on every tp rank */
        dt_tensor *all = m2(tp * N, O);
        int64_t j, ok = 1;
        CK(dt_comm_allgather(l->tp_comm, all, y));
        for (j = 1; j < tp; j++) ok &= memcmp(F(all), F(all) + j * N * O, sizeof(float) * N * O) == 0;
        dt_test_check_all(nm("row_linear_output_bitwise_equal_on_every_tp_rank"), (int)ok, "%s", "blocks differ");
    }
    CK(dt_tp_row_linear_bwd(l, dx, dw, dbs, m2(N, O), dy, x, w, sp));
    if (sp) CK(dt_tp_allreduce(l, dbs)); /* before the optimizer step, as the model must */
    cmpt("row_linear_bwd_dx_matches_single_rank", dx, cols(dX, k * Il, Il), tol);
    cmpt("row_linear_bwd_dw_matches_single_rank", dw, cols(dW, k * Il, Il), tol);
    cmpt("row_linear_bwd_dbias_matches_single_rank", dbs, db, tol);

    expect_err("row_linear_wrong_w_shard_is_named", dt_tp_row_linear_fwd(l, y, partial, x, m2(O, Il + 1), bs, sp),
               DT_ERR_SHAPE, "x shape");
    expect_err("row_linear_sp2_is_named", dt_tp_row_linear_bwd(l, dx, dw, dbs, partial, dy, x, w, 2), DT_ERR_ARG,
               "sp = 2");
    if (sp && tp > 1) {
        expect_err("row_linear_rows_not_divisible_by_tp_is_named", dt_tp_row_linear_fwd(l, m2(nl, O), m2(N + 1, O),
                   m2(N + 1, Il), w, bs, 1), DT_ERR_SHAPE, "not divisible by tp");
        expect_err("row_linear_sp_without_partial_is_named", dt_tp_row_linear_fwd(l, y, NULL, x, w, bs, 1), DT_ERR_ARG,
                   "partial is NULL");
    }
    free_pool();
}

/* ---- Megatron MLP block: out = x + row(gelu(column(ln(x)))) */

typedef struct mlp_grads { dt_tensor *out, *dx, *dw1, *db1, *dw2, *db2, *dlw, *dlb; } mlp_grads;

static void mlp_reference(mlp_grads *g) {
    dt_tensor *X = full("mlp.x", N, CH, 0, 1), *lw = full("mlp.ln.w", CH, 0, 1, 0.2), *lb = full("mlp.ln.b", CH, 0, 0, 0.2);
    dt_tensor *W1 = full("mlp.w1", HID, CH, 0, 0.4), *b1 = full("mlp.b1", HID, 0, 0, 0.2);
    dt_tensor *W2 = full("mlp.w2", CH, HID, 0, 0.3), *b2 = full("mlp.b2", CH, 0, 0, 0.2);
    dt_tensor *dY = full("mlp.dy", N, CH, 0, 1), *ln = m2(N, CH), *mu = m1(N), *rs = m1(N), *h = m2(N, HID);
    dt_tensor *a = m2(N, HID), *y = m2(N, CH), *da = m2(N, HID), *dh = m2(N, HID), *dln = m2(N, CH);
    g->out = m2(N, CH); g->dx = copy(dY); /* the residual's grad */
    g->dw1 = m2(HID, CH); g->db1 = m1(HID); g->dw2 = m2(CH, HID); g->db2 = m1(CH); g->dlw = m1(CH); g->dlb = m1(CH);
    CK(dt_layernorm_fwd(&C, ln, mu, rs, X, lw, lb, 1e-5f));
    CK(dt_linear_fwd(&C, h, ln, W1, b1));
    CK(dt_gelu_fwd(&C, a, h));
    CK(dt_linear_fwd(&C, y, a, W2, b2));
    CK(dt_add(&C, g->out, X, y));
    CK(dt_linear_bwd(&C, da, g->dw2, g->db2, dY, a, W2));
    CK(dt_gelu_bwd(&C, dh, da, h));
    CK(dt_linear_bwd(&C, dln, g->dw1, g->db1, dh, ln, W1));
    CK(dt_layernorm_bwd(&C, g->dx, g->dlw, g->dlb, dln, X, lw, mu, rs));
}

/* The same block on this tp rank's shards; under sp the rows of x, out and dx are this rank's. */
static void mlp_parallel(dt_layout *l, int sp, mlp_grads *g) {
    const int64_t tp = l->tp, k = l->tp_rank, Hl = HID / tp, nl = sp ? N / tp : N, r0 = sp ? k * nl : 0;
    dt_tensor *X = full("mlp.x", N, CH, 0, 1), *dY = full("mlp.dy", N, CH, 0, 1);
    dt_tensor *lw = shard(l, DT_TP_REPLICATED, "mlp.ln.w", CH, 0, 1, 0.2);
    dt_tensor *lb = shard(l, DT_TP_REPLICATED, "mlp.ln.b", CH, 0, 0, 0.2);
    dt_tensor *w1 = shard(l, DT_TP_COLUMN, "mlp.w1", HID, CH, 0, 0.4), *b1 = shard(l, DT_TP_COLUMN, "mlp.b1", HID, 0, 0, 0.2);
    dt_tensor *w2 = shard(l, DT_TP_ROW, "mlp.w2", CH, HID, 0, 0.3), *b2 = shard(l, DT_TP_REPLICATED, "mlp.b2", CH, 0, 0, 0.2);
    dt_tensor *x = rows(X, r0, nl), *dy = rows(dY, r0, nl);
    dt_tensor *ln = m2(nl, CH), *mu = m1(nl), *rs = m1(nl), *xbuf = m2(N, CH), *h = m2(N, Hl), *a = m2(N, Hl);
    dt_tensor *y = m2(nl, CH), *partial = m2(N, CH), *da = m2(N, Hl), *dh = m2(N, Hl), *dln = m2(nl, CH);
    g->out = m2(nl, CH); g->dx = copy(dy);
    g->dw1 = m2(Hl, CH); g->db1 = m1(Hl); g->dw2 = m2(CH, Hl); g->db2 = m1(CH); g->dlw = m1(CH); g->dlb = m1(CH);
    CK(dt_layernorm_fwd(&C, ln, mu, rs, x, lw, lb, 1e-5f));
    CK(dt_tp_column_linear_fwd(l, h, xbuf, ln, w1, b1, sp));
    CK(dt_gelu_fwd(&C, a, h)); /* elementwise on the local columns: no communication */
    CK(dt_tp_row_linear_fwd(l, y, partial, a, w2, b2, sp));
    CK(dt_add(&C, g->out, x, y));
    CK(dt_tp_row_linear_bwd(l, da, g->dw2, g->db2, partial, dy, a, w2, sp));
    CK(dt_gelu_bwd(&C, dh, da, h));
    CK(dt_tp_column_linear_bwd(l, dln, g->dw1, g->db1, m2(N, CH), dh, sp ? xbuf : ln, w1, sp));
    CK(dt_layernorm_bwd(&C, g->dx, g->dlw, g->dlb, dln, x, lw, mu, rs));
    if (sp) { /* the sharded region's params: partial grads per tp rank */
        CK(dt_tp_allreduce(l, g->dlw));
        CK(dt_tp_allreduce(l, g->dlb));
        CK(dt_tp_allreduce(l, g->db2));
    }
}

static void test_mlp(dt_layout *l, int sp, double tol) {
    const int64_t tp = l->tp, k = l->tp_rank, Hl = HID / tp, nl = sp ? N / tp : N, r0 = sp ? k * nl : 0;
    mlp_grads r, p, q;
    int same = 1;
    mlp_reference(&r);
    mlp_parallel(l, sp, &p);
    cmp("mlp_block_out_matches_single_rank", F(p.out), F(r.out) + r0 * CH, nl * CH, tol);
    cmp("mlp_block_dx_matches_single_rank", F(p.dx), F(r.dx) + r0 * CH, nl * CH, tol);
    cmpt("mlp_block_dw1_matches_single_rank", p.dw1, rows(r.dw1, k * Hl, Hl), tol);
    cmp("mlp_block_db1_matches_single_rank", F(p.db1), F(r.db1) + k * Hl, Hl, tol);
    cmpt("mlp_block_dw2_matches_single_rank", p.dw2, cols(r.dw2, k * Hl, Hl), tol);
    cmpt("mlp_block_db2_matches_single_rank", p.db2, r.db2, tol);
    cmpt("mlp_block_ln_dw_matches_single_rank", p.dlw, r.dlw, tol);
    cmpt("mlp_block_ln_db_matches_single_rank", p.dlb, r.dlb, tol);
    mlp_parallel(l, sp, &q);
#define SAME(f) same &= memcmp(F(p.f), F(q.f), dt_tensor_bytes(p.f)) == 0
    SAME(out); SAME(dx); SAME(dw1); SAME(db1); SAME(dw2); SAME(db2); SAME(dlw); SAME(dlb);
#undef SAME
    dt_test_check_all(nm("mlp_block_is_bitwise_repeatable"), same, "%s", "a second run differs");
    free_pool();
}

/* ---- attention block: out = x + proj(attention(qkv(ln(x)))), heads split over tp */

static void test_attention(dt_layout *l, int sp, double tol) {
    const int64_t tp = l->tp, k = l->tp_rank, Cl = CH / tp, Hl = NHEAD / tp, nl = sp ? N / tp : N, r0 = sp ? k * nl : 0;
    int64_t i, j;
    /* the reference: qkv weight [3C, C] whole, rows q | k | v */
    dt_tensor *X = full("att.x", N, CH, 0, 1), *dY = full("att.dy", N, CH, 0, 1);
    dt_tensor *lw = full("att.ln.w", CH, 0, 1, 0.2), *lb = full("att.ln.b", CH, 0, 0, 0.2);
    dt_tensor *Wq = full("att.qkv.w", 3 * CH, CH, 0, 0.5), *bq = full("att.qkv.b", 3 * CH, 0, 0, 0.2);
    dt_tensor *Wo = full("att.proj.w", CH, CH, 0, 0.4), *bo = full("att.proj.b", CH, 0, 0, 0.2);
    dt_tensor *ln = m2(N, CH), *mu = m1(N), *rs = m1(N), *qkv = mk(3, B, T, 3 * CH), *ao = mk(3, B, T, CH);
    dt_tensor *att = mk4(4, B, NHEAD, T, T), *y = m2(N, CH), *out = m2(N, CH), *dx = copy(dY);
    dt_tensor *dWq = m2(3 * CH, CH), *dbq = m1(3 * CH), *dWo = m2(CH, CH), *dbo = m1(CH), *dlw = m1(CH), *dlb = m1(CH);
    dt_tensor *dao = mk(3, B, T, CH), *dqkv = mk(3, B, T, 3 * CH), *dln = m2(N, CH);
    /* this rank: qkv weight as [3, C, C] cut on dim 1 (its heads), viewed as [3C/tp, C] */
    dt_tensor *wq3 = shard(l, DT_TP_QKV, "att.qkv.w", 3 * CH, CH, 0, 0.5), *bq3 = shard(l, DT_TP_QKV, "att.qkv.b", 3 * CH, 0, 0, 0.2);
    dt_tensor *wq = as2(wq3, 3 * Cl, CH), *bqv = as2(bq3, 1, 3 * Cl);
    dt_tensor *wo = shard(l, DT_TP_ROW, "att.proj.w", CH, CH, 0, 0.4), *bos = shard(l, DT_TP_REPLICATED, "att.proj.b", CH, 0, 0, 0.2);
    dt_tensor *lws = shard(l, DT_TP_REPLICATED, "att.ln.w", CH, 0, 1, 0.2), *lbs = shard(l, DT_TP_REPLICATED, "att.ln.b", CH, 0, 0, 0.2);
    dt_tensor *x = rows(X, r0, nl), *dy = rows(dY, r0, nl), *lnl = m2(nl, CH), *mul = m1(nl), *rsl = m1(nl);
    dt_tensor *xbuf = m2(N, CH), *qkvl = mk(3, B, T, 3 * Cl), *aol = mk(3, B, T, Cl), *attl = mk4(4, B, Hl, T, T);
    dt_tensor *yl = m2(nl, CH), *partial = m2(N, CH), *outl = m2(nl, CH), *dxl = copy(dy);
    dt_tensor *dwq = m2(3 * Cl, CH), *dbqv = m1(3 * Cl), *dwo = m2(CH, Cl), *dbos = m1(CH), *dlws = m1(CH), *dlbs = m1(CH);
    dt_tensor *daol = mk(3, B, T, Cl), *dqkvl = mk(3, B, T, 3 * Cl), *dlnl = m2(nl, CH);
    dt_tensor *qkv2 = as2(qkv, N, 3 * CH), *ao2 = as2(ao, N, CH), *dao2 = as2(dao, N, CH), *dqkv2 = as2(dqkv, N, 3 * CH);
    dt_tensor *qkvl2 = as2(qkvl, N, 3 * Cl), *aol2 = as2(aol, N, Cl), *daol2 = as2(daol, N, Cl), *dqkvl2 = as2(dqkvl, N, 3 * Cl);
    dt_tensor *Wqk, *wqk;
    /* the layout: the shard's values are the rows of its heads' q, k and v in the whole [3C, C] weight */
    Wqk = m2(3 * Cl, CH);
    for (i = 0; i < 3; i++)
        for (j = 0; j < Cl; j++)
            memcpy(F(Wqk) + (i * Cl + j) * CH, F(Wq) + (i * CH + k * Cl + j) * CH, sizeof(float) * CH);
    wqk = copy(wq);
    cmpt("qkv_shard_is_its_heads_q_k_v_rows_of_the_whole_weight", wqk, Wqk, 0);

    CK(dt_layernorm_fwd(&C, ln, mu, rs, X, lw, lb, 1e-5f));
    CK(dt_linear_fwd(&C, qkv2, ln, Wq, bq));
    CK(dt_attention_fwd(&C, ao, att, qkv, NHEAD));
    CK(dt_linear_fwd(&C, y, ao2, Wo, bo));
    CK(dt_add(&C, out, X, y));
    CK(dt_linear_bwd(&C, dao2, dWo, dbo, dY, ao2, Wo));
    CK(dt_attention_bwd(&C, dqkv, dao, qkv, att, NHEAD));
    CK(dt_linear_bwd(&C, dln, dWq, dbq, dqkv2, ln, Wq));
    CK(dt_layernorm_bwd(&C, dx, dlw, dlb, dln, X, lw, mu, rs));

    CK(dt_layernorm_fwd(&C, lnl, mul, rsl, x, lws, lbs, 1e-5f));
    CK(dt_tp_column_linear_fwd(l, qkvl2, xbuf, lnl, wq, bqv, sp));
    CK(dt_attention_fwd(&C, aol, attl, qkvl, (int)Hl)); /* the local heads, whole sequences */
    CK(dt_tp_row_linear_fwd(l, yl, partial, aol2, wo, bos, sp));
    CK(dt_add(&C, outl, x, yl));
    CK(dt_tp_row_linear_bwd(l, daol2, dwo, dbos, partial, dy, aol2, wo, sp));
    CK(dt_attention_bwd(&C, dqkvl, daol, qkvl, attl, (int)Hl));
    CK(dt_tp_column_linear_bwd(l, dlnl, dwq, dbqv, m2(N, CH), dqkvl2, sp ? xbuf : lnl, wq, sp));
    CK(dt_layernorm_bwd(&C, dxl, dlws, dlbs, dlnl, x, lws, mul, rsl));
    if (sp) { CK(dt_tp_allreduce(l, dlws)); CK(dt_tp_allreduce(l, dlbs)); CK(dt_tp_allreduce(l, dbos)); }

    cmp("attention_block_out_matches_single_rank", F(outl), F(out) + r0 * CH, nl * CH, tol);
    cmp("attention_block_dx_matches_single_rank", F(dxl), F(dx) + r0 * CH, nl * CH, tol);
    {   /* this rank's rows of the whole grads, in the [3, C/tp, C] layout */
        dt_tensor *dWqk = m2(3 * Cl, CH), *dbqk = m1(3 * Cl);
        for (i = 0; i < 3; i++) {
            memcpy(F(dWqk) + i * Cl * CH, F(dWq) + (i * CH + k * Cl) * CH, sizeof(float) * (size_t)(Cl * CH));
            memcpy(F(dbqk) + i * Cl, F(dbq) + i * CH + k * Cl, sizeof(float) * (size_t)Cl);
        }
        cmpt("attention_block_dqkv_w_matches_single_rank", dwq, dWqk, tol);
        cmpt("attention_block_dqkv_b_matches_single_rank", dbqv, dbqk, tol);
    }
    cmpt("attention_block_dproj_w_matches_single_rank", dwo, cols(dWo, k * Cl, Cl), tol);
    cmpt("attention_block_dproj_b_matches_single_rank", dbos, dbo, tol);
    cmpt("attention_block_ln_dw_matches_single_rank", dlws, dlw, tol);
    cmpt("attention_block_ln_db_matches_single_rank", dlbs, dlb, tol);
    free_pool();
}

/* ---- vocab-parallel embedding */

static void test_embedding(dt_layout *l, int sp) {
    const int64_t tp = l->tp, k = l->tp_rank, Vl = VP / tp, nl = sp ? N / tp : N, r0 = sp ? k * nl : 0;
    static const int32_t idv[N] = {0, 9, 3, 5, 1, 8, 4, 9}; /* every shard at tp 4 ([0,3) [3,6) [6,9) [9,12)), 9 twice */
    dt_tensor_desc d;
    dt_tensor ids, bad;
    dt_tensor *Tb = full("emb.table", VP, CH, 0, 1), *Y = m2(N, CH), *dY = full("emb.dy", N, CH, 0, 1);
    dt_tensor *dT = fill(m2(VP, CH), 0.25);
    dt_tensor *tb = shard(l, DT_TP_COLUMN, "emb.table", VP, CH, 0, 1), *y = m2(nl, CH), *partial = m2(N, CH);
    dt_tensor *dtb = fill(m2(Vl, CH), 0.25), *dy = rows(dY, r0, nl);
    memset(&d, 0, sizeof d);
    d.dtype = DT_I32; d.shape[0] = N;
    CK(dt_tensor_create(&C, &ids, &d));
    CK(dt_tensor_create(&C, &bad, &d));
    memcpy(ids.data, idv, sizeof idv);
    CK(dt_embedding_fwd(&C, Y, Tb, &ids));
    CK(dt_embedding_bwd(&C, dT, dY, &ids));
    CK(dt_tp_embedding_fwd(l, y, sp ? partial : NULL, tb, &ids, k * Vl, V, sp));
    cmp("vocab_embedding_fwd_equals_single_rank_bitwise", F(y), F(Y) + r0 * CH, nl * CH, 0);
    CK(dt_tp_embedding_bwd(l, dtb, sp ? partial : NULL, dy, &ids, k * Vl, V, sp));
    cmp("vocab_embedding_bwd_equals_single_rank_bitwise", F(dtb), F(dT) + k * Vl * CH, Vl * CH, 0);

    memcpy(bad.data, idv, sizeof idv);
    ((int32_t *)bad.data)[2] = V; /* a padding row: inside the table, outside the vocab */
    expect_err("vocab_embedding_id_in_padding_is_range_error", dt_tp_embedding_fwd(l, y, partial, tb, &bad, k * Vl, V, sp),
               DT_ERR_RANGE, "ids[2] = 10");
    ((int32_t *)bad.data)[2] = -1;
    expect_err("vocab_embedding_negative_id_is_range_error", dt_tp_embedding_bwd(l, dtb, partial, dy, &bad, k * Vl, V, sp),
               DT_ERR_RANGE, "ids[2] = -1");
    expect_err("vocab_embedding_wrong_vocab_start_is_named", dt_tp_embedding_fwd(l, y, partial, tb, &ids, k * Vl + 1, V,
               sp), DT_ERR_ARG, "vocab_start");
    expect_err("vocab_embedding_vocab_past_the_padded_table_is_named", dt_tp_embedding_fwd(l, y, partial, tb, &ids,
               k * Vl, VP + 1, sp), DT_ERR_ARG, "vocab = 13");
    { /* out over the table (the rows are copied from it), dtable over dout: named on every rank */
        dt_tensor *big = m2(Vl + nl, CH), tv, ov;
        int64_t st_[2] = {Vl, CH}, so[2] = {nl, CH};
        CK(dt_tensor_view(&C, &tv, big, 0, 2, st_));
        CK(dt_tensor_view(&C, &ov, big, (Vl - 1) * CH, 2, so));
        expect_err("vocab_embedding_out_over_table_is_named", dt_tp_embedding_fwd(l, &ov, partial, &tv, &ids, k * Vl, V, sp),
                   DT_ERR_ARG, "out shares memory with table");
        expect_err("vocab_embedding_bwd_dtable_over_dout_is_named",
                   dt_tp_embedding_bwd(l, &tv, partial, &ov, &ids, k * Vl, V, sp), DT_ERR_ARG, "dtable shares memory with dout");
    }
    dt_tensor_free(&C, &ids);
    dt_tensor_free(&C, &bad);
    free_pool();
}

/* ---- vocab-parallel cross entropy */

/* The loss in double from the whole [N, VP] logits: mean over rows whose target is not ignored of
   logsumexp over the first `vocab` columns minus the target logit. */
static double xent_double(const double *z, const int32_t *tg, int vocab, int ignore) {
    double total = 0, mx, s;
    int r, c, n = 0;
    for (r = 0; r < N; r++) {
        if (tg[r] == ignore) continue;
        for (mx = -INFINITY, c = 0; c < vocab; c++) if (z[r * VP + c] > mx) mx = z[r * VP + c];
        for (s = 0, c = 0; c < vocab; c++) s += exp(z[r * VP + c] - mx);
        total += log(s) + mx - z[r * VP + tg[r]];
        n++;
    }
    return n ? total / n : 0;
}

static void test_xent(dt_layout *l) {
    const int64_t tp = l->tp, k = l->tp_rank, Vl = VP / tp;
    const int ignore = -100;
    const float dloss = 1.7f;
    static const int32_t tgv[N] = {3, -100, 9, 0, 5, 7, -100, 1};
    static const int fd_r[] = {0, 0, 2, 2, 3, 1, 4};   /* entries checked by finite differences: */
    static const int fd_c[] = {3, 7, 9, 11, 0, 4, 10}; /* target, other, last real, padding, ignored row */
    enum { NFD = 7 };
    dt_tensor_desc d;
    dt_tensor tg;
    dt_tensor *Z = full("xent.logits", N, VP, 0, 2), *Zr, *P = m2(N, V), *dZ = m2(N, V), *z, *stats = m2(N, 2);
    dt_tensor *dz, *got = m1(NFD);
    double zd[N * VP], fd[NFD];
    float loss = 0, loss_ref = 0, lmin, lmax;
    int64_t nv = 0, nv_ref = 0, r, c, i;
    int ok;
    for (r = 0; r < N; r++)
        for (c = V; c < VP; c++) F(Z)[r * VP + c] = 50.0f; /* padding: would dominate the softmax if counted */
    Zr = cols(Z, 0, V);
    z = cols(Z, k * Vl, Vl);
    dz = fill(m2(N, Vl), 0.25);
    memset(&d, 0, sizeof d);
    d.dtype = DT_I32; d.shape[0] = N;
    CK(dt_tensor_create(&C, &tg, &d));
    memcpy(tg.data, tgv, sizeof tgv);
    CK(dt_softmax_xent_fwd(&C, &loss_ref, &nv_ref, P, Zr, &tg, ignore));
    CK(dt_softmax_xent_bwd(&C, dZ, P, &tg, ignore, dloss));
    CK(dt_tp_xent_fwd(l, &loss, &nv, stats, z, &tg, k * Vl, V, ignore));
    dt_test_check_all(nm("vocab_xent_loss_matches_softmax_xent"), fabs((double)loss - loss_ref) <= 1e-5 * fabs(loss_ref) &&
                      nv == nv_ref, "loss %.9g (n_valid %lld), want %.9g (n_valid %lld)", (double)loss, (long long)nv,
                      (double)loss_ref, (long long)nv_ref);
    lmin = lmax = loss;
    MPI_Allreduce(MPI_IN_PLACE, &lmin, 1, MPI_FLOAT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(MPI_IN_PLACE, &lmax, 1, MPI_FLOAT, MPI_MAX, MPI_COMM_WORLD);
    dt_test_check_all(nm("vocab_xent_loss_bitwise_equal_on_every_rank"), memcmp(&lmin, &lmax, sizeof lmin) == 0,
                      "losses from %.9g to %.9g", (double)lmin, (double)lmax);
    {   /* stats: each row's max over the real columns (exact) and log-sum-exp (double, 1e-6 relative) */
        double worst = 0;
        int64_t at = -1;
        for (r = 0; r < N; r++) {
            double mx = -INFINITY, se = 0, lse;
            for (c = 0; c < V; c++) if (F(Z)[r * VP + c] > mx) mx = F(Z)[r * VP + c];
            for (c = 0; c < V; c++) se += exp(F(Z)[r * VP + c] - mx);
            lse = mx + log(se);
            if (F(stats)[2 * r] != (float)mx && at < 0) at = r;
            if (fabs(F(stats)[2 * r + 1] - lse) / fabs(lse) > worst) worst = fabs(F(stats)[2 * r + 1] - lse) / fabs(lse);
        }
        dt_test_check_all(nm("vocab_xent_stats_are_row_max_and_logsumexp"), at < 0 && worst <= 1e-6, "row %lld max "
                          "differs; worst log-sum-exp relative difference %.3g", (long long)at, worst);
    }
    CK(dt_tp_xent_bwd(l, dz, z, stats, &tg, k * Vl, V, ignore, dloss));
    {   /* written over the 0.25 there before: real columns the reference grad, padding columns 0 */
        dt_tensor *want = fill(m2(N, Vl), 0.0);
        for (r = 0; r < N; r++)
            for (c = 0; c < Vl; c++)
                if (k * Vl + c < V) F(want)[r * Vl + c] = F(dZ)[r * V + k * Vl + c];
        cmp("vocab_xent_bwd_matches_softmax_xent_bwd", F(dz), F(want), N * Vl, 1e-5);
    }
    /* finite differences of the double loss; the owner of each column gives its grad */
    for (i = 0; i < N * VP; i++) zd[i] = F(Z)[i];
    for (i = 0; i < NFD; i++) {
        const double h = 1e-4, z0 = zd[fd_r[i] * VP + fd_c[i]];
        double lp, lm;
        zd[fd_r[i] * VP + fd_c[i]] = z0 + h; lp = xent_double(zd, tgv, V, ignore);
        zd[fd_r[i] * VP + fd_c[i]] = z0 - h; lm = xent_double(zd, tgv, V, ignore);
        zd[fd_r[i] * VP + fd_c[i]] = z0;
        fd[i] = (lp - lm) / (2 * h);
        F(got)[i] = fd_c[i] / Vl == k ? F(dz)[fd_r[i] * Vl + fd_c[i] % Vl] / dloss : 0.0f;
    }
    CK(dt_tp_allreduce(l, got)); /* one rank holds each entry, the others add 0 */
    for (ok = 1, i = 0; i < NFD && ok; i++) ok = fabs(F(got)[i] - fd[i]) <= 1e-5 * fabs(fd[i]) + 1e-7;
    i = ok ? 0 : i - 1;
    dt_test_check_all(nm("vocab_xent_grad_matches_finite_differences"), ok, "logit [%d, %d]: grad %.9g, finite "
                      "difference %.9g", fd_r[i], fd_c[i], (double)F(got)[i], fd[i]);
    {   /* vocab 9: at tp 4 the last rank's shard [9, 12) is all padding */
        int32_t t9[N];
        memcpy(t9, tgv, sizeof t9);
        t9[2] = 8;
        memcpy(tg.data, t9, sizeof t9);
        for (i = 0; i < N * VP; i++) zd[i] = F(Z)[i];
        CK(dt_tp_xent_fwd(l, &loss, NULL, stats, z, &tg, k * Vl, 9, ignore));
        dt_test_check_all(nm("vocab_xent_rank_with_only_padding_matches_double"), fabs(loss - xent_double(zd, t9, 9,
                          ignore)) <= 1e-5 * fabs(loss), "loss %.9g, want %.9g", (double)loss,
                          xent_double(zd, t9, 9, ignore));
        t9[5] = 9; /* padding now */
        memcpy(tg.data, t9, sizeof t9);
        expect_err("vocab_xent_target_past_vocab_is_range_error", dt_tp_xent_fwd(l, &loss, NULL, stats, z, &tg,
                   k * Vl, 9, ignore), DT_ERR_RANGE, "targets[5] = 9");
        memcpy(tg.data, tgv, sizeof tgv);
    }
    expect_err("vocab_xent_wrong_vocab_start_is_named", dt_tp_xent_fwd(l, &loss, NULL, stats, z, &tg, k * Vl + 1, V,
               ignore), DT_ERR_ARG, "vocab_start");
    expect_err("vocab_xent_wrong_stats_shape_is_named", dt_tp_xent_bwd(l, dz, z, m2(N, 3), &tg, k * Vl, V, ignore, 1),
               DT_ERR_SHAPE, "stats shape");
    { /* dlogits over stats (read while dlogits is written) */
        dt_tensor *big = m1(N * (Vl + 2)), sv, dv;
        int64_t s2[2] = {N, 2}, sd[2] = {N, Vl};
        CK(dt_tensor_view(&C, &sv, big, 0, 2, s2));
        CK(dt_tensor_view(&C, &dv, big, 1, 2, sd));
        expect_err("vocab_xent_bwd_dlogits_over_stats_is_named", dt_tp_xent_bwd(l, &dv, z, &sv, &tg, k * Vl, V, ignore, 1),
                   DT_ERR_ARG, "dlogits shares memory with stats");
    }
    dt_tensor_free(&C, &tg);
    free_pool();
}

/* ---- the helpers that need no layers */

static void test_helpers(dt_layout *l) {
    dt_param_desc d;
    const int64_t tp = l->tp, k = l->tp_rank;
    dt_tensor *full_rows, *sh, *sum;
    int64_t i;
    memset(&d, 0, sizeof d);
    CK(dt_tp_param_desc(l, &d, DT_TP_QKV, 3 * CH, CH));
    dt_test_check_all(nm("param_desc_qkv_is_3_by_heads_by_c"), d.ndim == 3 && d.shape[0] == 3 && d.shape[1] == CH / tp &&
                      d.shape[2] == CH && d.global_shape[1] == CH && d.start[1] == k * CH / tp && d.start[0] == 0,
                      "ndim %d shape [%lld, %lld, %lld] start [%lld, %lld]", d.ndim, (long long)d.shape[0],
                      (long long)d.shape[1], (long long)d.shape[2], (long long)d.start[0], (long long)d.start[1]);
    CK(dt_tp_param_desc(l, &d, DT_TP_ROW, 6, 4 * tp));
    dt_test_check_all(nm("param_desc_row_cuts_columns"), d.ndim == 2 && d.shape[0] == 6 && d.shape[1] == 4 &&
                      d.start[1] == 4 * k && d.start[0] == 0, "shape [%lld, %lld] start [%lld, %lld]",
                      (long long)d.shape[0], (long long)d.shape[1], (long long)d.start[0], (long long)d.start[1]);
    expect_err("param_desc_qkv_rows_not_3c_is_named", dt_tp_param_desc(l, &d, DT_TP_QKV, 7, CH), DT_ERR_ARG, "not 3*C");
    expect_err("param_desc_row_vector_is_named", dt_tp_param_desc(l, &d, DT_TP_ROW, 6, 0), DT_ERR_ARG, "DT_TP_ROW");
    expect_err("param_desc_bad_kind_is_named", dt_tp_param_desc(l, &d, (dt_tp_kind)99, 6, 4), DT_ERR_ARG, "kind = 99");
    if (tp > 1)
        expect_err("param_desc_column_not_divisible_is_named", dt_tp_param_desc(l, &d, DT_TP_COLUMN, 4 * tp + 1, 3),
                   DT_ERR_ARG, "not divisible by tp");
    /* gather then scatter: the gathered rows are every rank's shard; the scatter sums tp copies */
    full_rows = m2(N, 3);
    sh = m2(N / tp, 3);
    for (i = 0; i < sh->numel; i++) F(sh)[i] = (float)(k * 100 + i);
    CK(dt_sp_gather_rows(l, full_rows, sh));
    for (i = 0; i < full_rows->numel && F(full_rows)[i] == (float)((i / sh->numel) * 100 + i % sh->numel); i++) {}
    dt_test_check_all(nm("sp_gather_rows_is_the_shards_in_rank_order"), i == full_rows->numel, "element %lld is %g",
                      (long long)i, i < full_rows->numel ? (double)F(full_rows)[i] : 0.0);
    sum = m2(N / tp, 3);
    CK(dt_sp_scatter_rows(l, sum, full_rows));
    for (i = 0; i < sum->numel && F(sum)[i] == (float)tp * F(full_rows)[k * sh->numel + i]; i++) {}
    dt_test_check_all(nm("sp_scatter_rows_is_this_ranks_rows_of_the_sum"), i == sum->numel, "element %lld is %g",
                      (long long)i, i < sum->numel ? (double)F(sum)[i] : 0.0);
    expect_err("sp_gather_rows_wrong_full_is_named", dt_sp_gather_rows(l, m2(N + 1, 3), sh), DT_ERR_SHAPE,
               "full shape");
    free_pool();
}

/* An empty batch (0 rows) is a batch: every layer runs, under sp too, and the loss is 0. */
static void test_empty(dt_layout *l) {
    const int64_t tp = l->tp;
    dt_tensor *x = mk(2, 0, 6, 0), *xbuf = mk(2, 0, 6, 0), *w = m2(4, 6), *y = mk(2, 0, 4, 0), *dx = mk(2, 0, 6, 0);
    dt_tensor *dw = m2(4, 6), *w2 = m2(5, 4), *z = mk(2, 0, 5, 0), *stats = mk(2, 0, 2, 0), *logits = mk(2, 0, 3, 0);
    dt_tensor tg;
    dt_tensor_desc d;
    float loss = -1;
    int64_t nv = -1;
    dt_status st;
    memset(&d, 0, sizeof d);
    d.dtype = DT_I32; d.ndim = 1;
    CK(dt_tensor_create(&C, &tg, &d));
    st = dt_tp_column_linear_fwd(l, y, xbuf, x, w, NULL, 1);
    if (!st) st = dt_tp_column_linear_bwd(l, dx, dw, NULL, mk(2, 0, 6, 0), y, xbuf, w, 1);
    if (!st) st = dt_tp_row_linear_fwd(l, z, mk(2, 0, 5, 0), y, w2, NULL, 1);
    if (!st) st = dt_tp_row_linear_bwd(l, y, NULL, NULL, mk(2, 0, 5, 0), z, y, w2, 1);
    if (!st) st = dt_tp_xent_fwd(l, &loss, &nv, stats, logits, &tg, l->tp_rank * 3, 3 * tp, -1);
    if (!st) st = dt_tp_xent_bwd(l, logits, logits, stats, &tg, l->tp_rank * 3, 3 * tp, -1, 1.0f);
    dt_test_check_all(nm("empty_batch_runs_every_layer_under_sp"), st == DT_OK && loss == 0 && nv == 0,
                      "status %s (%s), loss %g, n_valid %lld", dt_status_name(st), dt_ctx_error(&C), (double)loss,
                      (long long)nv);
    dt_tensor_free(&C, &tg);
    free_pool();
}

static void run_layout(dt_comm *world, int tp) {
    dt_layout *l = NULL;
    dt_layout_desc d;
    int sp;
    double tol;
    memset(&d, 0, sizeof d);
    d.tp = tp;
    CK(dt_layout_create(world, &l, &d));
    tol = tp == 1 ? 0 : 1e-5; /* tp = 1 is the plain op, bitwise */
    worst_rel = 0;
    snprintf(cfg, sizeof cfg, "tp%d_dp%d", l->tp, l->dp);
    test_helpers(l);
    test_xent(l);
    test_empty(l);
    for (sp = 0; sp <= 1; sp++) {
        snprintf(cfg, sizeof cfg, "tp%d_dp%d_sp%d", l->tp, l->dp, sp);
        test_column(l, sp, tol);
        test_row(l, sp, tol);
        test_mlp(l, sp, tol);
        test_attention(l, sp, tol);
        test_embedding(l, sp);
    }
    if (world_rank == 0)
        printf("# tp=%d dp=%d: largest relative difference from the single-rank layers %.3g\n", l->tp, l->dp, worst_rel);
    dt_layout_free(l);
}

int main(void) {
    dt_comm *world = NULL;
    int size, st;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "no world: %s\n", dt_ctx_error(&C)); return 1; }
    world_rank = dt_comm_rank(world);
    size = dt_comm_size(world);
    run_layout(world, size);             /* tp = the world */
    if (size == 4) run_layout(world, 2); /* tp 2 x dp 2 */
    if (size > 1) run_layout(world, 1);  /* tp 1 x dp = world: every function is the plain op */
    st = dt_test_finish();
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return st;
}
