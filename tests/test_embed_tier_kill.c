/* tests/test_embed_tier_kill.c - a process training a tiered table (tier DISK) is killed with
   SIGKILL 20 ms into a loop of steps, each followed by dt_embed_flush (hundreds of changed rows
   written back each time), and once into a loop of steps alone; its last checkpoint then loads
   into a new tiered table and into a resident one, which continue equal bit for bit, and the
   dead process left no slow-tier file behind (the file is unlinked as soon as it is made). Where
   in the loop the kill lands is the machine's timing; what is checked holds wherever it lands.
   One process (fork), no MPI. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_embed.h"
#include "dt_test.h"

#include <dirent.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define B 64
static dt_ctx C;

static dt_embed *make(const char *tier_dir) {
    dt_embed_table_desc t;
    dt_embed_desc d;
    dt_embed *e = NULL;
    memset(&t, 0, sizeof t);
    t.name = "big"; t.rows = 200000; t.dim = 16; t.optim.kind = DT_EMBED_ADAGRAD;
    if (tier_dir) { t.tier = DT_TIER_DISK; t.cache_rows = 50000; }
    memset(&d, 0, sizeof d);
    d.tables = &t; d.n_tables = 1; d.seed = 9; d.tier_dir = tier_dir;
    if (dt_embed_create(&C, &e, &d)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    return e;
}

/* Step s: B bags of 8 ids, uniform over the rows (many rows changed per step). */
static void step(dt_embed *e, int s, dt_tensor *out) {
    int64_t len[B], ids[B * 8], b;
    dt_kjt k;
    dt_tensor dout;
    for (b = 0; b < B; b++) len[b] = 8;
    for (b = 0; b < B * 8; b++) ids[b] = (int64_t)(dt_rng_uniform(50 + (uint64_t)s, 0, (uint64_t)b) * 200000.0f) % 200000;
    memset(&k, 0, sizeof k);
    k.n_features = 1; k.batch = B; k.lengths = len; k.ids = ids;
    if (dt_embed_forward(e, out, &k)) { fprintf(stderr, "forward: %s\n", dt_ctx_error(&C)); exit(2); }
    dout = dt_test_t2(&C, B, 16);
    for (b = 0; b < B * 16; b++) ((float *)dout.data)[b] = dt_rng_normal(60 + (uint64_t)s, 0, (uint64_t)b);
    if (dt_embed_backward(e, &dout)) { fprintf(stderr, "backward: %s\n", dt_ctx_error(&C)); exit(2); }
    dt_tensor_free(&C, &dout);
}

static int tier_files(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *x;
    int n = 0;
    if (!d) return 0;
    while ((x = readdir(d)) != NULL) n += strstr(x->d_name, ".tier") != NULL;
    closedir(d);
    return n;
}

/* The child: 3 steps, a checkpoint, then steps and flushes until killed. It says "go" on the
   pipe once it starts the loop. */
static void child(const char *tdir, const char *ck, int fd, int flushing) {
    dt_embed *e = make(tdir);
    dt_tensor out = dt_test_t2(&C, B, 16);
    dt_checkpoint_desc cd;
    dt_train_state ts;
    int s;
    for (s = 0; s < 3; s++) step(e, s, &out);
    memset(&cd, 0, sizeof cd);
    memset(&ts, 0, sizeof ts);
    cd.dir = ck; ts.step = 3;
    if (dt_embed_checkpoint_save(e, &ts, &cd)) { fprintf(stderr, "save: %s\n", dt_ctx_error(&C)); _exit(2); }
    if (write(fd, "g", 1) != 1) _exit(2);
    for (s = 3;; s++) {
        step(e, s, &out);
        if (flushing) (void)dt_embed_flush(e);
    }
}

static void killed(const char *name, int flushing) {
    char tdir[600], ck[600], check[160], go;
    int p[2], st, s;
    int64_t bad = 0;
    pid_t pid;
    struct timespec ms = {0, 20 * 1000000L};
    snprintf(tdir, sizeof tdir, "%s/%s_tier", dt_test_tmpdir(), name);
    snprintf(ck, sizeof ck, "%s/%s_ckpt", dt_test_tmpdir(), name);
    {
        char cmd[1300];
        snprintf(cmd, sizeof cmd, "mkdir -p %s", tdir);
        if (system(cmd) != 0) { dt_test_fail(name, "cannot make %s", tdir); return; }
    }
    if (pipe(p) != 0) { dt_test_fail(name, "pipe"); return; }
    fflush(NULL);
    pid = fork();
    if (pid == 0) { close(p[0]); child(tdir, ck, p[1], flushing); _exit(0); }
    close(p[1]);
    if (read(p[0], &go, 1) != 1) { dt_test_fail(name, "the child did not start its loop"); return; }
    nanosleep(&ms, NULL); /* a few steps (and flushes) in */
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    close(p[0]);
    snprintf(check, sizeof check, "%s_was_killed", name);
    DT_TEST_CHECK(check, WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    {   /* the checkpoint of step 3, into a tiered and a resident table: the same next steps */
        dt_embed *a = make(tdir), *r = make(NULL);
        dt_tensor oa = dt_test_t2(&C, B, 16), orr = dt_test_t2(&C, B, 16), va, vr;
        dt_checkpoint_desc cd;
        dt_train_state ts;
        memset(&cd, 0, sizeof cd);
        cd.dir = ck;
        if (dt_embed_checkpoint_load(a, &ts, &cd) || dt_embed_checkpoint_load(r, &ts, &cd)) {
            dt_test_fail(name, "load: %s", dt_ctx_error(&C));
            return;
        }
        for (s = 3; s < 6; s++) {
            step(a, s, &oa);
            step(r, s, &orr);
            if (memcmp(oa.data, orr.data, (size_t)B * 16 * 4) != 0) bad++;
        }
        dt_embed_local_shard(a, &va, NULL, NULL, 0); /* flushes */
        dt_embed_local_shard(r, &vr, NULL, NULL, 0);
        if (memcmp(va.data, vr.data, dt_tensor_bytes(&vr)) != 0) bad++;
        snprintf(check, sizeof check, "%s_checkpoint_loads_and_continues_equal", name);
        dt_test_expect(check, bad == 0 && ts.step == 3, "%lld steps or the shard differ; step %lld", (long long)bad,
                      (long long)ts.step);
        dt_embed_free(a);
        dt_embed_free(r);
        dt_tensor_free(&C, &oa); dt_tensor_free(&C, &orr);
    }
    snprintf(check, sizeof check, "%s_left_no_slow_tier_file", name);
    dt_test_expect(check, tier_files(tdir) == 0, "%d *.tier files in %s", tier_files(tdir), tdir);
}

int main(void) {
    dt_ctx_init(&C, NULL);
    killed("embed_tier_killed_while_flushing", 1);
    killed("embed_tier_killed_while_training", 0);
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
