// np: 2 3 4
/* tests/mpi_comm_fault.c - what dt_comm.h does when ranks misbehave: a rank that skips a
   collective is named by the others after the timeout (not a hang), the communicator then
   refuses further calls at once, a late rank learns it came too late; checking mode names a
   rank that calls a different collective or size, or passes bad arguments; a recv with no
   sender times out and leaves the communicator usable. Short timeouts (1 s) keep it quick. */
#define DT_IMPLEMENTATION
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
        recv_without_sender_times_out();
        skipped_collective_is_named();
    }
    failed = dt_test_finish();
    dt_comm_free(W);
    dt_ctx_shutdown(&ctx);
    return failed;
}
