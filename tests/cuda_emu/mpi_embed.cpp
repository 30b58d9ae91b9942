// np: 1 2 4
// tests/cuda_emu/mpi_embed.cpp - dt_embed.h's CUDA tables across ranks on the emulator: a mixed
// plan (row-wise sum SGD, table-wise weighted mean Adagrad, column-wise sum Adam, data-parallel
// sum row-wise Adagrad, a dynamic table under capacity pressure with admit_after 2 and Adam;
// then the same with a static table-row table (group: the host's ranks) in place of the dynamic
// one, so every request is made on the device: dt__em_cuda_requests) built twice on the same world, once with desc.device cuda and once on the cpu; each rank
// feeds both its own local batch: 3 forward + backward steps, the pooled outputs and the
// dynamic counts must equal the cpu's each step and every rank's shards after the steps (bit
// for bit; row-wise Adagrad within 1e-6: its sum of squares is a tree on the device). Device
// tensors go through dt_comm's staged path (-DDT_MPI, no NCCL).
// Build (after `bash tests/run.sh cuda_emu` built build/cuda_emu/obj/*.o):
//   mpicxx -std=c++17 -O1 -g -Wall -Wextra -Werror -Wno-unknown-pragmas -DDT_MPI -DDT_CBLAS -I.
//     -Itests/cuda_emu/include -Ikernels -Itests -Itests/cuda_emu tests/cuda_emu/mpi_embed.cpp
//     build/cuda_emu/obj/*.o -o build/cuda_emu/mpi_embed -lopenblas -lm -lpthread
//   mpirun --allow-run-as-root --oversubscribe -np N build/cuda_emu/mpi_embed
#include <math.h>
#include <cuda_runtime.h>
#include <vector>
#define DT_CUDA
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "tests/dt_test.h"

enum { B = 3, NT = 5 };
static const int64_t ROWS[NT] = {20, 12, 10, 8, 8}, IDS[NT] = {20, 12, 10, 8, 14};
static const int DIMS[NT] = {4, 8, 8, 4, 4};

static uint64_t rng;
static uint64_t next_u(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static float next_f(void) { return (float)((next_u() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; }

static std::vector<float> host_copy(dt_ctx *ctx, const dt_tensor *t) {
    std::vector<float> v;
    dt_tensor h, f;
    if (t->numel == 0) return v;
    if (dt_tensor_create_like(ctx, &h, t, DT_DTYPE_DEFAULT, DT_CPU)) return v;
    if (!dt_tensor_copy(ctx, &h, t) && !dt_tensor_create_like(ctx, &f, &h, DT_F32, DT_CPU)) {
        if (!dt_tensor_cast(ctx, &f, &h)) v.assign((float *)f.data, (float *)f.data + f.numel);
        dt_tensor_free(ctx, &f);
    }
    dt_tensor_free(ctx, &h);
    return v;
}

static int g_dyn = 1; /* table 4: dynamic (1) or static table-row (0) */

static dt_embed *make(dt_ctx *ctx, dt_comm *c, dt_device dev) {
    static dt_embed_table_desc t[NT];
    static const char *names[NT] = {"row", "table", "col", "dp", "dyn"};
    dt_embed_sharding sh[NT] = {DT_SHARD_ROW, DT_SHARD_TABLE, DT_SHARD_COLUMN, DT_SHARD_DATA,
                                g_dyn ? DT_SHARD_DEFAULT : DT_SHARD_TABLE_ROW};
    dt_embed_optim op[NT] = {DT_EMBED_SGD, DT_EMBED_ADAGRAD, DT_EMBED_ADAM, DT_EMBED_ROWWISE_ADAGRAD, DT_EMBED_ADAM};
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(t, 0, sizeof t);
    for (int i = 0; i < NT; i++) {
        t[i].name = names[i]; t[i].rows = ROWS[i]; t[i].dim = DIMS[i]; t[i].sharding = sh[i];
        t[i].optim.kind = op[i]; t[i].optim.lr = 0.05;
    }
    t[1].pooling = DT_POOL_MEAN; t[1].weighted = 1;
    if (g_dyn) t[4].dynamic = 1, t[4].hash_shards = 4, t[4].admit_after = 2;
    else t[4].name = "trw", t[4].rows = IDS[4]; /* every id a row */
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = NT; d.comm = c; d.seed = 5; d.device = dev;
    if (dt_embed_create(ctx, &e, &d)) fprintf(stderr, "create: %s\n", dt_ctx_error(ctx));
    return e;
}

// One step on e: forward into a tensor on dev (copied back to *out), backward with dout.
static int step(dt_ctx *ctx, dt_embed *e, dt_device dev, const dt_kjt *kjt, const std::vector<float> &dout,
                std::vector<float> *out) {
    dt_tensor o, d;
    dt_tensor_desc td;
    memset(&td, 0, sizeof td);
    td.dtype = DT_F32; td.ndim = 2; td.shape[0] = B; td.shape[1] = dt_embed_pooled_dim(e); td.device = dev;
    if (dt_tensor_create(ctx, &o, &td)) return 1;
    if (dt_tensor_create(ctx, &d, &td)) { dt_tensor_free(ctx, &o); return 1; }
    int st = dt_embed_forward(e, &o, kjt);
    if (!st) *out = host_copy(ctx, &o);
    if (!st && dev == DT_CUDA_DEVICE) cudaMemcpy(d.data, dout.data(), dout.size() * 4, cudaMemcpyHostToDevice);
    else if (!st) memcpy(d.data, dout.data(), dout.size() * 4);
    if (!st) st = dt_embed_backward(e, &d);
    if (st) fprintf(stderr, "step: %s\n", dt_ctx_error(ctx));
    dt_tensor_free(ctx, &o);
    dt_tensor_free(ctx, &d);
    return st;
}

// A step on the CUDA tables repeated on the same batch (the first grew the buffers): no device
// allocation or free (ctx and runtime). At np 1 (no exchange to stage) exactly one copy down and
// one wait: the dynamic table's block, (3 ids + 4 shards x 4) x 8 bytes, as ctx->counters and the
// emulator both count. Across ranks dt_comm stages the device all-to-alls through the host
// (no NCCL here): their copies are dt_comm's, so only the allocations are checked.
static void check_counters(dt_ctx *ctx, dt_embed *e, int W, int R) {
    char name[160];
    std::vector<int64_t> lengths, ids;
    std::vector<float> weights;
    for (int f = 0; f < NT; f++)
        for (int b = 0; b < B; b++) {
            int64_t n = 1 + (int64_t)(next_u() % 3);
            lengths.push_back(n);
            for (int64_t j = 0; j < n; j++) ids.push_back((int64_t)(next_u() % (uint64_t)IDS[f])), weights.push_back(next_f());
        }
    dt_kjt kjt;
    memset(&kjt, 0, sizeof kjt);
    kjt.n_features = NT; kjt.batch = B;
    kjt.lengths = lengths.data(); kjt.ids = ids.data(); kjt.weights = weights.data();
    dt_tensor o, d;
    dt_tensor_desc td;
    memset(&td, 0, sizeof td);
    td.dtype = DT_F32; td.ndim = 2; td.shape[0] = B; td.shape[1] = dt_embed_pooled_dim(e); td.device = DT_CUDA_DEVICE;
    if (dt_tensor_create(ctx, &o, &td) || dt_tensor_create(ctx, &d, &td)) return;
    std::vector<float> dout((size_t)B * (size_t)dt_embed_pooled_dim(e));
    for (size_t i = 0; i < dout.size(); i++) dout[i] = next_f();
    cudaMemcpy(d.data, dout.data(), dout.size() * 4, cudaMemcpyHostToDevice);
    int ok = !dt_embed_forward(e, &o, &kjt) && !dt_embed_backward(e, &d);
    dt_emu_counters c0, c1;
    dt_ctx_counters_reset(ctx);
    dt_emu_get_counters(&c0);
    ok = ok && !dt_embed_forward(e, &o, &kjt) && !dt_embed_backward(e, &d);
    dt_emu_get_counters(&c1);
    dt_cuda_counters k = ctx->counters;
    snprintf(name, sizeof name, "mpi_embed_cuda%s_np%d_rank%d_counters_steps_run", g_dyn ? "" : "_static", W, R);
    if (!DT_TEST_CHECK(name, ok)) fprintf(stderr, "  %s\n", dt_ctx_error(ctx));
    snprintf(name, sizeof name, "mpi_embed_cuda%s_np%d_rank%d_second_step_allocates_and_frees_nothing",
             g_dyn ? "" : "_static", W, R);
    dt_test_check_all(name, k.allocs == 0 && k.frees == 0 && c1.allocs == c0.allocs && c1.frees == c0.frees,
                      "ctx allocs %lld frees %lld; runtime allocs %lld frees %lld", (long long)k.allocs,
                      (long long)k.frees, c1.allocs - c0.allocs, c1.frees - c0.frees);
    if (!g_dyn) { /* requests made on the device: at np 1 (nothing staged) only the batch goes up */
        if (W == 1) {
            long long nid = (long long)ids.size(), want = (long long)lengths.size() * 8 + nid * 8 + nid * 4;
            snprintf(name, sizeof name, "mpi_embed_cuda_static_np1_second_step_uploads_only_the_batch");
            dt_test_check_all(name, k.h2d_bytes == want && c1.h2d_bytes - c0.h2d_bytes == want,
                              "ctx %lld bytes, runtime %lld; expected %lld (lengths, ids, weights)",
                              (long long)k.h2d_bytes, c1.h2d_bytes - c0.h2d_bytes, want);
            snprintf(name, sizeof name, "mpi_embed_cuda_static_np1_second_step_copies_nothing_down_and_waits_for_nothing");
            dt_test_check_all(name, k.d2h_bytes == 0 && k.syncs == 0 && c1.syncs == c0.syncs,
                              "ctx d2h %lld bytes, syncs %lld; runtime syncs %lld", (long long)k.d2h_bytes,
                              (long long)k.syncs, c1.syncs - c0.syncs);
        }
    } else if (W == 1) {
        long long m = 0, want;
        for (int b = 0; b < B; b++) m += lengths[4 * B + b]; /* feature 4 reads the dynamic table */
        want = (3 * m + 16) * 8;
        snprintf(name, sizeof name, "mpi_embed_cuda_np1_second_step_one_copy_down_of_the_dynamic_block");
        dt_test_check_all(name, k.d2h_bytes == want && k.d2h_calls == 1 && c1.d2h_bytes - c0.d2h_bytes == want,
                          "ctx %lld bytes in %lld calls, runtime %lld bytes; expected %lld in 1", (long long)k.d2h_bytes,
                          (long long)k.d2h_calls, c1.d2h_bytes - c0.d2h_bytes, want);
        snprintf(name, sizeof name, "mpi_embed_cuda_np1_second_step_syncs_1");
        dt_test_check_all(name, k.syncs == 1 && c1.syncs - c0.syncs == 1, "ctx %lld, runtime %lld", (long long)k.syncs,
                          c1.syncs - c0.syncs);
    }
    dt_tensor_free(ctx, &o);
    dt_tensor_free(ctx, &d);
}

static void run_config(dt_ctx *pctx, dt_comm *world) {
    dt_ctx &ctx = *pctx;
    char name[160];
    int R = dt_comm_rank(world), W = dt_comm_size(world);
    dt_embed *ec = make(&ctx, world, DT_CPU), *eg = make(&ctx, world, DT_CUDA_DEVICE);
    snprintf(name, sizeof name, "mpi_embed_cuda%s_np%d_create", g_dyn ? "" : "_static", W);
    if (!DT_TEST_CHECK(name, ec && eg)) { dt_embed_free(ec); dt_embed_free(eg); return; }
    rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)(R + 1) * 0x1234567ull;
    int ok = 1;
    for (int s = 0; s < 3 && ok; s++) {
        std::vector<int64_t> lengths, ids;
        std::vector<float> weights;
        for (int f = 0; f < NT; f++)
            for (int b = 0; b < B; b++) {
                int64_t n = (int64_t)(next_u() % 4);
                lengths.push_back(n);
                for (int64_t j = 0; j < n; j++) ids.push_back((int64_t)(next_u() % (uint64_t)IDS[f])), weights.push_back(next_f());
            }
        dt_kjt kjt;
        memset(&kjt, 0, sizeof kjt);
        kjt.n_features = NT; kjt.batch = B;
        kjt.lengths = lengths.data(); kjt.ids = ids.data(); kjt.weights = weights.data();
        std::vector<float> dout((size_t)B * (size_t)dt_embed_pooled_dim(ec)), oc, og;
        for (size_t i = 0; i < dout.size(); i++) dout[i] = next_f();
        int sc = step(&ctx, ec, DT_CPU, &kjt, dout, &oc), sg = step(&ctx, eg, DT_CUDA_DEVICE, &kjt, dout, &og);
        snprintf(name, sizeof name, "mpi_embed_cuda%s_np%d_rank%d_step%d_runs", g_dyn ? "" : "_static", W, R, s + 1);
        if (!DT_TEST_CHECK(name, sc == 0 && sg == 0)) { ok = 0; break; }
        snprintf(name, sizeof name, "mpi_embed_cuda%s_np%d_rank%d_step%d_outputs_equal_cpu_bitwise",
                 g_dyn ? "" : "_static", W, R, s + 1);
        if (!DT_TEST_CHECK(name, oc.size() == og.size())) { ok = 0; break; }
        dt_test_allclose(name, og.data(), oc.data(), oc.size(), 0, 0);
        dt_embed_stats a, g;
        dt_embed_stats_get(ec, &a);
        dt_embed_stats_get(eg, &g);
        if (!g_dyn) { /* the unique rows updated: counted on the device (requests made there) */
            snprintf(name, sizeof name, "mpi_embed_cuda_static_np%d_rank%d_step%d_rows_updated_equal_cpu", W, R, s + 1);
            dt_test_check_all(name, a.rows_updated == g.rows_updated, "cuda %lld, cpu %lld", (long long)g.rows_updated,
                              (long long)a.rows_updated);
            continue;
        }
        snprintf(name, sizeof name, "mpi_embed_cuda_np%d_rank%d_step%d_dynamic_counts_equal_cpu", W, R, s + 1);
        if (!DT_TEST_CHECK(name, a.admitted == g.admitted && a.evicted == g.evicted && a.rejected == g.rejected))
            fprintf(stderr, "  admitted/evicted/rejected cuda %lld/%lld/%lld cpu %lld/%lld/%lld\n", (long long)g.admitted,
                    (long long)g.evicted, (long long)g.rejected, (long long)a.admitted, (long long)a.evicted,
                    (long long)a.rejected);
    }
    if (g_dyn) { /* the dynamic table was under pressure somewhere: ids admitted, and evicted or rejected */
        dt_embed_stats a;
        double v[3];
        dt_embed_stats_get(ec, &a);
        v[0] = (double)a.admitted; v[1] = (double)a.evicted; v[2] = (double)a.rejected;
        dt_comm_allreduce_f64(world, v, 3, DT_REDUCE_SUM);
        snprintf(name, sizeof name, "mpi_embed_cuda_np%d_dynamic_table_under_pressure", W);
        if (!DT_TEST_CHECK(name, v[0] > 0 && v[1] + v[2] > 0))
            fprintf(stderr, "  admitted %g evicted %g rejected %g\n", v[0], v[1], v[2]);
    }
    for (int t = 0; ok && t < NT; t++) {
        dt_tensor vc, vg;
        int64_t r0, c0, r0g, c0g;
        dt_embed_local_shard(ec, &vc, &r0, &c0, t);
        dt_embed_local_shard(eg, &vg, &r0g, &c0g, t);
        std::vector<float> hc = host_copy(&ctx, &vc), hg = host_copy(&ctx, &vg);
        snprintf(name, sizeof name, "mpi_embed_cuda%s_np%d_rank%d_table_%d_same_shard", g_dyn ? "" : "_static", W, R, t);
        if (!DT_TEST_CHECK(name, hc.size() == hg.size() && r0 == r0g && c0 == c0g)) continue;
        snprintf(name, sizeof name, "mpi_embed_cuda%s_np%d_rank%d_table_%d_rows_after_3_steps_equal_cpu",
                 g_dyn ? "" : "_static", W, R, t);
        dt_test_allclose(name, hg.data(), hc.data(), hc.size(), 0, t == 3 ? 1e-6 : 0);
    }
    if (ok) check_counters(&ctx, eg, W, R);
    dt_embed_free(ec);
    dt_embed_free(eg);
}

int main(void) {
    dt_ctx ctx;
    dt_comm *world;
    dt_ctx_init(&ctx, NULL);
    if (dt_comm_create_world(&ctx, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&ctx)); return 2; }
    run_config(&ctx, world);
    g_dyn = 0;
    run_config(&ctx, world);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
