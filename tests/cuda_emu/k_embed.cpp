// tests/cuda_emu/k_embed.cpp - kernels/dt_embed.cu on the emulator: the dense gather / scatter
// against dt_embedding_fwd / _bwd, the DLRM dot interaction against dt_dot_interaction_fwd /
// _bwd (within a bound derived from each sum's terms: its batched GEMMs sum in cuBLAS's order),
// and the sparse path (pooling, bucketization, dedup, fused row update) against host loops written from dt_embed.h's documented formulas, with
// dt_opt.h's dt_sgd_update / dt_adagrad_update for the per-row math.
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <algorithm>
#include <vector>
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "kernels/dt_kernels.h"
#include "tests/dt_test.h"
#include "k_common.h" /* k_refused */

/* DT_K_SMALL=1 (the ThreadSanitizer run of tests/run.sh): the small size. */
static int64_t ksz(int64_t normal, int64_t small) {
    const char *e = getenv("DT_K_SMALL");
    return e && e[0] == '1' ? small : normal;
}

template <typename T> static T *dev(const std::vector<T> &h) {
    T *d = NULL;
    if (cudaMalloc((void **)&d, h.size() * sizeof(T) + 8) != cudaSuccess) return NULL;
    if (!h.empty()) cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
    return d;
}
template <typename T> static std::vector<T> host(const T *d, size_t n) {
    std::vector<T> h(n);
    if (n) cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
}
static std::vector<float> rnd(size_t n, uint64_t stream, float lo, float hi) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * dt_rng_uniform(3, stream, i);
    return v;
}
static int64_t irnd(uint64_t stream, uint64_t i, int64_t n) {
    int64_t x = (int64_t)(dt_rng_uniform(9, stream, i) * (float)n);
    return x < n ? x : n - 1;
}
static dt_tensor wrap(void *p, dt_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int64_t numel) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = p; t.dtype = dt; t.device = DT_CPU; t.ndim = ndim;
    t.shape[0] = a; t.shape[1] = b; t.shape[2] = c;
    t.numel = numel;
    return t;
}

/* ---------------------------------------------------------------- dense embedding */

static void check_dense(dt_ctx *ctx) {
    const int64_t V = 11, D = 5, N = 9;
    std::vector<float> table = rnd(V * D, 1, -1, 1), out(N * D), dtab = rnd(V * D, 2, -1, 1), dout = rnd(N * D, 3, -1, 1);
    std::vector<int32_t> id32(N);
    std::vector<int64_t> id64(N);
    std::vector<int> zero(1, 0);
    for (int64_t i = 0; i < N; i++) id32[i] = (int32_t)(id64[i] = irnd(1, i, 4) * 3); /* repeats: 0, 3, 6, 9 */
    dt_tensor tt = wrap(table.data(), DT_F32, 2, V, D, 0, V * D), to = wrap(out.data(), DT_F32, 2, N, D, 0, N * D);
    dt_tensor ti = wrap(id32.data(), DT_I32, 1, N, 0, 0, N), tg = wrap(dout.data(), DT_F32, 2, N, D, 0, N * D);
    dt_tensor td = wrap(dtab.data(), DT_F32, 2, V, D, 0, V * D);
    float *d_t = dev(table), *d_o = dev(std::vector<float>(N * D, 7.0f)), *d_dt = dev(dtab), *d_g = dev(dout);
    int32_t *d_i32 = dev(id32);
    int64_t *d_i64 = dev(id64);
    int *d_bad = dev(zero);
    dt_embedding_fwd(ctx, &to, &tt, &ti);
    dt_embedding_bwd(ctx, &td, &tg, &ti);
    DT_TEST_CHECK("embedding_fwd_i32_returns_0", dt_k_embedding_fwd(d_o, d_t, d_i32, 0, N, V, D, d_bad, NULL) == 0);
    dt_test_equal_bytes("embedding_fwd_i32_gathers_cpu_rows", host(d_o, N * D).data(), out.data(), N * D * 4);
    cudaMemset(d_o, 0, N * D * 4);
    dt_k_embedding_fwd(d_o, d_t, d_i64, 1, N, V, D, d_bad, NULL);
    dt_test_equal_bytes("embedding_fwd_i64_gathers_cpu_rows", host(d_o, N * D).data(), out.data(), N * D * 4);
    DT_TEST_CHECK("embedding_bwd_returns_0", dt_k_embedding_bwd(d_dt, d_g, d_i64, 1, N, V, D, d_bad, NULL) == 0);
    /* repeated ids add by atomicAdd in any order: fp32 reassociation of at most 3 terms */
    dt_test_allclose("embedding_bwd_accumulates_as_cpu", host(d_dt, V * D).data(), dtab.data(), V * D, 1e-6, 1e-6);
    DT_TEST_CHECK("embedding_fwd_valid_ids_leave_bad_flag_0", host(d_bad, 1)[0] == 0);
    { /* id 11 = V: zeros gathered, nothing scattered, flag up */
        int64_t bad_id = V;
        std::vector<float> z(D, 0.0f), before = host(d_dt, V * D);
        cudaMemcpy(d_i64 + 4, &bad_id, 8, cudaMemcpyHostToDevice);
        dt_k_embedding_fwd(d_o, d_t, d_i64, 1, N, V, D, d_bad, NULL);
        DT_TEST_CHECK("embedding_fwd_out_of_range_id_sets_bad_flag", host(d_bad, 1)[0] == 1);
        dt_test_equal_bytes("embedding_fwd_out_of_range_id_gathers_zeros", host(d_o, N * D).data() + 4 * D, z.data(), D * 4);
        cudaMemcpy(d_bad, zero.data(), 4, cudaMemcpyHostToDevice);
        cudaMemset(d_g, 0, N * D * 4); /* only the bad id's row would add: make every other add 0 */
        {
            std::vector<float> one(D, 1.0f);
            cudaMemcpy(d_g + 4 * D, one.data(), D * 4, cudaMemcpyHostToDevice);
        }
        dt_k_embedding_bwd(d_dt, d_g, d_i64, 1, N, V, D, d_bad, NULL);
        DT_TEST_CHECK("embedding_bwd_out_of_range_id_sets_bad_flag", host(d_bad, 1)[0] == 1);
        dt_test_equal_bytes("embedding_bwd_out_of_range_id_writes_nothing", host(d_dt, V * D).data(), before.data(),
                            V * D * 4);
    }
    DT_TEST_CHECK("embedding_fwd_ids_dtype_flag_2_is_invalid_value",
                  dt_k_embedding_fwd(d_o, d_t, d_i64, 2, N, V, D, NULL, NULL) == (int)cudaErrorInvalidValue);
    cudaFree(d_t); cudaFree(d_o); cudaFree(d_dt); cudaFree(d_g); cudaFree(d_i32); cudaFree(d_i64); cudaFree(d_bad);
}

/* ---------------------------------------------------------------- pooling */

static float ld16(const std::vector<uint16_t> &t, int dt, int64_t i) {
    return dt == DT_BF16 ? dt_bf16_to_f32(t[i]) : dt_f16_to_f32(t[i]);
}

/* Bags of lengths 3, 0, 1, 4, 2, 1 (an empty bag, a dynamic id not admitted = row -1). */
static void check_pool(int dt, int weighted, int mean) {
    const int64_t R = 13, LD = 7, D = 6, NB = 6;
    const int64_t offs_h[NB + 1] = {0, 3, 3, 4, 8, 10, 11};
    const int64_t n = offs_h[NB];
    std::vector<int64_t> offs(offs_h, offs_h + NB + 1), rows(n);
    std::vector<float> tf = rnd(R * LD, 20, -1, 1), w = rnd(n, 21, 0.5f, 2.0f), want(NB * D), dout = rnd(NB * D, 22, -1, 1);
    std::vector<uint16_t> t16(R * LD);
    char tag[64], name[160];
    for (int64_t i = 0; i < n; i++) rows[i] = irnd(2, i, R);
    rows[9] = -1;
    for (int64_t i = 0; i < R * LD; i++)
        if (dt != DT_F32) t16[i] = dt == DT_BF16 ? dt_f32_to_bf16(tf[i]) : dt_f32_to_f16(tf[i]);
    /* dt_embed.h: pooled = ((0 + w_0 row_0) + w_1 row_1) + ... in f32, bag order; mean divides last */
    for (int64_t b = 0; b < NB; b++)
        for (int64_t c = 0; c < D; c++) {
            float acc = 0.0f;
            for (int64_t j = offs[b]; j < offs[b + 1]; j++) {
                float v;
                if (rows[j] < 0) continue;
                v = dt == DT_F32 ? tf[rows[j] * LD + c] : ld16(t16, dt, rows[j] * LD + c);
                acc += weighted ? w[j] * v : v;
            }
            if (mean && offs[b + 1] > offs[b]) acc /= (float)(offs[b + 1] - offs[b]);
            want[b * D + c] = acc;
        }
    snprintf(tag, sizeof tag, "%s%s%s", dt == DT_F32 ? "f32" : dt == DT_BF16 ? "bf16" : "f16",
             weighted ? "_weighted" : "", mean ? "_mean" : "_sum");
    {
        void *d_t = dt == DT_F32 ? (void *)dev(tf) : (void *)dev(t16);
        int64_t *d_r = dev(rows), *d_off = dev(offs);
        float *d_w = weighted ? dev(w) : NULL, *d_o = dev(std::vector<float>(NB * D, 7.0f));
        float *d_g = dev(dout), *d_gr = dev(std::vector<float>(n * D, 7.0f));
        int st = dt_k_embed_pool_fwd(d_o, d_t, dt, d_r, d_w, d_off, NB, D, LD, mean, NULL);
        snprintf(name, sizeof name, "embed_pool_fwd_equals_cpu_bag_order_sum_bitwise_%s", tag);
        if (DT_TEST_CHECK(name, st == 0)) dt_test_equal_bytes(name, host(d_o, NB * D).data(), want.data(), NB * D * 4);
        if (dt == DT_F32) { /* the backward: per-id rows, and scattered into a dense grad table */
            std::vector<float> gw(n * D), dtab = rnd(R * D, 23, -1, 1), dtab_want = dtab;
            for (int64_t b = 0; b < NB; b++)
                for (int64_t j = offs[b]; j < offs[b + 1]; j++)
                    for (int64_t c = 0; c < D; c++) {
                        float src = dout[b * D + c];
                        if (mean) src /= (float)(offs[b + 1] - offs[b]);
                        gw[j * D + c] = weighted ? w[j] * src : src;
                        if (rows[j] >= 0) dtab_want[rows[j] * D + c] += gw[j * D + c];
                    }
            st = dt_k_embed_pool_bwd(d_gr, d_g, NULL, d_w, d_off, NB, D, mean, NULL);
            snprintf(name, sizeof name, "embed_pool_bwd_per_id_rows_equal_cpu_bitwise_%s", tag);
            if (DT_TEST_CHECK(name, st == 0)) dt_test_equal_bytes(name, host(d_gr, n * D).data(), gw.data(), n * D * 4);
            {
                float *d_dt = dev(dtab);
                st = dt_k_embed_pool_bwd_dense(d_dt, d_g, d_r, d_w, d_off, NB, D, mean, NULL);
                snprintf(name, sizeof name, "embed_pool_bwd_dense_accumulates_as_cpu_%s", tag);
                if (DT_TEST_CHECK(name, st == 0))
                    dt_test_allclose(name, host(d_dt, R * D).data(), dtab_want.data(), R * D, 1e-6, 1e-6);
                cudaFree(d_dt);
            }
        }
        cudaFree(d_t); cudaFree(d_r); cudaFree(d_off); cudaFree(d_w); cudaFree(d_o); cudaFree(d_g); cudaFree(d_gr);
    }
}

/* ---------------------------------------------------------------- bucketize, dedup, update */

static void check_bucketize(void) {
    const int64_t n = ksz(600, 300), R = 1000; /* 3 (2) blocks of 256 ids; owners of 334, 333, 333 rows */
    const int W = 3;
    std::vector<int64_t> ids(n), want_c(W, 0), want_d(n), start(W, 0);
    std::vector<int> zero(1, 0);
    for (int64_t i = 0; i < n; i++) ids[i] = irnd(3, i, R);
    ids[0] = 0; ids[1] = 333; ids[2] = 334; ids[3] = 666; ids[4] = 667; ids[5] = 999; /* the owners' edges */
    {
        std::vector<int> own(n);
        for (int64_t i = 0; i < n; i++) { own[i] = ids[i] < 334 ? 0 : ids[i] < 667 ? 1 : 2; want_c[own[i]]++; }
        for (int k = 1; k < W; k++) start[k] = start[k - 1] + want_c[k - 1];
        for (int64_t i = 0; i < n; i++) want_d[i] = start[own[i]]++;
    }
    int64_t *d_ids = dev(ids), *d_c = dev(std::vector<int64_t>(W, 7)), *d_d = dev(std::vector<int64_t>(n, 7));
    int *d_bad = dev(zero);
    void *scr = dev(std::vector<char>(dt_k_embed_bucketize_scratch(n, W), 0));
    dt_emu_counters c0, c1;
    dt_emu_get_counters(&c0);
    int st = dt_k_embed_bucketize(d_c, d_d, d_ids, n, R, W, d_bad, scr, NULL);
    dt_emu_get_counters(&c1);
    DT_TEST_CHECK("embed_bucketize_returns_0", st == 0);
    dt_test_close("embed_bucketize_launcher_allocates_frees_and_waits_for_nothing",
                  (double)(c1.allocs - c0.allocs + c1.frees - c0.frees + c1.syncs - c0.syncs), 0, 0);
    dt_test_equal_bytes("embed_bucketize_counts_per_owner", host(d_c, W).data(), want_c.data(), W * 8);
    dt_test_equal_bytes("embed_bucketize_dest_is_stable_owner_major", host(d_d, n).data(), want_d.data(), n * 8);
    DT_TEST_CHECK("embed_bucketize_valid_ids_leave_bad_flag_0", host(d_bad, 1)[0] == 0);
    {
        int64_t bad = R;
        cudaMemcpy(d_ids + 270, &bad, 8, cudaMemcpyHostToDevice);
        st = dt_k_embed_bucketize(d_c, d_d, d_ids, n, R, W, d_bad, scr, NULL);
        DT_TEST_CHECK("embed_bucketize_id_past_rows_sets_bad_flag_and_dest_minus_1",
                      st == 0 && host(d_bad, 1)[0] == 1 && host(d_d + 270, 1)[0] == -1);
    }
    DT_TEST_CHECK("embed_bucketize_W_0_is_invalid_value",
                  dt_k_embed_bucketize(d_c, d_d, d_ids, n, R, 0, NULL, scr, NULL) == (int)cudaErrorInvalidValue);
    DT_TEST_CHECK("embed_bucketize_no_scratch_is_invalid_value",
                  dt_k_embed_bucketize(d_c, d_d, d_ids, n, R, W, NULL, NULL, NULL) == (int)cudaErrorInvalidValue);
    cudaFree(d_ids); cudaFree(d_c); cudaFree(d_d); cudaFree(d_bad);
}

/* rows in [0, n_rows) with many repeats, every 7th -1 when skips (a dynamic id not admitted:
   sorted after every row); the stable sort's order, runs and count. */
static void check_dedup(const char *tag, int64_t n, int64_t n_rows, int64_t distinct, int skips = 0) {
    std::vector<int64_t> rows(n), order(n), seg;
    char name[160];
    for (int64_t i = 0; i < n; i++) rows[i] = skips && i % 7 == 3 ? -1 : (irnd(4, i, distinct) * 7919) % n_rows;
    if (skips) rows[0] = rows[5] = n_rows - 1; /* the last row: all of its key's bits set, as a skip's low bits */
    for (int64_t i = 0; i < n; i++) order[i] = i;
    auto key = [&](int64_t a) { return rows[a] < 0 ? n_rows : rows[a]; };
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
    for (int64_t i = 0; i < n; i++)
        if (i == 0 || rows[order[i]] != rows[order[i - 1]]) seg.push_back(i);
    int64_t nu = (int64_t)seg.size();
    seg.push_back(n);
    int64_t *d_r = dev(rows), *d_o = dev(std::vector<int64_t>(n, 7)), *d_s = dev(std::vector<int64_t>(n + 1, 7));
    int64_t *d_nu = dev(std::vector<int64_t>(1, 7));
    void *scr = dev(std::vector<char>(dt_k_embed_dedup_scratch(n), 0));
    dt_emu_counters c0, c1;
    dt_emu_get_counters(&c0);
    int st = dt_k_embed_dedup(d_o, d_s, d_nu, d_r, n, n_rows, scr, NULL);
    dt_emu_get_counters(&c1);
    snprintf(name, sizeof name, "embed_dedup_returns_0_%s", tag);
    DT_TEST_CHECK(name, st == 0);
    snprintf(name, sizeof name, "embed_dedup_launcher_allocates_frees_and_waits_for_nothing_%s", tag);
    dt_test_close(name, (double)(c1.allocs - c0.allocs + c1.frees - c0.frees + c1.syncs - c0.syncs), 0, 0);
    {
        std::vector<int64_t> again = host(d_r, n); /* the caller's rows are read, never written */
        snprintf(name, sizeof name, "embed_dedup_leaves_rows_unchanged_%s", tag);
        dt_test_equal_bytes(name, again.data(), rows.data(), n * 8);
    }
    snprintf(name, sizeof name, "embed_dedup_order_is_stable_sort_%s", tag);
    dt_test_equal_bytes(name, host(d_o, n).data(), order.data(), n * 8);
    snprintf(name, sizeof name, "embed_dedup_n_uniq_counts_distinct_rows_%s", tag);
    dt_test_close(name, (double)host(d_nu, 1)[0], (double)nu, 0);
    snprintf(name, sizeof name, "embed_dedup_seg_starts_each_run_%s", tag);
    dt_test_equal_bytes(name, host(d_s, nu + 1).data(), seg.data(), (nu + 1) * 8);
    cudaFree(d_r); cudaFree(d_o); cudaFree(d_s); cudaFree(d_nu); cudaFree(scr);
}

/* kind 1 SGD, 2 Adagrad, 3 row-wise Adagrad over a table of dtype dt; two steps. */
static void check_sparse_update(int kind, int dt) {
    const int64_t R = 40, LD = 9, D = 9, n = ksz(300, 100);
    static const char *kn[] = {"", "sgd", "adagrad", "rowwise_adagrad"};
    const double lr = 0.05, eps = 1e-10;
    std::vector<float> tf = rnd(R * LD, 30, -1, 1), st_h(kind == 3 ? R : R * LD, 0.0f);
    std::vector<uint16_t> t16(R * LD);
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "%s_%s", kn[kind], dt == DT_F32 ? "f32" : "bf16");
    if (dt != DT_F32)
        for (int64_t i = 0; i < R * LD; i++) { t16[i] = dt_f32_to_bf16(tf[i]); tf[i] = dt_bf16_to_f32(t16[i]); }
    void *d_t = dt == DT_F32 ? (void *)dev(tf) : (void *)dev(t16);
    float *d_st = dev(st_h);
    int ok = 1;
    for (int step = 1; step <= 2; step++) {
        std::vector<int64_t> rows(n), order(n);
        std::vector<float> grads = rnd(n * D, 40 + step, -1, 1);
        for (int64_t i = 0; i < n; i++) rows[i] = i % 11 == 5 ? -1 : irnd(5 + step, i, R); /* -1: skipped */
        for (int64_t i = 0; i < n; i++) order[i] = i;
        auto key = [&](int64_t a) { return rows[a] < 0 ? R : rows[a]; };
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key(a) < key(b); });
        for (int64_t i = 0; i < n;) { /* the CPU: each row's g from 0 in order, then dt_embed.h's update */
            int64_t j = i, row = rows[order[i]], c;
            if (row < 0) break; /* the skipped rows, last */
            std::vector<float> g(D, 0.0f), w(D);
            while (j < n && rows[order[j]] == row) {
                for (c = 0; c < D; c++) g[c] += grads[order[j] * D + c];
                j++;
            }
            for (c = 0; c < D; c++) w[c] = tf[row * LD + c];
            if (kind == 1) dt_sgd_update(w.data(), g.data(), NULL, D, lr, 0, 0, 0, 0, 1);
            if (kind == 2) dt_adagrad_update(w.data(), g.data(), &st_h[row * LD], D, lr, 0, 0, eps, step);
            if (kind == 3) {
                double ss = 0;
                float m;
                for (c = 0; c < D; c++) ss += (double)g[c] * (double)g[c];
                st_h[row] = st_h[row] + (float)(ss / (double)D);
                m = (float)(lr / (sqrt((double)st_h[row]) + eps));
                for (c = 0; c < D; c++) w[c] -= m * g[c];
            }
            for (c = 0; c < D; c++) tf[row * LD + c] = dt == DT_F32 ? w[c] : dt_bf16_to_f32(dt_f32_to_bf16(w[c]));
            i = j;
        }
        int64_t *d_r = dev(rows), *d_o = dev(order), *d_s = dev(std::vector<int64_t>(n + 1)), *d_nu = dev(std::vector<int64_t>(1));
        float *d_g = dev(grads);
        void *scr = dev(std::vector<char>(dt_k_embed_dedup_scratch(n), 0));
        ok &= dt_k_embed_dedup(d_o, d_s, d_nu, d_r, n, R, scr, NULL) == 0;
        ok &= dt_k_embed_sparse_update(d_t, dt, d_st, d_g, d_r, d_o, d_s, d_nu, n, D, LD, kind, lr, eps, NULL) == 0;
        cudaFree(d_r); cudaFree(d_o); cudaFree(d_s); cudaFree(d_nu); cudaFree(d_g); cudaFree(scr);
    }
    snprintf(name, sizeof name, "embed_sparse_update_2_steps_return_0_%s", tag);
    DT_TEST_CHECK(name, ok);
    std::vector<float> got(R * LD);
    if (dt == DT_F32) got = host((float *)d_t, R * LD);
    else {
        std::vector<uint16_t> g16 = host((uint16_t *)d_t, R * LD);
        for (int64_t i = 0; i < R * LD; i++) got[i] = dt_bf16_to_f32(g16[i]);
    }
    snprintf(name, sizeof name, "embed_sparse_update_rows_match_cpu_%s", tag);
    dt_test_allclose(name, got.data(), tf.data(), R * LD, 1e-7, dt == DT_F32 ? 1e-6 : 1e-2);
    if (kind != 1) {
        snprintf(name, sizeof name, "embed_sparse_update_state_matches_cpu_%s", tag);
        dt_test_allclose(name, host(d_st, st_h.size()).data(), st_h.data(), st_h.size(), 1e-9, 1e-6);
    }
    cudaFree(d_t); cudaFree(d_st);
}

/* Runs of segments (column slices, in order), with and without accum and div: the CPU's
   dst[c] += src[c] in segment order, so bitwise. Run 2 has no segment (accum keeps out / div). */
static void check_gather_sum(void) {
    const int64_t NR = 4, L = 6, NS = 6;
    const int64_t runs_h[3 * NR] = {0, L, 0, L, L, 3, 2 * L, L, 3, 3 * L, 4, 3};
    const int64_t segs_h[3 * NS] = {0, 0, L, 6, 0, 3, 9, 3, 3, 12, 0, L, 18, 0, L, 24, 0, 4};
    std::vector<int64_t> runs(runs_h, runs_h + 3 * NR), segs(segs_h, segs_h + 3 * NS);
    std::vector<float> src = rnd(40, 70, -1, 1), out0 = rnd(NR * L, 71, -1, 1), div(NR);
    div[0] = 1.0f; div[1] = 3.0f; div[2] = 2.0f; div[3] = 7.0f;
    for (int accum = 0; accum <= 1; accum++)
        for (int with_div = 0; with_div <= 1; with_div++) {
            std::vector<float> want = out0;
            char name[160];
            for (int64_t r = 0; r < NR; r++) {
                int64_t s1 = r + 1 < NR ? runs[3 * (r + 1) + 2] : NS;
                for (int64_t c = 0; c < runs[3 * r + 1]; c++) {
                    float acc = accum ? out0[runs[3 * r] + c] : 0.0f;
                    for (int64_t s = runs[3 * r + 2]; s < s1; s++)
                        if (c >= segs[3 * s + 1] && c < segs[3 * s + 1] + segs[3 * s + 2])
                            acc += src[segs[3 * s] + c - segs[3 * s + 1]];
                    if (with_div) acc /= div[r];
                    want[runs[3 * r] + c] = acc;
                }
            }
            float *d_o = dev(out0), *d_s = dev(src), *d_div = dev(div);
            int64_t *d_r = dev(runs), *d_g = dev(segs);
            int st = dt_k_embed_gather_sum(d_o, d_s, d_r, d_g, with_div ? d_div : NULL, NR, NS, L, accum, NULL);
            snprintf(name, sizeof name, "embed_gather_sum_equals_cpu_segment_order_bitwise%s%s", accum ? "_accum" : "",
                     with_div ? "_div" : "");
            if (DT_TEST_CHECK(name, st == 0)) dt_test_equal_bytes(name, host(d_o, NR * L).data(), want.data(), NR * L * 4);
            cudaFree(d_o); cudaFree(d_s); cudaFree(d_div); cudaFree(d_r); cudaFree(d_g);
        }
    DT_TEST_CHECK("embed_gather_sum_accum_2_is_invalid_value",
                  dt_k_embed_gather_sum(NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 2, NULL) == (int)cudaErrorInvalidValue);
}

/* ---------------------------------------------------------------- dot interaction */

/* got[i] within bound[i] (>= 0) of want[i], for i < got.size(): the FAIL line names the first element out, both values and
   its bound; a NaN fails. */
static void within(const char *name, const std::vector<float> &got, const std::vector<float> &want,
                   const std::vector<double> &bound) {
    size_t i, bad = 0, first = 0;
    for (i = 0; i < got.size(); i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= bound[i]) && bad++ == 0) first = i;
    if (!bad) { dt_test_pass(name); return; }
    dt_test_fail(name, "%zu of %zu outside; first at [%zu]: got %.9g, want %.9g, |diff| %.3g > bound %.3g", bad,
                 got.size(), first, (double)got[first], (double)want[first],
                 fabs((double)got[first] - (double)want[first]), bound[first]);
}

/* The launchers against the CPU op. cuBLAS (OpenBLAS here) sums each dot product in its own
   order, so not bitwise: a sum of n products computed in any order is within n u sum |terms|
   of the exact one (u = 2^-24; Higham's gamma_n, n u << 1), so the two results are within
   2 n u sum |terms| of each other, the bound each element gets (n = D + 1 for a pair, F + 3
   for a gradient: its F + 1 products, the value it accumulates into and the pass-through). The
   pass-through columns of out are copies: bound 0. */
static void check_dot(dt_ctx *ctx, void *blas, int64_t B, int64_t F, int64_t D, int with_ddense) {
    const double u = 1.0 / 16777216.0;
    int64_t W = D + (F + 1) * F / 2;
    char tag[64], name[160];
    /* one float past the end of each: an empty tensor (F = 0, D = 0) still has data */
    std::vector<float> dense = rnd(B * D + 1, 60, -1, 1), emb = rnd(B * F * D + 1, 61, -1, 1), out(B * W),
                       dout = rnd(B * W, 62, -1, 1);
    std::vector<float> dd = rnd(B * D + 1, 63, -1, 1), de = rnd(B * F * D + 1, 64, -1, 1), dd0 = dd, de0 = de;
    std::vector<double> bo(B * W, 0.0), bdd(B * D + 1), bde(B * F * D + 1);
    dt_tensor tdn = wrap(dense.data(), DT_F32, 2, B, D, 0, B * D), tem = wrap(emb.data(), DT_F32, 3, B, F, D, B * F * D);
    dt_tensor to = wrap(out.data(), DT_F32, 2, B, W, 0, B * W), tg = wrap(dout.data(), DT_F32, 2, B, W, 0, B * W);
    dt_tensor tdd = wrap(dd.data(), DT_F32, 2, B, D, 0, B * D), tde = wrap(de.data(), DT_F32, 3, B, F, D, B * F * D);
    float *d_dn = dev(dense), *d_em = dev(emb), *d_o = dev(std::vector<float>(B * W, 7.0f)), *d_g = dev(dout);
    float *d_dd = dev(dd0), *d_de = dev(de0);
    void *scr = NULL;
    size_t bytes = dt_k_dot_interaction_scratch(B, F, D, 1);
    int st;
    snprintf(tag, sizeof tag, "B%lld_F%lld_D%lld%s", (long long)B, (long long)F, (long long)D, with_ddense ? "" : "_no_ddense");
    cudaMalloc(&scr, bytes + 1);
    for (int64_t b = 0; b < B; b++) { /* the bounds from the sums' terms */
        const float *x0 = dense.data() + b * D, *xe = emb.data() + b * F * D, *g = dout.data() + b * W;
        auto vec = [&](int64_t k) { return k ? xe + (k - 1) * D : x0; };
        for (int64_t i = 1, p = 0; i <= F; i++)
            for (int64_t j = 0; j < i; j++, p++) {
                double s = 0.0;
                for (int64_t d = 0; d < D; d++) s += fabs((double)vec(i)[d] * vec(j)[d]);
                bo[b * W + D + p] = 2.0 * (double)(D + 1) * u * s;
            }
        for (int64_t k = 0; k <= F; k++)
            for (int64_t d = 0; d < D; d++) {
                double s = k ? fabs(de0[(b * F + k - 1) * D + d]) : fabs(dd0[b * D + d]) + fabs(g[d]);
                for (int64_t m = 0; m <= F; m++)
                    if (m != k) s += fabs((double)g[D + (k > m ? k * (k - 1) / 2 + m : m * (m - 1) / 2 + k)] * vec(m)[d]);
                (k ? bde[(b * F + k - 1) * D + d] : bdd[b * D + d]) = 2.0 * (double)(F + 3) * u * s;
            }
    }
    if (!with_ddense) std::fill(bdd.begin(), bdd.end(), 0.0); /* untouched */
    st = dt_dot_interaction_fwd(ctx, &to, &tdn, &tem);
    if (!st) st = dt_dot_interaction_bwd(ctx, with_ddense ? &tdd : NULL, &tde, &tg, &tdn, &tem);
    snprintf(name, sizeof name, "dot_interaction_cpu_reference_runs_%s", tag);
    if (st) dt_test_fail(name, "%s", dt_ctx_error(ctx));
    st = dt_k_dot_interaction_fwd(blas, d_o, d_dn, d_em, B, F, D, scr, NULL);
    snprintf(name, sizeof name, "dot_interaction_fwd_within_2nu_of_cpu_%s", tag);
    if (DT_TEST_CHECK(name, st == 0)) within(name, host(d_o, B * W), out, bo);
    st = dt_k_dot_interaction_bwd(blas, with_ddense ? d_dd : NULL, d_de, d_g, d_dn, d_em, B, F, D, scr, NULL);
    snprintf(name, sizeof name, "dot_interaction_bwd_demb_accumulates_within_2nu_of_cpu_%s", tag);
    if (DT_TEST_CHECK(name, st == 0)) within(name, host(d_de, B * F * D), de, bde);
    snprintf(name, sizeof name, "dot_interaction_bwd_ddense_%s_%s", with_ddense ? "accumulates_within_2nu_of_cpu" : "NULL_is_skipped", tag);
    within(name, host(d_dd, B * D), dd, bdd);
    cudaFree(d_dn); cudaFree(d_em); cudaFree(d_o); cudaFree(d_g); cudaFree(d_dd); cudaFree(d_de); cudaFree(scr);
}

/* The launchers called directly with a NULL array their host sizes say holds data (each faulted
   inside a kernel: a SEGV on the emulator), or sizes whose products pass int64: refused before
   anything launches. Arrays sized on the device (the rows offsets[n_bags] counts, a segment's
   source) are not the launcher's to judge. */
static void check_refusals(cublasHandle_t blas) {
    float *d = NULL, *o = NULL;
    cudaMalloc((void **)&d, 4096);
    cudaMalloc((void **)&o, 4096);
    cudaMemset(d, 0, 4096);
    const int64_t *i = (const int64_t *)d;
    int64_t *w = (int64_t *)o;
    k_refused("embedding_fwd_NULL_out_is_invalid_value", dt_k_embedding_fwd(NULL, d, d, 0, 4, 4, 4, NULL, NULL));
    k_refused("embedding_fwd_NULL_ids_is_invalid_value", dt_k_embedding_fwd(o, d, NULL, 0, 4, 4, 4, NULL, NULL));
    k_refused("embedding_fwd_NULL_table_is_invalid_value", dt_k_embedding_fwd(o, NULL, d, 0, 4, 4, 4, NULL, NULL));
    k_refused("embedding_bwd_NULL_dout_is_invalid_value", dt_k_embedding_bwd(o, NULL, d, 0, 4, 4, 4, NULL, NULL));
    k_refused("embedding_bwd_NULL_ids_is_invalid_value", dt_k_embedding_bwd(o, d, NULL, 0, 4, 4, 4, NULL, NULL));
    k_refused("embed_pool_fwd_NULL_offsets_is_invalid_value", dt_k_embed_pool_fwd(o, d, DT_F32, i, NULL, NULL, 2, 4, 4, 0, NULL));
    k_refused("embed_pool_fwd_NULL_out_is_invalid_value", dt_k_embed_pool_fwd(NULL, d, DT_F32, i, NULL, i, 2, 4, 4, 0, NULL));
    k_refused("embed_pool_bwd_NULL_dout_is_invalid_value", dt_k_embed_pool_bwd(o, NULL, NULL, NULL, i, 2, 4, 0, NULL));
    k_refused("embed_pool_bwd_n_bags_D_past_int64_is_invalid_value",
              dt_k_embed_pool_bwd(o, d, NULL, NULL, i, (int64_t)1 << 40, (int64_t)1 << 30, 0, NULL));
    k_refused("embed_pool_bwd_dense_NULL_offsets_is_invalid_value", dt_k_embed_pool_bwd_dense(o, d, i, NULL, NULL, 2, 4, 0, NULL));
    k_refused("embed_gather_sum_NULL_runs_is_invalid_value", dt_k_embed_gather_sum(o, d, NULL, i, NULL, 2, 2, 4, 0, NULL));
    k_refused("embed_gather_sum_NULL_segs_is_invalid_value", dt_k_embed_gather_sum(o, d, i, NULL, NULL, 2, 2, 4, 0, NULL));
    k_refused("embed_gather_sum_3_n_runs_past_int64_is_invalid_value",
              dt_k_embed_gather_sum(o, d, i, i, NULL, INT64_MAX / 2, 2, 4, 0, NULL));
    k_refused("embed_bucketize_NULL_ids_is_invalid_value", dt_k_embed_bucketize(w, w + 8, NULL, 4, 8, 2, NULL, o + 512, NULL));
    k_refused("embed_bucketize_NULL_dest_is_invalid_value", dt_k_embed_bucketize(w, NULL, i, 4, 8, 2, NULL, o + 512, NULL));
    k_refused("embed_dedup_NULL_rows_is_invalid_value", dt_k_embed_dedup(w, w + 8, w + 16, NULL, 4, 8, o + 512, NULL));
    k_refused("embed_sparse_update_NULL_n_uniq_is_invalid_value",
              dt_k_embed_sparse_update(o, DT_F32, NULL, d, i, i, i, NULL, 2, 4, 4, 1, 0.1, 1e-10, NULL));
    k_refused("embed_sparse_update_NULL_grads_is_invalid_value",
              dt_k_embed_sparse_update(o, DT_F32, NULL, NULL, i, i, i, i, 2, 4, 4, 1, 0.1, 1e-10, NULL));
    k_refused("embed_sparse_adam_NULL_table_is_invalid_value",
              dt_k_embed_sparse_adam(NULL, DT_F32, o, o, d, i, i, i, i, 2, 4, 4, 0.1, 0.9, 0.999, 1e-8, 1, NULL));
    k_refused("embed_requests_3_F_B_past_int64_is_invalid_value",
              dt_k_embed_requests(w, w, NULL, w, w, w, w, o, i, d, 1, NULL, i, 2, INT64_MAX / 4, 1, 0, 1, NULL));
    k_refused("embed_serve_layout_4_n_requests_past_int64_is_invalid_value",
              dt_k_embed_serve_layout(w, o, w, i, i, NULL, i, INT64_MAX / 2, 1, NULL));
    k_refused("dot_interaction_fwd_NULL_emb_is_invalid_value", dt_k_dot_interaction_fwd(blas, o, d, NULL, 1, 2, 4, o + 256, NULL));
    k_refused("dot_interaction_fwd_NULL_out_is_invalid_value", dt_k_dot_interaction_fwd(blas, NULL, d, d, 1, 2, 4, o + 256, NULL));
    k_refused("dot_interaction_bwd_NULL_dout_is_invalid_value",
              dt_k_dot_interaction_bwd(blas, o, o + 16, NULL, d, d, 1, 2, 4, o + 256, NULL));
    /* what the launch does not read may stay NULL */
    DT_TEST_CHECK("embedding_bwd_NULL_dtable_is_ok", dt_k_embedding_bwd(NULL, NULL, NULL, 0, 4, 4, 4, NULL, NULL) == 0);
    DT_TEST_CHECK("embed_gather_sum_max_len_0_with_NULL_is_ok",
                  dt_k_embed_gather_sum(NULL, NULL, NULL, NULL, NULL, 2, 2, 0, 0, NULL) == 0);
    DT_TEST_CHECK("dot_interaction_bwd_no_gradient_with_NULL_is_ok",
                  dt_k_dot_interaction_bwd(blas, NULL, NULL, NULL, NULL, NULL, 1, 2, 4, o + 256, NULL) == 0);
    cudaFree(d);
    cudaFree(o);
}

int main(void) {
    dt_ctx ctx;
    dt_ctx_init(&ctx, NULL);
    check_dense(&ctx);
    check_pool(DT_F32, 1, 1);
    if (ksz(1, 0)) {
        check_pool(DT_F32, 0, 0);
        check_pool(DT_F32, 1, 0);
        check_pool(DT_F32, 0, 1);
        check_pool(DT_BF16, 1, 0);
        check_pool(DT_F16, 0, 1);
    }
    check_bucketize();
    /* the scratch of what the launchers refuse: 0, not an overflowed size */
    DT_TEST_CHECK("bucketize_scratch_past_int_is_0", dt_k_embed_bucketize_scratch(INT64_MAX, 4) == 0 &&
                                                        dt_k_embed_bucketize_scratch(-1, 4) == 0 &&
                                                        dt_k_embed_bucketize_scratch(100, 0) == 0 &&
                                                        dt_k_embed_bucketize_scratch(100, 4) > 0);
    DT_TEST_CHECK("dedup_scratch_past_int_is_0", dt_k_embed_dedup_scratch(INT64_MAX) == 0 &&
                                                    dt_k_embed_dedup_scratch((int64_t)1 << 40) == 0 &&
                                                    dt_k_embed_dedup_scratch(0) > 0);
    check_dedup("3_byte_rows_several_blocks", ksz(600, 300), 70000, 120); /* three radix passes (odd) */
    check_dedup("2_byte_rows", ksz(300, 100), 1000, 40);                 /* two passes (even) */
    check_dedup("one_row", 50, 1, 1);                     /* one pass: the identity order */
    check_dedup("skipped_rows_sort_last", ksz(300, 100), 256, 60, 1); /* -1 is not row 255 */
    check_gather_sum();
    check_sparse_update(3, DT_F32); /* the one with a barrier (the row's sum of squares) */
    if (ksz(1, 0)) { /* DT_K_SMALL (TSan): the barrier-free kinds once is enough */
        check_sparse_update(1, DT_F32);
        check_sparse_update(2, DT_F32);
        check_sparse_update(2, DT_BF16);
    }
    {
        cublasHandle_t blas = NULL;
        cublasCreate(&blas);
        check_dot(&ctx, blas, 3, 4, 5, 1);
        check_dot(&ctx, blas, 2, 3, 40, 0);  /* ddense NULL */
        check_dot(&ctx, blas, 1, 1, 7, 1);   /* one sample, one pair, odd D */
        check_dot(&ctx, blas, 4, 0, 6, 1);   /* no pairs: out is dense, ddense += dout */
        check_dot(&ctx, blas, 3, 2, 0, 1);   /* D = 0: every pair is 0 */
        check_dot(&ctx, blas, 2, 5, 3, 1);   /* D not a multiple of 4 */
        if (ksz(1, 0)) {
            check_dot(&ctx, blas, 5, 26, 16, 1); /* DLRM's F; more elements than a block's threads */
            check_dot(&ctx, blas, 2, 100, 200, 0); /* past the 48 KiB of shared memory the old kernels needed */
        }
        {
            float *d = NULL;
            cudaMalloc((void **)&d, 64);
            DT_TEST_CHECK("dot_interaction_fwd_without_cublas_is_invalid_value",
                          dt_k_dot_interaction_fwd(NULL, d, d, d, 1, 1, 1, d, NULL) == (int)cudaErrorInvalidValue);
            DT_TEST_CHECK("dot_interaction_bwd_F_past_int_is_invalid_value",
                          dt_k_dot_interaction_bwd(blas, d, d, d, d, d, 1, 2147483647LL, 1, d, NULL) ==
                              (int)cudaErrorInvalidValue);
            DT_TEST_CHECK("dot_interaction_scratch_negative_B_is_0", dt_k_dot_interaction_scratch(-1, 1, 1, 0) == 0);
            cudaFree(d);
        }
        check_refusals(blas);
        cublasDestroy(blas);
    }
    {
        float *d = NULL;
        cudaMalloc((void **)&d, 64);
        DT_TEST_CHECK("embed_pool_fwd_D_over_ld_is_invalid_value",
                      dt_k_embed_pool_fwd(d, d, DT_F32, (const int64_t *)d, NULL, (const int64_t *)d, 1, 8, 4, 0, NULL) ==
                          (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("embed_sparse_update_kind_4_is_invalid_value",
                      dt_k_embed_sparse_update(d, DT_F32, d, d, (const int64_t *)d, (const int64_t *)d, (const int64_t *)d,
                                               (const int64_t *)d, 1, 1, 1, 4, 0.1, 1e-10, NULL) == (int)cudaErrorInvalidValue);
        DT_TEST_CHECK("embed_dedup_negative_n_is_invalid_value",
                      dt_k_embed_dedup((int64_t *)d, (int64_t *)d, (int64_t *)d, (const int64_t *)d, -1, 4, d, NULL) ==
                          (int)cudaErrorInvalidValue);
        cudaFree(d);
    }
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
