// np: 1 2 4
/* tests/gpu_comm.c - dt_comm.h on device tensors: through NCCL (one GPU per rank) and staged
   through host memory (a world made with use_nccl = -1), each compared with the same collective
   on host tensors and with hand-derived values. Values are small integers and halves, exact
   whatever the sum order, so every path must match exactly.
   Built two ways by tests/run.sh:
     - gpu_comm (group gpu_): mpicc -DDT_MPI -DDT_CUDA -DDT_NCCL with nvcc's kernels and the real
       NCCL; without a GPU it is the build check of the NCCL code. Rank 0 also prints the staged
       all-reduce's throughput beside cudaMemcpy bandwidth (at 2 ranks and more).
     - cuda_emu_comm (group cuda_emu_comm): the same source as C++ against the CUDA emulator and
       its fake NCCL (tests/cuda_emu/nccl_emu.cpp, NCCL over MPI), with DT_EMU_DEVICES=4 so each
       rank has a device of its own, in both stream modes (DT_EMU_STREAMS immediate and
       deferred). There the checks that need the fake run too (DT_CUDA_EMU): a failing NCCL call
       is named, an asynchronous NCCL failure is reported and makes the group unusable, ranks
       that share a device are staged (use_nccl 0) or refused (use_nccl 1), and the NCCL path
       really carried the NCCL collectives (the fake counts its calls). */
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"
#include <cuda_runtime.h>
#ifdef DT_CUDA_EMU
#include <nccl.h>
#endif

static dt_ctx ctx;
static int R, N;
static dt_device where = DT_CUDA_DEVICE; /* of the tensors the collectives run on */

static dt_tensor dev(dt_dtype dt, int64_t n) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.device = where;
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
    d.device = DT_CPU; /* (the ctx default is the GPU) */
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
    d.device = DT_CPU; /* (the ctx default is the GPU) */
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
    for (k = 0; k < M; k++) { v[k] = (float)(R * 2 + (k % 5)); w[k] = (float)(N * (N - 1) + N * (k % 5)); }
    upload(&h, v);
    expect(path, "allreduce_bf16_sum", dt_comm_allreduce(c, &h, DT_REDUCE_SUM), &h, w);
    for (k = 0; k < M; k++) { v[k] = (float)((R * 37 + k) % 11) - 5.0f; w[k] = -1e30f; }
    for (j = 0; j < N; j++) for (k = 0; k < M; k++) if ((float)((j * 37 + k) % 11) - 5.0f > w[k]) w[k] = (float)((j * 37 + k) % 11) - 5.0f;
    upload(&a, v);
    expect(path, "allreduce_f32_max", dt_comm_allreduce(c, &a, DT_REDUCE_MAX), &a, w);
    /* send / recv around the ring, both posted before either is waited for (NCCL needs both) */
    {
        dt_comm_req *sq = NULL, *rq = NULL;
        dt_status st;
        for (k = 0; k < M; k++) { v[k] = (float)(R * 3 + k); w[k] = (float)(((R + N - 1) % N) * 3 + k); }
        upload(&a, v);
        st = dt_comm_isend(c, &a, (R + 1) % N, 5, &sq);
        if (!st) st = dt_comm_irecv(c, &blk, (R + N - 1) % N, 5, &rq);
        if (rq) { dt_status s2 = dt_comm_wait(rq); if (!st) st = s2; }
        if (sq) { dt_status s2 = dt_comm_wait(sq); if (!st) st = s2; }
        expect(path, "send_recv_ring", st, &blk, w);
    }
    /* all-gather and reduce-scatter */
    for (k = 0; k < M; k++) v[k] = (float)(R * 1000 + k);
    for (j = 0; j < N; j++) for (k = 0; k < M; k++) w[j * M + k] = (float)(j * 1000 + k);
    upload(&blk, v);
    expect(path, "allgather", dt_comm_allgather(c, &out, &blk), &out, w);
    { /* in place: in is this rank's own block of out (rank 0's starts at out's address, so a
         staged path that keyed "in place" on equal addresses alone overran in's buffer) */
        dt_tensor mine;
        int64_t off = (int64_t)R * M, len = M;
        dt_tensor_view(&ctx, &mine, &out, off, 1, &len);
        for (k = 0; k < (int64_t)N * M; k++) v[k] = k >= off && k < off + M ? (float)(R * 1000 + k - off) : -1.0f;
        upload(&out, v);
        expect(path, "allgather_in_place", dt_comm_allgather(c, &out, &mine), &out, w);
    }
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

#ifndef DT_CUDA_EMU /* on the emulator, bandwidth means nothing */
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
#endif

/* The statistics say which calls NCCL carried: after collectives(), 4 all-reduces (0 staged),
   and the table marks the row "(device, NCCL: 4)". */
static void stats_path(dt_comm *c, const char *path, int want) {
    dt_comm_stat st;
    char buf[2048], name[96];
    const char *row;
    dt_comm_stats(c, &st, DT_COLL_ALLREDUCE);
    dt_comm_stats_format(c, buf, sizeof buf);
    row = strstr(buf, "allreduce");
    snprintf(name, sizeof name, "%s_stats_count_the_nccl_allreduces", path);
    dt_test_check_all(name, st.nccl_calls == want && row &&
                      (want ? strstr(row, "(device, NCCL: 4)") != NULL : strstr(buf, "NCCL") == NULL),
                      "nccl_calls %lld of %lld (want %d); table: %.300s", (long long)st.nccl_calls,
                      (long long)st.calls, want, buf);
}

/* Bucketed all-reduce (dt_bucketer: three grads, buckets of 1 KB) of grads holding rank + 1:
   each ends as the average (N + 1) / 2. */
static void bucketed(dt_comm *c, const char *path) {
    dt_params ps;
    dt_param *p[3];
    dt_bucketer *b = NULL;
    dt_bucketer_desc bd;
    dt_status st = DT_OK;
    float *v = (float *)malloc(sizeof(float) * 300), *w = (float *)malloc(sizeof(float) * 300);
    int i, k;
    const int64_t sizes[3] = {300, 200, 100};
    memset(&ps, 0, sizeof ps);
    memset(&bd, 0, sizeof bd);
    bd.bucket_bytes = 1024;
    bd.first_bucket_bytes = 1024;
    for (i = 0; i < 3 && !st; i++) {
        dt_param_desc pd;
        char name[16];
        memset(&pd, 0, sizeof pd);
        snprintf(name, sizeof name, "p%d", i);
        pd.name = name;
        pd.device = where;
        pd.shape[0] = sizes[i];
        st = dt_params_add(&ctx, &ps, &p[i], &pd);
    }
    if (!st) st = dt_bucketer_create(c, &b, &ps, &bd);
    for (k = 0; k < 300; k++) { v[k] = (float)(R + 1); w[k] = (float)(N + 1) / 2.0f; }
    for (i = 2; i >= 0 && !st; i--) {
        upload(&p[i]->grad, v);
        st = dt_bucketer_mark_ready(b, p[i]);
    }
    if (!st) st = dt_bucketer_finish(b);
    for (i = 0; i < 3; i++) {
        char what[32];
        snprintf(what, sizeof what, "bucketer_avg_p%d", i);
        expect(path, what, st, st ? NULL : &p[i]->grad, w);
    }
    dt_bucketer_free(b);
    dt_params_free(&ctx, &ps);
    free(v);
    free(w);
}

/* Ranks that disagree on the size: every rank returns DT_ERR_COMM naming the calls, and the
   record of a device tensor on NCCL says so; the communicator stays usable. */
static void mismatch(dt_comm *c, const char *path, int on_nccl) {
    dt_tensor a = dev(DT_F32, R == 0 ? 64 : 32);
    char name[96];
    dt_status st = dt_comm_allreduce(c, &a, DT_REDUCE_SUM);
    const char *msg = dt_ctx_error(&ctx);
    int ok = st == DT_ERR_COMM && strstr(msg, "ranks disagree") &&
             (!on_nccl || strstr(msg, "(device, NCCL)")) && (on_nccl || !strstr(msg, "NCCL"));
    snprintf(name, sizeof name, "%s_mismatched_counts_named_on_every_rank", path);
    dt_test_check_all(name, ok, "status %s (want DT_ERR_COMM): %.200s", dt_status_name(st), msg);
    dt_tensor_free(&ctx, &a);
}

/* A producer queued on the ctx's own stream (dt_axpy, a kernel) right before the collective:
   the collective must see its result. Under DT_EMU_STREAMS=deferred the kernel runs only when
   something waits for it, so a collective not ordered after the ctx stream reads the old values. */
static void stream_order(dt_comm *c, const char *path) {
    enum { M = 256 };
    cudaStream_t cs = NULL;
    float v[M], w[M];
    dt_tensor a = dev(DT_F32, M), one = dev(DT_F32, M);
    dt_status st;
    int k;
    char name[64];
    if (cudaStreamCreate(&cs) != cudaSuccess) {
        dt_test_fail("stream_order", "cudaStreamCreate failed");
        return;
    }
    for (k = 0; k < M; k++) { v[k] = (float)(R * 10 + k); w[k] = (float)(10 * N * (N - 1) / 2 + N * k + N); }
    ctx.cuda_stream = cs;
    upload(&a, v);
    for (k = 0; k < M; k++) v[k] = 1.0f;
    upload(&one, v);
    st = dt_axpy(&ctx, &a, 1.0f, &one); /* a += 1 on the ctx stream */
    if (!st) st = dt_comm_allreduce(c, &a, DT_REDUCE_SUM);
    snprintf(name, sizeof name, "allreduce_after_kernel_on_ctx_stream");
    expect(path, name, st, &a, w);
    ctx.cuda_stream = NULL;
    cudaStreamDestroy(cs);
    dt_tensor_free(&ctx, &a);
    dt_tensor_free(&ctx, &one);
}

#ifdef DT_CUDA_EMU
/* A failing NCCL call (the fake fails it on every rank): the status names the call; the
   communicator stays usable. */
static void nccl_call_fails(dt_comm *c) {
    enum { M = 64 };
    float v[M], w[M];
    dt_tensor a = dev(DT_F32, M), in = dev(DT_F32, (int64_t)N * M), out = dev(DT_F32, (int64_t)N * M);
    dt_status st;
    int k;
    dt_emu_nccl_fail_next("ncclAllReduce", ncclInvalidArgument);
    st = dt_comm_allreduce(c, &a, DT_REDUCE_SUM);
    dt_test_check_all("nccl_failing_allreduce_names_ncclAllReduce",
                      st == DT_ERR_COMM && strstr(dt_ctx_error(&ctx), ": ncclAllReduce (allreduce on group nccl") &&
                          strstr(dt_ctx_error(&ctx), "invalid argument"),
                      "status %s (want DT_ERR_COMM): %.200s", dt_status_name(st), dt_ctx_error(&ctx));
    dt_emu_nccl_fail_next("ncclRecv", ncclInvalidUsage);
    st = dt_comm_alltoall(c, &out, &in);
    dt_test_check_all("nccl_failing_alltoall_names_ncclRecv",
                      st == DT_ERR_COMM && strstr(dt_ctx_error(&ctx), ": ncclRecv (alltoall on group nccl"),
                      "status %s (want DT_ERR_COMM): %.200s", dt_status_name(st), dt_ctx_error(&ctx));
    for (k = 0; k < M; k++) { v[k] = (float)(R + k); w[k] = (float)(N * (N - 1) / 2 + N * k); }
    upload(&a, v);
    expect("nccl", "allreduce_after_failed_calls", dt_comm_allreduce(c, &a, DT_REDUCE_SUM), &a, w);
    dt_tensor_free(&ctx, &a);
    dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out);
}

/* A blocking all-reduce on NCCL does not wait on the host: it returns once queued, and the ctx
   stream waits for it. Three in a row (each on the result of the one before): no counted sync in
   ctx->counters nor in the runtime's own count, the values right once dt_ctx_sync has waited,
   and the statistics and the observer see each call exactly once. Values are small integers:
   exact in any sum order. On a stream of the ctx's own: the emulator runs work on the legacy
   stream at once, so a wait queued there would be a hidden host wait. */
static int observed;
static void count_observed(const dt_comm *c, dt_coll kind, double bytes, double t0, double t1, void *user) {
    (void)c; (void)bytes; (void)t0; (void)t1; (void)user;
    if (kind == DT_COLL_ALLREDUCE) observed++;
}
static void nccl_blocking_stays_on_the_device(dt_comm *c) {
    enum { M = 300 };
    float v[M], w[M];
    dt_tensor a = dev(DT_F32, M);
    dt_comm_stat s0, s1;
    dt_emu_counters e0, e1;
    dt_status st = DT_OK;
    int k, i, seen;
    int64_t syncs;
    long long p = 1;
    cudaStream_t cs = NULL;
    if (cudaStreamCreate(&cs) != cudaSuccess) {
        dt_test_fail("nccl_blocking_stays_on_the_device", "cudaStreamCreate failed");
        return;
    }
    ctx.cuda_stream = cs;
    for (k = 0; k < M; k++) v[k] = (float)(R + k % 7);
    upload(&a, v);
    dt_comm_stats(c, &s0, DT_COLL_ALLREDUCE);
    dt_comm_set_observer(c, count_observed, NULL);
    observed = 0;
    dt_ctx_sync(&ctx);
    dt_ctx_counters_reset(&ctx);
    dt_emu_get_counters(&e0);
    for (i = 0; i < 3 && !st; i++) st = dt_comm_allreduce(c, &a, DT_REDUCE_SUM);
    syncs = ctx.counters.syncs;
    dt_emu_get_counters(&e1);
    dt_test_check_all("nccl_blocking_allreduce_returns_without_a_sync", st == DT_OK && syncs == 0 &&
                      e1.syncs == e0.syncs && ctx.counters.d2h_calls == 0, "status %s, ctx syncs %lld, runtime syncs "
                      "%lld, d2h calls %lld (want 0 each): %.200s", dt_status_name(st), (long long)syncs,
                      e1.syncs - e0.syncs, (long long)ctx.counters.d2h_calls, st ? dt_ctx_error(&ctx) : "");
    /* element k: the first sum is S = sum_r (r + k % 7), the second N S, the third N^2 S */
    for (i = 1; i < 3; i++) p *= N;
    for (k = 0; k < M; k++) w[k] = (float)(p * (long long)(N * (N - 1) / 2 + N * (k % 7)));
    if (!st) st = dt_ctx_sync(&ctx);
    expect("nccl", "blocking_allreduce_right_after_dt_ctx_sync", st, &a, w);
    seen = observed; /* whatever progress has finished so far: never more than the calls */
    dt_comm_stats(c, &s1, DT_COLL_ALLREDUCE);
    dt_test_check_all("nccl_blocking_allreduce_counted_once", s1.calls - s0.calls == 3 &&
                      s1.nccl_calls - s0.nccl_calls == 3 && seen <= 3 && observed == 3, "calls +%lld, nccl_calls "
                      "+%lld, observer %d then %d (want 3 each)", (long long)(s1.calls - s0.calls),
                      (long long)(s1.nccl_calls - s0.nccl_calls), seen, observed);
    dt_comm_set_observer(c, NULL, NULL);
    dt_tensor_free(&ctx, &a);
    ctx.cuda_stream = NULL;
    cudaStreamDestroy(cs);
}

/* An asynchronous NCCL failure (a lost peer): the blocking all-reduce returned once queued, so
   the next call on the group fails naming the collective, the group and NCCL's error; every later
   call is DT_ERR_STATE. (The ctx stream is one of its own, which waits behind the stuck
   collective; on the emulator's legacy stream the wait would block the host.) */
static void nccl_async_failure(dt_comm *c) {
    dt_tensor a = dev(DT_F32, 64);
    dt_status st, first;
    const char *e;
    cudaStream_t cs = NULL;
    if (cudaStreamCreate(&cs) != cudaSuccess) {
        dt_test_fail("nccl_async_failure", "cudaStreamCreate failed");
        return;
    }
    ctx.cuda_stream = cs;
    dt_emu_nccl_fail_async(ncclRemoteError);
    first = dt_comm_allreduce(c, &a, DT_REDUCE_SUM);
    st = dt_comm_broadcast(c, &a, 0); /* not a D2H copy: the ctx stream waits behind the stuck collective */
    e = dt_ctx_error(&ctx);
    dt_test_check_all("nccl_async_error_is_named_by_the_next_call", first == DT_OK && st == DT_ERR_COMM &&
                          strstr(e, "dt_comm_broadcast: an earlier blocking call on group nccl failed") &&
                          strstr(e, "allreduce(sum) of 64 x f32") && strstr(e, "ncclCommGetAsyncError") &&
                          strstr(e, "network error"),
                      "first call %s (want DT_OK), next %s (want DT_ERR_COMM): %.300s", dt_status_name(first),
                      dt_status_name(st), e);
    st = dt_comm_allreduce(c, &a, DT_REDUCE_SUM);
    dt_test_check_all("nccl_after_async_error_comm_is_unusable", st == DT_ERR_STATE,
                      "status %s (want DT_ERR_STATE): %.200s", dt_status_name(st), dt_ctx_error(&ctx));
    dt_tensor_free(&ctx, &a);
    ctx.cuda_stream = NULL;
    cudaStreamDestroy(cs); /* (its wait ends: the aborted collective lets go) */
}

/* ncclCommInitRank fails on every rank: every rank returns DT_ERR_COMM naming it (no hang), and
   the next device collective makes the communicator and works. */
static void nccl_init_fails(void) {
    dt_comm *c = NULL;
    dt_comm_desc d;
    dt_tensor a = dev(DT_F32, 64);
    float v[64], w[64];
    dt_status st;
    int k;
    memset(&d, 0, sizeof d);
    d.use_nccl = 1;
    d.name = "nccl_init";
    dt_comm_create_world(&ctx, &c, &d);
    if (N > 1) { /* a device send before any device collective: no NCCL communicator to use yet */
        dt_comm_req *rq = NULL;
        st = dt_comm_isend(c, &a, (R + 1) % N, 0, &rq);
        dt_test_check_all("nccl_send_before_first_collective_is_named", st == DT_ERR_STATE && !rq &&
                          strstr(dt_ctx_error(&ctx), "first collective on device tensors"),
                          "status %s (want DT_ERR_STATE): %.200s", dt_status_name(st), dt_ctx_error(&ctx));
        if (rq) dt_comm_wait(rq);
    }
    dt_emu_nccl_fail_next("ncclCommInitRank", ncclSystemError);
    st = dt_comm_allreduce(c, &a, DT_REDUCE_SUM);
    dt_test_check_all("nccl_failing_init_is_named_on_every_rank", st == DT_ERR_COMM &&
                      strstr(dt_ctx_error(&ctx), "ncclCommInitRank"), "status %s (want DT_ERR_COMM): %.200s",
                      dt_status_name(st), dt_ctx_error(&ctx));
    for (k = 0; k < 64; k++) { v[k] = (float)(R + k); w[k] = (float)(N * (N - 1) / 2 + N * k); }
    upload(&a, v);
    expect("nccl", "allreduce_after_failed_init", dt_comm_allreduce(c, &a, DT_REDUCE_SUM), &a, w);
    dt_comm_free(c);
    dt_tensor_free(&ctx, &a);
}

/* The fake NCCL itself, called directly: a communicator of the odd ranks only (rank 0 alone at
   np 1), its NCCL ranks in reverse order of the world's, made from a unique id while the other
   ranks do not call; an all-reduce on it; and NCCL's argument checks. */
static void fake_nccl(void) {
    int member = N == 1 || R % 2 == 1, sr = 0, sn = 0, nr = -1, ok_sum = 1, ok_args = 1;
    char why[300] = "", why_args[300] = "";
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, member ? 0 : MPI_UNDEFINED, R, &sub);
    if (member) {
        ncclUniqueId id;
        ncclComm_t comm = NULL;
        float h[8], *d = NULL, *d2 = NULL;
        cudaStream_t s;
        ncclResult_t r;
        int k;
        MPI_Comm_rank(sub, &sr);
        MPI_Comm_size(sub, &sn);
        if (sr == 0) ncclGetUniqueId(&id);
        MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, sub);
        r = ncclCommInitRank(&comm, sn, id, sn - 1 - sr);
        cudaStreamCreate(&s);
        cudaMalloc(&d, sizeof h);
        cudaMalloc(&d2, 2 * sizeof h);
        for (k = 0; k < 8; k++) h[k] = (float)(sn - 1 - sr + k);
        cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice);
        if (!r) r = ncclCommUserRank(comm, &nr);
        if (!r) r = ncclAllReduce(d, d, 8, ncclFloat32, ncclSum, comm, s);
        if (!r && cudaStreamSynchronize(s) != cudaSuccess) r = ncclUnhandledCudaError;
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        for (k = 0; k < 8 && !r; k++)
            if (h[k] != (float)(sn * (sn - 1) / 2 + sn * k)) ok_sum = 0;
        if (r || nr != sn - 1 - sr) ok_sum = 0;
        snprintf(why, sizeof why, "init/allreduce: %s, rank %d (want %d), [0] = %g", ncclGetErrorString(r), nr,
                 sn - 1 - sr, (double)h[0]);
        if (!r) {
            ncclResult_t got[6];
            got[0] = ncclAllReduce(h, d, 8, ncclFloat32, ncclSum, comm, s);                /* host sendbuff */
            got[1] = ncclAllReduce(d, d, 8, (ncclDataType_t)13, ncclSum, comm, s);         /* datatype */
            got[2] = ncclAllReduce(d, d, 8, ncclFloat32, (ncclRedOp_t)6, comm, s);         /* op (in the enums' range: C++) */
            got[3] = ncclBroadcast(d, d, 8, ncclFloat32, sn, comm, s);                     /* root */
            got[4] = ncclAllGather(d2 + 1, d2, 8 / sn, ncclFloat32, comm, s);             /* overlap, not in place */
            got[5] = ncclGroupEnd();                                                       /* no group */
            for (k = 0; k < 6; k++)
                if (got[k] != (k == 5 ? ncclInvalidUsage : ncclInvalidArgument)) ok_args = 0;
            snprintf(why_args, sizeof why_args, "results %d %d %d %d %d %d (want 4 4 4 4 4 5); last: %.120s", (int)got[0],
                     (int)got[1], (int)got[2], (int)got[3], (int)got[4], (int)got[5], ncclGetLastError(comm));
            if (ok_args && sn > 1 && ncclAllGather(d2 + (size_t)(sn - 1 - sr) * (8 / sn), d2, 8 / sn, ncclFloat32, comm,
                                                   s) != ncclSuccess) { /* the in-place form is fine */
                ok_args = 0;
                snprintf(why_args, sizeof why_args, "in-place all-gather refused: %.200s", ncclGetLastError(comm));
            }
            cudaStreamSynchronize(s);
            ncclCommDestroy(comm);
        }
        cudaFree(d);
        cudaFree(d2);
        cudaStreamDestroy(s);
        MPI_Comm_free(&sub);
    }
    dt_test_check_all("fake_nccl_comm_of_odd_ranks_in_reverse_order_sums", ok_sum, "%s", why);
    dt_test_check_all("fake_nccl_checks_arguments_as_nccl_does", ok_args, "%s", why_args);
}

/* Every rank on device 0: NCCL would refuse the group. use_nccl 0 stages it (values right, no
   NCCL communicator made); use_nccl 1 fails naming the ranks. */
static void shared_device(void) {
    dt_comm *sh = NULL;
    dt_comm_desc d;
    dt_tensor a;
    float v[64], w[64];
    int k, inits, reduces;
    dt_status st;
    cudaSetDevice(0);
    memset(&d, 0, sizeof d);
    d.name = "shared";
    dt_comm_create_world(&ctx, &sh, &d);
    a = dev(DT_F32, 64);
    for (k = 0; k < 64; k++) { v[k] = (float)(R + k); w[k] = (float)(N * (N - 1) / 2 + N * k); }
    upload(&a, v);
    inits = dt_emu_nccl_calls("ncclCommInitRank");
    reduces = dt_emu_nccl_calls("ncclAllReduce");
    expect("shared_gpu", "allreduce_staged", dt_comm_allreduce(sh, &a, DT_REDUCE_SUM), &a, w);
    dt_test_check_all("shared_gpu_makes_no_nccl_comm", dt_emu_nccl_calls("ncclCommInitRank") == inits &&
                      dt_emu_nccl_calls("ncclAllReduce") == reduces, "ncclCommInitRank calls %d -> %d, ncclAllReduce "
                      "%d -> %d", inits, dt_emu_nccl_calls("ncclCommInitRank"), reduces, dt_emu_nccl_calls("ncclAllReduce"));
    dt_comm_free(sh);
    sh = NULL;
    d.use_nccl = 1;
    d.name = "shared_required";
    dt_comm_create_world(&ctx, &sh, &d);
    st = dt_comm_allreduce(sh, &a, DT_REDUCE_SUM);
    dt_test_check_all("shared_gpu_with_use_nccl_1_is_named", st == DT_ERR_UNSUPPORTED &&
                      strstr(dt_ctx_error(&ctx), "share the GPU"), "status %s (want DT_ERR_UNSUPPORTED): %.200s",
                      dt_status_name(st), dt_ctx_error(&ctx));
    dt_comm_free(sh);
    dt_tensor_free(&ctx, &a);
}
#endif

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
    /* the reference: the same collectives on host tensors */
    where = DT_CPU;
    collectives(world, "host");
    bucketed(world, "host");
    where = DT_CUDA_DEVICE;
    memset(&d, 0, sizeof d);
    d.use_nccl = -1;
    d.name = "staged";
    dt_comm_create_world(&ctx, &staged, &d); /* a second world over the same processes, without NCCL */
    collectives(staged, "staged");
    stats_path(staged, "staged", 0);
    bucketed(staged, "staged");
    stream_order(staged, "staged");
    if (N > 1) mismatch(staged, "staged", 0);
    if (dt_comm_local_size(world) <= devices) {
        dt_comm *nccl = NULL;
#ifdef DT_CUDA_EMU
        int reduces = dt_emu_nccl_calls("ncclAllReduce"), inits = dt_emu_nccl_calls("ncclCommInitRank");
#endif
        memset(&d, 0, sizeof d);
        d.use_nccl = 1;
        d.name = "nccl";
        dt_comm_create_world(&ctx, &nccl, &d);
        collectives(nccl, "nccl");
        stats_path(nccl, "nccl", 4);
#ifdef DT_CUDA_EMU
        /* 4 all-reduces in collectives(): each one ncclAllReduce, and one communicator made */
        dt_test_check_all("nccl_path_carries_the_allreduces", dt_emu_nccl_calls("ncclAllReduce") - reduces == 4 &&
                          dt_emu_nccl_calls("ncclCommInitRank") - inits == 1, "ncclAllReduce calls %d (want 4), "
                          "ncclCommInitRank %d (want 1)", dt_emu_nccl_calls("ncclAllReduce") - reduces,
                          dt_emu_nccl_calls("ncclCommInitRank") - inits);
#endif
        bucketed(nccl, "nccl");
        stream_order(nccl, "nccl");
        if (N > 1) mismatch(nccl, "nccl", 1);
#ifdef DT_CUDA_EMU
        nccl_call_fails(nccl);
        nccl_blocking_stays_on_the_device(nccl);
        nccl_async_failure(nccl);
#endif
        dt_comm_free(nccl);
    } else
        dt_test_skip("nccl_collectives", "%d ranks share %d GPU(s) on this host; NCCL needs one GPU per rank",
                     dt_comm_local_size(world), devices);
#ifdef DT_CUDA_EMU
    fake_nccl();
    if (dt_comm_local_size(world) <= devices) nccl_init_fails();
    if (N > 1) shared_device();
#else
    if (N > 1) staged_throughput(staged);
#endif
    failed = dt_test_finish();
    dt_comm_free(staged);
    dt_comm_free(world);
    dt_ctx_shutdown(&ctx);
    return failed;
}
