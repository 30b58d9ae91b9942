// np: 2 3 4
/* tests/mpi_comm_mismatch.c - ranks that disagree about a collective: the last rank (the odd
   one) calls it with another size, dtype, op, root or collective than the others. With
   checking mode off and on, blocking and async, every rank must return DT_ERR_COMM naming both
   calls and the group, no rank's buffer may change (nothing was sent: never a half-summed
   result), and the communicator must still work. Under ASan (tests/run.sh runs an asan: build)
   this also proves that nothing is written out of bounds: 100000 vs 50000 f32 used to be a
   heap-buffer-overflow in the scratch block, 1000 vs 500 a half sum on one rank and an MPI
   abort on the other. Send/recv of different sizes: the recv fails, writes nothing, and the
   message does not linger to match a later recv. */
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"

static dt_ctx ctx;
static dt_comm *W;
static int R, N, ODD; /* world rank, size, the rank that disagrees (the last) */
static int CHECK;     /* checking mode of this round */

static dt_tensor make(dt_dtype dt, int64_t n, int salt) {
    dt_tensor t;
    dt_tensor_desc d;
    int64_t k;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.shape[0] = n;
    if (dt_tensor_create(&ctx, &t, &d)) memset(&t, 0, sizeof t);
    for (k = 0; k < t.numel; k++) {
        float v = (float)(R * 1000 + (k % 997) + salt);
        if (dt == DT_F32) ((float *)t.data)[k] = v;
        else if (dt == DT_F16) ((uint16_t *)t.data)[k] = dt_f32_to_f16(v / 64.0f);
        else if (dt == DT_I32) ((int32_t *)t.data)[k] = (int32_t)v;
    }
    return t;
}

/* A copy of t's bytes, to show afterwards that the failed call wrote nothing. */
static void *snap(const dt_tensor *t) {
    size_t b = dt_tensor_bytes(t);
    void *p = malloc(b ? b : 1);
    if (b) memcpy(p, t->data, b);
    return p;
}

static int unchanged(const dt_tensor *t, void *before) {
    int ok = memcmp(t->data, before, dt_tensor_bytes(t)) == 0;
    free(before);
    return ok;
}

/* After a mismatch the communicator must still work: a small all-reduce gives the rank sum. */
static int still_works(char *why, size_t n) {
    dt_tensor t = make(DT_F32, 7, 0);
    float want = 0;
    int r, ok;
    dt_status st;
    for (r = 0; r < N; r++) want += (float)(r * 1000 + 3);
    st = dt_comm_allreduce(W, &t, DT_REDUCE_SUM);
    ok = st == 0 && ((float *)t.data)[3] == want;
    if (!ok)
        snprintf(why, n, "the next allreduce: status %d, got %g want %g: %.150s", st, st ? 0.0 : (double)((float *)t.data)[3],
                 (double)want, dt_ctx_error(&ctx));
    dt_tensor_free(&ctx, &t);
    return ok;
}

/* Checks one failed call on every rank: DT_ERR_COMM, the message names both calls (the others'
   then the odd rank's) and the group, the buffers did not change, the comm works on. */
static void expect_named(const char *name, dt_status st, const char *even_call, const char *odd_call, int kept) {
    char full[160], why[300] = "";
    const char *msg = dt_ctx_error(&ctx);
    int ok = st == DT_ERR_COMM && strstr(msg, even_call) && strstr(msg, odd_call) && strstr(msg, "on group world");
    if (!ok) snprintf(why, sizeof why, "status %d: %.200s", st, msg);
    else if (!kept) ok = 0, snprintf(why, sizeof why, "a buffer changed although the call failed");
    else ok = still_works(why, sizeof why);
    snprintf(full, sizeof full, "%s_check_%s", name, CHECK ? "on" : "off");
    dt_test_check_all(full, ok, "%s", why);
}

/* all-reduce of `even` elements on most ranks and `odd` on the last, f32, sum */
static void allreduce_sizes(const char *name, int64_t even, int64_t odd) {
    dt_tensor t = make(DT_F32, R == ODD ? odd : even, 0);
    void *before = snap(&t);
    char e[64], o[64];
    dt_status st = dt_comm_allreduce(W, &t, DT_REDUCE_SUM);
    snprintf(e, sizeof e, "called allreduce(sum) of %lld x f32", (long long)even);
    snprintf(o, sizeof o, "called allreduce(sum) of %lld x f32", (long long)odd);
    expect_named(name, st, e, o, unchanged(&t, before));
    dt_tensor_free(&ctx, &t);
}

static void allreduce_dtype_and_op(void) {
    dt_tensor t = make(R == ODD ? DT_F16 : DT_F32, 1000, 1);
    void *before = snap(&t);
    dt_status st = dt_comm_allreduce(W, &t, DT_REDUCE_SUM);
    expect_named("allreduce_f32_vs_f16_is_named_on_every_rank", st, "allreduce(sum) of 1000 x f32",
                 "allreduce(sum) of 1000 x f16", unchanged(&t, before));
    dt_tensor_free(&ctx, &t);
    t = make(DT_F32, 300, 2);
    before = snap(&t);
    st = dt_comm_allreduce(W, &t, R == ODD ? DT_REDUCE_MAX : DT_REDUCE_SUM);
    expect_named("allreduce_sum_vs_max_is_named_on_every_rank", st, "allreduce(sum) of 300 x f32",
                 "allreduce(max) of 300 x f32", unchanged(&t, before));
    dt_tensor_free(&ctx, &t);
}

static void allreduce_f64_sizes(void) {
    double v[3] = {1.0 + R, 2.0, 3.0}, w[3];
    dt_status st;
    memcpy(w, v, sizeof v);
    st = dt_comm_allreduce_f64(W, v, R == ODD ? 2 : 3, DT_REDUCE_SUM);
    expect_named("allreduce_f64_3_vs_2_is_named_on_every_rank", st, "allreduce(sum) of 3 x f64",
                 "allreduce(sum) of 2 x f64", memcmp(v, w, sizeof v) == 0);
}

static void reduce_scatter_sizes(void) {
    int64_t m = R == ODD ? 500 : 1000;
    dt_tensor in = make(DT_F32, N * m, 3), out = make(DT_F32, m, 4);
    void *b1 = snap(&in), *b2 = snap(&out);
    char e[64], o[64];
    dt_status st = dt_comm_reduce_scatter(W, &out, &in, DT_REDUCE_SUM);
    int kept = unchanged(&in, b1);
    kept = unchanged(&out, b2) && kept;
    snprintf(e, sizeof e, "reduce_scatter(sum) of %lld x f32", (long long)(N * 1000));
    snprintf(o, sizeof o, "reduce_scatter(sum) of %lld x f32", (long long)(N * 500));
    expect_named("reduce_scatter_1000_vs_500_is_named_on_every_rank", st, e, o, kept);
    dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out);
}

static void allgather_sizes(void) {
    int64_t m = R == ODD ? 500 : 1000;
    dt_tensor in = make(DT_F32, m, 5), out = make(DT_F32, N * m, 6);
    void *b = snap(&out);
    dt_status st = dt_comm_allgather(W, &out, &in);
    expect_named("allgather_1000_vs_500_is_named_on_every_rank", st, "allgather of 1000 x f32", "allgather of 500 x f32",
                 unchanged(&out, b));
    dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out);
}

static void broadcast_sizes_and_roots(void) {
    dt_tensor t = make(DT_F32, R == ODD ? 500 : 1000, 7);
    void *b = snap(&t);
    char o[64];
    dt_status st = dt_comm_broadcast(W, &t, 0);
    expect_named("broadcast_1000_vs_500_is_named_on_every_rank", st, "broadcast(root 0) of 1000 x f32",
                 "broadcast(root 0) of 500 x f32", unchanged(&t, b));
    dt_tensor_free(&ctx, &t);
    t = make(DT_F32, 100000, 8);
    b = snap(&t);
    st = dt_comm_broadcast(W, &t, R == ODD ? ODD : 0);
    snprintf(o, sizeof o, "broadcast(root %d) of 100000 x f32", ODD);
    expect_named("broadcast_root_0_vs_last_is_named_on_every_rank", st, "broadcast(root 0) of 100000 x f32", o,
                 unchanged(&t, b));
    dt_tensor_free(&ctx, &t);
}

static void alltoall_sizes(void) {
    int64_t m = R == ODD ? 500 : 1000;
    dt_tensor in = make(DT_F32, N * m, 9), out = make(DT_F32, N * m, 10);
    void *b = snap(&out);
    char e[64], o[64];
    dt_status st = dt_comm_alltoall(W, &out, &in);
    snprintf(e, sizeof e, "alltoall of %lld x f32", (long long)(N * 1000));
    snprintf(o, sizeof o, "alltoall of %lld x f32", (long long)(N * 500));
    expect_named("alltoall_1000_vs_500_per_peer_is_named_on_every_rank", st, e, o, unchanged(&out, b));
    dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out);
}

/* all-to-allv counts may differ per rank; the dtype may not (f16 is half the bytes of f32) */
static void alltoallv_dtypes(void) {
    int64_t sc[64];
    int j;
    dt_dtype dt = R == ODD ? DT_F16 : DT_F32;
    dt_tensor in = make(dt, 100 * N, 11), out = make(dt, 100 * N, 12);
    void *b = snap(&out);
    dt_status st;
    for (j = 0; j < N; j++) sc[j] = 100;
    st = dt_comm_alltoallv(W, &out, NULL, &in, sc);
    expect_named("alltoallv_f32_vs_f16_is_named_on_every_rank", st, "alltoallv of f32", "alltoallv of f16", unchanged(&out, b));
    dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out);
}

static void different_collectives(void) {
    dt_tensor t = make(DT_F32, 1000, 13);
    void *b = snap(&t);
    dt_status st = R == ODD ? dt_comm_broadcast(W, &t, 0) : dt_comm_allreduce(W, &t, DT_REDUCE_SUM);
    expect_named("allreduce_vs_broadcast_is_named_on_every_rank", st, "allreduce(sum) of 1000 x f32",
                 "broadcast(root 0) of 1000 x f32", unchanged(&t, b));
    b = snap(&t);
    st = R == ODD ? dt_comm_barrier(W) : dt_comm_allreduce(W, &t, DT_REDUCE_SUM);
    expect_named("allreduce_vs_barrier_is_named_on_every_rank", st, "allreduce(sum) of 1000 x f32", "barrier",
                 unchanged(&t, b));
    dt_tensor_free(&ctx, &t);
}

/* async: the post may succeed (checking mode off: nothing waits at the post); the wait fails */
static void async_sizes(void) {
    enum { K = 4 };
    static const char *const names[K] = {"iallreduce", "ireduce_scatter", "iallgather", "ibroadcast"};
    int64_t m = R == ODD ? 50000 : 100000;
    int i;
    for (i = 0; i < K; i++) {
        dt_tensor a = make(DT_F32, N * m, 20 + i), b = make(DT_F32, (i == 2 ? N : 1) * m, 30 + i);
        void *sa = snap(&a), *sb = snap(&b);
        dt_comm_req *q = NULL;
        char name[96], e[64], o[64];
        int kept;
        dt_status st;
        switch (i) {
        case 0: st = dt_comm_iallreduce(W, &a, DT_REDUCE_SUM, &q); break;
        case 1: st = dt_comm_ireduce_scatter(W, &b, &a, DT_REDUCE_SUM, &q); break;
        case 2: {
            dt_tensor in;
            dt_tensor_view(&ctx, &in, &a, 0, 1, &m);
            st = dt_comm_iallgather(W, &b, &in, &q);
            break;
        }
        default: st = dt_comm_ibroadcast(W, &a, 0, &q); break;
        }
        if (!st) st = dt_comm_wait(q);
        else if (q) dt_comm_wait(q);
        kept = unchanged(&a, sa);
        kept = unchanged(&b, sb) && kept;
        snprintf(name, sizeof name, "%s_100000_vs_50000_is_named_on_every_rank", names[i]);
        snprintf(e, sizeof e, "of %lld x f32", (long long)((i == 2 ? 1 : N) * 100000));
        snprintf(o, sizeof o, "of %lld x f32", (long long)((i == 2 ? 1 : N) * 50000));
        expect_named(name, st, e, o, kept);
        dt_tensor_free(&ctx, &a);
        dt_tensor_free(&ctx, &b);
    }
}

/* Rank 0 sends, the last rank receives into a tensor of another size: the recv fails naming
   both sizes, t keeps its values, and the message is gone (the next recv gets the next one). */
static void recv_of_other_size(int64_t sent, int64_t room) {
    dt_tensor s = make(DT_F32, sent, 40), r = make(DT_F32, room, 41), good = make(DT_F32, 5, 42);
    void *before = snap(&r);
    char name[96], want[96], why[300] = "";
    int ok = 1, kept;
    dt_status st = DT_OK;
    if (R == 0) {
        st = dt_comm_send(W, &s, ODD, 4);
        if (!st) st = dt_comm_send(W, &good, ODD, 4);
        ok = st == 0;
        if (!ok) snprintf(why, sizeof why, "send: status %d: %.200s", st, dt_ctx_error(&ctx));
    }
    if (R == ODD) {
        st = dt_comm_recv(W, &r, 0, 4);
        kept = unchanged(&r, before);
        before = NULL;
        snprintf(want, sizeof want, "has %lld x f32; t has %lld x f32", (long long)sent, (long long)room);
        ok = st == DT_ERR_COMM && strstr(dt_ctx_error(&ctx), want) && strstr(dt_ctx_error(&ctx), "from rank 0 (tag 4)") && kept;
        if (!ok) snprintf(why, sizeof why, "recv: status %d, t %s: %.200s", st, kept ? "kept" : "changed", dt_ctx_error(&ctx));
        if (ok) { /* the wrong message was consumed: the next recv gets the next message */
            dt_tensor g2 = make(DT_F32, 5, 0);
            st = dt_comm_recv(W, &g2, 0, 4);
            ok = st == 0 && ((float *)g2.data)[2] == ((float *)good.data)[2] - (float)(ODD * 1000);
            if (!ok) snprintf(why, sizeof why, "the next recv: status %d, got %g: %.200s", st, (double)((float *)g2.data)[2],
                              dt_ctx_error(&ctx));
            dt_tensor_free(&ctx, &g2);
        }
    }
    free(before);
    snprintf(name, sizeof name, "recv_of_%lld_into_%lld_fails_and_writes_nothing", (long long)sent, (long long)room);
    dt_test_check_all(name, ok, "%s", why);
    dt_tensor_free(&ctx, &s);
    dt_tensor_free(&ctx, &r);
    dt_tensor_free(&ctx, &good);
}

int main(void) {
    dt_status st;
    dt_ctx_init(&ctx, NULL);
    st = dt_comm_create_world(&ctx, &W, NULL);
    if (st) {
        fprintf(stderr, "dt_comm_create_world: %s\n", dt_ctx_error(&ctx));
        return 1;
    }
    R = dt_comm_rank(W);
    N = dt_comm_size(W);
    ODD = N - 1;
    dt_comm_set_timeout(W, 20.0); /* a hang is a failure, not a 300 s wait */
    if (N < 2) {
        dt_test_skip("allreduce_1000_vs_500_f32_is_named_on_every_rank", "needs 2 ranks");
    } else {
        for (CHECK = 0; CHECK < 2; CHECK++) {
            dt_comm_set_check(W, CHECK);
            allreduce_sizes("allreduce_1000_vs_500_f32_is_named_on_every_rank", 1000, 500);
            allreduce_sizes("allreduce_100000_vs_50000_f32_is_named_on_every_rank", 100000, 50000);
            allreduce_sizes("allreduce_chunked_4m_vs_2m_f32_is_named_on_every_rank", 1 << 20, 1 << 19);
            allreduce_sizes("allreduce_inline_5_vs_3_f32_is_named_on_every_rank", 5, 3);
            /* the largest message that rides in the header against one element more */
            allreduce_sizes("allreduce_inline_vs_gather_f32_is_named_on_every_rank", (int64_t)dt__cm_inline_bytes(W) / 4,
                            (int64_t)dt__cm_inline_bytes(W) / 4 + 1);
            allreduce_dtype_and_op();
            allreduce_f64_sizes();
            reduce_scatter_sizes();
            allgather_sizes();
            broadcast_sizes_and_roots();
            alltoall_sizes();
            alltoallv_dtypes();
            different_collectives();
            async_sizes();
        }
        dt_comm_set_check(W, 0);
        recv_of_other_size(1000, 500);
        recv_of_other_size(500, 1000);
        recv_of_other_size(100000, 50000);
    }
    dt_comm_free(W); /* MPI stays up until exit: the checks below are still collective */
    dt_test_check_all("every_byte_comes_back", ctx.bytes_in_use == 0, "%lld bytes still held", (long long)ctx.bytes_in_use);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
