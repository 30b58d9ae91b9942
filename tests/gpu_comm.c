// np: 1 2
/* tests/gpu_comm.c - dt_comm.h on device tensors: through NCCL (one GPU per rank) and staged
   through host memory (a world made with use_nccl = -1). tests/run.sh builds it with mpicc
   -DDT_MPI -DDT_CUDA -DDT_NCCL and links NCCL, so without a GPU it is still the build check of
   the NCCL code. Values are small integers and halves, exact whatever the sum order, so both
   paths must match exactly. Rank 0 also prints the staged all-reduce's throughput beside
   cudaMemcpy bandwidth (at 2 ranks, where staging happens). */
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"
#include <cuda_runtime.h>

static dt_ctx ctx;
static int R, N;

static dt_tensor dev(dt_dtype dt, int64_t n) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.device = DT_CUDA_DEVICE;
    d.shape[0] = n;
    if (dt_tensor_create(&ctx, &t, &d)) memset(&t, 0, sizeof t);
    return t;
}

/* host values -> device tensor (f32 or bf16), and back */
static void upload(dt_tensor *t, const float *v) {
    dt_tensor h;
    dt_tensor_desc d;
    int64_t k;
    memset(&d, 0, sizeof d);
    d.dtype = t->dtype;
    d.shape[0] = t->numel;
    dt_tensor_create(&ctx, &h, &d);
    for (k = 0; k < t->numel; k++) {
        if (t->dtype == DT_BF16) ((uint16_t *)h.data)[k] = dt_f32_to_bf16(v[k]);
        else ((float *)h.data)[k] = v[k];
    }
    dt_tensor_copy(&ctx, t, &h);
    dt_tensor_free(&ctx, &h);
}

/* first k with got != want, or -1 */
static int64_t download_cmp(const dt_tensor *t, const float *want, float *got_at) {
    dt_tensor h;
    dt_tensor_desc d;
    int64_t k, bad = -1;
    memset(&d, 0, sizeof d);
    d.dtype = t->dtype;
    d.shape[0] = t->numel;
    dt_tensor_create(&ctx, &h, &d);
    dt_tensor_copy(&ctx, &h, t);
    for (k = 0; k < t->numel && bad < 0; k++) {
        float g = t->dtype == DT_BF16 ? dt_bf16_to_f32(((uint16_t *)h.data)[k]) : ((float *)h.data)[k];
        if (g != want[k]) {
            bad = k;
            *got_at = g;
        }
    }
    dt_tensor_free(&ctx, &h);
    return bad;
}

static void expect(const char *path, const char *what, dt_status st, const dt_tensor *t, const float *want) {
    char name[96];
    float got = 0;
    int64_t bad = st ? -2 : download_cmp(t, want, &got);
    snprintf(name, sizeof name, "%s_%s", path, what);
    dt_test_check_all(name, bad == -1, "status %d (%.60s); first bad [%lld]: got %g, want %g", st,
                      st ? dt_ctx_error(&ctx) : "", (long long)bad, (double)got, bad >= 0 ? (double)want[bad] : 0.0);
}

static void collectives(dt_comm *c, const char *path) {
    enum { M = 1000 };
    float *v = (float *)malloc(sizeof(float) * M * 8), *w = (float *)malloc(sizeof(float) * M * 8);
    dt_tensor a = dev(DT_F32, M), h = dev(DT_BF16, M), in = dev(DT_F32, (int64_t)N * M), out = dev(DT_F32, (int64_t)N * M),
              blk = dev(DT_F32, M);
    int64_t k, j, sc[8], rc[8];
    /* all-reduce sum (f32) and avg (bf16) */
    for (k = 0; k < M; k++) { v[k] = (float)R + 0.5f * (float)k; w[k] = (float)(N * (N - 1) / 2) + 0.5f * (float)(N * k); }
    upload(&a, v);
    expect(path, "allreduce_f32_sum", dt_comm_allreduce(c, &a, DT_REDUCE_SUM), &a, w);
    for (k = 0; k < M; k++) { v[k] = (float)(R + 1); w[k] = (float)(N + 1) / 2.0f; }
    upload(&h, v);
    expect(path, "allreduce_bf16_avg", dt_comm_allreduce(c, &h, DT_REDUCE_AVG), &h, w);
    /* all-gather and reduce-scatter */
    for (k = 0; k < M; k++) v[k] = (float)(R * 1000 + k);
    for (j = 0; j < N; j++) for (k = 0; k < M; k++) w[j * M + k] = (float)(j * 1000 + k);
    upload(&blk, v);
    expect(path, "allgather", dt_comm_allgather(c, &out, &blk), &out, w);
    for (k = 0; k < (int64_t)N * M; k++) v[k] = (float)(k + R);
    for (k = 0; k < M; k++) w[k] = (float)(N * (R * M + k) + N * (N - 1) / 2);
    upload(&in, v);
    expect(path, "reduce_scatter_sum", dt_comm_reduce_scatter(c, &blk, &in, DT_REDUCE_SUM), &blk, w);
    /* broadcast from the last rank */
    for (k = 0; k < M; k++) { v[k] = (float)(R * 7 + k); w[k] = (float)((N - 1) * 7 + k); }
    upload(&a, v);
    expect(path, "broadcast", dt_comm_broadcast(c, &a, N - 1), &a, w);
    /* all-to-all: block j of rank r holds r * 100 + j */
    for (j = 0; j < N; j++) for (k = 0; k < M; k++) { v[j * M + k] = (float)(R * 100 + j); w[j * M + k] = (float)(j * 100 + R); }
    upload(&in, v);
    expect(path, "alltoall", dt_comm_alltoall(c, &out, &in), &out, w);
    /* all-to-allv: rank r sends j + 1 elements of value r * 10 + j to rank j */
    for (k = 0, j = 0; j < N; j++) { sc[j] = j + 1; rc[j] = R + 1; }
    for (k = 0, j = 0; j < N; j++) { int64_t q; for (q = 0; q < sc[j]; q++) v[k++] = (float)(R * 10 + j); }
    upload(&in, v);
    for (k = 0; k < (int64_t)N * M; k++) v[k] = 0;
    upload(&out, v); /* out starts zeroed */
    for (k = 0, j = 0; j < N; j++) { int64_t q; for (q = 0; q < rc[j]; q++) w[k++] = (float)(j * 10 + R); }
    {
        dt_status st = dt_comm_alltoallv(c, &out, NULL, &in, sc);
        dt_tensor part;
        int64_t got = (int64_t)N * (R + 1);
        dt_tensor_view(&ctx, &part, &out, 0, 1, &got);
        expect(path, "alltoallv", st, &part, w);
    }
    dt_tensor_free(&ctx, &a); dt_tensor_free(&ctx, &h); dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out); dt_tensor_free(&ctx, &blk);
    free(v);
    free(w);
}

static double secs(void) { return MPI_Wtime(); }

/* Staged all-reduce of 64 MB against cudaMemcpy device->host and host->device of the same. */
static void staged_throughput(dt_comm *staged) {
    const int64_t n = 16 << 20;
    dt_tensor t = dev(DT_F32, n);
    void *host = malloc((size_t)n * 4);
    double best_ar = 1e30, best_d2h = 1e30, best_h2d = 1e30, t0;
    int k;
    for (k = 0; k < 5; k++) {
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = secs();
        dt_comm_allreduce(staged, &t, DT_REDUCE_SUM);
        if (secs() - t0 < best_ar) best_ar = secs() - t0;
        t0 = secs();
        cudaMemcpy(host, t.data, (size_t)n * 4, cudaMemcpyDeviceToHost);
        if (secs() - t0 < best_d2h) best_d2h = secs() - t0;
        t0 = secs();
        cudaMemcpy(t.data, host, (size_t)n * 4, cudaMemcpyHostToDevice);
        if (secs() - t0 < best_h2d) best_h2d = secs() - t0;
    }
    if (R == 0)
        printf("staged allreduce of 64 MB on %d ranks: %.2f ms (busbw %.2f GB/s); cudaMemcpy 64 MB d2h %.2f GB/s, h2d "
               "%.2f GB/s (pageable)\n", N, best_ar * 1e3, n * 4.0 / best_ar / 1e9 * dt_coll_bus_factor(DT_COLL_ALLREDUCE, N),
               n * 4.0 / best_d2h / 1e9, n * 4.0 / best_h2d / 1e9);
    dt_tensor_free(&ctx, &t);
    free(host);
}

int main(void) {
    dt_comm *world = NULL, *staged = NULL;
    dt_comm_desc d;
    dt_ctx_desc cd;
    int devices = 0, failed;
    dt_ctx tmp;
    /* the world first (to learn the local rank), then a ctx on this rank's GPU */
    dt_ctx_init(&tmp, NULL);
    if (dt_comm_create_world(&tmp, &world, NULL)) {
        fprintf(stderr, "gpu_comm: %s\n", dt_ctx_error(&tmp));
        return 1;
    }
    R = dt_comm_rank(world);
    N = dt_comm_size(world);
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        dt_test_skip("gpu_comm", "no CUDA device");
        failed = dt_test_finish();
        dt_comm_free(world);
        return failed;
    }
    memset(&cd, 0, sizeof cd);
    cd.device = DT_CUDA_DEVICE;
    cd.cuda_device = dt_comm_local_rank(world) % devices;
    dt_ctx_init(&ctx, &cd);
    memset(&d, 0, sizeof d);
    d.use_nccl = -1;
    d.name = "staged";
    dt_comm_create_world(&ctx, &staged, &d); /* a second world over the same processes, without NCCL */
    collectives(staged, "staged");
    if (dt_comm_local_size(world) <= devices) {
        dt_comm *nccl = NULL;
        memset(&d, 0, sizeof d);
        d.use_nccl = 1;
        d.name = "nccl";
        dt_comm_create_world(&ctx, &nccl, &d);
        collectives(nccl, "nccl");
        dt_comm_free(nccl);
    } else
        dt_test_skip("nccl_collectives", "%d ranks share %d GPU(s) on this host; NCCL needs one GPU per rank",
                     dt_comm_local_size(world), devices);
    if (N > 1) staged_throughput(staged);
    failed = dt_test_finish();
    dt_comm_free(staged);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return failed;
}
