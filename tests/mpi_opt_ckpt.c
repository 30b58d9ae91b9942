// np: 1 2 4
/* tests/mpi_opt_ckpt.c - checkpoints across ranks and layouts. The world trains 2 AdamW steps on
   a parameter sharded on dim 0, one sharded on dim 1, a replicated one and a bf16 one (master
   weights) sharded on dim 0, and saves. Then groups of 1, 2 and W ranks each load it with their
   own layout (resharding) and must hold exactly (bitwise) the slices of a single-rank run of the
   same steps: values, master weights, exp_avg, exp_avg_sq, step, train state. The replicated
   tensor is written once (by rank 0). An independent reader (tests/opt/ckpt_verify.py: Python,
   numpy) checks the files' XXH64 and reassembles the same tensors. A load that fails on one rank
   fails on every rank and changes nothing anywhere. A save whose write fails on the last rank
   (as on a full disk) fails on every rank and removes step_N.tmp/ with every rank's file in it;
   `latest` still names the previous checkpoint, which loads as before. */
#define _POSIX_C_SOURCE 200809L /* getrlimit, setrlimit, SIGXFSZ */
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"
#include "opt/sharded.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#ifndef __cplusplus
extern FILE *popen(const char *command, const char *type); /* POSIX; hidden by strict -std=c99 */
extern int pclose(FILE *stream);
#endif

static dt_ctx C;
static int R, W;
static char DIR_[1024];

static const char *NAMES[4] = {"A", "B", "R", "D"};

/* The model as `parts` ranks hold it, this rank being number idx: A [8,3] rows split, B [3,8]
   columns split, R [5] whole, D [4,4] bf16 rows split. */
static void make(dt_params *ps, int parts, int idx) {
    int64_t gs[4][2] = {{8, 3}, {3, 8}, {5, 0}, {4, 4}};
    int i, d;
    memset(ps, 0, sizeof *ps);
    for (i = 0; i < 4; i++) {
        dt_param_desc pd;
        memset(&pd, 0, sizeof pd);
        pd.name = NAMES[i];
        pd.dtype = i == 3 ? DT_BF16 : DT_F32;
        for (d = 0; d < 2; d++) { pd.global_shape[d] = gs[i][d]; pd.shape[d] = gs[i][d]; }
        if (i == 0 || i == 3) { pd.shape[0] = gs[i][0] / parts; pd.start[0] = idx * pd.shape[0]; }
        if (i == 1) { pd.shape[1] = gs[i][1] / parts; pd.start[1] = idx * pd.shape[1]; }
        pd.init.kind = DT_INIT_NORMAL;
        pd.init.seed = 3;
        pd.init.std = 1;
        if (dt_params_add(&C, ps, NULL, &pd)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    }
}

/* Bitwise: every element of the slice t (of parameter p) equals the element of the same global
   index in ref (the whole tensor). Returns the number of differing elements. */
static int64_t diff_slice(const dt_param *p, const dt_tensor *t, const dt_tensor *ref) {
    size_t es = dt_dtype_size(t->dtype);
    int64_t k, bad = 0;
    for (k = 0; k < t->numel; k++)
        if (memcmp((const char *)t->data + k * es, (const char *)ref->data + sh_global_index(p, k) * es, es) != 0) bad++;
    return bad;
}

static int64_t diff_all(dt_params *ps, dt_optimizer *o, dt_params *rps, dt_optimizer *ro) {
    int64_t bad = 0;
    int i, k;
    for (i = 0; i < ps->count; i++) {
        bad += diff_slice(ps->items[i], &ps->items[i]->value, &rps->items[i]->value);
        if (o->slots[i].master.data) bad += diff_slice(ps->items[i], &o->slots[i].master, &ro->slots[i].master);
        for (k = 0; k < 2; k++) bad += diff_slice(ps->items[i], &o->slots[i].state[k], &ro->slots[i].state[k]);
    }
    return bad;
}

/* Rank 0 reads the manifest: the replicated tensor has one shard, A one per rank. */
static int manifest_ok(char *why, size_t n) {
    char path[1200];
    FILE *fp;
    char *text;
    long len;
    dt_json *m = NULL;
    int ok = 0;
    snprintf(path, sizeof path, "%s/step_00000002/manifest.json", DIR_);
    if (!(fp = fopen(path, "rb"))) { snprintf(why, n, "no manifest.json"); return 0; }
    fseek(fp, 0, SEEK_END);
    len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    text = (char *)malloc((size_t)len + 1);
    if (fread(text, 1, (size_t)len, fp) != (size_t)len) len = 0;
    fclose(fp);
    if (!dt_json_parse(&C, &m, text, (size_t)len)) {
        const dt_json *t = dt_json_get(m, "tensors");
        int nr = dt_json_get(dt_json_get(t, "param/R"), "shards")->count;
        int na = dt_json_get(dt_json_get(t, "state/A/exp_avg"), "shards")->count;
        int nw = (int)dt_json_get(m, "world_size")->number;
        ok = nr == 1 && na == W && nw == W;
        snprintf(why, n, "R shards %d, A shards %d, world_size %d", nr, na, nw);
    }
    dt_json_free(&C, m);
    free(text);
    return ok;
}

/* The double sum of a whole reference tensor named as in the checkpoint ("state/A/exp_avg"). */
static int ref_sum(dt_params *rps, dt_optimizer *ro, const char *name, double *out) {
    int i, k;
    char buf[64];
    for (i = 0; i < rps->count; i++) {
        const dt_tensor *t[4];
        const char *nm[4] = {"param/%s", "master/%s", "state/%s/exp_avg", "state/%s/exp_avg_sq"};
        t[0] = &rps->items[i]->value; t[1] = &ro->slots[i].master; t[2] = &ro->slots[i].state[0];
        t[3] = &ro->slots[i].state[1];
        for (k = 0; k < 4; k++) {
            int64_t e;
            double s = 0;
            snprintf(buf, sizeof buf, nm[k], rps->items[i]->name);
            if (strcmp(buf, name) != 0 || !t[k]->data) continue;
            for (e = 0; e < t[k]->numel; e++)
                s += t[k]->dtype == DT_BF16 ? dt_bf16_to_f32(((uint16_t *)t[k]->data)[e]) : ((float *)t[k]->data)[e];
            *out = s;
            return 1;
        }
    }
    return 0;
}

/* Rank 0: tests/opt/ckpt_verify.py (Python and numpy, no dt code) checks every file's size and
   XXH64, reassembles every logical tensor from its shards, and its sums match the reference. */
static void python_verify(dt_params *rps, dt_optimizer *ro) {
    char cmd[1400], line[512], name[256], dtype[16], shape[64];
    const char *py = "/usr/bin/python3";
    FILE *f = fopen(py, "rb"), *out;
    double s, want;
    int seen = 0, bad = 0;
    if (f) fclose(f);
    else py = "python3";
    snprintf(cmd, sizeof cmd, "%s -c 'import numpy' 2>/dev/null && %s tests/opt/ckpt_verify.py '%s' 2>&1", py, py, DIR_);
    if (!(out = popen(cmd, "r"))) { dt_test_skip("python_reassembles_checkpoint", "popen failed"); return; }
    while (fgets(line, sizeof line, out)) {
        if (sscanf(line, "%255s %15s %63s %lf", name, dtype, shape, &s) != 4 || !ref_sum(rps, ro, name, &want)) {
            if (!bad++) dt_test_fail("python_reassembles_checkpoint", "%s", line);
            continue;
        }
        seen++;
        if (fabs(s - want) > 1e-12 * (1 + fabs(want)) && !bad++)
            dt_test_fail("python_reassembles_checkpoint", "%s: numpy sum %.17g, reference %.17g", name, s, want);
    }
    if (pclose(out) != 0 && seen == 0 && !bad)
        dt_test_skip("python_reassembles_checkpoint", "%s with numpy not available", py);
    else if (!bad)
        DT_TEST_CHECK("python_reassembles_checkpoint", seen == 13);
}

/* The hook of the failing save: on rank `rank`, at the first tensor written, the file size
   limit drops to 0, so the next write(2) fails with EFBIG (a real write failure, as ENOSPC). */
typedef struct fail_at {
    int rank, me, fired;
} fail_at;

static void fail_hook(const char *point, int index, void *user) {
    fail_at *f = (fail_at *)user;
    struct rlimit rl;
    if (f->me != f->rank || strcmp(point, "tensor") != 0 || index != 0 || getrlimit(RLIMIT_FSIZE, &rl) != 0) return;
    rl.rlim_cur = 0;
    f->fired = setrlimit(RLIMIT_FSIZE, &rl) == 0;
}

/* The world saves step 3 over DIR_ (latest: step 2) and the last rank's write fails. */
static void failed_save(dt_comm *world, dt_params *ref, dt_optimizer *ro) {
    dt_params ps;
    dt_optimizer *o;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    fail_at f;
    struct rlimit saved;
    struct stat sb;
    char path[1200], latest[64] = "", why[200];
    dt_status st;
    FILE *fp;
    size_t n = 0;
    int have_limit, ok;
    make(&ps, W, R);
    o = sh_adamw(&C, &ps, world);
    sh_train(&C, &ps, o, 1, 3);
    memset(&cd, 0, sizeof cd);
    cd.dir = DIR_;
    cd.comm = world;
    cd.hook = fail_hook;
    cd.hook_user = &f;
    f.rank = W - 1;
    f.me = R;
    f.fired = 0;
    memset(&ts, 0, sizeof ts);
    ts.step = 3;
    signal(SIGXFSZ, SIG_IGN);
    have_limit = getrlimit(RLIMIT_FSIZE, &saved) == 0;
    st = dt_checkpoint_save(&C, &ps, o, &ts, &cd);
    if (have_limit) setrlimit(RLIMIT_FSIZE, &saved); /* before anything is printed */
    signal(SIGXFSZ, SIG_DFL);
    ok = R == W - 1 ? f.fired && st == DT_ERR_IO && strstr(dt_ctx_error(&C), "File too large")
                    : st != DT_OK && strstr(dt_ctx_error(&C), "failed") != NULL;
    snprintf(why, sizeof why, "hook fired %d, status %d: %.150s", f.fired, (int)st, dt_ctx_error(&C));
    dt_test_check_all("save_failing_on_last_rank_fails_on_every_rank", ok, "%s", why);
    dt_comm_barrier(world); /* every rank has returned: its cleanup is done */
    ok = 1;
    why[0] = 0;
    if (R == 0) {
        snprintf(path, sizeof path, "%s/step_00000003.tmp", DIR_);
        if (stat(path, &sb) == 0) { ok = 0; snprintf(why, sizeof why, "%.150s is still there", path); }
        snprintf(path, sizeof path, "%s/latest", DIR_);
        if ((fp = fopen(path, "rb")) != NULL) { n = fread(latest, 1, sizeof latest - 1, fp); fclose(fp); }
        latest[n] = 0;
        if (ok && strcmp(latest, "step_00000002\n") != 0) {
            ok = 0;
            snprintf(why, sizeof why, "latest holds \"%.20s\"; want step_00000002", latest);
        }
    }
    dt_test_check_all("failed_save_removes_step_tmp_of_every_rank_and_keeps_latest", ok, "%s", why);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
    /* the previous checkpoint loads as before: the reference's state after 2 steps */
    make(&ps, W, R);
    o = sh_adamw(&C, &ps, world);
    cd.hook = NULL;
    st = dt_checkpoint_load(&C, &ps, o, NULL, &cd);
    ok = st == DT_OK && o->step == 2 && diff_all(&ps, o, ref, ro) == 0;
    snprintf(why, sizeof why, "status %d, step %lld: %.150s", (int)st, (long long)o->step,
             st ? dt_ctx_error(&C) : "slices differ");
    dt_test_check_all("after_failed_save_previous_checkpoint_loads_bitwise", ok, "%s", why);
    dt_opt_free(o);
    dt_params_free(&C, &ps);
}

int main(void) {
    dt_comm *world;
    dt_params ps, ref;
    dt_optimizer *o, *ro;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    dt_status st;
    char why[160] = "";
    int sizes[3] = {1, 2, 0}, si, ok;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "%s\n", dt_ctx_error(&C)); return 2; }
    R = dt_comm_rank(world);
    W = dt_comm_size(world);
    snprintf(DIR_, sizeof DIR_, "%s/mpi_opt_ckpt", dt_test_tmpdir());

    /* the reference: one rank, whole tensors, the same two steps */
    make(&ref, 1, 0);
    ro = sh_adamw(&C, &ref, NULL);
    sh_train(&C, &ref, ro, 1, 2);

    /* the world: train, save */
    make(&ps, W, R);
    o = sh_adamw(&C, &ps, world);
    sh_train(&C, &ps, o, 1, 2);
    dt_test_check_all("sharded_training_equals_single_rank", diff_all(&ps, o, &ref, ro) == 0, "slices differ");
    memset(&cd, 0, sizeof cd);
    cd.dir = DIR_;
    cd.comm = world;
    cd.layout = "A,D:dim0 B:dim1 R:replicated";
    memset(&ts, 0, sizeof ts);
    ts.step = 2;
    ts.data_cursor = 77;
    ts.rng_seed = 42;
    dt_train_state_set(&C, &ts, "note", "mpi");
    st = dt_checkpoint_save(&C, &ps, o, &ts, &cd);
    dt_test_check_all("save_on_every_rank", st == DT_OK, "%s", dt_ctx_error(&C));
    ok = R != 0 || manifest_ok(why, sizeof why);
    dt_test_check_all("manifest_writes_replicated_once_and_every_shard", ok, "%s", why);
    if (R == 0) python_verify(&ref, ro);
    dt_opt_free(o);
    dt_params_free(&C, &ps);

    /* groups of 1, 2 and W ranks load with their own layout */
    sizes[2] = W;
    for (si = 0; si < 3; si++) {
        int s = sizes[si];
        dt_comm *sub = NULL;
        char name[64];
        if (s > W || (si == 2 && (s == 1 || s == 2))) continue;
        dt_comm_split(world, &sub, R < s ? 0 : -1, R);
        ok = 1;
        why[0] = 0;
        if (sub) {
            dt_train_state got;
            make(&ps, s, dt_comm_rank(sub));
            o = sh_adamw(&C, &ps, sub);
            memset(&got, 0, sizeof got);
            cd.comm = sub;
            st = dt_checkpoint_load(&C, &ps, o, &got, &cd);
            if (st) {
                ok = 0;
                snprintf(why, sizeof why, "%.150s", dt_ctx_error(&C));
            } else {
                int64_t bad = diff_all(&ps, o, &ref, ro);
                ok = bad == 0 && o->step == 2 && got.step == 2 && got.data_cursor == 77 && got.rng_seed == 42 &&
                     dt_train_state_get(&got, "note") != NULL;
                snprintf(why, sizeof why, "%lld elements differ, step %lld, cursor %lld", (long long)bad,
                         (long long)o->step, (long long)got.data_cursor);
            }
            dt_opt_free(o);
            dt_params_free(&C, &ps);
            dt_comm_free(sub);
        }
        snprintf(name, sizeof name, "load_saved_at_np%d_on_np%d_reshards_bitwise", W, s);
        dt_test_check_all(name, ok, "%s", why);
    }

    /* the other way: one process saves whole tensors, the world loads its slices */
    {
        char dir1[1100];
        snprintf(dir1, sizeof dir1, "%s_np1", DIR_);
        st = DT_OK;
        if (R == 0) {
            dt_checkpoint_desc c1 = cd;
            c1.dir = dir1;
            c1.comm = NULL;
            st = dt_checkpoint_save(&C, &ref, ro, &ts, &c1);
        }
        dt_comm_barrier(world);
        make(&ps, W, R);
        o = sh_adamw(&C, &ps, world);
        cd.dir = dir1;
        cd.comm = world;
        if (!st) st = dt_checkpoint_load(&C, &ps, o, NULL, &cd);
        ok = st == DT_OK && diff_all(&ps, o, &ref, ro) == 0;
        snprintf(why, sizeof why, "%.150s", st ? dt_ctx_error(&C) : "slices differ");
        snprintf(dir1, sizeof dir1, "load_whole_tensors_saved_by_one_process_on_np%d", W);
        dt_test_check_all(dir1, ok, "%s", why);
        cd.dir = DIR_;
        dt_opt_free(o);
        dt_params_free(&C, &ps);
    }

    /* one rank asks for a tensor the checkpoint lacks: every rank fails, nothing changes */
    {
        dt_param_desc pd;
        float before;
        make(&ps, W, R);
        if (R == W - 1) {
            memset(&pd, 0, sizeof pd);
            pd.name = "ghost";
            pd.shape[0] = 2;
            dt_params_add(&C, &ps, NULL, &pd);
        }
        o = sh_adamw(&C, &ps, world);
        before = ((float *)ps.items[0]->value.data)[0];
        cd.comm = world;
        st = dt_checkpoint_load(&C, &ps, o, NULL, &cd);
        ok = st != DT_OK && ((float *)ps.items[0]->value.data)[0] == before && o->step == 0 &&
             strstr(dt_ctx_error(&C), R == W - 1 ? "ghost" : "failed") != NULL;
        dt_test_check_all("failed_load_on_one_rank_fails_everywhere_and_changes_nothing", ok, "status %d: %.120s",
                          (int)st, dt_ctx_error(&C));
        dt_opt_free(o);
        dt_params_free(&C, &ps);
    }

    failed_save(world, &ref, ro);

    dt_opt_free(ro);
    dt_params_free(&C, &ref);
    {
        int rc = dt_test_finish();
        dt_comm_free(world);
        dt_ctx_shutdown(&C);
        return rc;
    }
}
