// np: 1 2 4
/* tests/mpi_parallel_moe.c - dt_parallel.h's mixture-of-experts layer (dt_moe_fwd / _bwd /
   _step_end) against a MoE computed here in double over the whole global batch (nothing of dt's:
   a loop per token and expert): router softmax, top-2 with ties to the lower index, capacity per
   sequence in GShard's order, gates (Switch's, and renormalised as Mixtral's), experts C -> F ->
   GELU -> C, the combine, the aux loss over the global batch, and the backward of
   L = sum_t dy_t . y_t + aux. Layouts at the world size W: ep = W (dp = W), and at W = 4 ep 2 x
   edp 2 and ep 2 x tp 2, at W = 2 tp 2 (ep 1); each also with the world's ranks in reverse order
   (the tokens and experts arrive from other ranks, in another order), for capacity 1.0 (drops)
   and dropless, aux and bias balancing, renorm on and off. Checked per rank: y of its tokens
   (summed over tp) within 2e-5 + 1e-4 |ref|; dx (summed over tp) within 2e-5 + 2e-4 |ref|; the
   router grad averaged over dp x cp, and each expert's grads averaged over edp, within 2e-5 +
   2e-4 |ref| (the reference's / D for the tokens' part); the aux loss within 1e-6 relative;
   dropped count and fingerprint equal; the bias update of DeepSeek-V3 equal. The reference's
   router gradient is itself checked by central differences in double with the choice held
   fixed. Counted: the bytes each rank's all-to-allvs send over ep_comm equal 2 (S + R) C x 4, S the
   kept assignments of its tokens, R those its experts took (dt_comm_stats counts its own block). Bad inputs are named errors. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dt_ctx C;
static dt_comm *world;
static int W, R;

#define E 8
#define K 2
#define CW 16
#define F 32
#define T 8
#define SG 8 /* sequences in the global batch */
#define NG (SG * T)

static void die(const char *what) {
    fprintf(stderr, "[rank %d] %s: %s\n", R, what, dt_ctx_error(&C));
    exit(2);
}
#define OK(x) do { if ((x) != DT_OK) die(#x); } while (0)

static dt_tensor mk(int nd, int64_t d0, int64_t d1, int64_t d2) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = DT_F32;
    d.ndim = nd;
    d.shape[0] = d0; d.shape[1] = d1; d.shape[2] = d2;
    OK(dt_tensor_create(&C, &t, &d));
    OK(dt_tensor_fill(&C, &t, 0.0));
    return t;
}
static float *Fp(const dt_tensor *t) { return (float *)t->data; }

/* The whole layer's values, float (what dt gets) */
static float gx[NG * CW], gdy[NG * CW], grt[E * CW], gw1[E * F * CW], gb1[E * F], gw2[E * CW * F], gb2[E * CW];

static void make_inputs(void) {
    int i;
    for (i = 0; i < NG * CW; i++) { gx[i] = dt_test_unit(i, 1); gdy[i] = 0.5f * dt_test_unit(i, 2); }
    for (i = 0; i < E * CW; i++) grt[i] = 0.8f * dt_test_unit(i, 3);
    for (i = 0; i < E * F * CW; i++) gw1[i] = 0.3f * dt_test_unit(i, 4);
    for (i = 0; i < E * F; i++) gb1[i] = 0.1f * dt_test_unit(i, 5);
    for (i = 0; i < E * CW * F; i++) gw2[i] = 0.3f * dt_test_unit(i, 6);
    for (i = 0; i < E * CW; i++) gb2[i] = 0.1f * dt_test_unit(i, 7);
}

/* ---------------------------------------------------------------- the reference, in double */

typedef struct ref {
    double p[NG][E], y[NG][CW], dx[NG][CW], dx_aux[NG][CW], drt[E][CW], drt_aux[E][CW];
    double dw1[E][F][CW], db1[E][F], dw2[E][CW][F], db2[E][CW];
    int idx[NG][K], kept[NG][K];
    double gate[NG][K], aux, f[E];
    int64_t load[E], dropped;
    uint64_t print;
} ref;
static ref RF;

static double gelu(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double gelu_d(double x) {
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x), th = tanh(u);
    return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}
static uint64_t mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Expert e on token row x: hidden h[F], output o[CW]. */
static void expert(int e, const float *x, double *h, double *o) {
    int f, c;
    for (f = 0; f < F; f++) {
        double s = gb1[e * F + f];
        for (c = 0; c < CW; c++) s += (double)gw1[(e * F + f) * CW + c] * x[c];
        h[f] = s;
    }
    for (c = 0; c < CW; c++) {
        double s = gb2[e * CW + c];
        for (f = 0; f < F; f++) s += (double)gw2[(e * CW + c) * F + f] * gelu(h[f]);
        o[c] = s;
    }
}

/* Softmax of the router for token t with router weights rt (perturbed in the FD check). */
static void probs(const double *rt, int t, double *p) {
    double mx = -1e300, s = 0;
    int e, c;
    for (e = 0; e < E; e++) {
        double z = 0;
        for (c = 0; c < CW; c++) z += rt[e * CW + c] * gx[t * CW + c];
        p[e] = z;
        mx = p[e] > mx ? p[e] : mx;
    }
    for (e = 0; e < E; e++) s += (p[e] = exp(p[e] - mx));
    for (e = 0; e < E; e++) p[e] /= s;
}

/* The loss sum_t dy . y + coef E sum f P with the choice (idx, kept, f) held as in RF. */
static double loss_fixed(const double *rt, int renorm, double coef, int aux) {
    double L = 0, P[E] = {0}, h[F], o[CW], p[E];
    int t, j, e, c;
    for (t = 0; t < NG; t++) {
        double sel = 0;
        probs(rt, t, p);
        for (e = 0; e < E; e++) P[e] += p[e] / NG;
        for (j = 0; j < K; j++) sel += p[RF.idx[t][j]];
        for (j = 0; j < K; j++) {
            double g = p[RF.idx[t][j]] / (renorm ? sel : 1);
            if (!RF.kept[t][j]) continue;
            expert(RF.idx[t][j], gx + t * CW, h, o);
            for (c = 0; c < CW; c++) L += g * o[c] * gdy[t * CW + c];
        }
    }
    if (aux)
        for (e = 0; e < E; e++) L += coef * E * RF.f[e] * P[e];
    return L;
}

static void reference(double capacity, int renorm, int balance, double coef, const float *bias) {
    int64_t cap = capacity > 0 ? (int64_t)ceil(capacity * T * K / E) : 0;
    double h[F], o[CW];
    int t, j, e, c, f, s;
    memset(&RF, 0, sizeof RF);
    for (t = 0; t < NG; t++) {
        double rt[E * CW], sel = 0;
        for (c = 0; c < E * CW; c++) rt[c] = grt[c];
        probs(rt, t, RF.p[t]);
        for (j = 0; j < K; j++) { /* the j-th largest (p + bias in float, as the layer compares), ties low */
            int best = -1, i;
            float bs = 0;
            for (e = 0; e < E; e++) {
                float sc = balance == DT_MOE_BIAS ? (float)RF.p[t][e] + bias[e] : (float)RF.p[t][e];
                for (i = 0; i < j && RF.idx[t][i] != e; i++) {}
                if (i < j) continue;
                if (best < 0 || sc > bs) { best = e; bs = sc; }
            }
            RF.idx[t][j] = best;
            RF.load[best]++;
            sel += RF.p[t][best];
        }
        for (j = 0; j < K; j++) RF.gate[t][j] = RF.p[t][RF.idx[t][j]] / (renorm ? sel : 1);
    }
    for (s = 0; s < SG; s++) {
        int64_t used[E] = {0};
        for (j = 0; j < K; j++)
            for (t = s * T; t < (s + 1) * T; t++) {
                e = RF.idx[t][j];
                RF.kept[t][j] = !cap || used[e] < cap;
                if (RF.kept[t][j]) used[e]++;
                else {
                    RF.dropped++;
                    RF.print += mix((uint64_t)t * K + j) & 0xfffffu;
                }
            }
    }
    for (e = 0; e < E; e++) {
        double P = 0;
        RF.f[e] = (double)RF.load[e] / ((double)NG * K);
        for (t = 0; t < NG; t++) P += RF.p[t][e] / NG;
        RF.aux += coef * E * RF.f[e] * P;
    }
    /* forward and backward, token by token */
    for (t = 0; t < NG; t++) {
        double dg[K] = {0}, dp[E] = {0}, dpa[E], dot = 0, dota = 0, sel = 0, gd = 0;
        const float *x = gx + t * CW, *dy = gdy + t * CW;
        for (j = 0; j < K; j++) {
            double dh[F], da;
            if (!RF.kept[t][j]) continue;
            e = RF.idx[t][j];
            expert(e, x, h, o);
            for (c = 0; c < CW; c++) {
                RF.y[t][c] += RF.gate[t][j] * o[c];
                dg[j] += dy[c] * o[c];
            }
            /* the expert's backward with dO = g dy */
            for (f = 0; f < F; f++) {
                da = 0;
                for (c = 0; c < CW; c++) da += RF.gate[t][j] * dy[c] * gw2[(e * CW + c) * F + f];
                dh[f] = da * gelu_d(h[f]);
                for (c = 0; c < CW; c++) RF.dw2[e][c][f] += RF.gate[t][j] * dy[c] * gelu(h[f]);
                RF.db1[e][f] += dh[f];
                for (c = 0; c < CW; c++) {
                    RF.dw1[e][f][c] += dh[f] * x[c];
                    RF.dx[t][c] += dh[f] * gw1[(e * F + f) * CW + c];
                }
            }
            for (c = 0; c < CW; c++) RF.db2[e][c] += RF.gate[t][j] * dy[c];
        }
        for (j = 0; j < K; j++) sel += RF.p[t][RF.idx[t][j]];
        for (j = 0; j < K; j++) gd += dg[j] * RF.gate[t][j];
        for (j = 0; j < K; j++) dp[RF.idx[t][j]] += renorm ? (dg[j] - gd) / sel : dg[j];
        for (e = 0; e < E; e++) dpa[e] = balance == DT_MOE_AUX ? coef * E * RF.f[e] / NG : 0;
        for (e = 0; e < E; e++) { dot += RF.p[t][e] * dp[e]; dota += RF.p[t][e] * dpa[e]; }
        for (e = 0; e < E; e++) {
            double dz = RF.p[t][e] * (dp[e] - dot), dza = RF.p[t][e] * (dpa[e] - dota);
            for (c = 0; c < CW; c++) {
                RF.drt[e][c] += dz * x[c];
                RF.drt_aux[e][c] += dza * x[c];
                RF.dx[t][c] += dz * grt[e * CW + c];
                RF.dx_aux[t][c] += dza * grt[e * CW + c];
            }
        }
    }
}

/* The reference's router gradient against central differences of loss_fixed (double). */
static void check_fd(double capacity, int renorm, double coef) {
    double rt[E * CW], worst = 0;
    char name[128];
    int i;
    reference(capacity, renorm, DT_MOE_AUX, coef, NULL);
    for (i = 0; i < E * CW; i++) rt[i] = grt[i];
    for (i = 0; i < E * CW; i += 7) {
        double hstep = 1e-5, lp, lm, fd, an = RF.drt[i / CW][i % CW] + RF.drt_aux[i / CW][i % CW];
        rt[i] = grt[i] + hstep;
        lp = loss_fixed(rt, renorm, coef, 1);
        rt[i] = grt[i] - hstep;
        lm = loss_fixed(rt, renorm, coef, 1);
        rt[i] = grt[i];
        fd = (lp - lm) / (2 * hstep);
        if (fabs(fd - an) / (1e-6 + fabs(fd)) > worst) worst = fabs(fd - an) / (1e-6 + fabs(fd));
    }
    snprintf(name, sizeof name, "router_grad_equals_finite_differences_renorm%d_cap%g", renorm, capacity);
    dt_test_expect(name, worst < 1e-5, "worst relative difference %.3g (bound 1e-5)", worst);
}

/* ---------------------------------------------------------------- one layout */

static double maxrel(double got, double want, double atol, double rtol) {
    return fabs(got - want) / (atol + rtol * fabs(want));
}

static void run_case(dt_comm *w, int ep, int tp, double capacity, int renorm, int balance, const char *tag) {
    dt_layout *l;
    dt_layout_desc ld;
    dt_moe *m;
    dt_moe_acts *a;
    dt_moe_desc md;
    dt_moe_stats st;
    dt_comm_stat cs;
    float bias[E];
    char name[160];
    int D, El, Fl, ns, e, f, c, j;
    int64_t s0, t, n, i;
    double coef = 0.05, wy = 0, wdx = 0, wr = 0, we = 0, sent_rows = 0;
    memset(&ld, 0, sizeof ld);
    ld.tp = tp;
    ld.ep = ep;
    OK(dt_layout_create(w, &l, &ld));
    D = l->dpcp;
    El = E / ep;
    Fl = F / tp;
    ns = SG / D;
    s0 = (int64_t)l->dpcp_rank * ns;
    n = (int64_t)ns * T;
    memset(&md, 0, sizeof md);
    md.experts = E; md.top_k = K; md.width = CW; md.hidden = F; md.seq = T;
    md.capacity = capacity; md.renorm = renorm; md.balance = (dt_moe_balance)balance; md.aux_coef = coef;
    md.bias_rate = 0.01;
    OK(dt_moe_create(l, &m, &md));
    OK(dt_moe_acts_create(m, &a));
    for (e = 0; e < E; e++) bias[e] = balance == DT_MOE_BIAS ? 0.02f * (float)(e % 3) - 0.01f * (float)(e % 2) : 0;
    for (e = 0; e < E; e++) dt_moe_bias(m)[e] = bias[e];
    reference(capacity, renorm, balance, coef, bias);
    {
        dt_tensor x = mk(2, n, CW, 0), y = mk(2, n, CW, 0), dy = mk(2, n, CW, 0), dx = mk(2, n, CW, 0);
        dt_tensor rt = mk(2, E, CW, 0), w1 = mk(3, El, Fl, CW), b1 = mk(2, El, Fl, 0), w2 = mk(3, El, CW, Fl),
                  b2 = mk(2, El, CW, 0);
        dt_tensor drt = mk(2, E, CW, 0), dw1 = mk(3, El, Fl, CW), db1 = mk(2, El, Fl, 0), dw2 = mk(3, El, CW, Fl),
                  db2 = mk(2, El, CW, 0);
        memcpy(Fp(&x), gx + s0 * T * CW, (size_t)(n * CW) * sizeof(float));
        memcpy(Fp(&dy), gdy + s0 * T * CW, (size_t)(n * CW) * sizeof(float));
        memcpy(Fp(&rt), grt, sizeof grt);
        for (e = 0; e < El; e++) { /* this rank's experts, and its tp slice of F */
            int ge = l->ep_rank * El + e;
            for (f = 0; f < Fl; f++) {
                int gf = l->tp_rank * Fl + f;
                for (c = 0; c < CW; c++) {
                    Fp(&w1)[(e * Fl + f) * CW + c] = gw1[(ge * F + gf) * CW + c];
                    Fp(&w2)[(e * CW + c) * Fl + f] = gw2[(ge * CW + c) * F + gf];
                }
                Fp(&b1)[e * Fl + f] = gb1[ge * F + gf];
            }
            for (c = 0; c < CW; c++) Fp(&b2)[e * CW + c] = gb2[ge * CW + c];
        }
        dt_comm_stats_reset(l->ep_comm);
        OK(dt_moe_fwd(m, a, &y, &x, s0, &rt, &w1, &b1, &w2, &b2));
        OK(dt_moe_bwd(m, a, &dx, &drt, &dw1, &db1, &dw2, &db2, &dy, &x, &rt, &w1, &w2, 1.0f));
        OK(dt_comm_stats(l->ep_comm, &cs, DT_COLL_ALLTOALLV));
        OK(dt_moe_step_end(m, &st));
        /* tp partial sums, then the averages the data-parallel groups take */
        if (tp > 1) { OK(dt_comm_allreduce(l->tp_comm, &y, DT_REDUCE_SUM)); OK(dt_comm_allreduce(l->tp_comm, &dx, DT_REDUCE_SUM)); }
        OK(dt_comm_allreduce(l->dpcp_comm, &drt, DT_REDUCE_AVG));
        OK(dt_comm_allreduce(l->edp_comm, &dw1, DT_REDUCE_AVG));
        OK(dt_comm_allreduce(l->edp_comm, &db1, DT_REDUCE_AVG));
        OK(dt_comm_allreduce(l->edp_comm, &dw2, DT_REDUCE_AVG));
        OK(dt_comm_allreduce(l->edp_comm, &db2, DT_REDUCE_AVG));
        for (t = 0; t < n; t++)
            for (c = 0; c < CW; c++) {
                int64_t g = s0 * T + t;
                double m1 = maxrel(Fp(&y)[t * CW + c], RF.y[g][c], 2e-5, 1e-4);
                double m2 = maxrel(Fp(&dx)[t * CW + c], RF.dx[g][c] + D * RF.dx_aux[g][c], 2e-5, 2e-4);
                wy = m1 > wy ? m1 : wy;
                wdx = m2 > wdx ? m2 : wdx;
            }
        for (e = 0; e < E; e++)
            for (c = 0; c < CW; c++) {
                double m1 = maxrel(Fp(&drt)[e * CW + c], RF.drt[e][c] / D + RF.drt_aux[e][c], 2e-5, 2e-4);
                wr = m1 > wr ? m1 : wr;
            }
        for (e = 0; e < El; e++) {
            int ge = l->ep_rank * El + e;
            for (f = 0; f < Fl; f++) {
                int gf = l->tp_rank * Fl + f;
                double m1 = maxrel(Fp(&db1)[e * Fl + f], RF.db1[ge][gf] / D, 2e-5, 2e-4);
                we = m1 > we ? m1 : we;
                for (c = 0; c < CW; c++) {
                    double m2 = maxrel(Fp(&dw1)[(e * Fl + f) * CW + c], RF.dw1[ge][gf][c] / D, 2e-5, 2e-4);
                    double m3 = maxrel(Fp(&dw2)[(e * CW + c) * Fl + f], RF.dw2[ge][c][gf] / D, 2e-5, 2e-4);
                    we = m2 > we ? m2 : we;
                    we = m3 > we ? m3 : we;
                }
            }
            for (c = 0; c < CW; c++) {
                double m1 = maxrel(Fp(&db2)[e * CW + c], RF.db2[ge][c] / D, 2e-5, 2e-4);
                we = m1 > we ? m1 : we;
            }
        }
        /* rows each all-to-allv sends (dt_comm_stats counts a rank's own block too): the kept
           assignments of this rank's tokens (dispatch, forward and backward) and those its
           experts got from its ep group (combine, both ways) */
        for (i = 0; i < (int64_t)NG; i++)
            for (j = 0; j < K; j++) {
                int src = (int)(i / (ns * T)) % ep; /* the ep rank of the token's dp x cp rank */
                int mine = i / (ns * T) == l->dpcp_rank, grp = (int)(i / (ns * T)) / ep == l->edp_rank;
                if (!RF.kept[i][j]) continue;
                if (mine) sent_rows += 2;
                if (grp && RF.idx[i][j] / El == l->ep_rank) sent_rows += 2;
                (void)src;
            }
        snprintf(name, sizeof name, "moe_%s_y_equals_reference", tag);
        dt_test_check_all(name, wy <= 1, "worst y error %.3g of its bound", wy);
        snprintf(name, sizeof name, "moe_%s_dx_equals_reference", tag);
        dt_test_check_all(name, wdx <= 1, "worst dx error %.3g of its bound", wdx);
        snprintf(name, sizeof name, "moe_%s_router_grad_equals_reference", tag);
        dt_test_check_all(name, wr <= 1, "worst router grad error %.3g of its bound", wr);
        snprintf(name, sizeof name, "moe_%s_expert_grads_equal_reference", tag);
        dt_test_check_all(name, we <= 1, "worst expert grad error %.3g of its bound", we);
        snprintf(name, sizeof name, "moe_%s_aux_loss_equals_reference", tag);
        dt_test_check_all(name, fabs(st.aux - RF.aux) <= 1e-6 * fabs(RF.aux) + 1e-12, "aux %.12g, reference %.12g",
                          st.aux, RF.aux);
        if (capacity > 0) {
            snprintf(name, sizeof name, "moe_%s_capacity_drops_some", tag);
            dt_test_check_all(name, RF.dropped > 0, "reference drops %lld", (long long)RF.dropped);
        }
        snprintf(name, sizeof name, "moe_%s_same_tokens_dropped", tag);
        dt_test_check_all(name, st.dropped == RF.dropped && st.drop_print == RF.print && st.assigned == NG * K,
                          "dropped %lld (print %llx), reference %lld (%llx); assigned %lld", (long long)st.dropped,
                          (unsigned long long)st.drop_print, (long long)RF.dropped, (unsigned long long)RF.print,
                          (long long)st.assigned);
        {
            int okl = 1, okb = 1, okk = 1, ek = -1;
            int64_t kept[E] = {0}, t2;
            double mean = (double)NG * K / E;
            for (t2 = 0; t2 < (int64_t)NG; t2++)
                for (j = 0; j < K; j++) kept[RF.idx[t2][j]] += RF.kept[t2][j];
            for (e = 0; e < E; e++) {
                float want = bias[e] + (balance == DT_MOE_BIAS ? (float)(0.01 * (RF.load[e] < mean ? 1 : RF.load[e] > mean ? -1 : 0)) : 0);
                okl &= st.load[e] == RF.load[e];
                okb &= dt_moe_bias(m)[e] == want;
                if (st.kept[e] != kept[e] && ek < 0) ek = e;
            }
            okk = ek < 0;
            snprintf(name, sizeof name, "moe_%s_load_and_bias_update_equal_reference", tag);
            dt_test_check_all(name, okl && okb, "load %s, bias %s", okl ? "ok" : "differs", okb ? "ok" : "differs");
            snprintf(name, sizeof name, "moe_%s_kept_per_expert_equals_reference", tag);
            dt_test_check_all(name, okk, "expert %d kept %lld rows, reference %lld (of %lld assigned)", ek,
                              ek < 0 ? 0LL : (long long)st.kept[ek], ek < 0 ? 0LL : (long long)kept[ek],
                              ek < 0 ? 0LL : (long long)RF.load[ek]);
        }
        snprintf(name, sizeof name, "moe_%s_alltoall_bytes_equal_rows_dispatched", tag);
        dt_test_check_all(name, cs.bytes == sent_rows * CW * 4 && cs.calls == 4,
                          "sent %.0f bytes in %lld calls, formula %.0f rows x %d x 4 B = %.0f", (double)cs.bytes,
                          (long long)cs.calls, sent_rows, CW, sent_rows * CW * 4);
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &y); dt_tensor_free(&C, &dy); dt_tensor_free(&C, &dx);
        dt_tensor_free(&C, &rt); dt_tensor_free(&C, &w1); dt_tensor_free(&C, &b1); dt_tensor_free(&C, &w2);
        dt_tensor_free(&C, &b2); dt_tensor_free(&C, &drt); dt_tensor_free(&C, &dw1); dt_tensor_free(&C, &db1);
        dt_tensor_free(&C, &dw2); dt_tensor_free(&C, &db2);
    }
    dt_moe_acts_free(a);
    dt_moe_free(m);
    dt_layout_free(l);
}

static void bad_inputs(void) {
    dt_layout *l;
    dt_layout_desc ld;
    dt_moe *m = NULL;
    dt_moe_acts *a;
    dt_moe_desc md;
    dt_status s;
    memset(&ld, 0, sizeof ld);
    ld.ep = 3;
    s = dt_layout_create(world, &l, &ld);
    if (W % 3) dt_test_error("layout_ep_not_dividing_dp_is_named", s, dt_ctx_error(&C), "desc.ep = 3 does not divide");
    else dt_layout_free(l);
    memset(&ld, 0, sizeof ld);
    ld.ep = W;
    OK(dt_layout_create(world, &l, &ld));
    memset(&md, 0, sizeof md);
    md.experts = 3 * W + (W > 1); md.width = CW; md.seq = T;
    if (W > 1)
        dt_test_error("experts_not_multiple_of_ep_is_named", dt_moe_create(l, &m, &md), dt_ctx_error(&C), "desc.experts");
    md.experts = E; md.top_k = E + 1;
    dt_test_error("top_k_above_experts_is_named", dt_moe_create(l, &m, &md), dt_ctx_error(&C), "desc.top_k = 9");
    md.top_k = K; md.capacity = -1;
    dt_test_error("negative_capacity_is_named", dt_moe_create(l, &m, &md), dt_ctx_error(&C), "desc.capacity = -1");
    md.capacity = 0; md.micro = 2;
    OK(dt_moe_create(l, &m, &md));
    OK(dt_moe_acts_create(m, &a));
    {
        int El = E / W;
        dt_tensor x = mk(2, T, CW, 0), odd = mk(2, T - 1, CW, 0), y = mk(2, T, CW, 0), dx = mk(2, T, CW, 0);
        dt_tensor rt = mk(2, E, CW, 0), w1 = mk(3, El, 4 * CW, CW), w2 = mk(3, El, CW, 4 * CW), w2bad = mk(3, El, CW, CW);
        dt_tensor drt = mk(2, E, CW, 0), dw1 = mk(3, El, 4 * CW, CW), dw2 = mk(3, El, CW, 4 * CW);
        dt_test_error("rows_not_whole_sequences_are_named", dt_moe_fwd(m, a, &y, &odd, 0, &rt, &w1, NULL, &w2, NULL),
                      dt_ctx_error(&C), "whole sequences");
        dt_test_error("expert_weight_shape_is_named", dt_moe_fwd(m, a, &y, &x, 0, &rt, &w1, NULL, &w2bad, NULL),
                      dt_ctx_error(&C), "proj_w's dim 2 is 16");
        dt_test_error("bwd_before_fwd_is_named", dt_moe_bwd(m, a, &dx, &drt, &dw1, NULL, &dw2, NULL, &y, &x, &rt, &w1, &w2, 1.0f),
                      dt_ctx_error(&C), "no dt_moe_fwd");
        OK(dt_moe_fwd(m, a, &y, &x, 0, &rt, &w1, NULL, &w2, NULL));
        /* one forward of micro = 2, then a backward: the aux loss's f is not known yet */
        dt_test_error("aux_backward_before_every_forward_is_named",
                      dt_moe_bwd(m, a, &dx, &drt, &dw1, NULL, &dw2, NULL, &y, &x, &rt, &w1, &w2, 1.0f), dt_ctx_error(&C),
                      "1 forwards of desc.micro = 2");
        dt_test_error("bad_loss_scale_is_named",
                      dt_moe_bwd(m, a, &dx, &drt, &dw1, NULL, &dw2, NULL, &y, &x, &rt, &w1, &w2, 0.0f), dt_ctx_error(&C),
                      "loss_scale = 0");
        OK(dt_moe_fwd(m, a, &y, &x, 0, &rt, &w1, NULL, &w2, NULL));
        DT_TEST_CHECK("bwd_after_every_forward_works",
                      dt_moe_bwd(m, a, &dx, &drt, &dw1, NULL, &dw2, NULL, &y, &x, &rt, &w1, &w2, 1.0f) == DT_OK);
        dt_test_error("aux_forward_after_the_steps_backward_is_named",
                      dt_moe_fwd(m, a, &y, &x, 0, &rt, &w1, NULL, &w2, NULL), dt_ctx_error(&C),
                      "a forward after this step's first backward");
        dt_test_error("bwd_with_another_x_is_named",
                      dt_moe_bwd(m, a, &dx, &drt, &dw1, NULL, &dw2, NULL, &y, &y, &rt, &w1, &w2, 1.0f), dt_ctx_error(&C),
                      "is not the tensor these acts' forward read");
        OK(dt_moe_step_end(m, NULL));
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &odd); dt_tensor_free(&C, &y); dt_tensor_free(&C, &dx);
        dt_tensor_free(&C, &rt); dt_tensor_free(&C, &w1); dt_tensor_free(&C, &w2); dt_tensor_free(&C, &w2bad);
        dt_tensor_free(&C, &drt); dt_tensor_free(&C, &dw1); dt_tensor_free(&C, &dw2);
    }
    dt_moe_acts_free(a);
    dt_moe_free(m);
    if (W == 1) {
        memset(&md, 0, sizeof md);
        md.experts = 1; md.width = CW; md.seq = T;
        dt_test_error("default_top_k_with_one_expert_is_named", dt_moe_create(l, &m, &md), dt_ctx_error(&C),
                      "desc.top_k = 0");
    }
    /* the bias chooses experts whose probability underflowed to 0: renormalised gates stay 0, not
       0/0 */
    memset(&md, 0, sizeof md);
    md.experts = E; md.top_k = 2; md.width = CW; md.seq = T; md.renorm = 1; md.balance = DT_MOE_BIAS;
    OK(dt_moe_create(l, &m, &md));
    OK(dt_moe_acts_create(m, &a));
    {
        int El = E / W, i, finite = 1;
        dt_tensor x = mk(2, T, CW, 0), y = mk(2, T, CW, 0), dx = mk(2, T, CW, 0), rt = mk(2, E, CW, 0);
        dt_tensor w1 = mk(3, El, 4 * CW, CW), w2 = mk(3, El, CW, 4 * CW), drt = mk(2, E, CW, 0);
        dt_tensor dw1 = mk(3, El, 4 * CW, CW), dw2 = mk(3, El, CW, 4 * CW);
        for (i = 0; i < T * CW; i++) Fp(&x)[i] = 1.0f;
        for (i = 0; i < CW; i++) Fp(&rt)[i] = 100.0f; /* expert 0's logit 1600, the others 0: p = 1, 0, ... */
        for (i = 0; i < El * 4 * CW * CW; i++) { Fp(&w1)[i] = 0.01f; Fp(&w2)[i] = 0.01f; }
        dt_moe_bias(m)[0] = -2.0f; dt_moe_bias(m)[1] = 1.0f; dt_moe_bias(m)[2] = 1.0f;
        OK(dt_moe_fwd(m, a, &y, &x, 0, &rt, &w1, NULL, &w2, NULL));
        OK(dt_moe_bwd(m, a, &dx, &drt, &dw1, NULL, &dw2, NULL, &y, &x, &rt, &w1, &w2, 1.0f));
        for (i = 0; i < T * CW; i++) finite &= isfinite(Fp(&y)[i]) && isfinite(Fp(&dx)[i]);
        for (i = 0; i < E * CW; i++) finite &= isfinite(Fp(&drt)[i]);
        dt_test_check_all("renorm_gates_of_zero_probability_experts_stay_finite", finite, "y, dx or the router grad is "
                          "not finite");
        OK(dt_moe_step_end(m, NULL));
        dt_tensor_free(&C, &x); dt_tensor_free(&C, &y); dt_tensor_free(&C, &dx); dt_tensor_free(&C, &rt);
        dt_tensor_free(&C, &w1); dt_tensor_free(&C, &w2); dt_tensor_free(&C, &drt); dt_tensor_free(&C, &dw1);
        dt_tensor_free(&C, &dw2);
    }
    dt_moe_acts_free(a);
    dt_moe_free(m);
    dt_layout_free(l);
}

int main(void) {
    dt_comm *rev;
    int rc, ord;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    W = dt_comm_size(world);
    R = dt_comm_rank(world);
    make_inputs();
    if (R == 0) {
        check_fd(1.0, 0, 0.05);
        check_fd(0, 1, 0.05);
    }
    OK(dt_comm_split(world, &rev, 0, W - 1 - R)); /* the same ranks, in reverse order */
    for (ord = 0; ord < 2; ord++) {
        dt_comm *w = ord ? rev : world;
        char tag[64];
        const char *o = ord ? "_reversed" : "";
        snprintf(tag, sizeof tag, "ep%d_cap1_aux%s", W, o);
        run_case(w, W, 1, 1.0, 0, DT_MOE_AUX, tag);
        snprintf(tag, sizeof tag, "ep%d_dropless_renorm_aux%s", W, o);
        run_case(w, W, 1, 0, 1, DT_MOE_AUX, tag);
        snprintf(tag, sizeof tag, "ep%d_cap1_renorm_bias%s", W, o);
        run_case(w, W, 1, 1.0, 1, DT_MOE_BIAS, tag);
        if (W == 4) {
            snprintf(tag, sizeof tag, "ep2_edp2_cap1_aux%s", o);
            run_case(w, 2, 1, 1.0, 0, DT_MOE_AUX, tag);
            snprintf(tag, sizeof tag, "ep2_tp2_cap1_renorm_aux%s", o);
            run_case(w, 2, 2, 1.0, 1, DT_MOE_AUX, tag);
        }
        if (W == 2) {
            snprintf(tag, sizeof tag, "ep1_tp2_cap1_bias%s", o);
            run_case(w, 1, 2, 1.0, 0, DT_MOE_BIAS, tag);
        }
    }
    bad_inputs();
    dt_comm_free(rev);
    rc = dt_test_finish();
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return rc;
}
