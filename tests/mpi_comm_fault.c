// np: 2 3 4
/* tests/mpi_comm_fault.c - what dt_comm.h does when ranks misbehave: a rank that skips a
   collective is named by the others after the timeout (not a hang), the communicator then
   refuses further calls at once, a late rank learns it came too late; checking mode names a
   rank that calls a different collective or size, or passes bad arguments; a recv with no
   sender times out and leaves the communicator usable; a rank that runs out of memory in a
   chunked all-reduce is named on every rank; all-to-allv counts that overflow int64 or MPI's
   int are named errors before anything is allocated or read; a rank late to every call of a
   step, each within its timeout, is named once the step's deadline passes
   (dt_comm_set_deadline). Short timeouts keep it quick.
   (Mismatched sizes, dtypes and collectives: tests/mpi_comm_mismatch.c.) */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"

static dt_ctx ctx;
static dt_comm *W;
static int R, N;

static dt_tensor make(int64_t n, float v) {
    dt_tensor t;
    dt_tensor_desc d;
    int64_t k;
    memset(&d, 0, sizeof d);
    d.shape[0] = n;
    if (dt_tensor_create(&ctx, &t, &d)) memset(&t, 0, sizeof t);
    for (k = 0; k < t.numel; k++) ((float *)t.data)[k] = v;
    return t;
}

static double now(void) { return MPI_Wtime(); }

/* The last rank skips an all-reduce; the others must name it within timeout + grace. */
static void skipped_collective_is_named(void) {
    dt_comm *tc = NULL;
    dt_tensor t = make(1000, 1.0f); /* stays alive to the end: MPI still holds it on the others */
    dt_status st = DT_OK, st2;
    char want[64], msg[DT_ERROR_MAX];
    double t0, took = 0, took2;
    int skipper = N - 1, ok;
    dt_comm_split(W, &tc, 0, R);
    dt_comm_set_timeout(tc, 1.0);
    dt_comm_barrier(tc);
    snprintf(want, sizeof want, "did not arrive: rank %d (", skipper);
    if (R != skipper) {
        t0 = now();
        st = dt_comm_allreduce(tc, &t, DT_REDUCE_SUM);
        took = now() - t0;
        snprintf(msg, sizeof msg, "%s", dt_ctx_error(&ctx));
        ok = st == DT_ERR_TIMEOUT && strstr(msg, want) && strstr(msg, "allreduce(sum) of 1000 x f32 at seq 2") &&
             strstr(msg, "group world.0 (size") && took < 3.0;
    } else
        ok = 1;
    dt_test_check_all("skipped_collective_names_the_missing_rank", ok, "status %d after %.2f s: %.120s", st, took,
                      R != skipper ? msg : "");
    if (R != skipper) {
        t0 = now();
        st2 = dt_comm_barrier(tc);
        took2 = now() - t0;
        ok = st2 == DT_ERR_STATE && !dt_comm_ok(tc) && took2 < 0.1 && strstr(dt_ctx_error(&ctx), "unusable");
        dt_test_check_all("after_timeout_calls_fail_fast_with_state", ok, "status %d after %.3f s: %.150s", st2, took2,
                          dt_ctx_error(&ctx));
    } else {
        /* the skipper comes late to the same collective: told, not hung, and not matched */
        t0 = now();
        st2 = dt_comm_allreduce(tc, &t, DT_REDUCE_SUM);
        took2 = now() - t0;
        ok = st2 == DT_ERR_STATE && strstr(dt_ctx_error(&ctx), "timed out at seq 2") && took2 < 0.5;
        dt_test_check_all("after_timeout_calls_fail_fast_with_state", ok, "late rank: status %d after %.3f s: %.150s", st2,
                          took2, dt_ctx_error(&ctx));
    }
    dt_comm_free(tc);
    /* t is not freed: the abandoned all-reduce may still own it (documented). */
}

static void pause_for(double s) {
    double end = now() + s;
    while (now() < end) {}
}

/* One rank 0.15 s late to each of 6 all-reduces: every call completes within its 2 s timeout,
   so without a deadline the run goes on (slowly); with a 0.5 s deadline (dt_comm_set_deadline
   on the world, which the group shares) every rank fails with a named timeout within about
   the deadline plus the report's grace. */
static void slow_rank_is_caught_by_the_deadline(void) {
    int slow = N - 1, round, ok, k;
    for (round = 0; round < 2; round++) {
        dt_comm *tc = NULL;
        dt_tensor t = make(1000, 1.0f); /* not freed: an abandoned all-reduce may still own it */
        dt_status st = DT_OK;
        double t0, took;
        dt_comm_split(W, &tc, 0, R);
        dt_comm_set_timeout(tc, 2.0);
        dt_comm_barrier(tc);
        if (round == 1) dt_comm_set_deadline(tc, 0.5);
        t0 = now();
        for (k = 0; k < 6 && !st; k++) {
            if (R == slow) pause_for(0.15);
            st = dt_comm_allreduce(tc, &t, DT_REDUCE_SUM);
        }
        took = now() - t0;
        if (round == 0)
            ok = st == DT_OK;
        else /* a punctual rank names the deadline, or the rank whose report of it reached it first (a
                rank slowed by the machine, as under ASan on a loaded VM, hears of another's before its own
                check: "was abandoned: rank K timed out on it", dt__cm_abandon) */
            ok = st == DT_ERR_TIMEOUT && took < 0.5 + 1.5 &&
                 (R == slow ? strstr(dt_ctx_error(&ctx), "allreduce(sum)") != NULL
                            : (strstr(dt_ctx_error(&ctx), "did not complete by the deadline set 0.5 s before") != NULL ||
                               strstr(dt_ctx_error(&ctx), "was abandoned: rank ") != NULL) &&
                                  strstr(dt_ctx_error(&ctx), "group world.0") != NULL);
        dt_test_check_all(round ? "slow_rank_is_named_when_the_step_deadline_passes"
                                : "slow_rank_within_each_calls_timeout_completes_without_a_deadline",
                          ok, "status %d after %.2f s, %d calls: %.160s", st, took, k, st ? dt_ctx_error(&ctx) : "");
        dt_comm_set_deadline(W, 0);
        dt_comm_free(tc);
        if (round == 0) dt_tensor_free(&ctx, &t);
    }
    {
        dt_status st = dt_comm_set_deadline(W, -1.0);
        ok = st == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "seconds = -1");
        dt_test_check_all("negative_deadline_is_named", ok, "status %d: %s", st, dt_ctx_error(&ctx));
    }
}

static void checking_mode_names_the_odd_rank(void) {
    dt_comm *tk = NULL;
    dt_tensor a = make(200, (float)R), small = make(100, 1.0f);
    dt_status st;
    char want[96];
    int odd = N - 1, ok, r;
    dt_comm_split(W, &tk, 0, R);
    dt_comm_set_timeout(tk, 5.0);
    dt_comm_set_check(tk, 1);
    /* a different size */
    st = dt_comm_allreduce(tk, R == odd ? &small : &a, DT_REDUCE_SUM);
    snprintf(want, sizeof want, "rank %d called allreduce(sum) of 100 x f32", odd);
    ok = st == DT_ERR_COMM && strstr(dt_ctx_error(&ctx), want) && strstr(dt_ctx_error(&ctx), "allreduce(sum) of 200 x f32");
    dt_test_check_all("checking_mode_names_rank_with_other_size", ok, "status %d: %.150s", st, dt_ctx_error(&ctx));
    /* a different collective */
    st = R == odd ? dt_comm_broadcast(tk, &a, 0) : dt_comm_allreduce(tk, &a, DT_REDUCE_MAX);
    snprintf(want, sizeof want, "rank %d called broadcast(root 0) of 200 x f32", odd);
    ok = st == DT_ERR_COMM && strstr(dt_ctx_error(&ctx), want) && strstr(dt_ctx_error(&ctx), "allreduce(max) of 200 x f32");
    dt_test_check_all("checking_mode_names_rank_with_other_collective", ok, "status %d: %.150s", st, dt_ctx_error(&ctx));
    /* bad arguments on one rank: it reports its own error, the others name it */
    st = dt_comm_allreduce(tk, R == odd ? NULL : &a, DT_REDUCE_SUM);
    snprintf(want, sizeof want, "rank %d called allreduce with invalid arguments", odd);
    ok = R == odd ? st == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "t is NULL") != NULL
                  : st == DT_ERR_COMM && strstr(dt_ctx_error(&ctx), want) != NULL;
    dt_test_check_all("checking_mode_names_rank_with_bad_arguments", ok, "status %d: %.150s", st, dt_ctx_error(&ctx));
    /* nothing was sent: the communicator works on */
    st = dt_comm_allreduce(tk, &a, DT_REDUCE_SUM);
    for (ok = st == 0, r = 0; ok && r < 200; r++) ok = ((float *)a.data)[r] == (float)(N * (N - 1) / 2);
    dt_test_check_all("checking_mode_comm_usable_after_mismatch", ok, "status %d: %.150s, a[0] = %g", st, dt_ctx_error(&ctx),
                      (double)((float *)a.data)[0]);
    dt_comm_free(tk);
    dt_tensor_free(&ctx, &a);
    dt_tensor_free(&ctx, &small);
}

static void recv_without_sender_times_out(void) {
    dt_comm *tp = NULL;
    dt_tensor t = make(10, 0.0f);
    dt_status st = DT_OK;
    int ok = 1;
    dt_comm_split(W, &tp, 0, R);
    dt_comm_set_timeout(tp, 1.0);
    if (R == 0) {
        st = dt_comm_recv(tp, &t, N - 1, 9);
        ok = st == DT_ERR_TIMEOUT && strstr(dt_ctx_error(&ctx), "from rank") && strstr(dt_ctx_error(&ctx), "(tag 9)") && dt_comm_ok(tp);
    }
    dt_test_check_all("recv_without_sender_times_out_naming_peer_and_tag", ok, "status %d: %.150s", st, dt_ctx_error(&ctx));
    st = dt_comm_barrier(tp);
    dt_test_check_all("comm_usable_after_p2p_timeout", st == 0, "status %d: %.150s", st, dt_ctx_error(&ctx));
    dt_comm_free(tp);
    dt_tensor_free(&ctx, &t);
}

/* ---- running out of memory: a ctx whose allocator fails its N-th allocation on the last rank */

static int fail_at = -1; /* allocations left before the failing one; -1: never fail */
static void *fail_alloc(size_t n, void *u) {
    (void)u;
    if (fail_at == 0) {
        fail_at = -1;
        return NULL;
    }
    if (fail_at > 0) fail_at--;
    return malloc(n);
}
static void fail_release(void *p, void *u) {
    (void)u;
    free(p);
}

/* A chunked all-reduce (4 MB: 4 chunks) with the k-th allocation on the last rank failing, for
   every k until the call needs no more: the failing rank returns DT_ERR_OOM, the others a named
   error (DT_ERR_COMM: the header said the rank could not take part; DT_ERR_TIMEOUT when not even
   the header could be made), nothing crashes or writes freed memory (ASan), the failing rank
   gets every byte back, and after a header-announced failure the group still works. It used to
   free the buffers of the chunks in flight when one chunk could not be allocated. */
static void out_of_memory_in_chunked_allreduce(void) {
    dt_ctx fctx;
    dt_ctx_desc cd;
    dt_comm *fw = NULL;
    dt_tensor t = make(1 << 20, 1.0f);
    int k, ok = 1, done = 0, victim = N - 1;
    char why[300] = "";
    memset(&cd, 0, sizeof cd);
    cd.allocator.alloc_fn = fail_alloc;
    cd.allocator.release_fn = fail_release;
    dt_ctx_init(&fctx, &cd);
    dt_comm_create_world(&fctx, &fw, NULL);
    for (k = 0; k < 40 && ok && !done; k++) {
        dt_comm *g = NULL;
        size_t before = fctx.bytes_in_use;
        dt_status st, st2;
        int64_t j;
        double any, timed_out, all_ok;
        dt_comm_split(fw, &g, 0, R);
        dt_comm_set_timeout(g, 0.5);
        for (j = 0; j < t.numel; j++) ((float *)t.data)[j] = (float)(R + 1);
        if (R == victim) fail_at = k;
        st = dt_comm_allreduce(g, &t, DT_REDUCE_SUM);
        fail_at = -1;
        /* the verdicts of all ranks, so that every rank takes the same branches below */
        any = st != 0;
        timed_out = st == DT_ERR_TIMEOUT;
        dt_comm_allreduce_f64(W, &any, 1, DT_REDUCE_MAX);
        dt_comm_allreduce_f64(W, &timed_out, 1, DT_REDUCE_MAX);
        if (any == 0) {
            done = 1;
            ok = ((float *)t.data)[77] == (float)(N * (N + 1) / 2);
            if (!ok) snprintf(why, sizeof why, "k %d: no failure but t[77] = %g", k, (double)((float *)t.data)[77]);
        } else if (R == victim) {
            ok = st == DT_ERR_OOM;
            if (!ok) snprintf(why, sizeof why, "k %d: victim status %d: %.200s", k, st, dt_ctx_error(&fctx));
        } else {
            char want[64];
            snprintf(want, sizeof want, "rank %d could not take part (out of memory)", victim);
            /* the first allocation is the header itself: without one nothing was sent, and the
               others time out naming the rank; every later one is announced in the header */
            ok = k == 0 ? st == DT_ERR_TIMEOUT && strstr(dt_ctx_error(&fctx), "did not arrive")
                        : st == DT_ERR_COMM && strstr(dt_ctx_error(&fctx), want);
            if (!ok) snprintf(why, sizeof why, "k %d: status %d: %.200s", k, st, dt_ctx_error(&fctx));
        }
        if (any != 0 && timed_out == 0) { /* announced in the header: the group works on */
            for (j = 0; j < t.numel; j++) ((float *)t.data)[j] = (float)(R + 1);
            st2 = dt_comm_allreduce(g, &t, DT_REDUCE_SUM);
            if (ok && !(st2 == 0 && ((float *)t.data)[5] == (float)(N * (N + 1) / 2))) {
                ok = 0;
                snprintf(why, sizeof why, "k %d: the next allreduce: status %d: %.200s", k, st2, dt_ctx_error(&fctx));
            }
        }
        dt_comm_free(g);
        if (ok && R == victim && fctx.bytes_in_use != before) {
            ok = 0;
            snprintf(why, sizeof why, "k %d: %lld bytes still held after the group was freed", k,
                     (long long)(fctx.bytes_in_use - before));
        }
        all_ok = ok;
        dt_comm_allreduce_f64(W, &all_ok, 1, DT_REDUCE_MIN);
        if (all_ok == 0 && ok) snprintf(why, sizeof why, "k %d: fine here, not on another rank", k);
        ok = all_ok != 0 && ok;
        if (all_ok == 0) break;
    }
    if (ok && !done) ok = 0, snprintf(why, sizeof why, "still failing after %d allocations", k);
    dt_test_check_all("out_of_memory_in_chunked_allreduce_is_named_on_every_rank", ok, "%s (%d allocations tried)", why, k);
    dt_tensor_free(&ctx, &t);
    dt_comm_free(fw);
    dt_ctx_shutdown(&fctx);
}

/* ---- all-to-allv counts that overflow: named errors before anything is allocated or sent */

/* A tensor of `numel` u8 that claims more than its buffer holds: the checks must fire before
   anything reads it (ASan would see a read past buf). */
static dt_tensor fake_u8(void *buf, int64_t numel) {
    dt_tensor t;
    memset(&t, 0, sizeof t);
    t.data = buf;
    t.dtype = DT_U8;
    t.device = DT_CPU;
    t.ndim = 1;
    t.shape[0] = numel;
    t.numel = numel;
    return t;
}

static void alltoallv_counts_that_overflow(void) {
    static unsigned char in_buf[64];
    unsigned char out_buf[64]; /* on the stack: far from in_buf, so the claimed sizes do not overlap */
    int64_t sc[64];
    int j, ok;
    dt_status st;
    dt_tensor in = fake_u8(in_buf, (int64_t)1 << 30), out = fake_u8(out_buf, 64);
    /* every rank's counts are wrong in the same way: each fails by itself, before entering */
    for (j = 0; j < N; j++) sc[j] = INT64_MAX;
    st = dt_comm_alltoallv(W, &out, NULL, &in, sc);
    ok = st == DT_ERR_SHAPE && strstr(dt_ctx_error(&ctx), "send_counts[0] = 9223372036854775807; in has only 1073741824");
    dt_test_check_all("alltoallv_send_count_past_int64_is_named", ok, "status %d: %.200s", st, dt_ctx_error(&ctx));
    for (j = 0; j < N; j++) sc[j] = ((int64_t)1 << 29) + 1; /* each fits in, two of them do not */
    st = dt_comm_alltoallv(W, &out, NULL, &in, sc);
    ok = st == DT_ERR_SHAPE && strstr(dt_ctx_error(&ctx), "send_counts[0..1] add up to 1073741826 elements already; in "
                                      "has only 1073741824");
    dt_test_check_all("alltoallv_send_counts_summing_past_in_are_named", ok, "status %d: %.200s", st, dt_ctx_error(&ctx));
    /* every rank sends 2^30 elements to rank 0: rank 0 would receive N x 2^30 > INT_MAX */
    for (j = 0; j < N; j++) sc[j] = j == 0 ? (int64_t)1 << 30 : 0;
    st = dt_comm_alltoallv(W, &out, NULL, &in, sc);
    {
        char want[96];
        snprintf(want, sizeof want, "rank 0 would receive %lld elements in all", (long long)N << 30);
        ok = st == (R == 0 ? DT_ERR_UNSUPPORTED : DT_ERR_COMM) && strstr(dt_ctx_error(&ctx), want) &&
             strstr(dt_ctx_error(&ctx), "at most 2147483647");
    }
    dt_test_check_all("alltoallv_receiving_past_int_max_is_named_on_every_rank", ok, "status %d: %.200s", st,
                      dt_ctx_error(&ctx));
    st = dt_comm_barrier(W);
    dt_test_check_all("alltoallv_overflow_leaves_the_comm_usable", st == 0 && dt_comm_ok(W), "status %d: %.200s", st,
                      dt_ctx_error(&ctx));
}

int main(void) {
    dt_status st;
    int failed;
    dt_ctx_init(&ctx, NULL);
    st = dt_comm_create_world(&ctx, &W, NULL);
    if (st) {
        fprintf(stderr, "dt_comm_create_world: %s\n", dt_ctx_error(&ctx));
        return 1;
    }
    R = dt_comm_rank(W);
    N = dt_comm_size(W);
    if (N < 2) {
        dt_test_skip("skipped_collective_names_the_missing_rank", "needs 2 ranks");
    } else {
        checking_mode_names_the_odd_rank();
        alltoallv_counts_that_overflow();
        out_of_memory_in_chunked_allreduce();
        recv_without_sender_times_out();
        slow_rank_is_caught_by_the_deadline();
        skipped_collective_is_named();
    }
    failed = dt_test_finish();
    dt_comm_free(W);
    dt_ctx_shutdown(&ctx);
    return failed;
}
