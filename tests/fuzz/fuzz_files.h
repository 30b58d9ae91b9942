/* tests/fuzz/fuzz_files.h - what the file readers' libFuzzer targets share (tests/fuzz/fuzz_plan.c,
   fuzz_ckpt.c, fuzz_gpt_shard.c): the check macro, a scratch directory the inputs are written
   into (the readers take paths, not memory), and the check every failed load must pass.

   Include after the dt headers; needs _POSIX_C_SOURCE 200809L before the first system header
   (mkdtemp). The targets are also included together into tests/test_fuzz_files_replay.c, which
   defines DT_FUZZ_CHECK first and DT_FUZZ_NO_MAIN (no LLVMFuzzerTestOneInput). */
#ifndef DT_FUZZ_FILES_H
#define DT_FUZZ_FILES_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef DT_FUZZ_CHECK
#define DT_FUZZ_CHECK(cond, what)                                             \
    do {                                                                      \
        if (!(cond)) {                                                        \
            fprintf(stderr, "fuzz: check failed: %s (%s)\n", what, #cond);   \
            abort();                                                          \
        }                                                                     \
    } while (0)
#endif

/* One scratch directory per process, under $DT_TEST_TMPDIR (tests/run.sh's), $TMPDIR or /tmp,
   removed at exit with the files the targets leave in it (each target names its own). */
static char dt_fuzz_dir_path[512];
static const char *const dt_fuzz_leftovers[] = {
    "plan.json", "plan_again.json", "shard.bin", "ckpt/latest", "ckpt/step_00000007/manifest.json",
    "ckpt/step_00000007/rank_00000.safetensors", "ckpt/step_00000007/rank_00001.safetensors",
    "ckpt/step_00000007/rank_00002.safetensors", "ckpt/step_00000007/rank_00003.safetensors",
    "ckpt/step_00000007", "ckpt"};

static void dt_fuzz_dir_remove(void) {
    char path[1024];
    size_t i;
    for (i = 0; i < sizeof dt_fuzz_leftovers / sizeof *dt_fuzz_leftovers; i++) {
        snprintf(path, sizeof path, "%s/%s", dt_fuzz_dir_path, dt_fuzz_leftovers[i]);
        remove(path);
    }
    remove(dt_fuzz_dir_path);
}

static const char *dt_fuzz_dir(void) {
    if (!dt_fuzz_dir_path[0]) {
        const char *base = getenv("DT_TEST_TMPDIR");
        if (!base || !base[0]) base = getenv("TMPDIR");
        if (!base || !base[0]) base = "/tmp";
        snprintf(dt_fuzz_dir_path, sizeof dt_fuzz_dir_path, "%.400s/dt_fuzz_XXXXXX", base);
        DT_FUZZ_CHECK(mkdtemp(dt_fuzz_dir_path) != NULL, "a scratch directory");
        atexit(dt_fuzz_dir_remove);
    }
    return dt_fuzz_dir_path;
}

/* dir/name, in out[n] */
static const char *dt_fuzz_path(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/%s", dt_fuzz_dir(), name);
    return out;
}

static void dt_fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    DT_FUZZ_CHECK(f != NULL, "scratch file opens");
    if (f) {
        DT_FUZZ_CHECK(n == 0 || fwrite(data, 1, n, f) == n, "scratch file written");
        DT_FUZZ_CHECK(fclose(f) == 0, "scratch file closed");
    }
}

/* The input of the run, for checks a file's own text could fool (a message echoes the file). */
static const uint8_t *dt_fuzz_input;
static size_t dt_fuzz_input_size;

static int dt_fuzz_input_has(const char *s) {
    size_t i, n = strlen(s);
    for (i = 0; n && i + n <= dt_fuzz_input_size; i++)
        if (!memcmp(dt_fuzz_input + i, s, n)) return 1;
    return 0;
}

/* A failed load: a non-zero status, a message that starts with the function's name and names
   the file (its path or, with want2, that other text), and no memory kept. */
static void dt_fuzz_check_failure(dt_ctx *ctx, dt_status st, size_t bytes_before, const char *fn, const char *want,
                                  const char *want2) {
    const char *msg = dt_ctx_error(ctx);
    int starts = !strncmp(msg, fn, strlen(fn)) && msg[strlen(fn)] == ':',
        names = strstr(msg, want) || (want2 && strstr(msg, want2)), once = 1;
    /* the function named twice: a message formatted from its own buffer ("fn: file: fn: file: ..."),
       unless the input put the name there */
    if (starts && !dt_fuzz_input_has(fn)) once = !strstr(msg + strlen(fn), fn);
    if (st == DT_OK || ctx->last_status != st || !starts || !names || !once)
        fprintf(stderr, "fuzz: %s returned %d, the ctx holds %d: \"%s\"\n", fn, (int)st, (int)ctx->last_status, msg);
    DT_FUZZ_CHECK(st != DT_OK, "a failure is a status");
    DT_FUZZ_CHECK(ctx->last_status == st, "the status returned is the ctx's");
    DT_FUZZ_CHECK(starts, "the message starts with the function");
    DT_FUZZ_CHECK(names, "the message names the file");
    DT_FUZZ_CHECK(once, "the message says the function once (not garbled)");
    DT_FUZZ_CHECK(ctx->bytes_in_use == bytes_before, "a failed load keeps no memory");
}

#endif /* DT_FUZZ_FILES_H */
