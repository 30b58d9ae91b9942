/* tests/test_fuzz_files_replay.c - runs every file of the file readers' seed corpora through
   their libFuzzer targets' checks, without libFuzzer: a deterministic replay that tests/run.sh
   builds with gcc, plainly and with ASan+UBSan.

       tests/fuzz/corpus_plan       tests/fuzz/fuzz_plan.c       dt_plan.h's three JSON readers
       tests/fuzz/corpus_ckpt       tests/fuzz/fuzz_ckpt.c       dt_opt.h's dt_checkpoint_load
       tests/fuzz/corpus_gpt_shard  tests/fuzz/fuzz_gpt_shard.c  examples/gpt/gpt_data.h's shards

   Each corpus holds files the readers accept (ok_*: written by the matching save function, or
   docs/machines' files; each must load), files they must refuse (bad_*: each must fail, with
   the checks of a failure), and small inputs the fuzzer found (any result; the checks hold).
   $DT_FUZZ_CORPORA names another directory holding the three. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, in the targets */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dt_replay_file = "";
static int dt_replay_failed = 0;
/* a failed check of a target: one FAIL line naming the input, and the replay goes on */
#define DT_FUZZ_CHECK(cond, what)                                                                     \
    do {                                                                                              \
        if (!(cond)) {                                                                                \
            printf("FAIL fuzz_files_replay_%s: check \"%s\" (%s) failed\n", dt_replay_file, what, #cond); \
            dt_replay_failed++;                                                                       \
        }                                                                                             \
    } while (0)
#define DT_FUZZ_NO_MAIN

#include "fuzz/fuzz_plan.c"
#include "fuzz/fuzz_ckpt.c"
#include "fuzz/fuzz_gpt_shard.c"
#include "dt_test.h"

/* one input through its target: 1 when the reader took it (plan: exactly one of the three) */
static int dt_replay_plan(const uint8_t *d, size_t n) { return dt_fuzz_plan_one(d, n) == 1; }
static int dt_replay_ckpt(const uint8_t *d, size_t n) { return dt_fuzz_ckpt_one(d, n) == DT_OK; }
static int dt_replay_gpt(const uint8_t *d, size_t n) { return dt_fuzz_gpt_one(d, n) == DT_OK; }

static int dt_replay_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every file of dir/name, in name order; the failures are counted in dt_replay_failed. */
static void dt_replay_corpus(const char *root, const char *name, int (*one)(const uint8_t *, size_t)) {
    char dir[1200], path[2400], label[300], *names[256];
    DIR *d;
    struct dirent *e;
    int n = 0, i, unread = 0, n_ok = 0, failed_before = dt_replay_failed;
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    if (!(d = opendir(dir))) {
        dt_test_fail("fuzz_files_corpus_exists", "cannot open %s", dir);
        return;
    }
    while ((e = readdir(d)) != NULL && n < 256)
        if (e->d_name[0] != '.') { /* strdup is not C99 */
            size_t l = strlen(e->d_name) + 1;
            names[n] = (char *)malloc(l);
            memcpy(names[n++], e->d_name, l);
        }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, dt_replay_cmp); /* a fixed order, run after run */
    for (i = 0; i < n; i++) {
        FILE *f;
        long len;
        unsigned char *buf;
        int took;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        snprintf(label, sizeof label, "%s_%s", name, names[i]);
        dt_replay_file = label;
        if (!(f = fopen(path, "rb")) || fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
            if (f) fclose(f);
            unread++;
            continue;
        }
        buf = (unsigned char *)malloc((size_t)len + 1);
        if (fread(buf, 1, (size_t)len, f) == (size_t)len) {
            took = one(buf, (size_t)len);
            if (!strncmp(names[i], "ok_", 3)) {
                n_ok++;
                DT_FUZZ_CHECK(took, "a seed the reader accepts loads");
            }
            if (!strncmp(names[i], "bad_", 4)) DT_FUZZ_CHECK(!took, "a seed the reader refuses fails");
        } else {
            unread++;
        }
        fclose(f);
        free(buf);
    }
    for (i = 0; i < n; i++) free(names[i]);
    snprintf(label, sizeof label, "fuzz_files_replay_of_%s", name);
    if (unread) dt_test_fail(label, "%d of %d files in %s could not be read", unread, n, dir);
    else if (n < 5 || n_ok < 1) dt_test_fail(label, "%d files (%d ok_) in %s, want >= 5 with an ok_ one", n, n_ok, dir);
    else if (dt_replay_failed > failed_before)
        dt_test_fail(label, "%d checks failed over %d inputs", dt_replay_failed - failed_before, n);
    else {
        snprintf(label, sizeof label, "fuzz_files_replay_of_%s_holds_every_check", name);
        dt_test_pass(label);
    }
}

int main(void) {
    char root[1024];
    const char *env = getenv("DT_FUZZ_CORPORA");
    if (env && env[0]) snprintf(root, sizeof root, "%s", env);
    else { /* next to this source: tests/fuzz, whatever the working directory */
        const char *src = __FILE__, *slash = strrchr(src, '/');
        snprintf(root, sizeof root, "%.*s%sfuzz", slash ? (int)(slash - src) : 0, src, slash ? "/" : "");
    }
    dt_replay_corpus(root, "corpus_plan", dt_replay_plan);
    dt_replay_corpus(root, "corpus_ckpt", dt_replay_ckpt);
    dt_replay_corpus(root, "corpus_gpt_shard", dt_replay_gpt);
    return dt_test_finish();
}
