// mpi-driver
/* tests/mpi_opt_kill.c - a multi-rank save killed part-way leaves the previous checkpoint.

   Run directly (not under mpirun), this program is the driver: for each case it starts
       $DT_MPIRUN -np 2 <this program> worker DIR KILL_RANK POINT INDEX
   whose two ranks train 2 AdamW steps on a row-sharded f32 tensor, a replicated one and a
   row-sharded bf16 one (f32 master weights), saving after each step. During the save of step 2
   rank KILL_RANK sends itself SIGKILL at the save's hook POINT/INDEX (it first leaves a marker
   file, so the driver knows the kill happened there); mpirun then takes the other rank down
   too, as a real job loses a node. The driver then loads DIR in its own process (world of one,
   so the 2-rank files are resharded) and checks that `latest` names the step it must (step 1
   when killed before `latest` moved, step 2 after) and that the load is bitwise the state a
   single process reaches after that many steps. A run without a kill is the baseline. */
#define _POSIX_C_SOURCE 200809L
#include "dt_tensor.h"
#include "dt_comm.h"
#include "dt_opt.h"
#include "dt_test.h"
#include "opt/sharded.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static dt_ctx C;

/* The model as `parts` ranks hold it, this rank being number idx: A [6,4] rows split, R [5]
   whole on every rank, D [4,2] bf16 rows split. */
static void make(dt_params *ps, int parts, int idx) {
    static const char *names[3] = {"A", "R", "D"};
    int64_t gs[3][2] = {{6, 4}, {5, 0}, {4, 2}};
    int i, d;
    memset(ps, 0, sizeof *ps);
    for (i = 0; i < 3; i++) {
        dt_param_desc pd;
        memset(&pd, 0, sizeof pd);
        pd.name = names[i];
        pd.dtype = i == 2 ? DT_BF16 : DT_F32;
        for (d = 0; d < 2; d++) { pd.global_shape[d] = gs[i][d]; pd.shape[d] = gs[i][d]; }
        if (i != 1) { pd.shape[0] = gs[i][0] / parts; pd.start[0] = idx * pd.shape[0]; }
        pd.init.kind = DT_INIT_NORMAL;
        pd.init.seed = 9;
        pd.init.std = 1;
        if (dt_params_add(&C, ps, NULL, &pd)) { fprintf(stderr, "make: %s\n", dt_ctx_error(&C)); exit(2); }
    }
}

/* ---------------------------------------------------------------- worker (under mpirun) */

typedef struct kill_at {
    int rank, index, me;
    const char *point, *marker;
} kill_at;

static void kill_hook(const char *point, int index, void *user) {
    const kill_at *k = (const kill_at *)user;
    FILE *fp;
    if (k->me != k->rank || index != k->index || strcmp(point, k->point) != 0) return;
    if ((fp = fopen(k->marker, "w")) != NULL) fclose(fp);
    raise(SIGKILL);
}

static int worker(char **argv) {
    dt_comm *world = NULL;
    dt_params ps;
    dt_optimizer *o;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    kill_at k;
    char marker[1200];
    int t;
    dt_ctx_init(&C, NULL);
    if (dt_comm_create_world(&C, &world, NULL)) { fprintf(stderr, "world: %s\n", dt_ctx_error(&C)); return 2; }
    snprintf(marker, sizeof marker, "%s/killed", argv[2]);
    k.rank = atoi(argv[3]);
    k.point = argv[4];
    k.index = atoi(argv[5]);
    k.me = dt_comm_rank(world);
    k.marker = marker;
    make(&ps, dt_comm_size(world), dt_comm_rank(world));
    o = sh_adamw(&C, &ps, world);
    for (t = 1; t <= 2; t++) {
        sh_train(&C, &ps, o, t, t);
        memset(&cd, 0, sizeof cd);
        cd.dir = argv[2];
        cd.comm = world;
        cd.layout = "rows split over 2";
        if (t == 2) { cd.hook = kill_hook; cd.hook_user = &k; }
        memset(&ts, 0, sizeof ts);
        ts.step = t;
        if (dt_checkpoint_save(&C, &ps, o, &ts, &cd)) { fprintf(stderr, "save: %s\n", dt_ctx_error(&C)); return 2; }
    }
    dt_opt_free(o);
    dt_params_free(&C, &ps);
    dt_comm_free(world);
    dt_ctx_shutdown(&C);
    return 0;
}

/* ---------------------------------------------------------------- driver */

static const char *self;

static void show_file(const char *path) {
    char line[512];
    FILE *fp = fopen(path, "r");
    int n = 0;
    if (!fp) return;
    while (fgets(line, sizeof line, fp) && n++ < 30) fprintf(stderr, "    | %s", line);
    fclose(fp);
}

static int file_exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

/* Runs the 2-rank job killed at rank/point/index (rank -1: not killed) in a fresh directory and
   checks what a 1-process load of that directory finds. */
static void kill_case(int rank, const char *point, int index, int want_step) {
    char dir[1024], cmd[4096], path[1200], latest[64], want[64], name[160];
    const char *mpirun = getenv("DT_MPIRUN");
    dt_params ps, rps;
    dt_optimizer *o, *ro;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    dt_status st;
    FILE *fp;
    size_t n = 0;
    int status, i, s, passed = 0;
    int64_t bad = 0;
    if (rank < 0) snprintf(name, sizeof name, "two_rank_save_unkilled");
    else snprintf(name, sizeof name, "two_rank_save_killed_on_rank_%d_at_%s_%d", rank, point, index);
    if (!mpirun || !mpirun[0]) mpirun = geteuid() == 0 ? "mpirun --oversubscribe --allow-run-as-root" : "mpirun --oversubscribe";
    snprintf(dir, sizeof dir, "%s/dt_kill_%ld_%d_%s_%d", dt_test_tmpdir(), (long)getpid(), rank + 1, point, index);
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    if (system(cmd) != 0) { dt_test_fail(name, "cannot make %s", dir); return; }
    /* timeout: a job that mpirun fails to take down is this case's failure, not the whole run's */
    snprintf(cmd, sizeof cmd, "timeout 120 %s -np 2 '%s' worker '%s' %d %s %d > '%s/worker.log' 2>&1", mpirun, self,
             dir, rank, point, index, dir);
    fflush(stdout);
    status = system(cmd);
    snprintf(path, sizeof path, "%s/killed", dir);
    if (rank < 0 ? status != 0 : (status == 0 || !file_exists(path))) {
        dt_test_fail(name, "the job %s (status %d; 124: timed out); %s kept; its output:",
                     rank < 0 ? "failed" : "was not killed at that point", status, dir);
        snprintf(path, sizeof path, "%s/worker.log", dir);
        show_file(path);
        return;
    }
    /* what `latest` names */
    snprintf(path, sizeof path, "%s/latest", dir);
    latest[0] = 0;
    if ((fp = fopen(path, "rb")) != NULL) { n = fread(latest, 1, sizeof latest - 1, fp); fclose(fp); }
    latest[n] = 0;
    if (n && latest[n - 1] == '\n') latest[n - 1] = 0;
    snprintf(want, sizeof want, "step_%08d", want_step);
    if (strcmp(latest, want) != 0)
        dt_test_fail(name, "latest holds \"%s\"; expected \"%s\" (%s kept)", latest, want, dir);
    /* a 1-process load (resharding the 2 rank files) equals a 1-process run of want_step steps */
    make(&ps, 1, 0);
    o = sh_adamw(&C, &ps, NULL);
    make(&rps, 1, 0);
    ro = sh_adamw(&C, &rps, NULL);
    sh_train(&C, &rps, ro, 1, want_step);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    memset(&ts, 0, sizeof ts);
    st = dt_checkpoint_load(&C, &ps, o, &ts, &cd);
    if (st) {
        dt_test_fail(name, "load after the kill: %s (%s kept)", dt_ctx_error(&C), dir);
    } else {
        for (i = 0; i < ps.count; i++) {
            const dt_tensor *a[4] = {&ps.items[i]->value, &o->slots[i].master, &o->slots[i].state[0], &o->slots[i].state[1]};
            const dt_tensor *b[4] = {&rps.items[i]->value, &ro->slots[i].master, &ro->slots[i].state[0],
                                     &ro->slots[i].state[1]};
            for (s = 0; s < 4; s++)
                if (a[s]->data && (!b[s]->data || memcmp(a[s]->data, b[s]->data, dt_tensor_bytes(a[s])) != 0)) bad++;
        }
        if (ts.step != want_step || o->step != want_step || bad)
            dt_test_fail(name, "loaded train step %lld, optimizer step %lld, %lld tensors differ from a 1-process "
                         "run of %d steps (%s kept)", (long long)ts.step, (long long)o->step, (long long)bad,
                         want_step, dir);
        else if (strcmp(latest, want) == 0)
            passed = 1;
    }
    dt_opt_free(o);
    dt_opt_free(ro);
    dt_params_free(&C, &ps);
    dt_params_free(&C, &rps);
    if (!passed) return; /* the directory and worker.log stay, for a look */
    dt_test_pass(name);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

int main(int argc, char **argv) {
    if (argc == 6 && strcmp(argv[1], "worker") == 0) return worker(argv);
    self = argv[0];
    dt_ctx_init(&C, NULL);
    kill_case(-1, "none", 0, 2);
    kill_case(1, "tensor", 0, 1);    /* rank 1 dies inside its rank file */
    kill_case(1, "tensor", 3, 1);
    kill_case(1, "rank_file", 1, 1); /* rank 1's file complete; rank 0's maybe not */
    kill_case(0, "rank_file", 0, 1);
    kill_case(0, "manifest", 0, 1);  /* every file and the manifest written, not renamed */
    kill_case(0, "renamed", 0, 1);   /* step_00000002/ in place, latest not moved */
    kill_case(0, "latest", 0, 2);    /* latest moved: step 2 is the checkpoint */
    dt_ctx_shutdown(&C);
    return dt_test_finish();
}
