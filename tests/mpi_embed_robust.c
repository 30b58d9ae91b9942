// np: 1 2
/* tests/mpi_embed_robust.c - dt_embed.h's failed calls leave everything as it was, on every rank.
   (1) A checkpoint load that fails (a missing directory, a truncated rank file, a corrupt
   dynamic-slot record, one id in two slots) between a forward and its backward, with gradients
   accumulated from an earlier micro-batch: the step then finishes and two more follow, and the
   pooled outputs, tables, optimizer state (a checkpoint saved at the end, byte for byte),
   admission counts and *state equal a run that never tried the load. (2) One id in two slots
   is DT_ERR_FORMAT naming the id. (3) A forward with a bad out (shape, dtype, NULL) on one rank
   fails on every rank without admitting, evicting or rejecting an id. (4) A NaN or infinite
   per-id weight is DT_ERR_ARG naming the index, the table and the value, on every rank, and
   changes nothing. (5) dt_embed_export_changed with nothing changed succeeds (under UBSan: no
   qsort of a NULL list). (6) An out over the sequence rows of the forward before the last (the
   set of buffers the next forward fills, when forwards follow forwards) on one rank fails on
   every rank naming both, admitting nothing. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

#include <unistd.h>

static dt_ctx C;
static dt_comm *WORLD;
static int R, W;

#define GB 8   /* global batch */
#define NF 2
#define PD 8   /* pooled dim: two features of dim 4 */

static int HS = 4; /* the dynamic table's hash_shards */

static dt_embed *make(void) {
    dt_embed_table_desc t[2];
    dt_embed_feature_desc f[2];
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(t, 0, sizeof t);
    memset(f, 0, sizeof f);
    t[0].name = "st"; t[0].rows = 16; t[0].dim = 4; t[0].weighted = 1; t[0].optim.kind = DT_EMBED_ADAM;
    t[0].optim.lr = 0.05;
    t[1].name = "dyn"; t[1].rows = 12; t[1].dim = 4; t[1].dynamic = 1; t[1].admit_after = 1; t[1].hash_shards = HS;
    t[1].optim.kind = DT_EMBED_ADAGRAD; t[1].optim.lr = 0.1;
    f[0].table = 0; f[1].table = 1;
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = 2; d.features = f; d.n_features = NF; d.comm = WORLD; d.seed = 11;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

static int64_t LEN[NF * GB], IDS[NF * GB * 4];
static float WTS[NF * GB * 4];
static int64_t B0, NB; /* this rank's samples */

/* This rank's samples of step s: 0..3 ids per bag; "dyn" draws from 40 ids for 12 slots. */
static void batch(dt_kjt *k, int s) {
    int f;
    int64_t b, j, o = 0;
    for (f = 0; f < NF; f++)
        for (b = 0; b < NB; b++) {
            int64_t len = (int64_t)(dt_rng_uniform(100 + s, (uint64_t)f, (uint64_t)(B0 + b)) * 4.0f);
            LEN[f * NB + b] = len;
            for (j = 0; j < len; j++) {
                float u = dt_rng_uniform(200 + s, (uint64_t)(f * 8 + j), (uint64_t)(B0 + b));
                IDS[o] = f == 0 ? (int64_t)(u * 16) : 1000 + (int64_t)(u * 40);
                WTS[o] = 0.5f + 0.25f * (float)j;
                o++;
            }
        }
    memset(k, 0, sizeof *k);
    k->n_features = NF; k->batch = NB; k->lengths = LEN; k->ids = IDS; k->weights = WTS;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *c = (const unsigned char *)p;
    size_t i;
    for (i = 0; i < n; i++) h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

typedef struct run_rec {
    uint64_t outs;      /* every forward's pooled output */
    uint64_t tables;    /* the local shards at the end */
    uint64_t ckpt;      /* this rank's file of a checkpoint saved at the end (optimizer state, slots) */
    dt_embed_stats st;
    dt_train_state ts;
    int fail;           /* a step that should have worked failed */
} run_rec;

static int fwd(dt_embed *e, int s, run_rec *rr) {
    dt_kjt k;
    dt_tensor out = dt_test_t2(&C, NB, PD);
    int bad = 0;
    batch(&k, s);
    if (dt_embed_forward(e, &out, &k)) { fprintf(stderr, "[rank %d] forward %d: %s\n", R, s, dt_ctx_error(&C)); bad = 1; }
    rr->outs = fnv(rr->outs, out.data, (size_t)out.numel * 4);
    dt_tensor_free(&C, &out);
    rr->fail += bad;
    return bad;
}

static void bwd(dt_embed *e, int s, run_rec *rr) {
    dt_tensor dout = dt_test_t2(&C, NB, PD);
    int64_t b, c;
    for (b = 0; b < NB; b++)
        for (c = 0; c < PD; c++) ((float *)dout.data)[b * PD + c] = dt_rng_normal(300 + s, (uint64_t)c, (uint64_t)(B0 + b));
    if (dt_embed_backward(e, &dout)) { fprintf(stderr, "[rank %d] backward %d: %s\n", R, s, dt_ctx_error(&C)); rr->fail++; }
    dt_tensor_free(&C, &dout);
}

static void finish(dt_embed *e, run_rec *rr, const char *tag) {
    dt_checkpoint_desc cd;
    char dir[1024], path[1200];
    FILE *fp;
    int t;
    for (t = 0; t < 2; t++) {
        dt_tensor v;
        if (!dt_embed_local_shard(e, &v, NULL, NULL, t) && v.numel) rr->tables = fnv(rr->tables, v.data, (size_t)v.numel * 4);
    }
    dt_embed_stats_get(e, &rr->st);
    snprintf(dir, sizeof dir, "%s/mpi_embed_robust_np%d_end_%s", dt_test_tmpdir(), W, tag);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir; cd.comm = WORLD;
    if (dt_embed_checkpoint_save(e, &rr->ts, &cd)) { fprintf(stderr, "save: %s\n", dt_ctx_error(&C)); rr->fail++; return; }
    snprintf(path, sizeof path, "%s/step_%08lld/rank_%05d.safetensors", dir, (long long)rr->ts.step, R);
    if ((fp = fopen(path, "rb")) != NULL) {
        unsigned char buf[4096];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, fp)) > 0) rr->ckpt = fnv(rr->ckpt, buf, n);
        fclose(fp);
    } else rr->fail++;
}

/* ---------------------------------------------------------------- (1), (2) failed loads */

/* The checkpoint every case starts from: saved after step 0, dir/step_00000001. */
static void save_good(const char *dir) {
    dt_embed *e = make();
    dt_checkpoint_desc cd;
    dt_train_state ts;
    run_rec rr;
    memset(&rr, 0, sizeof rr);
    memset(&ts, 0, sizeof ts);
    ts.step = 1; ts.data_cursor = GB;
    fwd(e, 0, &rr);
    bwd(e, 0, &rr);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir; cd.comm = WORLD;
    if (rr.fail || dt_embed_checkpoint_save(e, &ts, &cd)) { fprintf(stderr, "save_good: %s\n", dt_ctx_error(&C)); exit(2); }
    dt_embed_free(e);
}

/* Rank 0 edits "param/embed/dyn/<entry>" of the first rank file holding a filled shard's first two
   slots: how 0 (stamp of slot 0 = 0: a slot filled after an empty one) or 1 (slot 1 gets slot
   0's id), then fixes the file's xxh64 in the manifest, so only the embed's own check can tell. */
static int corrupt(const char *dir, int how) {
    char step[1100], path[1200], man[1200], old[17], neu[17];
    int r, done = 0;
    snprintf(step, sizeof step, "%s/step_00000001", dir);
    for (r = 0; r < W && !done; r++) {
        dt_st_file f;
        int i, ids = -1, stamps = -1;
        FILE *fp;
        unsigned char *bytes;
        long n;
        int64_t s[2], id[2];
        uint64_t base;
        snprintf(path, sizeof path, "%s/rank_%05d.safetensors", step, r);
        if (dt_safetensors_open(&C, &f, path)) continue;
        for (i = 0; i < f.n_entries; i++) {
            if (strcmp(f.entries[i].name, "param/embed/dyn/slot_id") == 0) ids = i;
            if (strcmp(f.entries[i].name, "param/embed/dyn/slot_stamp") == 0) stamps = i;
        }
        base = 8 + f.header_len;
        if (ids < 0 || stamps < 0 || f.entries[ids].shape[0] < 2) { dt_safetensors_close(&C, &f); continue; }
        fp = fopen(path, "rb");
        fseek(fp, 0, SEEK_END);
        n = ftell(fp);
        fseek(fp, 0, SEEK_SET);
        bytes = (unsigned char *)malloc((size_t)n);
        if (fread(bytes, 1, (size_t)n, fp) != (size_t)n) n = 0;
        fclose(fp);
        memcpy(s, bytes + base + f.entries[stamps].begin, 16);
        memcpy(id, bytes + base + f.entries[ids].begin, 16);
        if (n && s[0] > 0 && s[1] > 0) {
            char *text;
            long mn;
            snprintf(old, sizeof old, "%016llx", (unsigned long long)dt_xxh64(bytes, (size_t)n));
            if (how == 0) { s[0] = 0; memcpy(bytes + base + f.entries[stamps].begin, s, 8); }
            else memcpy(bytes + base + f.entries[ids].begin + 8, &id[0], 8);
            snprintf(neu, sizeof neu, "%016llx", (unsigned long long)dt_xxh64(bytes, (size_t)n));
            fp = fopen(path, "wb");
            fwrite(bytes, 1, (size_t)n, fp);
            fclose(fp);
            snprintf(man, sizeof man, "%s/manifest.json", step);
            fp = fopen(man, "rb");
            fseek(fp, 0, SEEK_END);
            mn = ftell(fp);
            fseek(fp, 0, SEEK_SET);
            text = (char *)malloc((size_t)mn + 1);
            if (fread(text, 1, (size_t)mn, fp) != (size_t)mn) mn = 0;
            text[mn] = 0;
            fclose(fp);
            if (strstr(text, old)) {
                memcpy(strstr(text, old), neu, 16);
                fp = fopen(man, "wb");
                fwrite(text, 1, (size_t)mn, fp);
                fclose(fp);
                done = 1;
            }
            free(text);
        }
        free(bytes);
        dt_safetensors_close(&C, &f);
    }
    return done;
}

/* step 0; then accumulating: step 1 forward + backward, step 2 forward, [the load], step 2
   backward; updating: steps 3 and 4. */
static void trial(const char *dir, run_rec *rr, dt_status *st, char *msg, const char *tag) {
    dt_embed *e = make();
    dt_checkpoint_desc cd;
    memset(rr, 0, sizeof *rr);
    rr->ts.step = 9; rr->ts.data_cursor = 77; rr->ts.rng_seed = 5;
    dt_train_state_set(&C, &rr->ts, "k", "v");
    fwd(e, 0, rr); bwd(e, 0, rr);
    dt_embed_set_sync(e, 0);
    fwd(e, 1, rr); bwd(e, 1, rr);
    fwd(e, 2, rr);
    if (dir) {
        memset(&cd, 0, sizeof cd);
        cd.dir = dir; cd.comm = WORLD;
        *st = dt_embed_checkpoint_load(e, &rr->ts, &cd);
        snprintf(msg, DT_ERROR_MAX, "%s", dt_ctx_error(&C));
    }
    bwd(e, 2, rr);
    dt_embed_set_sync(e, 1);
    fwd(e, 3, rr); bwd(e, 3, rr);
    fwd(e, 4, rr); bwd(e, 4, rr);
    finish(e, rr, tag);
    dt_embed_free(e);
}

static void failed_loads(void) {
    static const char *cases[5] = {"missing_directory", "truncated_rank_file", "corrupt_slot_stamp", "id_in_two_slots", "good"};
    static const dt_status want[4] = {DT_ERR_IO, DT_ERR_FORMAT, DT_ERR_FORMAT, DT_ERR_FORMAT};
    static const char *says[4] = {"is not a directory", "truncated", "filled after an empty one", "is in slots"};
    char dirs[5][1024], msg[DT_ERROR_MAX], name[160];
    run_rec ref, rr;
    double named[1];
    int c, ok;
    for (c = 0; c < 5; c++) snprintf(dirs[c], sizeof dirs[c], "%s/mpi_embed_robust_np%d_%s", dt_test_tmpdir(), W, cases[c]);
    for (c = 1; c < 5; c++) save_good(dirs[c]);
    if (R == 0) { /* the edits */
        char path[1200];
        ok = 1;
        snprintf(path, sizeof path, "%s/step_00000001/rank_%05d.safetensors", dirs[1], W - 1);
        ok &= truncate(path, 100) == 0;
        ok &= corrupt(dirs[2], 0);
        ok &= corrupt(dirs[3], 1);
        if (!ok) dt_test_fail("embed_robust_checkpoint_edits", "could not truncate or edit the saved checkpoints");
    }
    dt_comm_barrier(WORLD);
    trial(NULL, &ref, NULL, msg, "ref");
    for (c = 0; c < 4; c++) {
        dt_status st = DT_OK;
        msg[0] = 0;
        trial(dirs[c], &rr, &st, msg, cases[c]);
        named[0] = strstr(msg, says[c]) != NULL; /* on the rank that found it; the others name that rank */
        dt_comm_allreduce_f64(WORLD, named, 1, DT_REDUCE_SUM);
        snprintf(name, sizeof name, "embed_failed_load_%s_names_it_on_every_rank", cases[c]);
        dt_test_check_all(name, st == want[c] && named[0] >= 1, "status %d (want %d), message \"%.100s\" (%g ranks say "
                          "\"%s\")", (int)st, (int)want[c], msg, named[0], says[c]);
        snprintf(name, sizeof name, "embed_failed_load_%s_changes_nothing", cases[c]);
        ok = !rr.fail && rr.outs == ref.outs && rr.tables == ref.tables && rr.ckpt == ref.ckpt &&
             memcmp(&rr.ts, &ref.ts, sizeof rr.ts) == 0 && rr.st.admitted == ref.st.admitted &&
             rr.st.evicted == ref.st.evicted && rr.st.rejected == ref.st.rejected && rr.st.backwards == ref.st.backwards;
        dt_test_check_all(name, ok, "failed steps %d; outputs %s, tables %s, final checkpoint %s, state %s, admitted %lld/%lld",
                          rr.fail, rr.outs == ref.outs ? "same" : "differ", rr.tables == ref.tables ? "same" : "differ",
                          rr.ckpt == ref.ckpt ? "same" : "differ", memcmp(&rr.ts, &ref.ts, sizeof rr.ts) ? "differs" : "same",
                          (long long)rr.st.admitted, (long long)ref.st.admitted);
    }
    {   /* one id in two slots, loaded into another hash_shards (the ids move between shards) */
        dt_embed *e;
        dt_checkpoint_desc cd;
        dt_status st;
        HS = 2;
        e = make();
        HS = 4;
        memset(&cd, 0, sizeof cd);
        cd.dir = dirs[3]; cd.comm = WORLD;
        st = dt_embed_checkpoint_load(e, NULL, &cd);
        named[0] = strstr(dt_ctx_error(&C), "in two saved slots") || strstr(dt_ctx_error(&C), "is in slots");
        dt_comm_allreduce_f64(WORLD, named, 1, DT_REDUCE_SUM);
        dt_test_check_all("embed_failed_load_id_in_two_slots_into_other_hash_shards_names_it", st == DT_ERR_FORMAT &&
                          named[0] >= 1, "status %d: %.120s", (int)st, dt_ctx_error(&C));
        dt_embed_free(e);
    }
    {   /* the unedited checkpoint loads, so the failures above are the edits' */
        dt_embed *e = make();
        dt_checkpoint_desc cd;
        dt_train_state ts;
        dt_status st;
        memset(&cd, 0, sizeof cd);
        memset(&ts, 0, sizeof ts);
        cd.dir = dirs[4]; cd.comm = WORLD;
        st = dt_embed_checkpoint_load(e, &ts, &cd);
        dt_test_check_all("embed_unedited_checkpoint_loads", st == DT_OK && ts.step == 1 && ts.data_cursor == GB,
                          "status %d step %lld: %.100s", (int)st, (long long)ts.step, dt_ctx_error(&C));
        dt_embed_free(e);
    }
}

/* ---------------------------------------------------------------- (3), (4) failed forwards */

static void counts(dt_embed *e, double v[3]) {
    dt_embed_stats s;
    dt_embed_stats_get(e, &s);
    v[0] = (double)s.admitted; v[1] = (double)s.evicted; v[2] = (double)s.rejected;
    dt_comm_allreduce_f64(WORLD, v, 3, DT_REDUCE_SUM);
}

/* e and ref run step 0; e then fails a forward of step 1 (bad(): breaks this rank's call when
   mine); both run steps 1 and 2: everything equal. */
static void failed_forward(const char *what, int kind, int bad_rank, dt_status want, const char *says) {
    dt_embed *e = make(), *ref = make();
    run_rec a, b;
    double c0[3], c1[3];
    dt_kjt k;
    dt_tensor out = dt_test_t2(&C, NB, PD), wrong;
    dt_tensor_desc d;
    dt_status st;
    char name[160], msg[DT_ERROR_MAX];
    int mine = R == bad_rank % W, ok;
    float keep = 0;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    fwd(e, 0, &a); bwd(e, 0, &a);
    fwd(ref, 0, &b); bwd(ref, 0, &b);
    counts(e, c0);
    batch(&k, 1);
    memset(&d, 0, sizeof d);
    d.ndim = 2; d.shape[0] = NB; d.shape[1] = PD;
    if (kind == 1) d.shape[1] = PD + 1;
    if (kind == 2) d.dtype = DT_I32;
    dt_tensor_create(&C, &wrong, &d);
    if (mine && kind >= 4) { /* the first weight: feature 0's ("st", weighted) when it has ids here */
        int64_t b, n0 = 0;
        for (b = 0; b < NB; b++) n0 += LEN[b];
        if (!n0) dt_test_fail("embed_robust_setup", "rank %d has no ids of feature 0 in step 1", R);
        keep = WTS[0];
        WTS[0] = kind == 4 ? NAN : -INFINITY;
    }
    if (mine && kind == 3) st = dt_embed_forward(e, NULL, &k);
    else st = dt_embed_forward(e, mine && kind < 4 ? &wrong : &out, &k);
    snprintf(msg, sizeof msg, "%s", dt_ctx_error(&C));
    if (mine && kind >= 4) WTS[0] = keep;
    counts(e, c1);
    snprintf(name, sizeof name, "embed_forward_with_%s_fails_on_every_rank", what);
    dt_test_check_all(name, mine ? st == want && strstr(msg, says) != NULL : st != DT_OK,
                      "status %d (want %d): %.110s", (int)st, (int)want, msg);
    snprintf(name, sizeof name, "embed_forward_with_%s_admits_and_evicts_nothing", what);
    dt_test_check_all(name, c0[0] == c1[0] && c0[1] == c1[1] && c0[2] == c1[2],
                      "admitted %g -> %g, evicted %g -> %g, rejected %g -> %g", c0[0], c1[0], c0[1], c1[1], c0[2], c1[2]);
    a.outs = b.outs = 0;
    fwd(e, 1, &a); bwd(e, 1, &a); fwd(e, 2, &a); bwd(e, 2, &a);
    fwd(ref, 1, &b); bwd(ref, 1, &b); fwd(ref, 2, &b); bwd(ref, 2, &b);
    {
        int t;
        for (t = 0; t < 2; t++) {
            dt_tensor v;
            if (!dt_embed_local_shard(e, &v, NULL, NULL, t) && v.numel) a.tables = fnv(a.tables, v.data, (size_t)v.numel * 4);
            if (!dt_embed_local_shard(ref, &v, NULL, NULL, t) && v.numel) b.tables = fnv(b.tables, v.data, (size_t)v.numel * 4);
        }
    }
    counts(e, c0);
    counts(ref, c1);
    ok = !a.fail && !b.fail && a.outs == b.outs && a.tables == b.tables && c0[0] == c1[0] && c0[1] == c1[1] && c0[2] == c1[2];
    snprintf(name, sizeof name, "embed_forward_with_%s_then_continues_as_if_never_called", what);
    dt_test_check_all(name, ok, "failed steps %d/%d, outputs %s, tables %s, admitted %g vs %g", a.fail, b.fail,
                      a.outs == b.outs ? "same" : "differ", a.tables == b.tables ? "same" : "differ", c0[0], c1[0]);
    dt_tensor_free(&C, &out);
    dt_tensor_free(&C, &wrong);
    dt_embed_free(e);
    dt_embed_free(ref);
}

/* ---------------------------------------------------------------- (6) out over a sequence buffer */

/* Forwards without backwards (evaluation) alternate two sets of sequence buffers, so the set a
   forward fills is the one viewed two forwards earlier. Such a view as out was seen only at the
   end, after begin had admitted the batch's ids on every rank, and failed that rank alone (the
   others returned DT_OK); now before begin, on every rank (the others: DT_ERR_ARG, "out was refused
   on another rank", not the bad batch they were told of before). */
static void out_over_sequence_of_the_forward_before(void) {
    dt_embed_table_desc t[2];
    dt_embed_desc d;
    dt_embed *e = NULL;
    int64_t len[2 * GB], ids[2 * GB], sh[2], b;
    dt_tensor out = dt_test_t2(&C, NB, 4), v, ov;
    double c0[3], c1[3];
    dt_kjt k;
    dt_status st;
    int s, mine = R == W - 1;
    char msg[DT_ERROR_MAX];
    memset(&ov, 0, sizeof ov);
    memset(t, 0, sizeof t);
    t[0].name = "dyn"; t[0].rows = 12; t[0].dim = 4; t[0].dynamic = 1; t[0].hash_shards = HS;
    t[1].name = "seq"; t[1].rows = 16; t[1].dim = 4; t[1].pooling = DT_POOL_NONE; /* one id a sample: NB x 4 floats */
    memset(&d, 0, sizeof d);
    d.tables = t; d.n_tables = 2; d.comm = WORLD; d.seed = 11;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    memset(&k, 0, sizeof k);
    k.n_features = 2; k.batch = NB; k.lengths = len; k.ids = ids;
    for (s = 0; s < 3; s++) {
        for (b = 0; b < NB; b++) {
            len[b] = len[NB + b] = 1;
            ids[b] = 1000 + 100 * s + B0 + b; /* new ids each forward: each admits */
            ids[NB + b] = (B0 + b) % 16;
        }
        if (s == 2) {
            counts(e, c0);
            st = dt_embed_forward(e, mine ? &ov : &out, &k);
            snprintf(msg, sizeof msg, "%s", dt_ctx_error(&C));
            counts(e, c1);
            dt_test_check_all("embed_forward_out_over_the_sequence_of_the_forward_before_fails_on_every_rank",
                              mine ? st == DT_ERR_ARG && strstr(msg, "dt_embed_forward: out shares memory with the "
                                                                     "embed's sequence rows") != NULL
                                   : st == DT_ERR_ARG && strstr(msg, "out was refused on another rank") != NULL,
                              "status %d: %.110s", (int)st, msg);
            dt_test_check_all("embed_forward_out_over_the_sequence_of_the_forward_before_admits_nothing", c0[0] == c1[0],
                              "admitted %g -> %g", c0[0], c1[0]);
            break;
        }
        if (dt_embed_forward(e, &out, &k)) dt_test_fail("embed_sequence_out_setup", "forward %d: %s", s, dt_ctx_error(&C));
        if (s == 0) { /* the first forward's rows, shaped as out */
            dt_embed_sequence(e, &v, 1);
            sh[0] = NB; sh[1] = 4;
            if (dt_tensor_view(&C, &ov, &v, 0, 2, sh)) dt_test_fail("embed_sequence_out_setup", "%s", dt_ctx_error(&C));
        }
    }
    dt_tensor_free(&C, &out);
    dt_embed_free(e);
}

/* ---------------------------------------------------------------- (5) export with nothing changed */

static void export_unchanged(void) {
    dt_embed *e = make();
    char prefix[1024];
    dt_status s1, s2;
    snprintf(prefix, sizeof prefix, "%s/mpi_embed_robust_np%d_export", dt_test_tmpdir(), W);
    s1 = dt_embed_export_changed(e, prefix); /* nothing ever changed: no change list at all */
    s2 = dt_embed_export_changed(e, prefix);
    dt_test_check_all("embed_export_changed_with_nothing_changed_is_ok", s1 == DT_OK && s2 == DT_OK,
                      "statuses %d %d: %.120s", (int)s1, (int)s2, dt_ctx_error(&C));
    dt_embed_free(e);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &WORLD, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(WORLD);
    W = dt_comm_size(WORLD);
    B0 = (int64_t)GB * R / W;
    NB = (int64_t)GB * (R + 1) / W - B0;
    export_unchanged();
    failed_loads();
    failed_forward("out_of_another_shape", 1, W - 1, DT_ERR_SHAPE, "out is [");
    failed_forward("out_of_another_dtype", 2, 0, DT_ERR_DTYPE, "out");
    failed_forward("out_null", 3, W - 1, DT_ERR_ARG, "out");
    failed_forward("nan_weight", 4, 0, DT_ERR_ARG, "kjt.weights[0] = nan (table \"st\", feature 0");
    failed_forward("infinite_weight", 5, W - 1, DT_ERR_ARG, "kjt.weights[0] = -inf");
    out_over_sequence_of_the_forward_before();
    dt_comm_free(WORLD);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
