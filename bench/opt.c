/* bench/opt.c - CPU performance of dt_opt.h, each figure beside a peer measured in the same run
   on the same machine (DESIGN.md, Benchmarks):
     1. The AdamW update (dt_adam_update, one thread) in GB/s of optimizer state touched: param,
        grad, exp_avg, exp_avg_sq read, param, exp_avg, exp_avg_sq written = 28 bytes per
        parameter; against memcpy of 64 MiB (bytes read + written) in the same run.
        Target: AdamW / memcpy >= 0.5. Also shown: the bf16 master-weight form (+ 2 bytes per
        parameter for the working copy) and a whole dt_opt_step (which also reads every grad
        once more for the global norm when clip_norm is set, when info is passed, and on every
        step when a norm comm has more than one rank: credited with 32 bytes then; the "with
        info" row is that cost on one process, without the one-number all-reduce).
     2. dt_checkpoint_save / dt_checkpoint_load of an AdamW training state (params + exp_avg +
        exp_avg_sq, 3 x 48 MiB) in MB/s, against plain stdio of the same bytes:
        save vs fwrite + fflush + fsync of one file (dt fsyncs too; fairness),
        load vs fread of that file into a buffer, both from the page cache (the file was just
        written) and, when the kernel honours posix_fadvise(POSIX_FADV_DONTNEED), from the disk.
        Target: dt / stdio >= 0.8. dt's load maps the file, verifies the XXH64 of every byte and
        only then copies into the live tensors (nothing is half-loaded); its save hashes every byte,
        writes the manifest and `latest` with fsyncs and removes the previous step directory.
   Every figure is the median of REPS timed runs after one warm-up run; CLOCK_MONOTONIC.

   build (what ./build.sh does; it includes dt_comm.h, so build.sh uses mpicc -DDT_MPI):
       mpicc -std=c99 -O2 -g -Wall -Wextra -Werror -DDT_MPI -DDT_CBLAS -I. bench/opt.c \
           -o build/bench/opt -lopenblas -lm
   run:  build/bench/opt [dir]     dir: where the checkpoint files go (default $TMPDIR or /tmp)

   clock_gettime, posix_fadvise, fsync and fileno are POSIX, hidden by strict -std=c99; the
   feature-test macro asks for them. */
#define _POSIX_C_SOURCE 200809L

#define DT_IMPLEMENTATION
#include "../dt_tensor.h"
#include "../dt_comm.h"
#include "../dt_opt.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench.h"

enum { REPS = 11, CK_REPS = 5 };
#define N_ADAM ((int64_t)16 * 1024 * 1024)    /* 64 MiB per f32 array, well above the caches */
#define N_CKPT ((int64_t)12 * 1024 * 1024)    /* 48 MiB of f32 parameters: 144 MiB of state */

#define CHECK(call) do { dt_status s_ = (call); if (s_) { \
    fprintf(stderr, "bench/opt: %s failed: %s\n", #call, dt_ctx_error(&g_ctx)); exit(1); } } while (0)

static dt_ctx g_ctx;

static float *falloc(int64_t n, float v) {
    float *p = (float *)malloc((size_t)n * sizeof(float));
    int64_t i;
    if (!p) { fprintf(stderr, "bench/opt: out of memory\n"); exit(1); }
    for (i = 0; i < n; i++) p[i] = v + 1e-7f * (float)(i % 1000);
    return p;
}

/* ---------------------------------------------------------------- 1. the update */

static void bench_update(void) {
    float *w = falloc(N_ADAM, 0.5f), *g = falloc(N_ADAM, 0.01f), *m = falloc(N_ADAM, 0.0f), *v = falloc(N_ADAM, 0.0f);
    float *src = falloc(N_ADAM, 1.0f), *dst = falloc(N_ADAM, 0.0f);
    uint16_t *h = (uint16_t *)malloc((size_t)N_ADAM * 2);
    double t[REPS], copy_gbs, adam_gbs, bf_gbs, step_gbs, info_gbs, clip_gbs, xxh_gbs, bfs_gbs[2], t0;
    int sr;
    dt_opt_step_info info;
    volatile uint64_t hash_sink = 0;
    dt_params ps;
    dt_param *p;
    dt_param_desc pd;
    dt_optimizer *opt = NULL;
    dt_opt_desc od;
    int r;
    int64_t i;
    const double mem_bytes = 2.0 * 4 * (double)N_ADAM, adam_bytes = 28.0 * (double)N_ADAM;
    for (r = -1; r < REPS; r++) {
        t0 = now_s();
        memcpy(dst, src, (size_t)N_ADAM * 4);
        if (r >= 0) t[r] = now_s() - t0;
    }
    copy_gbs = mem_bytes / median(t, REPS) / 1e9;
    for (r = -1; r < REPS; r++) { /* the checkpoint checksum: every byte saved or loaded */
        t0 = now_s();
        hash_sink += dt_xxh64(src, (size_t)N_ADAM * 4);
        if (r >= 0) t[r] = now_s() - t0;
    }
    xxh_gbs = 4.0 * (double)N_ADAM / median(t, REPS) / 1e9;
    for (r = -1; r < REPS; r++) {
        t0 = now_s();
        dt_adam_update(w, g, m, v, N_ADAM, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1, r + 2);
        if (r >= 0) t[r] = now_s() - t0;
    }
    adam_gbs = adam_bytes / median(t, REPS) / 1e9;
    for (r = -1; r < REPS; r++) { /* master weights: the update, then the bf16 working copy */
        t0 = now_s();
        dt_adam_update(w, g, m, v, N_ADAM, 1e-3, 0.9, 0.999, 1e-8, 0.01, 1, r + 2);
        for (i = 0; i < N_ADAM; i++) h[i] = dt_f32_to_bf16(w[i]);
        if (r >= 0) t[r] = now_s() - t0;
    }
    bf_gbs = (adam_bytes + 2.0 * (double)N_ADAM) / median(t, REPS) / 1e9;
    /* a whole step through the optimizer object: grad pass (norm) + the update */
    memset(&ps, 0, sizeof ps);
    memset(&pd, 0, sizeof pd);
    pd.name = "w";
    pd.shape[0] = N_ADAM;
    CHECK(dt_params_add(&g_ctx, &ps, &p, &pd));
    memcpy(p->value.data, w, (size_t)N_ADAM * 4);
    memcpy(p->grad.data, g, (size_t)N_ADAM * 4);
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_ADAMW;
    CHECK(dt_opt_create(&g_ctx, &opt, &ps, &od));
    for (r = -1; r < REPS; r++) {
        t0 = now_s();
        CHECK(dt_opt_step(opt, NULL));
        if (r >= 0) t[r] = now_s() - t0;
    }
    step_gbs = adam_bytes / median(t, REPS) / 1e9;
    for (r = -1; r < REPS; r++) { /* the norm for the log: one more read of the grads */
        t0 = now_s();
        CHECK(dt_opt_step(opt, &info));
        if (r >= 0) t[r] = now_s() - t0;
    }
    info_gbs = (adam_bytes + 4.0 * (double)N_ADAM) / median(t, REPS) / 1e9;
    dt_opt_free(opt);
    od.clip_norm = 1e9; /* the norm pass runs, nothing is clipped: the same update */
    CHECK(dt_opt_create(&g_ctx, &opt, &ps, &od));
    for (r = -1; r < REPS; r++) {
        t0 = now_s();
        CHECK(dt_opt_step(opt, NULL));
        if (r >= 0) t[r] = now_s() - t0;
    }
    clip_gbs = (adam_bytes + 4.0 * (double)N_ADAM) / median(t, REPS) / 1e9;
    dt_opt_free(opt);
    dt_params_free(&g_ctx, &ps);
    /* a bf16 parameter: the update on its f32 master, the value rounded to nearest or (sr)
       stochastically (a splitmix64 hash per element) */
    pd.dtype = DT_BF16;
    for (sr = 0; sr < 2; sr++) {
        memset(&ps, 0, sizeof ps);
        CHECK(dt_params_add(&g_ctx, &ps, &p, &pd));
        memcpy(p->grad.data, g, (size_t)N_ADAM * 4);
        memset(&od, 0, sizeof od);
        od.kind = DT_OPT_ADAMW; od.stochastic_rounding = sr; od.rounding_seed = 1;
        CHECK(dt_opt_create(&g_ctx, &opt, &ps, &od));
        for (r = -1; r < REPS; r++) {
            t0 = now_s();
            CHECK(dt_opt_step(opt, NULL));
            if (r >= 0) t[r] = now_s() - t0;
        }
        bfs_gbs[sr] = (adam_bytes + 2.0 * (double)N_ADAM) / median(t, REPS) / 1e9;
        dt_opt_free(opt);
        dt_params_free(&g_ctx, &ps);
    }
    printf("== 1. AdamW update, 1 thread, %lld parameters (64 MiB per array); GB/s of state touched\n",
           (long long)N_ADAM);
    printf("%-34s %12s %9s %9s\n", "", "bytes/param", "GB/s", "/memcpy");
    printf("%-34s %12s %9.2f %9.3f\n", "memcpy (reference, r+w)", "r4 w4", copy_gbs, 1.0);
    printf("%-34s %12s %9.2f %9.3f\n", "dt_adam_update (AdamW)", "r16 w12", adam_gbs, adam_gbs / copy_gbs);
    printf("%-34s %12s %9.2f %9.3f\n", "  + bf16 working copy (master)", "r16 w14", bf_gbs, bf_gbs / copy_gbs);
    printf("%-34s %12s %9.2f %9.3f\n", "dt_opt_step (AdamW, whole step)", "r16 w12", step_gbs, step_gbs / copy_gbs);
    printf("%-34s %12s %9.2f %9.3f\n", "  with info (+ grad norm pass)", "r20 w12", info_gbs, info_gbs / copy_gbs);
    printf("%-34s %12s %9.2f %9.3f\n", "  with clip_norm (+ grad norm pass)", "r20 w12", clip_gbs, clip_gbs / copy_gbs);
    printf("%-34s %12s %9.2f %9.3f\n", "dt_opt_step, bf16 value (nearest)", "r16 w14", bfs_gbs[0], bfs_gbs[0] / copy_gbs);
    printf("%-34s %12s %9.2f %9.3f\n", "  stochastic rounding", "r16 w14", bfs_gbs[1], bfs_gbs[1] / copy_gbs);
    printf("%-34s %12s %9.2f %9.3f\n", "dt_xxh64 (checkpoint checksum)", "r4", xxh_gbs, xxh_gbs / copy_gbs);
    printf("AdamW / memcpy = %.3f (target >= 0.5): %s\n", adam_gbs / copy_gbs,
           adam_gbs / copy_gbs >= 0.5 ? "met" : "NOT met");
    printf("the grad norm pass costs %.0f%% of a step's time (info row vs whole step, same update)\n\n",
           100.0 * ((adam_bytes + 4.0 * (double)N_ADAM) / info_gbs - adam_bytes / step_gbs) / (adam_bytes / step_gbs));
    free(w); free(g); free(m); free(v); free(src); free(dst); free(h);
}

/* ---------------------------------------------------------------- 2. checkpoints */

/* Drops the file's pages from the page cache (clean pages only: call after an fsync). 0 if the
   kernel did it. */
static int drop_cache(const char *path) {
    int fd = open(path, O_RDONLY), r;
    if (fd < 0) return -1;
    r = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return r;
}

static void stdio_write(const char *path, dt_params *ps, dt_optimizer *opt) {
    FILE *fp = fopen(path, "wb");
    int i, k;
    if (!fp) { perror(path); exit(1); }
    for (i = 0; i < ps->count; i++) {
        fwrite(ps->items[i]->value.data, 1, dt_tensor_bytes(&ps->items[i]->value), fp);
        for (k = 0; k < 2; k++) fwrite(opt->slots[i].state[k].data, 1, dt_tensor_bytes(&opt->slots[i].state[k]), fp);
    }
    if (fflush(fp) != 0 || fsync(fileno(fp)) != 0) perror("fsync");
    fclose(fp);
}

static void stdio_read(const char *path, char *buf, size_t bytes) {
    FILE *fp = fopen(path, "rb");
    if (!fp || fread(buf, 1, bytes, fp) != bytes) { perror(path); exit(1); }
    fclose(fp);
}

static void bench_checkpoint(const char *root) {
    char dir[1024], file[1100], rank_file[1200];
    dt_params ps;
    dt_param_desc pd;
    dt_optimizer *opt = NULL;
    dt_opt_desc od;
    dt_checkpoint_desc cd;
    dt_train_state ts;
    double ts_save[CK_REPS], ts_fw[CK_REPS], ts_load[CK_REPS], ts_fr[CK_REPS], ts_loadc[CK_REPS], ts_frc[CK_REPS];
    double mb, t0, save, fw, load, fr, loadc = 0, frc = 0;
    char *buf;
    const char *names[4] = {"embed", "block0.w", "block1.w", "head"};
    int i, r, cold = 1;
    size_t bytes;
    snprintf(dir, sizeof dir, "%s/dt_bench_opt_ckpt", root);
    snprintf(file, sizeof file, "%s/dt_bench_opt_stdio.bin", root);
    memset(&ps, 0, sizeof ps);
    for (i = 0; i < 4; i++) { /* four tensors of 12 MiB */
        memset(&pd, 0, sizeof pd);
        pd.name = names[i];
        pd.shape[0] = N_CKPT / 4 / 1024;
        pd.shape[1] = 1024;
        pd.init.kind = DT_INIT_NORMAL;
        pd.init.std = 0.02;
        CHECK(dt_params_add(&g_ctx, &ps, NULL, &pd));
    }
    memset(&od, 0, sizeof od);
    od.kind = DT_OPT_ADAMW;
    CHECK(dt_opt_create(&g_ctx, &opt, &ps, &od));
    for (i = 0; i < ps.count; i++) { /* non-trivial state */
        dt_tensor_fill(&g_ctx, &opt->slots[i].state[0], 1e-3);
        dt_tensor_fill(&g_ctx, &opt->slots[i].state[1], 1e-6);
    }
    bytes = 3 * (size_t)N_CKPT * 4;
    mb = (double)bytes / 1e6;
    buf = (char *)malloc(bytes);
    memset(&cd, 0, sizeof cd);
    cd.dir = dir;
    cd.keep = 1;
    memset(&ts, 0, sizeof ts);
    for (r = -1; r < CK_REPS; r++) {
        ts.step = r + 2;
        t0 = now_s();
        CHECK(dt_checkpoint_save(&g_ctx, &ps, opt, &ts, &cd));
        if (r >= 0) ts_save[r] = now_s() - t0;
        t0 = now_s();
        stdio_write(file, &ps, opt);
        if (r >= 0) ts_fw[r] = now_s() - t0;
        t0 = now_s();
        CHECK(dt_checkpoint_load(&g_ctx, &ps, opt, &ts, &cd));
        if (r >= 0) ts_load[r] = now_s() - t0;
        t0 = now_s();
        stdio_read(file, buf, bytes);
        if (r >= 0) ts_fr[r] = now_s() - t0;
        /* cold: the pages dropped first (the files are clean after the fsyncs) */
        snprintf(rank_file, sizeof rank_file, "%s/step_%08lld/rank_00000.safetensors", dir, (long long)ts.step);
        if (drop_cache(rank_file) != 0 || drop_cache(file) != 0) cold = 0;
        t0 = now_s();
        CHECK(dt_checkpoint_load(&g_ctx, &ps, opt, &ts, &cd));
        if (r >= 0) ts_loadc[r] = now_s() - t0;
        t0 = now_s();
        stdio_read(file, buf, bytes);
        if (r >= 0) ts_frc[r] = now_s() - t0;
    }
    save = mb / median(ts_save, CK_REPS);
    fw = mb / median(ts_fw, CK_REPS);
    load = mb / median(ts_load, CK_REPS);
    fr = mb / median(ts_fr, CK_REPS);
    if (cold) { loadc = mb / median(ts_loadc, CK_REPS); frc = mb / median(ts_frc, CK_REPS); }
    printf("== 2. checkpoints of an AdamW state (params + exp_avg + exp_avg_sq = %.0f MB) in %s\n", mb, root);
    printf("%-44s %9s %9s %9s\n", "", "dt MB/s", "stdio", "dt/stdio");
    printf("%-44s %9.0f %9.0f %9.3f\n", "save vs fwrite+fflush+fsync", save, fw, save / fw);
    printf("%-44s %9.0f %9.0f %9.3f\n", "load vs fread, page cache (warm)", load, fr, load / fr);
    if (cold) printf("%-44s %9.0f %9.0f %9.3f\n", "load vs fread, pages dropped (cold)", loadc, frc, loadc / frc);
    else printf("load from disk: not measured (posix_fadvise(DONTNEED) refused)\n");
    printf("save/stdio = %.3f, load/stdio = %.3f warm%s (target >= 0.8)\n", save / fw, load / fr,
           cold ? "" : " (cold not measured)");
    if (cold) printf("                                load/stdio = %.3f cold\n", loadc / frc);
    {
        char cmd[2400];
        snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", dir, file);
        if (system(cmd) != 0) fprintf(stderr, "bench/opt: could not remove %s\n", dir);
    }
    free(buf);
    dt_opt_free(opt);
    dt_params_free(&g_ctx, &ps);
}

int main(int argc, char **argv) {
    const char *root = argc > 1 ? argv[1] : getenv("TMPDIR");
    double t0 = now_s();
    if (!root || !root[0]) root = "/tmp";
    CHECK(dt_ctx_init(&g_ctx, NULL));
    printf("bench/opt: dt_opt.h on the CPU, medians of %d (update) and %d (checkpoint) runs\n\n", REPS, CK_REPS);
    bench_update();
    bench_checkpoint(root);
    printf("\nbench/opt took %.0f s\n", now_s() - t0);
    dt_ctx_shutdown(&g_ctx);
    return 0;
}
