// np: 4 6 8
// asan np: 4 6
/* tests/mpi_comm_hier.c - the host-aware all-reduce (dt_comm.h, "Across hosts") on hosts
   modelled with desc.host_size (every k consecutive world ranks one host): what rank r
   contributes at element i is a pure function of (r, i), so each rank computes both orders
   dt promises in f32 itself: host by host (each host's ranks in rank order, then the hosts'
   partial sums in host order) where the group spans hosts with the same number of ranks (> 1)
   on each, rank order otherwise and with hier = -1; and compares bitwise. Every size takes the
   same order (inline, gather, the two-level transport, chunks), so a bucket equals one call per
   tensor and reduce-scatter + all-gather equals all-reduce; integers, max and min equal the flat
   result; bf16 keeps rank order. Also: async forms mixed with flat ones, split groups (hosts,
   ranks per host), and bad settings named. */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_test.h"

static dt_ctx ctx;
static int R, N; /* world rank and size */

static float val_of(int r, int64_t i, int salt) {
    /* magnitudes that differ by 2^10, so that the two orders round differently */
    float f = dt_rng_normal((uint64_t)(7000 + salt), (uint64_t)r, (uint64_t)i);
    return (r % 3 == 0 ? 1024.0f : 1.0f) * f;
}

/* val_of, remembered: every rank computes every rank's values for its expected sums, so without
   this the checks cost N^2 normals per element: 8 ranks on 2 cores took 44.5 s, now 14.4 s */
enum { SALTS = 128 };
static float *memo[SALTS]; /* memo[salt][i * N + r] */
static int64_t memo_n[SALTS];
static float val(int r, int64_t i, int salt) {
    if (salt < 0 || salt >= SALTS || i < 0) return val_of(r, i, salt);
    if (i >= memo_n[salt]) {
        int64_t n = memo_n[salt] * 2 > i + 4096 ? memo_n[salt] * 2 : i + 4096, j;
        float *m = (float *)realloc(memo[salt], (size_t)n * (size_t)N * sizeof *m);
        int q;
        if (!m) return val_of(r, i, salt);
        for (j = memo_n[salt]; j < n; j++)
            for (q = 0; q < N; q++) m[j * N + q] = val_of(q, j, salt);
        memo[salt] = m;
        memo_n[salt] = n;
    }
    return memo[salt][i * N + r];
}
static void memo_free(void) {
    int s;
    for (s = 0; s < SALTS; s++) free(memo[s]);
}

static dt_tensor make(dt_dtype dt, int64_t n) {
    dt_tensor t;
    dt_tensor_desc d;
    memset(&d, 0, sizeof d);
    d.dtype = dt;
    d.shape[0] = n;
    if (dt_tensor_create(&ctx, &t, &d)) memset(&t, 0, sizeof t);
    return t;
}

/* The sum of ranks[0..n) at element i, left to right in f32 (as dt adds: (x0 + x1) + x2 ...). */
static float fold(const int *ranks, int n, int64_t i, int salt) {
    float a = val(ranks[0], i, salt);
    int j;
    for (j = 1; j < n; j++) a = a + val(ranks[j], i, salt);
    return a;
}

/* ranks: the group's world ranks in group order; host k = world rank / hs (hs 0: one host).
   Host order when the hosts are > 1 with the same count > 1 on each, else rank order. */
static float expect(const int *ranks, int n, int hs, int64_t i, int salt, int avg, int flat) {
    int hosts[64], cnt[64] = {0}, by[64][64], H = 0, k, j, L, same = 1;
    float part[64], a;
    for (j = 0; j < n; j++) {
        int h = hs ? ranks[j] / hs : 0;
        for (k = 0; k < H && hosts[k] != h; k++) {}
        if (k == H) {
            hosts[H] = h;
            cnt[H++] = 0;
        }
        by[k][cnt[k]++] = ranks[j];
    }
    L = cnt[0];
    for (k = 1; k < H; k++) same = same && cnt[k] == L;
    if (flat || H < 2 || L < 2 || !same) a = fold(ranks, n, i, salt);
    else {
        for (k = 0; k < H; k++) part[k] = fold(by[k], L, i, salt);
        a = part[0];
        for (k = 1; k < H; k++) a = a + part[k];
    }
    return avg ? a / (float)n : a;
}

/* t (count elements from element base) against expect(); why gets the first difference */
static int check(const dt_tensor *t, const int *ranks, int n, int hs, int64_t base, int salt, int avg, int flat,
                 char *why, size_t size) {
    int64_t i;
    for (i = 0; i < t->numel; i++) {
        float want = expect(ranks, n, hs, base + i, salt, avg, flat), got = ((const float *)t->data)[i];
        if (memcmp(&want, &got, sizeof got) != 0) {
            snprintf(why, size, "element %lld: %.9g, want %.9g (%s order)", (long long)(base + i), got, want,
                     flat ? "rank" : "host");
            return 0;
        }
    }
    return 1;
}

static dt_status fill(dt_comm *c, dt_tensor *t, int64_t base, int salt) {
    int64_t i;
    (void)c;
    for (i = 0; i < t->numel; i++) ((float *)t->data)[i] = val(R, base + i, salt);
    return DT_OK;
}

static dt_comm *world(int hs, int hier) {
    dt_comm_desc d;
    dt_comm *w = NULL;
    memset(&d, 0, sizeof d);
    d.host_size = hs;
    d.hier = hier;
    if (dt_comm_create_world(&ctx, &w, &d)) fprintf(stderr, "dt_comm_create_world: %s\n", dt_ctx_error(&ctx));
    return w;
}

/* f32 sum and avg at every size (inline, gather, two-level, chunked), hier auto, on and off */
static void allreduce_orders(int hs) {
    static const int64_t sizes[] = {5, 1000, 30011, 400009};
    int ranks[64], j, mode, s, avg, ok = 1, differ = 0;
    char why[200] = "", name[96];
    for (j = 0; j < N; j++) ranks[j] = j;
    for (mode = -1; mode <= 1; mode++) {
        dt_comm *w = world(hs, mode);
        ok = w != NULL;
        for (s = 0; s < 4 && ok; s++)
            for (avg = 0; avg < 2 && ok; avg++) {
                dt_tensor t = make(DT_F32, sizes[s]);
                dt_status st = fill(w, &t, 0, s);
                if (!st) st = dt_comm_allreduce(w, &t, avg ? DT_REDUCE_AVG : DT_REDUCE_SUM);
                if (st) {
                    snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx));
                    ok = 0;
                } else
                    ok = check(&t, ranks, N, hs, 0, s, avg, mode < 0, why, sizeof why);
                if (mode == 0 && s == 3) { /* the two orders really differ on these values */
                    int64_t i;
                    for (i = 0; i < 1000; i++) {
                        float a = expect(ranks, N, hs, i, s, avg, 0), b = expect(ranks, N, hs, i, s, avg, 1);
                        differ += memcmp(&a, &b, sizeof a) != 0;
                    }
                }
                if (!ok) snprintf(why + strlen(why), sizeof why - strlen(why), " (size %lld, %s)",
                                  (long long)sizes[s], avg ? "avg" : "sum");
                dt_tensor_free(&ctx, &t);
            }
        if (w) dt_comm_free(w);
        snprintf(name, sizeof name, "allreduce_f32_hosts_of_%d_hier_%s_%s_order_bitwise", hs,
                 mode < 0 ? "off" : mode ? "on" : "auto", mode >= 0 && hs > 1 && hs < N && N % hs == 0 ? "host" : "rank");
        dt_test_check_all(name, ok, "%s", why);
    }
    if (hs && hs < N && N % hs == 0 && hs > 1)
        dt_test_check_all("host_and_rank_orders_differ_on_the_test_values", differ > 0,
                          "%d of 1000 elements differ: the test could not tell the orders apart", differ);
}

/* integers, max and min: the same as rank order; bf16 keeps rank order (summed in f32, rounded once) */
static void other_types_and_ops(int hs) {
    dt_comm *w = world(hs, 1);
    int ok = w != NULL, k;
    char why[200] = "";
    int64_t n = 20011, i;
    for (k = 0; k < 4 && ok; k++) {
        dt_tensor t = make(k == 0 ? DT_I32 : k == 3 ? DT_BF16 : DT_F32, n);
        dt_reduce_op op = k == 1 ? DT_REDUCE_MAX : k == 2 ? DT_REDUCE_MIN : DT_REDUCE_SUM;
        for (i = 0; i < n; i++) {
            float v = val(R, i, 50 + k);
            if (k == 0) ((int32_t *)t.data)[i] = (int32_t)(v * 1e4f);
            else if (k == 3) ((uint16_t *)t.data)[i] = dt_f32_to_bf16(v);
            else ((float *)t.data)[i] = v;
        }
        if (dt_comm_allreduce(w, &t, op)) {
            snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx));
            ok = 0;
        }
        for (i = 0; i < n && ok; i++) {
            int r;
            if (k == 0) {
                uint32_t a = 0;
                for (r = 0; r < N; r++) a += (uint32_t)(int32_t)(val(r, i, 50 + k) * 1e4f);
                ok = ((int32_t *)t.data)[i] == (int32_t)a;
            } else if (k == 3) {
                float a = dt_bf16_to_f32(dt_f32_to_bf16(val(0, i, 50 + k)));
                for (r = 1; r < N; r++) a = a + dt_bf16_to_f32(dt_f32_to_bf16(val(r, i, 50 + k)));
                ok = ((uint16_t *)t.data)[i] == dt_f32_to_bf16(a);
            } else {
                float a = val(0, i, 50 + k);
                for (r = 1; r < N; r++) {
                    float v = val(r, i, 50 + k);
                    a = k == 1 ? (v > a ? v : a) : (v < a ? v : a);
                }
                ok = ((float *)t.data)[i] == a;
            }
            if (!ok) snprintf(why, sizeof why, "%s at element %lld", k == 0 ? "i32 sum" : k == 1 ? "max" : k == 2 ? "min" : "bf16 sum",
                              (long long)i);
        }
        dt_tensor_free(&ctx, &t);
    }
    if (w) dt_comm_free(w);
    {
        char name[96];
        snprintf(name, sizeof name, "hosts_of_%d_i32_max_min_bf16_equal_rank_order", hs);
        dt_test_check_all(name, ok, "%s", why);
    }
}

/* reduce-scatter + all-gather = all-reduce; async two-level, gather and flat reduce-scatter in
   flight together, waited in reverse; a bucketer's buckets = one all-reduce per tensor */
static void forms_agree(int hs) {
    dt_comm *w = world(hs, 0);
    int ranks[64], j, ok = w != NULL;
    char why[200] = "";
    int64_t m = 7001;
    dt_status st = DT_OK;
    for (j = 0; j < N; j++) ranks[j] = j;
    if (ok) {
        dt_tensor in = make(DT_F32, m * N), part = make(DT_F32, m), all = make(DT_F32, m * N);
        st = fill(w, &in, 0, 9);
        if (!st) st = dt_comm_reduce_scatter(w, &part, &in, DT_REDUCE_SUM);
        if (!st) st = dt_comm_allgather(w, &all, &part);
        ok = !st && check(&all, ranks, N, hs, 0, 9, 0, 0, why, sizeof why);
        if (st) snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx));
        dt_tensor_free(&ctx, &in);
        dt_tensor_free(&ctx, &part);
        dt_tensor_free(&ctx, &all);
    }
    {
        char name[96];
        snprintf(name, sizeof name, "hosts_of_%d_reduce_scatter_then_allgather_equals_host_order", hs);
        dt_test_check_all(name, ok, "%s", why);
    }
    if (w) { /* async */
        dt_tensor a = make(DT_F32, 300007), b = make(DT_F32, 600), in = make(DT_F32, 4001 * N), part = make(DT_F32, 4001);
        dt_comm_req *qa = NULL, *qb = NULL, *qc = NULL;
        st = fill(w, &a, 0, 11);
        if (!st) st = fill(w, &b, 0, 12);
        if (!st) st = fill(w, &in, 0, 13);
        if (!st) st = dt_comm_iallreduce(w, &a, DT_REDUCE_AVG, &qa);
        if (!st) st = dt_comm_iallreduce(w, &b, DT_REDUCE_SUM, &qb);
        if (!st) st = dt_comm_ireduce_scatter(w, &part, &in, DT_REDUCE_SUM, &qc);
        if (!st) st = dt_comm_wait(qc);
        if (!st) st = dt_comm_wait(qb);
        if (!st) st = dt_comm_wait(qa);
        ok = !st && check(&a, ranks, N, hs, 0, 11, 1, 0, why, sizeof why) &&
             check(&b, ranks, N, hs, 0, 12, 0, 0, why, sizeof why) &&
             check(&part, ranks, N, hs, (int64_t)R * 4001, 13, 0, 0, why, sizeof why);
        if (st) snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx));
        dt_tensor_free(&ctx, &a);
        dt_tensor_free(&ctx, &b);
        dt_tensor_free(&ctx, &in);
        dt_tensor_free(&ctx, &part);
        {
            char name[96];
            snprintf(name, sizeof name, "hosts_of_%d_async_waited_in_reverse_bitwise", hs);
            dt_test_check_all(name, ok, "%s", why);
        }
    }
    if (w) { /* bucketer */
        dt_params ps;
        dt_bucketer *bk = NULL;
        dt_bucketer_desc bd;
        int i, np = 12;
        memset(&ps, 0, sizeof ps);
        memset(&bd, 0, sizeof bd);
        st = DT_OK;
        for (i = 0; i < np && !st; i++) {
            dt_param_desc d;
            char name[16];
            memset(&d, 0, sizeof d);
            snprintf(name, sizeof name, "w%d", i);
            d.name = name;
            d.shape[0] = 1 + (int64_t)(dt_rng_uniform(5, 0, (uint64_t)i) * 9000);
            st = dt_params_add(&ctx, &ps, NULL, &d);
        }
        bd.bucket_bytes = 16 * 1024;
        bd.first_bucket_bytes = 4 * 1024;
        if (!st) st = dt_bucketer_create(w, &bk, &ps, &bd);
        for (i = 0; i < np && !st; i++) st = fill(w, &ps.items[i]->grad, 0, 100 + i);
        for (i = np - 1; i >= 0 && !st; i--) st = dt_bucketer_mark_ready(bk, ps.items[i]);
        if (!st) st = dt_bucketer_finish(bk);
        ok = !st;
        for (i = 0; i < np && ok; i++) ok = check(&ps.items[i]->grad, ranks, N, hs, 0, 100 + i, 1, 0, why, sizeof why);
        if (st) snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx));
        dt_bucketer_free(bk);
        dt_params_free(&ctx, &ps);
        {
            char name[96];
            snprintf(name, sizeof name, "hosts_of_%d_bucketer_avg_equals_host_order", hs);
            dt_test_check_all(name, ok, "%s", why);
        }
    }
    if (w) dt_comm_free(w);
}

/* split groups: their hosts and ranks per host, and the order of their sums */
static void groups(int hs) {
    dt_comm *w = world(hs, 0), *g = NULL;
    int ranks[64], n = 0, j, ok = w != NULL, color;
    char why[200] = "";
    for (color = 0; color < 2 && ok; color++) { /* 0: even world ranks; 1: every rank, reversed */
        dt_status st = dt_comm_split(w, &g, color == 0 ? R % 2 : 0, color == 0 ? R : N - R);
        int want_h = 0, want_l = 0;
        n = 0;
        if (color == 0)
            for (j = R % 2; j < N; j += 2) ranks[n++] = j;
        else
            for (j = N - 1; j >= 0; j--) ranks[n++] = j;
        { /* hosts and ranks per host, from the world's host of each rank */
            int seen[64], cnt[64] = {0}, k;
            for (j = 0; j < n; j++) {
                int h = ranks[j] / hs;
                for (k = 0; k < want_h && seen[k] != h; k++) {}
                if (k == want_h) { seen[want_h] = h; cnt[want_h++] = 0; }
                cnt[k]++;
            }
            want_l = cnt[0];
            for (k = 1; k < want_h; k++)
                if (cnt[k] != cnt[0]) want_l = 0;
        }
        if (st || !g) {
            snprintf(why, sizeof why, "split: %s", dt_ctx_error(&ctx));
            ok = 0;
            break;
        }
        if (dt_comm_hosts(g) != want_h || dt_comm_ranks_per_host(g) != want_l) {
            snprintf(why, sizeof why, "group %d: hosts %d, ranks per host %d; want %d, %d", color, dt_comm_hosts(g),
                     dt_comm_ranks_per_host(g), want_h, want_l);
            ok = 0;
        }
        if (ok) {
            dt_tensor t = make(DT_F32, 50021);
            st = fill(g, &t, 0, 20 + color);
            if (!st) st = dt_comm_allreduce(g, &t, DT_REDUCE_SUM);
            ok = !st && check(&t, ranks, n, hs, 0, 20 + color, 0, 0, why, sizeof why);
            if (st) snprintf(why, sizeof why, "%s", dt_ctx_error(&ctx));
            dt_tensor_free(&ctx, &t);
        }
        dt_comm_free(g);
        g = NULL;
    }
    if (w) dt_comm_free(w);
    {
        char name[96];
        snprintf(name, sizeof name, "hosts_of_%d_split_groups_know_their_hosts_and_order", hs);
        dt_test_check_all(name, ok, "%s", why);
    }
}

/* ---------------------------------------------------------------- all-to-all in two levels */

/* What group rank src sends group rank dst (salt picks the case; big: blocks averaging past
   DT_COMM_A2A_HIER_MAX_BYTES in i32), about a fifth of them empty; and its element j, which
   names src, dst and j so that a block in the wrong place or order shows. */
static int64_t a2a_count(int src, int dst, int salt, int big) {
    uint64_t h = ((uint64_t)src * 2654435761u) ^ ((uint64_t)dst * 40503u) ^ ((uint64_t)salt * 97u);
    h = (h ^ (h >> 13)) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 29;
    if (h % 5 == 0) return 0;
    return big ? 6000 + (int64_t)(h % 5000) : 1 + (int64_t)(h % 300);
}
static int32_t a2a_val(int src, int dst, int64_t j) { return (int32_t)(((uint32_t)src << 22) | ((uint32_t)dst << 16) | (uint32_t)(j & 0xffff)); }

/* The ranks a host when the group of n ranks (world ranks `ranks`, hosts of hs) spans hosts
   with the same number of ranks, more than one, on each (the two-level path applies); else 0. */
static int spans_hosts_evenly(const int *ranks, int n, int hs) {
    int seen[64], cnt[64] = {0}, H = 0, j, k;
    for (j = 0; j < n; j++) {
        int h = hs ? ranks[j] / hs : 0;
        for (k = 0; k < H && seen[k] != h; k++) {}
        if (k == H) { seen[H] = h; cnt[H++] = 0; }
        cnt[k]++;
    }
    for (k = 1; k < H; k++)
        if (cnt[k] != cnt[0]) return 0;
    return H > 1 && cnt[0] > 1 ? cnt[0] : 0;
}

/* One alltoallv (i32 or bf16) and one alltoall on g against the blocks computed here; *two:
   the calls the statistics say went in two levels. */
static int a2a_case(dt_comm *g, int salt, int big, dt_dtype dt, int give_recv, int64_t *two, char *why, size_t size) {
    int n = dt_comm_size(g), me = dt_comm_rank(g), r, ok = 1;
    int64_t send[64], recv[64], ts = 0, tr = 0, j, k, m = big ? 6000 : salt % 3 == 0 ? 1 : 37;
    size_t es = dt_dtype_size(dt);
    dt_tensor in, out, ain, aout;
    dt_comm_stat s0, s1, u0, u1;
    const int64_t *rc;
    dt_status st;
    for (r = 0; r < n; r++) {
        ts += send[r] = a2a_count(me, r, salt, big);
        tr += recv[r] = a2a_count(r, me, salt, big);
    }
    in = make(dt, ts > 0 ? ts : 1);
    out = make(dt, tr + 5);
    ain = make(dt, m * n);
    aout = make(dt, m * n);
    for (k = 0, r = 0; r < n; r++) /* block for r: its values, truncated to the element's size */
        for (j = 0; j < send[r]; j++, k++) {
            int32_t v = a2a_val(me, r, j);
            memcpy((char *)in.data + (size_t)k * es, &v, es);
        }
    for (r = 0; r < n; r++)
        for (j = 0; j < m; j++) {
            int32_t v = a2a_val(me, r, j);
            memcpy((char *)ain.data + (size_t)(r * m + j) * es, &v, es);
        }
    dt_comm_stats(g, &s0, DT_COLL_ALLTOALLV);
    dt_comm_stats(g, &u0, DT_COLL_ALLTOALL);
    st = dt_comm_alltoallv(g, &out, give_recv ? recv : NULL, &in, send);
    if (!st) st = dt_comm_alltoall(g, &aout, &ain);
    if (st) {
        snprintf(why, size, "salt %d: %s", salt, dt_ctx_error(&ctx));
        ok = 0;
    }
    rc = dt_comm_recv_counts(g);
    for (k = 0, r = 0; ok && r < n; r++) {
        if (!rc || rc[r] != recv[r]) {
            snprintf(why, size, "salt %d: recv_counts[%d] = %lld, want %lld", salt, r, rc ? (long long)rc[r] : -1LL,
                     (long long)recv[r]);
            ok = 0;
        }
        for (j = 0; ok && j < recv[r]; j++, k++) {
            int32_t v = a2a_val(r, me, j);
            if (memcmp((char *)out.data + (size_t)k * es, &v, es) != 0) {
                snprintf(why, size, "salt %d (%s): alltoallv element %lld of the block from %d differs", salt,
                         dt_dtype_name(dt), (long long)j, r);
                ok = 0;
            }
        }
        for (j = 0; ok && j < m; j++) {
            int32_t v = a2a_val(r, me, j);
            if (memcmp((char *)aout.data + (size_t)(r * m + j) * es, &v, es) != 0) {
                snprintf(why, size, "salt %d (%s): alltoall element %lld of the block from %d differs", salt,
                         dt_dtype_name(dt), (long long)j, r);
                ok = 0;
            }
        }
    }
    dt_comm_stats(g, &s1, DT_COLL_ALLTOALLV);
    dt_comm_stats(g, &u1, DT_COLL_ALLTOALL);
    two[0] += s1.hier_calls - s0.hier_calls;
    two[1] += u1.hier_calls - u0.hier_calls;
    dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out);
    dt_tensor_free(&ctx, &ain);
    dt_tensor_free(&ctx, &aout);
    return ok;
}

/* alltoallv and alltoall on the world and on split groups (every other rank; all, reversed),
   hier off, auto and on, small and large blocks, i32 and bf16, recv_counts given and not:
   every block where the flat exchange puts it, and the two-level path taken exactly where it
   applies (hier 1; auto for blocks averaging up to DT_COMM_A2A_HIER_MAX_BYTES). Then a rank
   whose out is too small fails alone while the others receive, async all-reduces in flight
   across the exchanges keep their order, and the group stays usable. */
static void alltoalls(int hs) {
    int hier, color, ok = 1, j, n;
    char why[300] = "";
    for (hier = -1; hier <= 1 && ok; hier++) {
        dt_comm *w = world(hs, hier), *g = NULL;
        ok = w != NULL;
        /* -1: the world; 0: every other rank; 1: reversed; 2: by place on the host, so that a
           host's ranks are not next to each other in the group */
        for (color = -1; color < 3 && ok; color++) {
            int ranks[64], big, salt, dtk, a, key = color == 0 ? R : color == 1 ? N - R : (R % hs) * N + R;
            n = 0;
            if (color < 0) {
                g = w;
                for (j = 0; j < N; j++) ranks[n++] = j;
            } else {
                if (dt_comm_split(w, &g, color == 0 ? R % 2 : 0, key) || !g) {
                    snprintf(why, sizeof why, "split: %s", dt_ctx_error(&ctx));
                    ok = 0;
                    break;
                }
                if (color == 0)
                    for (j = R % 2; j < N; j += 2) ranks[n++] = j;
                else if (color == 1)
                    for (j = N - 1; j >= 0; j--) ranks[n++] = j;
                else
                    for (a = 0; a < hs; a++)
                        for (j = a; j < N; j += hs) ranks[n++] = j;
            }
            for (big = 0; big < 2 && ok; big++)
                for (dtk = 0; dtk < 2 && ok; dtk++)
                    for (salt = 1; salt <= 3 && ok; salt++) {
                        int even = spans_hosts_evenly(ranks, n, hs), sl = salt + 10 * color + 100 * big, b;
                        int64_t two[2] = {0, 0}, want[2], sum = 0, m = big ? 6000 : sl % 3 == 0 ? 1 : 37, k2; /* as a2a_case */
                        size_t es = dtk ? 2 : 4;
                        for (a = 0; a < n; a++)
                            for (b = 0; b < n; b++) sum += a2a_count(a, b, sl, big);
                        /* two levels where the group spans hosts evenly, for hier 1, and for auto
                           when the blocks (alltoallv: on average, in bytes) are small or a host
                           has DT_COMM_A2A_HIER_RANKS ranks */
                        int many = even >= DT_COMM_A2A_HIER_RANKS;
                        want[0] = even && (hier == 1 || (hier == 0 && (many || (double)sum * (double)es /
                                                                       ((double)n * n) <= DT_COMM_A2A_HIER_MAX_BYTES)));
                        want[1] = even && (hier == 1 || (hier == 0 && (many || (double)m * (double)es <=
                                                                                 DT_COMM_A2A_HIER_MAX_BYTES)));
                        ok = a2a_case(g, sl, big, dtk ? DT_BF16 : DT_I32, salt != 2, two, why, sizeof why);
                        for (k2 = 0; ok && k2 < 2; k2++)
                            if (two[k2] != want[k2]) {
                                snprintf(why, sizeof why, "hier %d, group %d (%d ranks), %s blocks of %s: %lld %s calls in "
                                         "two levels, want %lld", hier, color, n, big ? "large" : "small",
                                         dtk ? "bf16" : "i32", (long long)two[k2], k2 ? "alltoall" : "alltoallv",
                                         (long long)want[k2]);
                                ok = 0;
                            }
                    }
            if (color >= 0) dt_comm_free(g);
            g = NULL;
        }
        if (w && ok && hier == 1) { /* a rank whose out is too small; async all-reduces around */
            int me = dt_comm_rank(w), r;
            int64_t send[64], recv[64], ts = 0, tr = 0, k;
            dt_tensor in, out, a = make(DT_F32, 300007), b = make(DT_F32, 600);
            dt_comm_req *qa = NULL, *qb = NULL;
            dt_status st, sa;
            for (r = 0; r < N; r++) {
                ts += send[r] = a2a_count(me, r, 77, 0);
                tr += recv[r] = a2a_count(r, me, 77, 0);
            }
            in = make(DT_I32, ts > 0 ? ts : 1);
            out = make(DT_I32, me == 0 ? (tr > 0 ? tr - 1 : 0) : tr + 1);
            for (k = 0, r = 0; r < N; r++)
                for (j = 0; j < send[r]; j++, k++) ((int32_t *)in.data)[k] = a2a_val(me, r, j);
            sa = fill(w, &a, 0, 31);
            if (!sa) sa = fill(w, &b, 0, 32);
            if (!sa) sa = dt_comm_iallreduce(w, &a, DT_REDUCE_SUM, &qa);
            st = dt_comm_alltoallv(w, &out, NULL, &in, send);
            if (!sa) sa = dt_comm_iallreduce(w, &b, DT_REDUCE_SUM, &qb);
            if (!sa) sa = dt_comm_wait(qa);
            if (!sa) sa = dt_comm_wait(qb);
            if (sa) {
                snprintf(why, sizeof why, "async all-reduce beside the alltoallv: %s", dt_ctx_error(&ctx));
                ok = 0;
            } else if (me == 0 ? st != DT_ERR_SHAPE || !strstr(dt_ctx_error(&ctx), "out has") : st != DT_OK) {
                snprintf(why, sizeof why, "rank %d, out %s: status %d: %s", me, me == 0 ? "too small" : "fits", st,
                         dt_ctx_error(&ctx));
                ok = 0;
            }
            for (k = 0, r = 0; ok && me != 0 && r < N; r++)
                for (j = 0; ok && j < recv[r]; j++, k++)
                    if (((int32_t *)out.data)[k] != a2a_val(r, me, j)) {
                        snprintf(why, sizeof why, "beside a failing rank: element %lld from %d differs", (long long)j, r);
                        ok = 0;
                    }
            if (ok) {
                int all[64];
                for (j = 0; j < N; j++) all[j] = j;
                ok = check(&a, all, N, hs, 0, 31, 0, 0, why, sizeof why) && check(&b, all, N, hs, 0, 32, 0, 0, why, sizeof why);
            }
            if (ok) { /* still usable */
                int64_t two[2] = {0, 0};
                ok = a2a_case(w, 5, 0, DT_I32, 1, two, why, sizeof why);
            }
            dt_tensor_free(&ctx, &in);
            dt_tensor_free(&ctx, &out);
            dt_tensor_free(&ctx, &a);
            dt_tensor_free(&ctx, &b);
        }
        if (w) dt_comm_free(w);
    }
    {
        char name[96];
        snprintf(name, sizeof name, "hosts_of_%d_alltoalls_move_every_block_and_take_two_levels_where_they_apply", hs);
        dt_test_check_all(name, ok, "%s", why);
    }
}

/* An allocator that refuses blocks of big_fail bytes and more (0: none), on the ranks that set it. */
static size_t big_fail = 0;
static void *big_alloc(size_t n, void *u) {
    (void)u;
    return big_fail && n >= big_fail ? NULL : malloc(n);
}
static void big_release(void *p, void *u) {
    (void)u;
    free(p);
}

/* hier 1 on hosts of hs, the last rank unable to allocate 1 MB: its alltoall and alltoallv
   (scratch of 2-3 MB for two levels) go flat on every rank, every block arrives, and the
   statistics count no call in two levels; with room again, both go in two levels. Then ranks
   set to different hier: every rank fails naming the settings, nothing sent, and the group
   works once they agree. */
static void no_room_and_mismatch(int hs) {
    dt_ctx fctx;
    dt_ctx_desc cd;
    dt_comm_desc d;
    dt_comm *w = NULL;
    int ok = 1, round, r;
    char why[300] = "";
    memset(&cd, 0, sizeof cd);
    cd.allocator.alloc_fn = big_alloc;
    cd.allocator.release_fn = big_release;
    dt_ctx_init(&fctx, &cd);
    memset(&d, 0, sizeof d);
    d.host_size = hs;
    d.hier = 1;
    if (dt_comm_create_world(&fctx, &w, &d)) {
        snprintf(why, sizeof why, "world: %s", dt_ctx_error(&fctx));
        ok = 0;
    }
    for (round = 0; round < 2 && ok; round++) { /* 0: no room on the last rank; 1: room */
        int64_t m = 100000, send[64], two = 0, j, k;
        dt_tensor in = make(DT_I32, m * N), out = make(DT_I32, m * N);
        dt_comm_stat s0, s1, u0, u1;
        dt_status st;
        for (r = 0; r < N; r++) {
            send[r] = m - 1 - r; /* uneven, as an alltoallv's */
            for (j = 0; j < m; j++) ((int32_t *)in.data)[r * m + j] = a2a_val(R, r, j);
        }
        dt_comm_stats(w, &s0, DT_COLL_ALLTOALLV);
        dt_comm_stats(w, &u0, DT_COLL_ALLTOALL);
        big_fail = round == 0 && R == N - 1 ? (size_t)1 << 20 : 0;
        st = dt_comm_alltoall(w, &out, &in);
        for (k = 0, r = 0; !st && ok && r < N; r++)
            for (j = 0; ok && j < m; j++, k++)
                if (((int32_t *)out.data)[k] != a2a_val(r, R, j)) {
                    snprintf(why, sizeof why, "round %d: alltoall element %lld from %d differs", round, (long long)j, r);
                    ok = 0;
                }
        { /* the alltoallv: block r of in holds send[r] elements at r * (m - 1) - ... packed */
            int64_t off = 0;
            for (r = 0; r < N; r++) {
                for (j = 0; j < send[r]; j++) ((int32_t *)in.data)[off + j] = a2a_val(R, r, j);
                off += send[r];
            }
        }
        if (!st) st = dt_comm_alltoallv(w, &out, NULL, &in, send);
        big_fail = 0;
        for (k = 0, r = 0; !st && ok && r < N; r++)
            for (j = 0; ok && j < m - 1 - R; j++, k++)
                if (((int32_t *)out.data)[k] != a2a_val(r, R, j)) {
                    snprintf(why, sizeof why, "round %d: alltoallv element %lld from %d differs", round, (long long)j, r);
                    ok = 0;
                }
        if (st) {
            snprintf(why, sizeof why, "round %d: status %d: %s", round, st, dt_ctx_error(&fctx));
            ok = 0;
        }
        dt_comm_stats(w, &s1, DT_COLL_ALLTOALLV);
        dt_comm_stats(w, &u1, DT_COLL_ALLTOALL);
        two = (s1.hier_calls - s0.hier_calls) + (u1.hier_calls - u0.hier_calls);
        if (ok && two != (round == 0 ? 0 : 2)) {
            snprintf(why, sizeof why, "round %d: %lld calls in two levels, want %d", round, (long long)two, round ? 2 : 0);
            ok = 0;
        }
        dt_tensor_free(&ctx, &in);
        dt_tensor_free(&ctx, &out);
    }
    if (ok) { /* rank 0 set to flat, the others to two levels */
        dt_tensor in = make(DT_I32, 8 * N), out = make(DT_I32, 8 * N);
        int64_t send[64];
        dt_status st;
        for (r = 0; r < N; r++) send[r] = 8;
        dt_comm_set_hier(w, R == 0 ? -1 : 1);
        st = dt_comm_alltoallv(w, &out, NULL, &in, send);
        if (!(st == DT_ERR_COMM && strstr(dt_ctx_error(&fctx), "with hier -1") && strstr(dt_ctx_error(&fctx), "with hier 1") &&
              strstr(dt_ctx_error(&fctx), "nothing was sent"))) {
            snprintf(why, sizeof why, "mixed hier: status %d: %.200s", st, dt_ctx_error(&fctx));
            ok = 0;
        }
        dt_comm_set_hier(w, 0);
        st = dt_comm_alltoallv(w, &out, NULL, &in, send);
        if (ok && st) {
            snprintf(why, sizeof why, "after the mixed call: status %d: %.200s", st, dt_ctx_error(&fctx));
            ok = 0;
        }
        dt_tensor_free(&ctx, &in);
        dt_tensor_free(&ctx, &out);
    }
    if (w) dt_comm_free(w);
    {
        char name[96];
        snprintf(name, sizeof name, "hosts_of_%d_no_room_for_two_levels_goes_flat_and_mixed_hier_is_named", hs);
        dt_test_check_all(name, ok, "%s", why);
    }
    dt_ctx_shutdown(&fctx);
}

static void bad_settings(void) {
    dt_comm_desc d;
    dt_comm *w = NULL, *w2 = NULL;
    dt_status st;
    int ok;
    memset(&d, 0, sizeof d);
    d.hier = 2;
    st = dt_comm_create_world(&ctx, &w, &d);
    ok = st == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "desc.hier = 2") && !w;
    dt_test_check_all("bad_hier_is_named", ok, "status %d: %s", st, dt_ctx_error(&ctx));
    d.hier = 0;
    d.host_size = -3;
    st = dt_comm_create_world(&ctx, &w, &d);
    ok = st == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "desc.host_size = -3") && !w;
    dt_test_check_all("bad_host_size_is_named", ok, "status %d: %s", st, dt_ctx_error(&ctx));
    w = world(0, 0); /* MPI is up, at MPI_THREAD_FUNNELED: a progress thread cannot be had now */
    d.host_size = 0;
    d.progress_us = 100;
    st = dt_comm_create_world(&ctx, &w2, &d);
    ok = st == DT_ERR_STATE && strstr(dt_ctx_error(&ctx), "needs MPI_THREAD_MULTIPLE") && !w2;
    dt_test_check_all("progress_thread_over_funneled_mpi_is_named", ok, "status %d: %s", st, dt_ctx_error(&ctx));
    st = w ? dt_comm_set_hier(w, 7) : DT_ERR_STATE;
    ok = st == DT_ERR_ARG && strstr(dt_ctx_error(&ctx), "mode = 7");
    dt_test_check_all("bad_set_hier_is_named", ok, "status %d: %s", st, dt_ctx_error(&ctx));
    /* one host (every rank here): nothing to do across hosts */
    ok = w && dt_comm_hosts(w) == 1 && dt_comm_ranks_per_host(w) == N;
    dt_test_check_all("one_host_by_name", ok, "hosts %d, ranks per host %d", dt_comm_hosts(w), dt_comm_ranks_per_host(w));
    dt_comm_free(w);
}

/* Two levels (hier 1), only the first host's ranks sending, blocks of 3000 f32 (past MPI's eager
   size): the other hosts' ranks send and relay nothing, so their X is empty. Y once began where X
   did, and Open MPI read the equal buffers as MPI_IN_PLACE: those ranks waited for ever (dlrm
   --plan at np 4 on hosts of 2 hung in its table-row profile). A timeout turns a hang into a
   failure here. Every block where the flat exchange puts it. */
static void one_host_sends(int hs) {
    const int64_t B = 3000;
    dt_comm *w = world(hs, 1);
    int64_t send[64], recv[64], j;
    int r, ok = w != NULL, sends = R < hs;
    dt_tensor in, out;
    dt_status st = DT_ERR_STATE;
    char why[200] = "";
    if (ok) dt_comm_set_timeout(w, 30);
    for (r = 0; r < N; r++) {
        send[r] = sends ? B : 0;
        recv[r] = r < hs ? B : 0;
    }
    in = make(DT_F32, sends ? B * N : 1);
    out = make(DT_F32, B * hs);
    for (r = 0; sends && r < N; r++)
        for (j = 0; j < B; j++) ((float *)in.data)[r * B + j] = val(R, r * B + j, 7);
    if (ok) st = dt_comm_alltoallv(w, &out, recv, &in, send);
    ok = ok && st == DT_OK;
    if (!ok) snprintf(why, sizeof why, "status %d: %s", st, dt_ctx_error(&ctx));
    for (r = 0; ok && r < hs; r++)
        for (j = 0; ok && j < B; j++)
            if (((float *)out.data)[r * B + j] != val(r, R * B + j, 7)) {
                snprintf(why, sizeof why, "element %lld of the block from rank %d: %.9g, want %.9g", (long long)j, r,
                         ((float *)out.data)[r * B + j], val(r, R * B + j, 7));
                ok = 0;
            }
    dt_test_check_all("hier_alltoallv_where_one_host_sends", ok, "hosts of %d: %s", hs, why);
    dt_tensor_free(&ctx, &in);
    dt_tensor_free(&ctx, &out);
    dt_comm_free(w);
}

int main(void) {
    int hs;
    dt_comm *w;
    dt_ctx_init(&ctx, NULL);
    w = world(0, 0); /* MPI up; the rank and size */
    if (!w) return 1;
    R = dt_comm_rank(w);
    N = dt_comm_size(w);
    dt_comm_free(w);
    bad_settings();
    for (hs = 1; hs <= N; hs++) {
        if (hs != 1 && hs != N && N % hs != 0 && hs != 3) continue; /* divisors, and 3 (unequal hosts) */
        allreduce_orders(hs);
        if (hs > 1 && hs < N) {
            other_types_and_ops(hs);
            forms_agree(hs);
            groups(hs);
        }
        if (hs > 1) alltoalls(hs);
        if (hs > 1 && hs < N && N % hs == 0) one_host_sends(hs);
        if (hs > 1 && hs < N && N % hs == 0) no_room_and_mismatch(hs);
    }
    memo_free();
    dt_test_check_all("every_byte_comes_back", ctx.bytes_in_use == 0, "%lld bytes still held", (long long)ctx.bytes_in_use);
    dt_ctx_shutdown(&ctx);
    return dt_test_finish();
}
