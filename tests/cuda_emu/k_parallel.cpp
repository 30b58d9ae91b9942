// tests/cuda_emu/k_parallel.cpp - dt_parallel.h built with DT_CUDA on the emulator: the vocab-parallel
// embedding and cross entropy (kernels/dt_parallel.cu) on CUDA tensors against the same calls on
// CPU tensors (a tp world of 1: the math per rank), their launchers at another rank's vocab
// range against host loops of the CPU function's formulas (the cross entropy's at two ranks, the
// all-reduces done on the host), within bounds derived from the sums' lengths, bitwise run to run;
// a step without a loss read that allocates, copies down and waits for nothing (dt's counters and
// the emulator's); dt_concat / dt_split on CUDA tensors, the arena on CUDA parameters, and bad
// inputs named (ids and targets out of range, found on the device; mixed devices).
#include <cuda_runtime.h>
#include <math.h>
#include <vector>
#define DT_CUDA
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_parallel.h"
#include "dt_kernels.h" /* the launchers it calls directly (the implementation includes it too) */
#include "tests/dt_test.h"
#include "k_common.h" /* k_refused */

static dt_ctx ctx;

/* A CPU tensor with random values (ids / targets: integers in [0, vmax)) and its CUDA copy. */
struct pair_t { dt_tensor h, d; };
static pair_t make(dt_dtype dt, int ndim, int64_t a, int64_t b = 0, uint64_t seed = 1, int64_t vmax = 0) {
    pair_t p;
    dt_tensor_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.dtype = dt; desc.ndim = ndim;
    desc.shape[0] = a; desc.shape[1] = b;
    desc.device = DT_CPU;
    dt_tensor_create(&ctx, &p.h, &desc);
    desc.device = DT_CUDA_DEVICE;
    dt_tensor_create(&ctx, &p.d, &desc);
    for (int64_t i = 0; i < p.h.numel; i++) {
        float u = dt_rng_uniform(31, seed, (uint64_t)i);
        if (dt == DT_F32) ((float *)p.h.data)[i] = 4.0f * u - 2.0f;
        if (dt == DT_I32) ((int32_t *)p.h.data)[i] = (int32_t)(u * (float)vmax) % (int32_t)vmax;
        if (dt == DT_I64) ((int64_t *)p.h.data)[i] = (int64_t)(u * (float)vmax) % vmax;
    }
    dt_tensor_copy(&ctx, &p.d, &p.h);
    return p;
}
static void release(pair_t &p) { dt_tensor_free(&ctx, &p.h); dt_tensor_free(&ctx, &p.d); }
/* The runtime's own counts of allocations, frees, copies and waits: the emulator keeps them; a
   build against the real CUDA runtime (./build.sh gpu) compares dt's counts with zeros. */
#ifdef DT_CUDA_EMU
typedef dt_emu_counters rt_counters;
static void rt_counts(rt_counters *c) { dt_emu_get_counters(c); }
#else
struct rt_counters { long long syncs, allocs, frees, h2d_bytes, h2d_calls, d2h_bytes, d2h_calls; };
static void rt_counts(rt_counters *c) { memset(c, 0, sizeof *c); }
#endif
static std::vector<float> k_down(const float *d, int64_t n) {
    std::vector<float> v((size_t)n);
    if (n) cudaMemcpy(v.data(), d, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}
static std::vector<float> down(const dt_tensor &d) {
    std::vector<float> v((size_t)d.numel);
    if (d.numel) cudaMemcpy(v.data(), d.data, (size_t)d.numel * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
}
/* PASS iff the CUDA tensor's values equal the CPU tensor's within rtol (0: bit for bit). */
static void same(const char *name, pair_t &p, double rtol) {
    std::vector<float> got = down(p.d);
    if (rtol == 0) dt_test_equal_bytes(name, got.data(), p.h.data, dt_tensor_bytes(&p.h));
    else dt_test_allclose(name, got.data(), (const float *)p.h.data, (size_t)p.h.numel, rtol * 0.1, rtol);
}
static int ok2(const char *name, dt_status a, dt_status b) {
    if (a == DT_OK && b == DT_OK) return 1;
    return dt_test_fail(name, "cpu status %d, cuda status %d: %s", (int)a, (int)b, dt_ctx_error(&ctx));
}

/* ids with long runs of one value (rows that many positions add into), in [0, V). */
static void repeat_ids(pair_t &ids, int64_t V) {
    int32_t *id = (int32_t *)ids.h.data;
    for (int64_t n = 0; n < ids.h.numel; n++)
        if (n % 3 == 0) id[n] = 7;
        else if (n % 5 == 0) id[n] = (int32_t)(V - 1);
    dt_tensor_copy(&ctx, &ids.d, &ids.h);
}

static void embedding(dt_layout *l) {
    const int64_t N = 24, V = 40, C = 12;
    pair_t table = make(DT_F32, 2, V, C, 1), ids = make(DT_I32, 1, N, 0, 2, V), out = make(DT_F32, 2, N, C, 3);
    pair_t dout = make(DT_F32, 2, N, C, 4), dtable = make(DT_F32, 2, V, C, 5);
    repeat_ids(ids, V); /* id 7 at 8 positions, V - 1 at 3: runs the backward must add in order */
    if (ok2("tp_embedding_fwd_cuda_runs", dt_tp_embedding_fwd(l, &out.h, NULL, &table.h, &ids.h, 0, V, 0),
            dt_tp_embedding_fwd(l, &out.d, NULL, &table.d, &ids.d, 0, V, 0)))
        same("tp_embedding_fwd_cuda_equals_cpu_bitwise", out, 0);
    /* the backward adds each row's dout rows in position order, as the CPU loop: bit for bit */
    if (ok2("tp_embedding_bwd_cuda_runs", dt_tp_embedding_bwd(l, &dtable.h, NULL, &dout.h, &ids.h, 0, V, 0),
            dt_tp_embedding_bwd(l, &dtable.d, NULL, &dout.d, &ids.d, 0, V, 0)))
        same("tp_embedding_bwd_cuda_accumulates_as_cpu_bitwise", dtable, 0);
    {   /* run to run: the same bits (a second backward from the same start) */
        std::vector<float> first = down(dtable.d);
        pair_t again = make(DT_F32, 2, V, C, 5);
        dt_tp_embedding_bwd(l, &again.d, NULL, &dout.d, &ids.d, 0, V, 0);
        std::vector<float> a = down(again.d);
        pair_t once = make(DT_F32, 2, V, C, 5);
        dt_tp_embedding_bwd(l, &once.d, NULL, &dout.d, &ids.d, 0, V, 0);
        std::vector<float> b = down(once.d);
        dt_test_equal_bytes("tp_embedding_bwd_cuda_deterministic_bitwise", a.data(), b.data(), a.size() * sizeof(float));
        release(again); release(once);
    }
    /* the launchers at rank 0 and 1 of 2 (vocab rows [0, 20), [20, 40)): other rows give zeros and
       add nothing; i64 ids at rank 1 */
    for (int rank = 0; rank < 2; rank++) {
        const int64_t Vl = V / 2, vs = rank * Vl;
        char nm[96];
        std::vector<float> t = down(table.d), o, g, want((size_t)(N * C)), gw((size_t)(Vl * C));
        const int32_t *id = (const int32_t *)ids.h.data;
        const float *d = (const float *)dout.h.data;
        std::vector<int64_t> id64(id, id + N);
        void *ids_arg = ids.d.data, *keys = NULL;
        int64_t *d64 = NULL;
        if (rank == 1) {
            cudaMalloc((void **)&d64, sizeof(int64_t) * N);
            cudaMemcpy(d64, id64.data(), sizeof(int64_t) * N, cudaMemcpyHostToDevice);
            ids_arg = d64;
        }
        for (int64_t n = 0; n < N; n++)
            for (int64_t c = 0; c < C; c++) {
                int64_t r = id[n] - vs;
                want[(size_t)(n * C + c)] = r >= 0 && r < Vl ? t[(size_t)((vs + r) * C + c)] : 0.0f;
                if (r >= 0 && r < Vl) gw[(size_t)(r * C + c)] += d[n * C + c];
            }
        float *shard = (float *)table.d.data + vs * C; /* this rank's rows of the table */
        int e = dt_k_tp_embedding_fwd((float *)out.d.data, shard, ids_arg, rank, N, Vl, C, vs, NULL);
        o = down(out.d);
        snprintf(nm, sizeof nm, "tp_embedding_fwd_rank%d_masks_other_ranks_rows", rank);
        if (DT_TEST_CHECK("tp_embedding_fwd_launcher_runs", e == 0))
            dt_test_allclose(nm, o.data(), want.data(), want.size(), 0, 0);
        dt_tensor_fill(&ctx, &dtable.d, 0.0);
        cudaMalloc(&keys, dt_k_tp_embedding_bwd_scratch(N));
        e = dt_k_tp_embedding_bwd((float *)dtable.d.data, (const float *)dout.d.data, ids_arg, rank, N, Vl, C, vs,
                                  keys, NULL);
        g = down(dtable.d);
        snprintf(nm, sizeof nm, "tp_embedding_bwd_rank%d_adds_only_its_rows_bitwise", rank);
        if (DT_TEST_CHECK("tp_embedding_bwd_launcher_runs", e == 0))
            dt_test_allclose(nm, g.data(), gw.data(), gw.size(), 0, 0);
        cudaFree(keys);
        cudaFree(d64);
    }
    DT_TEST_CHECK("tp_embedding_bwd_launcher_without_scratch_is_invalid",
                  dt_k_tp_embedding_bwd((float *)dtable.d.data, (const float *)dout.d.data, ids.d.data, 0, N, V, C, 0,
                                        NULL, NULL) == (int)cudaErrorInvalidValue);
    /* bad inputs: an id out of the vocab is found on the device, named at the next sync */
    ((int32_t *)ids.h.data)[3] = (int32_t)V;
    dt_tensor_copy(&ctx, &ids.d, &ids.h);
    DT_TEST_CHECK("tp_embedding_fwd_cuda_id_out_of_vocab_does_not_wait",
                  dt_tp_embedding_fwd(l, &out.d, NULL, &table.d, &ids.d, 0, V, 0) == DT_OK);
    dt_test_error("tp_embedding_fwd_cuda_id_out_of_vocab_is_named_at_sync", dt_ctx_sync(&ctx), dt_ctx_error(&ctx),
                  "dt_tp_embedding_fwd: ids[3] = 40 is outside [0, 40)");
    DT_TEST_CHECK("tp_embedding_fwd_cuda_id_out_of_vocab_is_range", ctx.last_status == DT_ERR_RANGE);
    DT_TEST_CHECK("tp_embedding_cuda_id_error_is_reported_once", dt_ctx_sync(&ctx) == DT_OK);
    ((int32_t *)ids.h.data)[3] = -2;
    dt_tensor_copy(&ctx, &ids.d, &ids.h);
    dt_tp_embedding_bwd(l, &dtable.d, NULL, &dout.d, &ids.d, 0, V, 0);
    dt_test_error("tp_embedding_bwd_cuda_negative_id_is_named_at_sync", dt_ctx_sync(&ctx), dt_ctx_error(&ctx),
                  "dt_tp_embedding_bwd: ids[3] = -2");
    ((int32_t *)ids.h.data)[3] = 0;
    dt_tensor_copy(&ctx, &ids.d, &ids.h);
    dt_test_error("tp_embedding_fwd_mixed_devices_is_named",
                  dt_tp_embedding_fwd(l, &out.d, NULL, &table.h, &ids.d, 0, V, 0), dt_ctx_error(&ctx), "cuda");
    DT_TEST_CHECK("tp_embedding_fwd_mixed_devices_is_device_error", ctx.last_status == DT_ERR_DEVICE);
    release(table); release(ids); release(out); release(dout); release(dtable);
}

/* The error bound of the device's per-row sum of exp (float) against the CPU's (double): every
   term is the CPU's (the same expf of the same difference), each <= 1, and the sum runs through
   at most ceil(nv / T) sequential adds per thread and 10 levels of the block's tree (5 in the
   warp, 5 across warps), T = the kernel's threads (nv / 8 rounded up to whole warps, 32..512).
   So |s - s_cpu| <= k u s with k = ceil(nv / T) + 10, u = 2^-24, and log s, the row's loss and
   their mean are off by at most 1.01 k u (plus one rounding of the float result: u |value|). */
static double xent_k(int64_t nv) {
    int64_t T = ((nv + 7) / 8 + 31) / 32 * 32;
    T = T < 32 ? 32 : T > 512 ? 512 : T;
    return (double)((nv + T - 1) / T + 10);
}
static const double U24 = 1.0 / 16777216.0;

/* tp 2 inside one process: the launchers at ranks 0 and 1 of the same [N, Vp] logits, with the
   two all-reduces done on the host in rank order (what dt_comm's staged path does), against the
   1-rank loss and stats from the CPU. */
static void xent_two_ranks(pair_t &logits, pair_t &tg, int64_t N, int64_t Vp, int64_t V, float want_loss,
                           const float *want_stats) {
    const int64_t Vl = Vp / 2;
    std::vector<float> z = down(logits.d), mloc[2], mglob[2], sz[2], sum((size_t)(2 * N)), mx((size_t)N);
    float *dz = NULL, *dm = NULL, *dg = NULL, *ds = NULL, *dstats = NULL;
    double *slot = NULL, got[2];
    int e = 0;
    cudaMalloc((void **)&dz, sizeof(float) * N * Vl);
    cudaMalloc((void **)&dm, sizeof(float) * N);
    cudaMalloc((void **)&dg, sizeof(float) * N);
    cudaMalloc((void **)&ds, sizeof(float) * 2 * N);
    cudaMalloc((void **)&dstats, sizeof(float) * 2 * N);
    cudaMalloc((void **)&slot, sizeof(double) * 2);
    for (int rank = 0; rank < 2; rank++) {
        std::vector<float> zl((size_t)(N * Vl));
        for (int64_t r = 0; r < N; r++)
            for (int64_t c = 0; c < Vl; c++) zl[(size_t)(r * Vl + c)] = z[(size_t)(r * Vp + rank * Vl + c)];
        cudaMemcpy(dz, zl.data(), sizeof(float) * N * Vl, cudaMemcpyHostToDevice);
        int64_t nv = V - rank * Vl;
        nv = nv > Vl ? Vl : nv;
#ifndef DT_EMU_STUBS
        long long vec0 = dt_emu_vector_accesses();
        int rep0 = dt_emu_report_count();
#endif
        e |= dt_k_tp_xent_fwd(dm, dg, ds, dz, (const int32_t *)tg.d.data, -1, N, Vl, nv, rank * Vl, NULL);
#ifndef DT_EMU_STUBS
        /* rows of a multiple of 4 floats from an aligned buffer: the real columns by 16-byte loads */
        DT_TEST_CHECK(rank ? "tp_xent_rows_load_by_16_bytes_rank1" : "tp_xent_rows_load_by_16_bytes_rank0",
                      Vl % 4 != 0 || (dt_emu_vector_accesses() > vec0 && dt_emu_report_count() == rep0));
#endif
        mloc[rank] = k_down(dm, N); mglob[rank] = k_down(dg, N); sz[rank] = k_down(ds, 2 * N);
    }
    for (int64_t r = 0; r < N; r++) mx[(size_t)r] = fmaxf(mglob[0][(size_t)r], mglob[1][(size_t)r]);
    for (int rank = 0; rank < 2; rank++) {
        cudaMemcpy(dm, mloc[rank].data(), sizeof(float) * N, cudaMemcpyHostToDevice);
        cudaMemcpy(dg, mx.data(), sizeof(float) * N, cudaMemcpyHostToDevice);
        cudaMemcpy(ds, sz[rank].data(), sizeof(float) * 2 * N, cudaMemcpyHostToDevice);
        e |= dt_k_tp_xent_rescale(ds, dm, dg, N, NULL);
        sz[rank] = k_down(ds, 2 * N);
    }
    for (int64_t i = 0; i < 2 * N; i++) sum[(size_t)i] = sz[0][(size_t)i] + sz[1][(size_t)i];
    cudaMemcpy(ds, sum.data(), sizeof(float) * 2 * N, cudaMemcpyHostToDevice);
    e |= dt_k_tp_xent_loss(slot, dstats, dg, ds, (const int32_t *)tg.d.data, -1, N, NULL);
    cudaMemcpy(got, slot, sizeof got, cudaMemcpyDeviceToHost);
    std::vector<float> st = k_down(dstats, 2 * N);
    /* each rank's sum has the bound of its nv columns, the rescale one exp and one product (2u)
       and the sum of the two one more add: k of the wider rank + 3 */
    double k = xent_k(Vl) + 3;
    if (DT_TEST_CHECK("tp_xent_launchers_two_ranks_run", e == 0)) {
        dt_test_close("tp_xent_two_ranks_loss_equals_one_rank_cpu", got[0], want_loss,
                      1.01 * k * U24 + 2 * U24 * fabs((double)want_loss));
        DT_TEST_CHECK("tp_xent_two_ranks_count_the_rows_not_ignored", got[1] == (double)(N - 2));
        dt_test_allclose("tp_xent_two_ranks_stats_equal_one_rank_cpu", st.data(), want_stats, (size_t)(2 * N),
                         1.01 * k * U24, 2 * U24);
    }
    cudaFree(dz); cudaFree(dm); cudaFree(dg); cudaFree(ds); cudaFree(dstats); cudaFree(slot);
}

static void xent(dt_layout *l) {
    const int64_t N = 20, Vp = 48, V = 45; /* 3 padding columns, never a target */
    pair_t logits = make(DT_F32, 2, N, Vp, 11), tg = make(DT_I32, 1, N, 0, 12, V), stats = make(DT_F32, 2, N, 2, 13);
    pair_t dl = make(DT_F32, 2, N, Vp, 14);
    float lc = 0, lg = 0;
    int64_t nc = 0, ng = 0;
    const double k = xent_k(V);
    ((int32_t *)tg.h.data)[4] = -1; /* ignored rows */
    ((int32_t *)tg.h.data)[17] = -1;
    dt_tensor_copy(&ctx, &tg.d, &tg.h);
    if (ok2("tp_xent_fwd_cuda_runs", dt_tp_xent_fwd(l, &lc, &nc, &stats.h, &logits.h, &tg.h, 0, V, -1),
            dt_tp_xent_fwd(l, &lg, &ng, &stats.d, &logits.d, &tg.d, 0, V, -1))) {
        dt_test_close("tp_xent_fwd_cuda_loss_equals_cpu", lg, lc, 1.01 * k * U24 + 2 * U24 * fabs((double)lc));
        DT_TEST_CHECK("tp_xent_fwd_cuda_counts_the_rows_not_ignored", ng == nc && nc == N - 2);
    }
    {   /* the max is exact; the log-sum-exp within the sum's bound */
        std::vector<float> st = down(stats.d);
        dt_test_allclose("tp_xent_fwd_cuda_stats_within_bound", st.data(), (const float *)stats.h.data,
                         (size_t)(2 * N), 1.01 * k * U24, 2 * U24);
    }
    {   /* run to run, the same bits: loss and stats */
        float l2 = 0;
        std::vector<float> s1 = down(stats.d);
        dt_tp_xent_fwd(l, &l2, NULL, &stats.d, &logits.d, &tg.d, 0, V, -1);
        std::vector<float> s2 = down(stats.d);
        DT_TEST_CHECK("tp_xent_fwd_cuda_loss_deterministic_bitwise", memcmp(&l2, &lg, sizeof l2) == 0);
        dt_test_equal_bytes("tp_xent_fwd_cuda_stats_deterministic_bitwise", s2.data(), s1.data(), s1.size() * 4);
    }
    {   /* loss may be NULL on the host too (the stats are still written) */
        int64_t n_host = 0;
        DT_TEST_CHECK("tp_xent_fwd_cpu_without_loss_counts_and_runs",
                      dt_tp_xent_fwd(l, NULL, &n_host, &stats.h, &logits.h, &tg.h, 0, V, -1) == DT_OK &&
                          n_host == N - 2);
    }
    xent_two_ranks(logits, tg, N, Vp, V, lc, (const float *)stats.h.data);
    /* the backward writes g = s (p - onehot), p = exp(z - lse) with the device's lse (off by at
       most 1.01 k u + u |lse| from the CPU's), so |dg| <= |s| p (1.01 k u + u |lse| + 2u) + 2u |g|;
       p <= 1 and |lse| < 8 here. dl holds random values before: a write must not see them. */
    {
        const float dloss = 0.75f;
        const double s = dloss / (double)nc;
        if (ok2("tp_xent_bwd_cuda_runs", dt_tp_xent_bwd(l, &dl.h, &logits.h, &stats.h, &tg.h, 0, V, -1, dloss),
                dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.d, &tg.d, 0, V, -1, dloss))) {
            std::vector<float> g = down(dl.d);
            int64_t nz = 0;
            dt_test_allclose("tp_xent_bwd_cuda_writes_as_cpu_within_bound", g.data(), (const float *)dl.h.data,
                             g.size(), s * (1.01 * k + 8 + 2) * U24, 2 * U24);
            for (int64_t r = 0; r < N; r++) /* padding columns and ignored rows: written 0, exactly */
                for (int64_t c = 0; c < Vp; c++)
                    if ((c >= V || r == 4 || r == 17) && g[(size_t)(r * Vp + c)] != 0.0f) nz++;
            DT_TEST_CHECK("tp_xent_bwd_cuda_writes_zeros_on_padding_and_ignored_rows", nz == 0);
            /* again over NaNs: the same bits (nothing of what was there is read) */
            dt_tensor_fill(&ctx, &dl.d, NAN);
#ifdef DT_CUDA_EMU
            long long v0 = dt_emu_vector_accesses();
#endif
            dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.d, &tg.d, 0, V, -1, dloss);
#ifdef DT_CUDA_EMU
            /* rows of 48 columns, aligned: one float4 load and one store per 4 columns */
            DT_TEST_CHECK("tp_xent_bwd_cuda_moves_float4", dt_emu_vector_accesses() - v0 == 2 * N * Vp / 4);
#endif
            std::vector<float> g2 = down(dl.d);
            dt_test_equal_bytes("tp_xent_bwd_cuda_deterministic_bitwise_over_any_start", g2.data(), g.data(),
                                g.size() * 4);
            /* in place over the logits (as llm.c): the bits of the separate buffer */
            pair_t zin = make(DT_F32, 2, N, Vp, 11);
            DT_TEST_CHECK("tp_xent_bwd_cuda_in_place_runs",
                          dt_tp_xent_bwd(l, &zin.d, &zin.d, &stats.d, &tg.d, 0, V, -1, dloss) == DT_OK);
            std::vector<float> g3 = down(zin.d);
            dt_test_equal_bytes("tp_xent_bwd_cuda_in_place_equals_out_of_place", g3.data(), g.data(), g.size() * 4);
            DT_TEST_CHECK("tp_xent_bwd_cpu_in_place_runs",
                          dt_tp_xent_bwd(l, &zin.h, &zin.h, &stats.h, &tg.h, 0, V, -1, dloss) == DT_OK);
            dt_test_equal_bytes("tp_xent_bwd_cpu_in_place_equals_out_of_place", zin.h.data, dl.h.data, g.size() * 4);
            release(zin);
        }
    }
    /* a row length that is no multiple of 4 (the scalar path of the same pass), with padding */
    {
        const int64_t V2 = 41, Vp2 = 43;
        const double k2 = xent_k(V2);
        pair_t z2 = make(DT_F32, 2, N, Vp2, 21), t2 = make(DT_I32, 1, N, 0, 22, V2), s2 = make(DT_F32, 2, N, 2, 23);
        pair_t d2 = make(DT_F32, 2, N, Vp2, 24);
        int64_t n2 = 0, nz = 0;
        dt_status sh = dt_tp_xent_fwd(l, NULL, &n2, &s2.h, &z2.h, &t2.h, 0, V2, -1), sd;
        if (!sh) sh = dt_tp_xent_bwd(l, &d2.h, &z2.h, &s2.h, &t2.h, 0, V2, -1, 1.0f);
        sd = dt_tp_xent_fwd(l, NULL, NULL, &s2.d, &z2.d, &t2.d, 0, V2, -1);
        if (!sd) sd = dt_tp_xent_bwd(l, &d2.d, &z2.d, &s2.d, &t2.d, 0, V2, -1, 1.0f);
        if (ok2("tp_xent_bwd_cuda_odd_row_runs", sh, sd)) {
            std::vector<float> g = down(d2.d);
            dt_test_allclose("tp_xent_bwd_cuda_odd_row_writes_as_cpu_within_bound", g.data(), (const float *)d2.h.data,
                             g.size(), (1.0 / (double)n2) * (1.01 * k2 + 8 + 2) * U24, 2 * U24);
            for (int64_t r = 0; r < N; r++)
                for (int64_t c = V2; c < Vp2; c++)
                    if (g[(size_t)(r * Vp2 + c)] != 0.0f) nz++;
            DT_TEST_CHECK("tp_xent_bwd_cuda_odd_row_writes_zeros_on_padding", nz == 0);
        }
        release(z2); release(t2); release(s2); release(d2);
    }
    /* no target counts: loss 0, n_valid 0, the backward writes zeros */
    {
        pair_t none = make(DT_I32, 1, N, 0, 15, V);
        float l0 = 1;
        int64_t n0 = 1;
        dt_tensor_fill(&ctx, &none.d, -1.0);
        DT_TEST_CHECK("tp_xent_fwd_cuda_all_ignored_runs",
                      dt_tp_xent_fwd(l, &l0, &n0, &stats.d, &logits.d, &none.d, 0, V, -1) == DT_OK);
        DT_TEST_CHECK("tp_xent_fwd_cuda_all_ignored_is_zero", l0 == 0.0f && n0 == 0);
        dt_tensor_fill(&ctx, &dl.d, 3.0);
        dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.d, &none.d, 0, V, -1, 1.0f);
        std::vector<float> after = down(dl.d), zeros(after.size(), 0.0f);
        dt_test_equal_bytes("tp_xent_bwd_cuda_all_ignored_writes_zeros", after.data(), zeros.data(), after.size() * 4);
        release(none);
    }
    /* a step that does not log: loss NULL; after a first call, nothing is allocated, freed, copied
       down or waited for, by dt's count and by the runtime's own */
    {
        float lwarm = 0;
        dt_tp_xent_fwd(l, &lwarm, NULL, &stats.d, &logits.d, &tg.d, 0, V, -1);
        dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.d, &tg.d, 0, V, -1, 1.0f);
        pair_t table = make(DT_F32, 2, Vp, 8, 16), out = make(DT_F32, 2, N, 8, 17), dtab = make(DT_F32, 2, Vp, 8, 18);
        pair_t ids = make(DT_I32, 1, N, 0, 19, V);
        dt_tp_embedding_fwd(l, &out.d, NULL, &table.d, &ids.d, 0, V, 0); /* the embedding's warm-up */
        dt_tp_embedding_bwd(l, &dtab.d, NULL, &out.d, &ids.d, 0, V, 0);
        rt_counters e0, e1;
        dt_ctx_counters_reset(&ctx);
        rt_counts(&e0);
        dt_status st = dt_tp_xent_fwd(l, NULL, NULL, &stats.d, &logits.d, &tg.d, 0, V, -1);
        if (!st) st = dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.d, &tg.d, 0, V, -1, 1.0f);
        if (!st) st = dt_tp_embedding_fwd(l, &out.d, NULL, &table.d, &ids.d, 0, V, 0);
        if (!st) st = dt_tp_embedding_bwd(l, &dtab.d, NULL, &out.d, &ids.d, 0, V, 0);
        rt_counts(&e1);
        dt_cuda_counters c = ctx.counters;
        DT_TEST_CHECK("tp_xent_and_embedding_cuda_without_loss_run", st == DT_OK);
        dt_test_check_all("tp_xent_and_embedding_cuda_step_allocates_copies_and_waits_for_nothing",
                          c.allocs == 0 && c.frees == 0 && c.d2h_calls == 0 && c.d2h_bytes == 0 && c.syncs == 0 &&
                              c.h2d_calls == 0,
                          "ctx counters: allocs %lld frees %lld d2h %lld calls %lld bytes syncs %lld h2d calls %lld",
                          (long long)c.allocs, (long long)c.frees, (long long)c.d2h_calls, (long long)c.d2h_bytes,
                          (long long)c.syncs, (long long)c.h2d_calls);
        dt_test_check_all("tp_xent_and_embedding_cuda_runtime_counts_nothing_either",
                          e1.allocs == e0.allocs && e1.frees == e0.frees && e1.d2h_calls == e0.d2h_calls &&
                              e1.syncs == e0.syncs && e1.h2d_calls == e0.h2d_calls,
                          "runtime deltas: allocs %lld frees %lld d2h calls %lld syncs %lld h2d calls %lld",
                          e1.allocs - e0.allocs, e1.frees - e0.frees, e1.d2h_calls - e0.d2h_calls, e1.syncs - e0.syncs,
                          e1.h2d_calls - e0.h2d_calls);
        /* the logging step: one copy down, one wait, and the loss of the first call */
        float llog = 0;
        dt_ctx_counters_reset(&ctx);
        dt_tp_xent_fwd(l, &llog, NULL, &stats.d, &logits.d, &tg.d, 0, V, -1);
        DT_TEST_CHECK("tp_xent_fwd_cuda_logging_step_reads_once",
                      ctx.counters.d2h_calls == 1 && ctx.counters.syncs == 1 && ctx.counters.allocs == 0 &&
                          memcmp(&llog, &lg, sizeof llog) == 0);
        release(table); release(out); release(dtab); release(ids);
    }
    /* bad inputs */
    dt_test_error("tp_xent_bwd_mixed_devices_is_named",
                  dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.h, &tg.d, 0, V, -1, 1.0f), dt_ctx_error(&ctx), "stats");
    dt_test_error("tp_xent_fwd_mixed_devices_is_named",
                  dt_tp_xent_fwd(l, &lg, &ng, &stats.h, &logits.d, &tg.d, 0, V, -1), dt_ctx_error(&ctx), "stats");
    ((int32_t *)tg.h.data)[6] = (int32_t)V; /* a padding column is not a target */
    dt_tensor_copy(&ctx, &tg.d, &tg.h);
    dt_test_error("tp_xent_fwd_cuda_target_in_padding_is_named",
                  dt_tp_xent_fwd(l, &lg, &ng, &stats.d, &logits.d, &tg.d, 0, V, -1), dt_ctx_error(&ctx),
                  "dt_tp_xent_fwd: targets[6] = 45 is outside [0, 45)");
    DT_TEST_CHECK("tp_xent_fwd_cuda_target_in_padding_is_range", ctx.last_status == DT_ERR_RANGE);
    DT_TEST_CHECK("tp_xent_bwd_cuda_target_in_padding_does_not_wait",
                  dt_tp_xent_bwd(l, &dl.d, &logits.d, &stats.d, &tg.d, 0, V, -1, 1.0f) == DT_OK);
    dt_test_error("tp_xent_bwd_cuda_target_in_padding_is_named_at_sync", dt_ctx_sync(&ctx), dt_ctx_error(&ctx),
                  "dt_tp_xent_bwd: targets[6] = 45");
    release(logits); release(tg); release(stats); release(dl);
}

static void concat() {
    pair_t q = make(DT_F32, 2, 6, 4, 21), k = make(DT_F32, 2, 6, 4, 22), v = make(DT_F32, 2, 6, 5, 23);
    pair_t qkv = make(DT_F32, 2, 6, 13, 24);
    const dt_tensor *ph[3] = {&q.h, &k.h, &v.h}, *pd[3] = {&q.d, &k.d, &v.d};
    dt_tensor *wh[3] = {&q.h, &k.h, &v.h}, *wd[3] = {&q.d, &k.d, &v.d};
    if (ok2("concat_fwd_cuda_runs", dt_concat_fwd(&ctx, &qkv.h, ph, 3), dt_concat_fwd(&ctx, &qkv.d, pd, 3)))
        same("concat_fwd_cuda_equals_cpu_bitwise", qkv, 0);
    dt_scale(&ctx, &qkv.h, 0.5f);
    dt_tensor_copy(&ctx, &qkv.d, &qkv.h);
    if (ok2("split_fwd_cuda_runs", dt_split_fwd(&ctx, wh, 3, &qkv.h), dt_split_fwd(&ctx, wd, 3, &qkv.d))) {
        same("split_fwd_cuda_equals_cpu_bitwise_q", q, 0);
        same("split_fwd_cuda_equals_cpu_bitwise_v", v, 0);
    }
    if (ok2("concat_bwd_cuda_runs", dt_concat_bwd(&ctx, wh, 3, &qkv.h), dt_concat_bwd(&ctx, wd, 3, &qkv.d)))
        same("concat_bwd_cuda_accumulates_as_cpu", k, 0);
    dt_test_error("concat_fwd_cuda_widths_that_do_not_sum_are_named",
                  dt_concat_fwd(&ctx, &qkv.d, pd, 2), dt_ctx_error(&ctx), "sum to 8");
    dt_test_error("concat_fwd_cuda_mixed_devices_are_named",
                  dt_concat_fwd(&ctx, &qkv.d, ph, 3), dt_ctx_error(&ctx), "part 0 is on cpu");
    release(q); release(k); release(v); release(qkv);
}

/* PASS iff every CUDA value is within tol of |cpu| + rms(cpu): bf16's rounding of q, k, v moves
   each score by some 2^-8 of its size, so an output by about 1e-2 of the values' scale (tests/
   cuda_emu/k_ops.cpp's bound for the tensor-core attention, 5e-2, is the one used). */
static void near_rms(const char *name, pair_t &p, double tol) {
    std::vector<float> got = down(p.d);
    const float *want = (const float *)p.h.data;
    double ss = 0, worst = 0, rms;
    size_t at = 0;
    for (size_t i = 0; i < got.size(); i++) ss += (double)want[i] * want[i];
    rms = got.empty() ? 0 : sqrt(ss / (double)got.size());
    for (size_t i = 0; i < got.size(); i++) {
        double e = fabs((double)got[i] - want[i]) / (fabs((double)want[i]) + rms);
        if (!(e <= worst)) worst = e, at = i;
    }
    dt_test_check_all(name, worst <= tol, "[%zu] cuda %.7g, cpu %.7g: %.3g of |cpu| + rms (allowed %g)", at,
                      got.empty() ? 0.0 : (double)got[at], got.empty() ? 0.0 : (double)want[at], worst, tol);
}

/* Ulysses' row moves (kernels/dt_parallel.cu) against host loops of their definitions, then
   dt_cp_ulysses_fwd / _bwd on CUDA tensors at cp 1 (plain causal attention) against the CPU's, f32
   and with a bf16 uqkv (the tensor cores), and their bad inputs named. */
static void ulysses(dt_layout *l) {
    const int64_t B = 2, T = 12, w = 5;
    for (int cp = 1; cp <= 3; cp += 2) {
        const int64_t Tl = T / cp, n = B * T * w;
        pair_t sh = make(DT_F32, 2, B * T, w, 41 + cp), seq = make(DT_F32, 2, B * T, w, 43);
        std::vector<float> want((size_t)n), back;
        for (int i = 0; i < cp; i++) /* block i = rank i's rows: seq's row at dt_cp_position */
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < Tl; t++)
                    memcpy(&want[(size_t)((b * T + dt_cp_position(cp, i, T, t)) * w)],
                           (const float *)sh.h.data + ((i * B + b) * Tl + t) * w, (size_t)w * sizeof(float));
        char name[96];
        snprintf(name, sizeof name, "cp_rows_to_seq_cp%d_places_every_row_at_its_position", cp);
        if (dt_k_cp_rows((float *)seq.d.data, (float *)sh.d.data, B, T, cp, w, 1, NULL) == 0) {
            std::vector<float> got = down(seq.d);
            dt_test_equal_bytes(name, got.data(), want.data(), (size_t)n * sizeof(float));
        } else dt_test_fail(name, "dt_k_cp_rows failed");
        snprintf(name, sizeof name, "cp_rows_to_shards_cp%d_inverts_it", cp);
        dt_tensor_fill(&ctx, &sh.d, 0.0);
        if (dt_k_cp_rows((float *)seq.d.data, (float *)sh.d.data, B, T, cp, w, 0, NULL) == 0) same(name, sh, 0);
        else dt_test_fail(name, "dt_k_cp_rows failed");
        release(sh); release(seq);
    }
    DT_TEST_CHECK("cp_rows_T_not_a_multiple_of_2cp_is_refused",
                  dt_k_cp_rows(NULL, NULL, 1, 10, 3, 4, 1, NULL) == (int)cudaErrorInvalidValue);
    {
        pair_t src = make(DT_F32, 2, 5, 4, 51), dst = make(DT_F32, 2, 5, 7, 52);
        for (int acc = 0; acc < 2; acc++) { /* columns 0..2 of src's rows into columns 2..4 of dst's */
            for (int64_t r = 0; r < 5; r++)
                for (int64_t c = 0; c < 3; c++) {
                    float *d = (float *)dst.h.data + r * 7 + 2 + c, v = ((const float *)src.h.data)[r * 4 + c];
                    *d = acc ? *d + v : v;
                }
            DT_TEST_CHECK(acc ? "cols_copy_accumulate_runs" : "cols_copy_runs", dt_k_cols_copy((float *)dst.d.data + 2, 7, (const float *)src.d.data, 4, 5,
                                                           3, acc, NULL) == 0);
            same(acc ? "cols_copy_accumulates_as_the_host_loop" : "cols_copy_writes_as_the_host_loop", dst, 0);
        }
        DT_TEST_CHECK("cols_copy_stride_below_width_is_refused",
                      dt_k_cols_copy((float *)dst.d.data, 2, (const float *)src.d.data, 4, 5, 3, 0, NULL) ==
                          (int)cudaErrorInvalidValue);
        release(src); release(dst);
    }
    { /* cp 1: plain causal attention, 2 heads of 16 */
        const int64_t Tq = 8, W = 96, C = 32;
        pair_t qkv = make(DT_F32, 2, B * Tq, W, 61), out = make(DT_F32, 2, B * Tq, C, 62);
        pair_t uq = make(DT_F32, 2, B * Tq, W, 63), dout = make(DT_F32, 2, B * Tq, C, 64);
        pair_t dq = make(DT_F32, 2, B * Tq, W, 65);
        dt_tensor att_h, att_d, uq16;
        dt_tensor_desc td;
        int64_t s3[3] = {B, Tq, W}, so[3] = {B, Tq, C};
        for (pair_t *p : {&qkv, &uq, &dq}) { dt_tensor_reshape(&ctx, &p->h, &p->h, 3, s3); dt_tensor_reshape(&ctx, &p->d, &p->d, 3, s3); }
        for (pair_t *p : {&out, &dout}) { dt_tensor_reshape(&ctx, &p->h, &p->h, 3, so); dt_tensor_reshape(&ctx, &p->d, &p->d, 3, so); }
        memset(&td, 0, sizeof td);
        td.dtype = DT_F32; td.ndim = 4; td.shape[0] = B; td.shape[1] = 2; td.shape[2] = Tq; td.shape[3] = Tq;
        td.device = DT_CPU; dt_tensor_create(&ctx, &att_h, &td);
        td.device = DT_CUDA_DEVICE; dt_tensor_create(&ctx, &att_d, &td);
        memset(&td, 0, sizeof td);
        td.dtype = DT_BF16; td.ndim = 3; td.shape[0] = B; td.shape[1] = Tq; td.shape[2] = W; td.device = DT_CUDA_DEVICE;
        if (dt_tensor_create(&ctx, &uq16, &td)) dt_test_fail("ulysses_bf16_uqkv_made", "%s", dt_ctx_error(&ctx));
        if (ok2("ulysses_fwd_cuda_f32_runs", dt_cp_ulysses_fwd(l, &out.h, &uq.h, &att_h, &qkv.h, 2, 2),
                dt_cp_ulysses_fwd(l, &out.d, &uq.d, &att_d, &qkv.d, 2, 2)))
            same("ulysses_fwd_cuda_f32_equals_cpu", out, 1e-5);
        dt_tensor_fill(&ctx, &dq.h, 0.0);
        dt_tensor_fill(&ctx, &dq.d, 0.0);
        if (ok2("ulysses_bwd_cuda_f32_runs", dt_cp_ulysses_bwd(l, &dq.h, &dout.h, &uq.h, &att_h, 2, 2),
                dt_cp_ulysses_bwd(l, &dq.d, &dout.d, &uq.d, &att_d, 2, 2)))
            same("ulysses_bwd_cuda_f32_equals_cpu", dq, 1e-5);
        /* bf16 uqkv: q, k, v rounded to bf16 on the way in (near_rms's bound) */
        if (ok2("ulysses_fwd_cuda_bf16_runs", dt_cp_ulysses_fwd(l, &out.h, &uq.h, &att_h, &qkv.h, 2, 2),
                dt_cp_ulysses_fwd(l, &out.d, &uq16, NULL, &qkv.d, 2, 2)))
            near_rms("ulysses_fwd_cuda_bf16_within_5e-2_of_cpu_f32", out, 5e-2);
        dt_tensor_fill(&ctx, &dq.h, 0.0);
        dt_tensor_fill(&ctx, &dq.d, 0.0);
        if (ok2("ulysses_bwd_cuda_bf16_runs", dt_cp_ulysses_bwd(l, &dq.h, &dout.h, &uq.h, &att_h, 2, 2),
                dt_cp_ulysses_bwd(l, &dq.d, &dout.d, &uq16, NULL, 2, 2)))
            near_rms("ulysses_bwd_cuda_bf16_within_5e-2_of_cpu_f32", dq, 5e-2);
        dt_test_error("ulysses_bf16_uqkv_with_att_is_named", dt_cp_ulysses_fwd(l, &out.d, &uq16, &att_d, &qkv.d, 2, 2),
                      dt_ctx_error(&ctx), "att is given with a bf16 uqkv");
        dt_test_error("ulysses_f32_uqkv_without_att_is_named", dt_cp_ulysses_fwd(l, &out.d, &uq.d, NULL, &qkv.d, 2, 2),
                      dt_ctx_error(&ctx), "att");
        dt_test_error("ulysses_mixed_devices_are_named", dt_cp_ulysses_fwd(l, &out.d, &uq.h, &att_d, &qkv.d, 2, 2),
                      dt_ctx_error(&ctx), "uqkv is on cpu");
        dt_tensor_free(&ctx, &att_h); dt_tensor_free(&ctx, &att_d); dt_tensor_free(&ctx, &uq16);
        release(qkv); release(out); release(uq); release(dout); release(dq);
    }
}

static void arena() {
    dt_params ps;
    dt_param *p = NULL;
    dt_param_desc d;
    dt_arena *a = NULL;
    memset(&ps, 0, sizeof ps);
    memset(&d, 0, sizeof d);
    d.name = "w"; d.shape[0] = 5; d.shape[1] = 3; d.init.kind = DT_INIT_NORMAL; d.init.std = 1; d.init.seed = 3;
    dt_params_add(&ctx, &ps, &p, &d);
    d.name = "b"; d.shape[0] = 7; d.shape[1] = 0;
    dt_params_add(&ctx, &ps, &p, &d);
    std::vector<float> w0 = down(ps.items[0]->value), b0 = down(ps.items[1]->value);
    if (DT_TEST_CHECK("arena_create_on_cuda_params", dt_arena_create(&ctx, &a, &ps, NULL) == DT_OK)) {
        std::vector<float> w1 = down(ps.items[0]->value), b1 = down(ps.items[1]->value);
        DT_TEST_CHECK("arena_cuda_buffers_live_on_cuda", a->device == DT_CUDA_DEVICE &&
                      a->values[DT_F32].device == DT_CUDA_DEVICE && a->grads.device == DT_CUDA_DEVICE &&
                      ps.items[1]->value.data == (float *)a->values[DT_F32].data + 15);
        dt_test_allclose("arena_cuda_keeps_the_values_w", w1.data(), w0.data(), w0.size(), 0, 0);
        dt_test_allclose("arena_cuda_keeps_the_values_b", b1.data(), b0.data(), b0.size(), 0, 0);
        dt_arena_free(a);
    }
    dt_params_free(&ctx, &ps);
    /* one parameter on the host, one on the device */
    memset(&ps, 0, sizeof ps);
    d.name = "dev"; d.device = DT_CUDA_DEVICE;
    dt_params_add(&ctx, &ps, &p, &d);
    d.name = "host"; d.device = DT_CPU;
    dt_params_add(&ctx, &ps, &p, &d);
    dt_test_error("arena_mixed_devices_is_named", dt_arena_create(&ctx, &a, &ps, NULL), dt_ctx_error(&ctx),
                  "parameter \"host\" has its value on cpu");
    DT_TEST_CHECK("arena_mixed_devices_is_device_error", ctx.last_status == DT_ERR_DEVICE && a == NULL);
    dt_params_free(&ctx, &ps);
}

/* ZeRO 0..3 on CUDA parameters (one rank): after a first step, a step's gathers, releases, grad
   readiness and dt_zero_step (its reduce-scatters and all-gathers; the update is plain SGD
   without clipping, which reads nothing back) allocate, free, copy down and wait for nothing. */
static void zero_counters(dt_layout *l) {
    for (int stage = 0; stage <= 3; stage++) {
        dt_params ps;
        dt_param *p = NULL;
        dt_param_desc d;
        dt_arena *a = NULL;
        dt_zero *z = NULL;
        dt_zero_desc zd;
        dt_arena_desc ad;
        const int units[4] = {0, 0, 1, 1};
        const char *names[4] = {"u0.w", "u0.b", "u1.w", "u1.b"};
        char nm[96];
        memset(&ps, 0, sizeof ps);
        memset(&zd, 0, sizeof zd);
        memset(&ad, 0, sizeof ad);
        for (int i = 0; i < 4; i++) {
            memset(&d, 0, sizeof d);
            d.name = names[i]; d.shape[0] = 6; d.shape[1] = i % 2 ? 0 : 5;
            d.init.kind = DT_INIT_NORMAL; d.init.std = 1; d.init.seed = (uint64_t)(40 + i);
            d.device = DT_CUDA_DEVICE;
            dt_params_add(&ctx, &ps, &p, &d);
        }
        ad.units = units;
        zd.stage = stage;
        zd.opt.kind = DT_OPT_SGD;
        dt_status st = dt_arena_create(&ctx, &a, &ps, &ad);
        if (!st) st = dt_zero_create(l, &z, a, &zd);
        rt_counters e0 = {0, 0, 0, 0, 0, 0, 0}, e1 = e0;
        for (int step = 0; step < 2 && !st; step++) {
            if (step == 1) { dt_ctx_counters_reset(&ctx); rt_counts(&e0); }
            for (int u = 0; u < 2 && !st; u++) {
                st = dt_zero_gather(z, u);
                if (!st) st = dt_zero_release(z, u);
            }
            if (!st) st = dt_zero_backward_begin(z);
            for (int u = 1; u >= 0 && !st; u--) {
                st = dt_zero_gather(z, u);
                for (int i = 0; i < 4 && !st; i++) /* the unit's grads: one grad per element */
                    if (units[i] == u) st = dt_tensor_fill(&ctx, &ps.items[i]->grad, 0.5);
                if (!st) st = dt_zero_grad_ready(z, u);
                if (!st) st = dt_zero_release(z, u);
            }
            if (!st) st = dt_zero_step(z, NULL);
            if (step == 1) rt_counts(&e1);
        }
        dt_cuda_counters c = ctx.counters;
        snprintf(nm, sizeof nm, "zero%d_cuda_step_runs", stage);
        if (!DT_TEST_CHECK(nm, st == DT_OK)) fprintf(stderr, "%s\n", dt_ctx_error(&ctx));
        snprintf(nm, sizeof nm, "zero%d_cuda_step_allocates_copies_and_waits_for_nothing", stage);
        dt_test_check_all(nm, c.allocs == 0 && c.frees == 0 && c.d2h_calls == 0 && c.syncs == 0 && c.h2d_calls == 0 &&
                                  e1.allocs == e0.allocs && e1.frees == e0.frees && e1.d2h_calls == e0.d2h_calls &&
                                  e1.syncs == e0.syncs && e1.h2d_calls == e0.h2d_calls,
                          "ctx: allocs %lld frees %lld d2h %lld syncs %lld h2d %lld; runtime deltas: allocs %lld frees "
                          "%lld d2h %lld syncs %lld h2d %lld", (long long)c.allocs, (long long)c.frees,
                          (long long)c.d2h_calls, (long long)c.syncs, (long long)c.h2d_calls, e1.allocs - e0.allocs,
                          e1.frees - e0.frees, e1.d2h_calls - e0.d2h_calls, e1.syncs - e0.syncs,
                          e1.h2d_calls - e0.h2d_calls);
        dt_zero_free(z);
        dt_arena_free(a);
        dt_params_free(&ctx, &ps);
    }
}

/* The launchers called directly with a NULL pointer the launch reads or writes where the sizes
   say there is data (each faulted inside a kernel: a SEGV on the emulator): refused. */
static void launcher_refusals(void) {
    float *d = NULL, *o = NULL; /* inputs (zeros), and the outputs of the launches that run */
    void *scr = NULL;
    const int32_t *t;
    cudaMalloc((void **)&d, 256 * sizeof(float));
    cudaMalloc((void **)&o, 256 * sizeof(float));
    cudaMalloc(&scr, dt_k_tp_embedding_bwd_scratch(4));
    cudaMemset(d, 0, 256 * sizeof(float));
    t = (const int32_t *)d;
    k_refused("tp_embedding_fwd_NULL_ids_is_invalid_value", dt_k_tp_embedding_fwd(d, d, NULL, 0, 4, 4, 4, 0, NULL));
    k_refused("tp_embedding_fwd_NULL_table_is_invalid_value", dt_k_tp_embedding_fwd(d, NULL, d, 0, 4, 4, 4, 0, NULL));
    k_refused("tp_embedding_fwd_NULL_out_is_invalid_value", dt_k_tp_embedding_fwd(NULL, d, d, 0, 4, 4, 4, 0, NULL));
    k_refused("tp_embedding_bwd_NULL_ids_is_invalid_value", dt_k_tp_embedding_bwd(d, d, NULL, 0, 4, 4, 4, 0, scr, NULL));
    k_refused("tp_embedding_bwd_NULL_dout_is_invalid_value", dt_k_tp_embedding_bwd(d, NULL, d, 0, 4, 4, 4, 0, scr, NULL));
    k_refused("tp_embedding_bwd_NULL_dtable_is_invalid_value", dt_k_tp_embedding_bwd(NULL, d, d, 0, 4, 4, 4, 0, scr, NULL));
    k_refused("tp_xent_fwd_NULL_targets_is_invalid_value", dt_k_tp_xent_fwd(d, d, d, d, NULL, -1, 2, 4, 4, 0, NULL));
    k_refused("tp_xent_fwd_NULL_logits_is_invalid_value", dt_k_tp_xent_fwd(d, d, d, NULL, t, -1, 2, 4, 4, 0, NULL));
    k_refused("tp_xent_fwd_NULL_sz_is_invalid_value", dt_k_tp_xent_fwd(d, d, NULL, d, t, -1, 2, 4, 4, 0, NULL));
    k_refused("tp_xent_rescale_NULL_mglob_is_invalid_value", dt_k_tp_xent_rescale(d, d, NULL, 2, NULL));
    k_refused("tp_xent_loss_NULL_targets_is_invalid_value", dt_k_tp_xent_loss((double *)d, NULL, d, d, NULL, -1, 2, NULL));
    k_refused("tp_xent_bwd_NULL_stats_is_invalid_value", dt_k_tp_xent_bwd(d, d, NULL, t, -1, 1.0f, (double *)d, 2, 4, 4, 0, NULL));
    k_refused("tp_xent_bwd_NULL_dlogits_is_invalid_value", dt_k_tp_xent_bwd(NULL, d, d, t, -1, 1.0f, (double *)d, 2, 4, 4, 0, NULL));
    k_refused("concat_NULL_part_is_invalid_value", dt_k_concat(d, NULL, 2, 4, 0, 2, 1, 0, NULL));
    k_refused("concat_NULL_whole_is_invalid_value", dt_k_concat(NULL, d, 2, 4, 0, 2, 0, 0, NULL));
    /* what no launch touches may stay NULL: no rows, no vocab here, no real column, stats */
    DT_TEST_CHECK("tp_embedding_fwd_Vl_0_with_NULL_table_is_ok", dt_k_tp_embedding_fwd(o, NULL, d, 0, 4, 0, 4, 0, NULL) == 0);
    DT_TEST_CHECK("tp_xent_fwd_nv_0_with_NULL_logits_is_ok", dt_k_tp_xent_fwd(o, o + 8, o + 16, NULL, t, -1, 2, 4, 0, 0, NULL) == 0);
    DT_TEST_CHECK("tp_xent_loss_N_0_with_NULL_is_ok", dt_k_tp_xent_loss((double *)d, NULL, NULL, NULL, NULL, -1, 0, NULL) == 0);
    DT_TEST_CHECK("concat_C_0_with_NULL_is_ok", dt_k_concat(NULL, NULL, 2, 4, 0, 0, 1, 0, NULL) == 0);
    cudaFree(d);
    cudaFree(o);
    cudaFree(scr);
}

int main(void) {
    dt_ctx_desc cd;
    dt_comm *world = NULL;
    dt_layout *l = NULL;
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    if (dt_ctx_init(&ctx, &cd) || dt_comm_create_world(&ctx, &world, NULL) || dt_layout_create(world, &l, NULL)) {
        dt_test_fail("setup_cuda_ctx_and_layout", "%s", dt_ctx_error(&ctx));
        return dt_test_finish();
    }
    embedding(l);
    xent(l);
    concat();
    ulysses(l);
    arena();
    zero_counters(l);
    launcher_refusals();
    dt_layout_free(l);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
