/* tests/test_fuzz_tsv_replay.c - runs every file of tests/fuzz/corpus through the libFuzzer
   target tests/fuzz/fuzz_tsv.c (its LLVMFuzzerTestOneInput, with its checks), without
   libFuzzer: a deterministic replay that tests/run.sh builds with gcc, plainly and with
   ASan+UBSan. The corpus holds hand-written seeds (valid lines, empty fields, every malformed
   case, overlong and unterminated lines, control bytes) and small inputs the fuzzer found
   that reach new code. $DT_FUZZ_CORPUS names another directory. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *dt_replay_file = "";
static int dt_replay_failed = 0;
/* a failed check of the target: one FAIL line naming the input, and the replay goes on */
#define DT_FUZZ_CHECK(cond, what)                                                                         \
    do {                                                                                                  \
        if (!(cond)) {                                                                                    \
            printf("FAIL fuzz_tsv_replay_%s: check \"%s\" (%s) failed\n", dt_replay_file, what, #cond); \
            dt_replay_failed++;                                                                           \
        }                                                                                                 \
    } while (0)

#include "fuzz/fuzz_tsv.c"
#include "dt_test.h"

static int dt_replay_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    char dir[1024], path[2048], *names[512];
    const char *env = getenv("DT_FUZZ_CORPUS");
    DIR *d;
    struct dirent *e;
    int n = 0, i, unread = 0;
    if (env && env[0]) snprintf(dir, sizeof dir, "%s", env);
    else { /* next to this source: tests/fuzz/corpus, whatever the working directory */
        const char *src = __FILE__, *slash = strrchr(src, '/');
        snprintf(dir, sizeof dir, "%.*s%sfuzz/corpus", slash ? (int)(slash - src) : 0, src, slash ? "/" : "");
    }
    if (!(d = opendir(dir))) {
        dt_test_fail("fuzz_tsv_corpus_exists", "cannot open %s", dir);
        return dt_test_finish();
    }
    while ((e = readdir(d)) != NULL && n < 512)
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
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        dt_replay_file = names[i];
        if (!(f = fopen(path, "rb")) || fseek(f, 0, SEEK_END) || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
            if (f) fclose(f);
            unread++;
            continue;
        }
        buf = (unsigned char *)malloc((size_t)len + 1);
        if (fread(buf, 1, (size_t)len, f) == (size_t)len) LLVMFuzzerTestOneInput(buf, (size_t)len);
        else unread++;
        fclose(f);
        free(buf);
    }
    for (i = 0; i < n; i++) free(names[i]);
    if (unread) dt_test_fail("fuzz_tsv_corpus_files_read", "%d of %d files in %s could not be read", unread, n, dir);
    if (n < 10) dt_test_fail("fuzz_tsv_corpus_has_seeds", "%d files in %s, want >= 10", n, dir);
    else if (dt_replay_failed) dt_test_fail("fuzz_tsv_replay_of_the_corpus", "%d checks failed over %d inputs", dt_replay_failed, n);
    else dt_test_pass("fuzz_tsv_replay_of_the_corpus_holds_every_check");
    return dt_test_finish();
}
