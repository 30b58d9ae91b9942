// emu-modes: parallel random:1 (each launch also runs in every order in same_bits checks)
/* tests/cuda_emu/k_flash.cpp - kernels/dt_flash.cu (causal attention on the tensor cores, bf16 q k v,
   f32 accumulation) against an f64 reference, on the emulator (and on a GPU through bench/gpu).

   Reference: the same bf16 q, k, v (their exact values), dout in f32, everything in double:
       out = softmax(q k^T / sqrt(hs), causal) v,  lse = log sum exp,
       dv = P^T dout, dP = dout v^T, dS = P (dP - rowsum(dout * out)) / sqrt(hs), dq = dS k, dk = dS^T q
   (grouped-query: a K/V head's dk, dv sum over the query heads that read it).
   The kernel rounds P, dS and dout to bf16 before their mma (FlashAttention-2's precision), and
   the order of the sums inside an mma is unspecified, so the comparison is by a bound derived per
   element, not bits. With u = 2^-8 (bf16's unit roundoff):
       out[t]  u sum_u P |v|                        (P rounded)
       dv[u]   2u sum_t P |dout|                    (P and dout rounded)
       dS      |dS| u + P scale (u sum_d |dout v| + e(D)),  e(D) = sum_d |dout| (u |out| + e(out))
       dq[t]   sum_u e(dS) |k|,   dk[u]   sum_t e(dS) |q|
   times 1.5 for the second-order and f32 terms (f32 sums of exact products, exp2f: ~1e-4
   relative), plus 1e-5 rms. The test prints how much of the bound the worst element uses
   (~0.55) and the worst error relative to |want| + rms (~2e-2: a K/V row that 257 queries
   read sums 257 rounded P). lse, from f32 sums of exact products: 1e-4 (|want| + 1).
   A fragment in the wrong place or a tile read before it is written gives errors of the size of
   the values: the planted copies below (the same source built with DT_K__FL_PLANT) must fail.

   Shapes: T 1 .. 257 (inside one tile, on and off the 64 edges), hs 16, 32, 64, 96, 128, GQA
   groups 1, 2 and 4, B 1 and 2. Gradients accumulate (dq, dk, dv start non-zero). The backward
   gives the same bits in every thread order (no atomics). */
#include "dt_tensor.h"
#include "k_common.h"
#include "dt_cuda.cuh" /* before the namespaces: the planted copies share them */
#include "dt_mma.cuh"

/* The planted copies: the same file, renamed launchers (the linked dt_flash.o is the real one). */
#define dt_k_flash_fwd k_flash_plant1_fwd
#define dt_k_flash_bwd k_flash_plant1_bwd
#define dt_k_flash_bwd_scratch k_flash_plant1_scratch
#define dt_k_flash_bwd_prep k_flash_plant1_prep
#define DT_K__FL_PLANT 1
namespace k_plant1 {
#include "dt_flash.cu"
}
#undef dt_k_flash_fwd
#undef dt_k_flash_bwd
#undef dt_k_flash_bwd_scratch
#undef dt_k_flash_bwd_prep
#undef DT_K__FL_PLANT
#define dt_k_flash_fwd k_flash_plant2_fwd
#define dt_k_flash_bwd k_flash_plant2_bwd
#define dt_k_flash_bwd_scratch k_flash_plant2_scratch
#define dt_k_flash_bwd_prep k_flash_plant2_prep
#define DT_K__FL_PLANT 2
namespace k_plant2 {
#include "dt_flash.cu"
}
#undef dt_k_flash_fwd
#undef dt_k_flash_bwd
#undef dt_k_flash_bwd_scratch
#undef dt_k_flash_bwd_prep
#undef DT_K__FL_PLANT

typedef int (*k_flash_fn)(const dt_k_flash *, void *);

struct shape {
    int64_t B, T;
    int H, Hkv, hs;
};

/* Inputs, laid out as a packed projection [B, T, (H + 2 Hkv) hs]: q | k | v per row. */
struct inputs {
    shape s;
    int64_t ld;                    /* the packed row */
    std::vector<uint16_t> qkv16;   /* bf16 bits */
    std::vector<double> qkv;       /* their values */
    std::vector<float> dout, g0;   /* dout [B, T, H hs]; initial gradients [B, T, ld] */
};

static inputs make_inputs(shape s) {
    inputs in;
    in.s = s;
    in.ld = (int64_t)(s.H + 2 * s.Hkv) * s.hs;
    size_t n = (size_t)(s.B * s.T * in.ld);
    std::vector<float> r = k_random(n, -2.0f, 2.0f);
    in.qkv16.resize(n), in.qkv.resize(n);
    for (size_t i = 0; i < n; i++) {
        in.qkv16[i] = dt_f32_to_bf16(r[i]);
        in.qkv[i] = dt_bf16_to_f32(in.qkv16[i]);
    }
    in.dout = k_random((size_t)(s.B * s.T * s.H * s.hs), -1.0f, 1.0f);
    in.g0 = k_random(n, -0.5f, 0.5f);
    return in;
}

struct outputs {
    std::vector<double> out, lse, g; /* g: the gradient [B, T, ld] (q | k | v), without g0 */
    std::vector<double> out_bound, g_bound;
};

/* bf16's unit roundoff (8 significant bits, round to nearest even) */
static const double K_UB = 1.0 / 256.0;

static outputs reference(const inputs &in) {
    const shape &s = in.s;
    const int64_t T = s.T, hs = s.hs, C = (int64_t)s.H * hs, ld = in.ld, grp = s.H / s.Hkv;
    const double scale = 1.0 / sqrt((double)hs);
    outputs r;
    r.out.assign((size_t)(s.B * T * C), 0.0), r.lse.assign((size_t)(s.B * s.H * T), 0.0);
    r.g.assign((size_t)(s.B * T * ld), 0.0);
    r.out_bound.assign(r.out.size(), 0.0), r.g_bound.assign(r.g.size(), 0.0);
    std::vector<double> P((size_t)(T * T));
    for (int64_t b = 0; b < s.B; b++)
        for (int h = 0; h < s.H; h++) {
            const int64_t qo = h * hs, ko = C + (h / grp) * hs, vo = C + (int64_t)s.Hkv * hs + (h / grp) * hs;
            auto X = [&](int64_t t, int64_t off, int64_t d) { return in.qkv[(size_t)((b * T + t) * ld + off + d)]; };
            for (int64_t t = 0; t < T; t++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t u = 0; u <= t; u++) {
                    double a = 0.0;
                    for (int64_t d = 0; d < hs; d++) a += X(t, qo, d) * X(u, ko, d);
                    P[t * T + u] = a * scale;
                    mx = fmax(mx, a * scale);
                }
                for (int64_t u = 0; u <= t; u++) sum += exp(P[t * T + u] - mx);
                r.lse[(size_t)((b * s.H + h) * T + t)] = mx + log(sum);
                for (int64_t u = 0; u <= t; u++) P[t * T + u] = exp(P[t * T + u] - mx) / sum;
                for (int64_t d = 0; d < hs; d++) {
                    double o = 0.0, mag = 0.0;
                    for (int64_t u = 0; u <= t; u++)
                        o += P[t * T + u] * X(u, vo, d), mag += P[t * T + u] * fabs(X(u, vo, d));
                    r.out[(size_t)((b * T + t) * C + qo + d)] = o;
                    r.out_bound[(size_t)((b * T + t) * C + qo + d)] = K_UB * mag; /* P rounded for the mma */
                }
            }
            for (int64_t t = 0; t < T; t++) {
                const float *go = &in.dout[(size_t)((b * T + t) * C + qo)];
                double D = 0.0, eD = 0.0; /* eD: dout rounded, and out's own error, in D */
                for (int64_t d = 0; d < hs; d++) {
                    size_t o = (size_t)((b * T + t) * C + qo + d);
                    D += (double)go[d] * r.out[o];
                    eD += fabs((double)go[d]) * (K_UB * fabs(r.out[o]) + r.out_bound[o]);
                }
                for (int64_t u = 0; u <= t; u++) {
                    double dp = 0.0, edp = 0.0, p = P[t * T + u];
                    for (int64_t d = 0; d < hs; d++)
                        dp += (double)go[d] * X(u, vo, d), edp += fabs(go[d] * X(u, vo, d));
                    double ds = p * (dp - D) * scale;
                    /* dS's error: its own rounding, dout rounded in dP, D's error */
                    double eds = fabs(ds) * K_UB + p * scale * (K_UB * edp + eD);
                    for (int64_t d = 0; d < hs; d++) {
                        size_t iq = (size_t)((b * T + t) * ld + qo + d), ik = (size_t)((b * T + u) * ld + ko + d),
                               iv = (size_t)((b * T + u) * ld + vo + d);
                        r.g[iq] += ds * X(u, ko, d);
                        r.g[ik] += ds * X(t, qo, d);
                        r.g[iv] += p * go[d];
                        r.g_bound[iq] += eds * fabs(X(u, ko, d));
                        r.g_bound[ik] += eds * fabs(X(t, qo, d));
                        r.g_bound[iv] += 2.0 * K_UB * p * fabs((double)go[d]); /* P and dout rounded */
                    }
                }
            }
        }
    return r;
}

/* The kernels' arguments for the device copies. */
struct device {
    uint16_t *qkv;
    float *out, *lse, *dout, *g;
    void *scratch;
    size_t scratch_bytes;
};

static dt_k_flash args(const inputs &in, const device &d) {
    const shape &s = in.s;
    dt_k_flash a;
    memset(&a, 0, sizeof a);
    a.B = s.B, a.T = s.T, a.H = s.H, a.H_kv = s.Hkv, a.hs = s.hs;
    a.q = d.qkv, a.k = d.qkv + (int64_t)s.H * s.hs, a.v = a.k + (int64_t)s.Hkv * s.hs;
    a.q_stride = a.kv_stride = in.ld;
    a.out = d.out, a.lse = d.lse, a.out_stride = (int64_t)s.H * s.hs;
    a.dout = d.dout;
    a.dq = d.g, a.dk = d.g + (int64_t)s.H * s.hs, a.dv = a.dk + (int64_t)s.Hkv * s.hs;
    a.dq_stride = a.dkv_stride = in.ld;
    a.scratch = d.scratch;
    return a;
}

static device upload(const inputs &in) {
    const shape &s = in.s;
    device d;
    d.qkv = k_upload(in.qkv16);
    d.out = k_upload(std::vector<float>((size_t)(s.B * s.T * s.H * s.hs), NAN));
    d.lse = k_upload(std::vector<float>((size_t)(s.B * s.H * s.T), NAN));
    d.dout = k_upload(in.dout);
    d.g = k_upload(in.g0);
    d.scratch_bytes = dt_k_flash_bwd_scratch(s.B, s.T, s.H, s.hs);
    d.scratch = k_upload(std::vector<unsigned char>(d.scratch_bytes ? d.scratch_bytes : 1, 0xff));
    return d;
}

/* fwd then bwd (from g0) with the given launchers; out, lse and the gradient minus g0. */
static int run(const inputs &in, const device &d, k_flash_fn fwd, k_flash_fn bwd, std::vector<float> *out,
               std::vector<float> *lse, std::vector<float> *g) {
    const shape &s = in.s;
    dt_k_flash a = args(in, d);
    cudaMemcpy(d.g, in.g0.data(), in.g0.size() * sizeof(float), cudaMemcpyHostToDevice);
    int st = fwd(&a, NULL);
    if (!st && bwd) st = bwd(&a, NULL);
    if (!st) st = (int)cudaDeviceSynchronize();
    *out = k_download(d.out, (size_t)(s.B * s.T * s.H * s.hs));
    *lse = k_download(d.lse, (size_t)(s.B * s.H * s.T));
    *g = k_download(d.g, in.g0.size());
    for (size_t i = 0; i < g->size(); i++) (*g)[i] -= in.g0[i];
    return st;
}

/* The worst element: max over i of |got - want| / (K_MARGIN bound + 1e-5 rms(want)) (NaN counts as
   infinite), *at its index; *rel the worst |got - want| / (|want| + rms(want)), for the record. */
static const double K_MARGIN = 1.5; /* the bounds' second-order and f32 terms (~1e-4 relative) */
static double worst(const std::vector<float> &got, const std::vector<double> &want, const std::vector<double> &bound,
                    size_t *at, double *rel) {
    double ss = 0.0, w = 0.0;
    for (size_t i = 0; i < want.size(); i++) ss += want[i] * want[i];
    double rms = want.empty() ? 0.0 : sqrt(ss / (double)want.size());
    *at = 0, *rel = 0.0;
    for (size_t i = 0; i < want.size(); i++) {
        double d = fabs((double)got[i] - want[i]), e = d / (K_MARGIN * bound[i] + 1e-5 * rms + 1e-30);
        if (!(e <= w)) w = e != e ? INFINITY : e, *at = i;
        *rel = fmax(*rel, d / (fabs(want[i]) + rms + 1e-30));
    }
    return w;
}

static void check_shape(shape s, double *max_ratio, double *max_rel) {
    char tag[96], name[160];
    snprintf(tag, sizeof tag, "B%lld_T%lld_H%d_kv%d_hs%d", (long long)s.B, (long long)s.T, s.H, s.Hkv, s.hs);
    inputs in = make_inputs(s);
    outputs want = reference(in);
    device d = upload(in);
    std::vector<float> out, lse, g;
    snprintf(name, sizeof name, "flash_mma_%s_runs", tag);
    if (!k_ok(name, run(in, d, dt_k_flash_fwd, dt_k_flash_bwd, &out, &lse, &g))) return;
    /* out, then dq, dk, dv apart (their sizes differ: each has its own rms) */
    const char *what[4] = {"out", "dq", "dk", "dv"};
    std::vector<float> gp[4];
    std::vector<double> wp[4], bp[4];
    gp[0] = out, wp[0] = want.out, bp[0] = want.out_bound;
    for (size_t i = 0; i < g.size(); i++) {
        int64_t c = (int64_t)(i % (size_t)in.ld);
        int part = c < (int64_t)s.H * s.hs ? 1 : c < (int64_t)(s.H + s.Hkv) * s.hs ? 2 : 3;
        gp[part].push_back(g[i]), wp[part].push_back(want.g[i]), bp[part].push_back(want.g_bound[i]);
    }
    for (int k = 0; k < 4; k++) {
        size_t at;
        double rel, e = worst(gp[k], wp[k], bp[k], &at, &rel);
        max_ratio[k] = fmax(max_ratio[k], e), max_rel[k] = fmax(max_rel[k], rel);
        snprintf(name, sizeof name, "flash_mma_%s_%s_within_bf16_bound", tag, what[k]);
        dt_test_check_all(name, e <= 1.0, "[%zu] got %.7g, want %.7g: |diff| %.3g is %.3g times the bound %.3g", at,
                          (double)gp[k][at], wp[k][at], fabs(gp[k][at] - wp[k][at]), e,
                          K_MARGIN * bp[k][at]);
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < lse.size(); i++)
        if (!(fabs(lse[i] - want.lse[i]) <= 1e-4 * (fabs(want.lse[i]) + 1.0)) && bad++ == 0) first = i;
    snprintf(name, sizeof name, "flash_mma_%s_lse_matches", tag);
    dt_test_check_all(name, !bad, "%zu of %zu; first [%zu] got %.7g want %.7g", bad, lse.size(), first,
                      bad ? (double)lse[first] : 0.0, bad ? want.lse[first] : 0.0);
}

/* The backward's bits in every thread order (dq, dk, dv each summed by one lane, in order). */
static void check_bits(shape s) {
    inputs in = make_inputs(s);
    device d = upload(in);
    k_same_bits_in_every_order("flash_mma_bwd_same_bits_in_every_order", [&]() {
        std::vector<float> out, lse, g;
        if (run(in, d, dt_k_flash_fwd, dt_k_flash_bwd, &out, &lse, &g)) g.assign(g.size(), NAN);
        g.insert(g.end(), out.begin(), out.end());
        return g;
    });
}

/* A planted copy must leave the bound (in some thread order, for the barrier). */
static void check_plant(const char *name, shape s, k_flash_fn fwd, k_flash_fn bwd, int every_order) {
    static const char *const modes[] = {"forward", "reverse", "random:1", "random:2"};
    inputs in = make_inputs(s);
    outputs want = reference(in);
    device d = upload(in);
    std::string own = dt_emu_mode();
    double e = 0.0;
    for (int m = -1; m < (every_order ? 4 : 0); m++) {
        std::vector<float> out, lse, g;
        size_t at;
        double rel;
        if (m >= 0) dt_emu_set_mode(modes[m]);
        int st = run(in, d, fwd, bwd, &out, &lse, &g);
        dt_emu_set_mode(own.c_str());
        if (st) { e = INFINITY; break; }
        e = fmax(e, fmax(worst(out, want.out, want.out_bound, &at, &rel),
                         bwd ? worst(g, want.g, want.g_bound, &at, &rel) : 0.0));
    }
    dt_test_check_all(name, e > 1.0, "the planted copy stays within the bound (worst: %.3g of it)", e);
}

/* Block mode, as context parallelism's ring calls it (dt_parallel.h >>cp): the sequence in 4
   chunks of c, two "ranks" holding chunks {0, 3} and {1, 2} (the zigzag of cp 2) in buffers of
   their own: q, out, lse, the gradient [B, 2c, ...] per rank, and the K/V of each rank packed
   [B, 2c + 3, 2 Hkv hs] (k | v; the 3 rows past the chunks are NaN, never to be read). Each rank
   merges every (query chunk, key chunk) block of both ranks' K/V, above the diagonal too (a
   no-op), in the ring's order; backward with the scratch filled once (dt_k_flash_bwd_prep) and
   prepped blocks, dk and dv added into the owner's buffer. Mapped back to positions, the result
   is held to the whole sequence's f64 reference and bounds, as check_shape's. */
static void check_blocks(shape s, double *max_ratio) {
    char tag[96], name[256];
    const int64_t c = s.T / 4, T = 4 * c, hs = s.hs, C = (int64_t)s.H * hs, Ckv = (int64_t)s.Hkv * hs, L = 2 * c;
    const int64_t Lk = L + 3, ld = (int64_t)(s.H + 2 * s.Hkv) * hs;
    s.T = T;
    snprintf(tag, sizeof tag, "B%lld_T%lld_H%d_kv%d_hs%d", (long long)s.B, (long long)T, s.H, s.Hkv, s.hs);
    inputs in = make_inputs(s);
    outputs want = reference(in);
    auto chunk = [](int r, int a) { return a == 0 ? r : 3 - r; };
    auto pos = [&](int r, int64_t j) { return chunk(r, (int)(j / c)) * c + j % c; }; /* local row j of rank r */
    uint16_t *q[2], *kv[2];
    float *out[2], *lse[2], *g[2], *dkv[2], *dout[2];
    void *scratch[2];
    const size_t sb = dt_k_flash_bwd_scratch(s.B, L, s.H, s.hs);
    for (int r = 0; r < 2; r++) {
        std::vector<uint16_t> hq((size_t)(s.B * L * ld)), hkv((size_t)(s.B * Lk * 2 * Ckv), (uint16_t)0x7fc0);
        std::vector<float> hg((size_t)(s.B * L * ld)), hd((size_t)(s.B * L * C));
        for (int64_t b = 0; b < s.B; b++)
            for (int64_t j = 0; j < L; j++) {
                const int64_t t = b * T + pos(r, j), lr = b * L + j;
                for (int64_t e = 0; e < ld; e++) hq[(size_t)(lr * ld + e)] = in.qkv16[(size_t)(t * ld + e)];
                for (int64_t e = 0; e < 2 * Ckv; e++) hkv[(size_t)((b * Lk + j) * 2 * Ckv + e)] = in.qkv16[(size_t)(t * ld + C + e)];
                for (int64_t e = 0; e < ld; e++) hg[(size_t)(lr * ld + e)] = in.g0[(size_t)(t * ld + e)];
                for (int64_t e = 0; e < C; e++) hd[(size_t)(lr * C + e)] = in.dout[(size_t)(t * C + e)];
            }
        q[r] = k_upload(hq), kv[r] = k_upload(hkv), g[r] = k_upload(hg), dout[r] = k_upload(hd);
        out[r] = k_upload(std::vector<float>((size_t)(s.B * L * C), 0.0f));
        lse[r] = k_upload(std::vector<float>((size_t)(s.B * s.H * L), -INFINITY));
        dkv[r] = k_upload(std::vector<float>((size_t)(s.B * Lk * 2 * Ckv), 0.0f));
        scratch[r] = k_upload(std::vector<unsigned char>(sb, 0xff));
    }
    auto blk = [&](int r, int src, int a, int b2) { /* rank r's query chunk a against src's key chunk b2 */
        dt_k_flash x;
        memset(&x, 0, sizeof x);
        x.B = s.B, x.T = L, x.H = s.H, x.H_kv = s.Hkv, x.hs = s.hs;
        x.q = q[r], x.k = kv[src], x.v = kv[src] + Ckv, x.q_stride = ld, x.kv_stride = 2 * Ckv;
        x.out = out[r], x.lse = lse[r], x.out_stride = C, x.dout = dout[r];
        x.dq = g[r], x.dk = dkv[src], x.dv = dkv[src] + Ckv, x.dq_stride = ld, x.dkv_stride = 2 * Ckv;
        x.scratch = scratch[r], x.block = 1, x.prepped = 1, x.Tk = Lk;
        x.q_row = a * c, x.q_rows = c, x.q_pos = chunk(r, a) * c;
        x.k_row = b2 * c, x.k_rows = c, x.k_pos = chunk(src, b2) * c;
        return x;
    };
    int st = 0;
    for (int r = 0; r < 2 && !st; r++)
        for (int step = 0; step < 2; step++)
            for (int a = 0; a < 2; a++)
                for (int b2 = 0; b2 < 2 && !st; b2++) {
                    dt_k_flash x = blk(r, (r - step + 2) % 2, a, b2);
                    st = dt_k_flash_fwd(&x, NULL);
                }
    for (int r = 0; r < 2 && !st; r++) {
        dt_k_flash x = blk(r, r, 0, 0);
        x.q_row = 0, x.q_rows = L; /* the scratch for every query row at once */
        st = dt_k_flash_bwd_prep(&x, NULL);
        for (int step = 0; step < 2; step++)
            for (int a = 0; a < 2; a++)
                for (int b2 = 0; b2 < 2 && !st; b2++) {
                    x = blk(r, (r - step + 2) % 2, a, b2);
                    st = dt_k_flash_bwd(&x, NULL);
                }
    }
    if (!st) st = (int)cudaDeviceSynchronize();
    snprintf(name, sizeof name, "flash_mma_blocks_%s_c%lld_run", tag, (long long)c);
    if (!k_ok(name, st)) return;
    /* back to positions: out, lse, and the gradient (q's from the ranks' g, k and v's from dkv) */
    std::vector<float> go((size_t)(s.B * T * C)), gl((size_t)(s.B * s.H * T)), gg((size_t)(s.B * T * ld));
    size_t nan_tail = 0;
    for (int r = 0; r < 2; r++) {
        std::vector<float> ho = k_download(out[r], (size_t)(s.B * L * C)), hl = k_download(lse[r], (size_t)(s.B * s.H * L));
        std::vector<float> hg = k_download(g[r], (size_t)(s.B * L * ld)), hk = k_download(dkv[r], (size_t)(s.B * Lk * 2 * Ckv));
        for (int64_t b = 0; b < s.B; b++) {
            for (int64_t j = 0; j < L; j++) {
                const int64_t t = b * T + pos(r, j);
                for (int64_t e = 0; e < C; e++) go[(size_t)(t * C + e)] = ho[(size_t)((b * L + j) * C + e)];
                for (int h = 0; h < s.H; h++) gl[(size_t)((b * s.H + h) * T + pos(r, j))] = hl[(size_t)((b * s.H + h) * L + j)];
                for (int64_t e = 0; e < C; e++)
                    gg[(size_t)(t * ld + e)] = hg[(size_t)((b * L + j) * ld + e)] - in.g0[(size_t)(t * ld + e)];
                for (int64_t e = 0; e < 2 * Ckv; e++) gg[(size_t)(t * ld + C + e)] = hk[(size_t)((b * Lk + j) * 2 * Ckv + e)];
            }
            for (int64_t j = L; j < Lk; j++) /* the rows past the chunks: never written */
                for (int64_t e = 0; e < 2 * Ckv; e++) nan_tail += hk[(size_t)((b * Lk + j) * 2 * Ckv + e)] != 0.0f;
        }
    }
    const char *what[4] = {"out", "dq", "dk", "dv"};
    std::vector<float> gp[4];
    std::vector<double> wp[4], bp[4];
    gp[0] = go, wp[0] = want.out, bp[0] = want.out_bound;
    for (size_t i = 0; i < gg.size(); i++) {
        int64_t col = (int64_t)(i % (size_t)ld);
        int part = col < C ? 1 : col < C + Ckv ? 2 : 3;
        gp[part].push_back(gg[i]), wp[part].push_back(want.g[i]), bp[part].push_back(want.g_bound[i]);
    }
    for (int k = 0; k < 4; k++) {
        size_t at;
        double rel, e = worst(gp[k], wp[k], bp[k], &at, &rel);
        max_ratio[k] = fmax(max_ratio[k], e);
        snprintf(name, sizeof name, "flash_mma_blocks_%s_c%lld_%s_within_bf16_bound", tag, (long long)c, what[k]);
        dt_test_check_all(name, e <= 1.0, "[%zu] got %.7g, want %.7g: |diff| %.3g is %.3g times the bound %.3g", at,
                          (double)gp[k][at], wp[k][at], fabs(gp[k][at] - wp[k][at]), e, K_MARGIN * bp[k][at]);
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < gl.size(); i++)
        if (!(fabs(gl[i] - want.lse[i]) <= 1e-4 * (fabs(want.lse[i]) + 1.0)) && bad++ == 0) first = i;
    snprintf(name, sizeof name, "flash_mma_blocks_%s_c%lld_lse_matches", tag, (long long)c);
    dt_test_check_all(name, !bad, "%zu of %zu; first [%zu] got %.7g want %.7g", bad, gl.size(), first,
                      bad ? (double)gl[first] : 0.0, bad ? want.lse[first] : 0.0);
    snprintf(name, sizeof name, "flash_mma_blocks_%s_c%lld_rows_past_the_keys_untouched", tag, (long long)c);
    dt_test_check_all(name, !nan_tail, "%zu values written in dk / dv rows past k_rows", nan_tail);
}

/* The block mode's refusals: a block outside its buffer. */
static void check_block_refusals(void) {
    shape s = {1, 8, 2, 2, 64};
    inputs in = make_inputs(s);
    device d = upload(in);
    dt_k_flash a = args(in, d), b;
    a.block = 1, a.Tk = 8, a.q_rows = 4, a.k_rows = 4, a.q_pos = 4;
    DT_TEST_CHECK("flash_mma_block_accepts_a_block", dt_k_flash_fwd(&a, NULL) == 0);
    DT_TEST_CHECK("flash_mma_block_refuses_rows_past_T",
                  (b = a, b.q_row = 5, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_block_refuses_keys_past_Tk",
                  (b = a, b.k_row = 2, b.Tk = 5, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_block_refuses_negative_position",
                  (b = a, b.k_pos = -1, dt_k_flash_bwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_block_refuses_negative_rows",
                  (b = a, b.q_rows = -1, dt_k_flash_bwd_prep(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_block_of_no_keys_is_a_no_op", (b = a, b.k_rows = 0, dt_k_flash_fwd(&b, NULL) == 0));
}

/* Shapes and devices the launchers refuse, and the empty ones they accept. */
static void check_refusals(void) {
    shape s = {1, 8, 2, 2, 64};
    inputs in = make_inputs(s);
    device d = upload(in);
    dt_k_flash a = args(in, d), b;
    DT_TEST_CHECK("flash_mma_refuses_hs_48", (b = a, b.hs = 48, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_refuses_heads_not_a_multiple_of_kv_heads",
                  (b = a, b.H_kv = 3, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_refuses_unaligned_q",
                  (b = a, b.q = a.q + 1, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_refuses_stride_not_a_multiple_of_8",
                  (b = a, b.q_stride = in.ld + 4, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_refuses_stride_under_the_heads",
                  (b = a, b.kv_stride = 8, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_refuses_negative_T", (b = a, b.T = -1, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_refuses_grid_past_65535_heads",
                  (b = a, b.B = 40000, dt_k_flash_fwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_bwd_refuses_no_scratch",
                  (b = a, b.scratch = NULL, dt_k_flash_bwd(&b, NULL) == cudaErrorInvalidValue));
    DT_TEST_CHECK("flash_mma_accepts_T_0",
                  (b = a, b.T = 0, dt_k_flash_fwd(&b, NULL) == 0 && dt_k_flash_bwd(&b, NULL) == 0));
    DT_TEST_CHECK("flash_mma_scratch_of_an_overflowing_size_is_0",
                  dt_k_flash_bwd_scratch(1, INT64_MAX / 2, 64, 128) == 0);
    {   /* hs + 1 in int would overflow (hs INT_MAX) and pass the size check negative: 0 */
        size_t got = dt_k_flash_bwd_scratch(1, 1, 1, 2147483647), want = (size_t)4294967296 + 4;
        dt_test_check_all("flash_mma_scratch_at_hs_int_max_is_its_size", got == want, "got %zu, want %zu", got, want);
    }
    /* f32 and bf16 pointers off their alignment (a GPU faults): T one row short, so that the
       bytes a broken check let through stay inside the buffers */
    k_refused("flash_mma_refuses_out_off_4_bytes",
              (b = a, b.T = a.T - 1, b.out = (float *)((char *)a.out + 2), dt_k_flash_fwd(&b, NULL)));
    k_refused("flash_mma_refuses_lse_off_4_bytes",
              (b = a, b.T = a.T - 1, b.lse = (float *)((char *)a.lse + 2), dt_k_flash_fwd(&b, NULL)));
    k_refused("flash_mma_refuses_out16_off_2_bytes",
              (b = a, b.out = NULL, b.out16 = (uint16_t *)((char *)a.out + 1), dt_k_flash_fwd(&b, NULL)));
    k_refused("flash_mma_bwd_refuses_dout_off_4_bytes",
              (b = a, b.T = a.T - 1, b.dout = (const float *)((const char *)a.dout + 2), dt_k_flash_bwd(&b, NULL)));
    k_refused("flash_mma_bwd_refuses_dk_off_4_bytes",
              (b = a, b.T = a.T - 1, b.dk = (float *)((char *)a.dk + 2), dt_k_flash_bwd(&b, NULL)));
    k_refused("flash_mma_bwd_refuses_dq16_off_2_bytes",
              (b = a, b.dq = b.dk = b.dv = NULL, b.dq16 = (uint16_t *)((char *)a.dq + 1), b.dk16 = (uint16_t *)a.dk,
               b.dv16 = (uint16_t *)a.dv, dt_k_flash_bwd(&b, NULL)));
}

int main(int argc, char **argv) {
    (void)argc, (void)argv;
    const shape shapes[] = {
        {1, 1, 1, 1, 64},   {1, 17, 2, 2, 64},  {2, 65, 2, 1, 64},  {1, 130, 4, 1, 128}, {1, 257, 2, 2, 128},
        {1, 64, 4, 4, 32},  {1, 33, 2, 2, 16},  {1, 100, 4, 2, 96}, {1, 200, 4, 4, 64},  {2, 40, 2, 1, 128},
    };
    const shape small[] = {{1, 17, 2, 1, 32}, {1, 70, 2, 2, 16}};
    double max_ratio[4] = {0.0, 0.0, 0.0, 0.0}, max_rel[4] = {0.0, 0.0, 0.0, 0.0};
    int n_shapes = k_size(1, 0) ? (int)(sizeof shapes / sizeof shapes[0]) : 2;
    for (int i = 0; i < n_shapes; i++) check_shape(k_size(1, 0) ? shapes[i] : small[i], max_ratio, max_rel);
    printf("flash_mma: worst |diff| / bound: out %.3g, dq %.3g, dk %.3g, dv %.3g; worst |diff| / (|want| + rms): "
           "out %.3g, dq %.3g, dk %.3g, dv %.3g\n", max_ratio[0], max_ratio[1], max_ratio[2], max_ratio[3], max_rel[0],
           max_rel[1], max_rel[2], max_rel[3]);
    check_bits(k_size(1, 0) ? shape{1, 130, 2, 1, 32} : shape{1, 20, 2, 1, 16});
    {
        double br[4] = {0.0, 0.0, 0.0, 0.0};
        /* chunks inside one tile (small runs, as under TSan: a smaller one) */
        check_blocks(k_size(1, 0) ? shape{2, 4 * 37, 2, 1, 64} : shape{1, 4 * 20, 2, 1, 16}, br);
        if (k_size(1, 0)) {
            check_blocks(shape{1, 4 * 70, 4, 2, 32}, br); /* chunks across the 64 edges */
            check_blocks(shape{1, 4 * 33, 4, 1, 128}, br);
        }
        printf("flash_mma blocks: worst |diff| / bound: out %.3g, dq %.3g, dk %.3g, dv %.3g\n", br[0], br[1], br[2],
               br[3]);
    }
    check_refusals();
    check_block_refusals();
#ifdef DT_EMU_STUBS
    dt_test_skip("flash_mma_planted_bugs_are_caught", "the planted copies run on the emulator only");
#else
    if (k_size(1, 0)) {
        check_plant("flash_mma_planted_fragment_bug_is_caught", shape{1, 100, 2, 2, 64}, k_plant1::k_flash_plant1_fwd,
                    k_plant1::k_flash_plant1_bwd, 0);
        check_plant("flash_mma_removed_barrier_is_caught", shape{1, 100, 2, 2, 64}, k_plant2::k_flash_plant2_fwd,
                    NULL, 1);
    }
#endif
    k_free_all();
    return dt_test_finish();
}
