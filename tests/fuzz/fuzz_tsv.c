/* tests/fuzz/fuzz_tsv.c - libFuzzer target for the Criteo TSV reader of examples/dlrm/dlrm_data.h.

   Build and run (tests/fuzz/run.sh does both):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_tsv.c -o build/fuzz_tsv -lm
       build/fuzz_tsv -max_total_time=300 build/fuzz_corpus tests/fuzz/corpus
   tests/test_fuzz_tsv_replay.c runs every file of tests/fuzz/corpus through the same function
   without libFuzzer (gcc, plain and ASan+UBSan), as a normal test.

   Input: byte 0 picks the options (max_line, skip_bad, read size, table sizes), the rest is
   the TSV. Each input is read three ways: from memory strictly, from memory skipping bad
   lines, and from a stream (tmpfile) in small reads with the same options. Beyond "no crash,
   no sanitizer report", it checks what must hold for any input:
     - every sample returned has a label 0/1, finite dense values >= 0, ids in [0, table size);
     - the stream and the memory reader return the same samples, lines and status;
     - strict mode returns the same samples as skip mode up to its first error, and that error
       is DT_ERR_FORMAT with a message naming the line;
     - skip mode never fails on memory input, and every line is a sample or a skipped line. */
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "examples/dlrm/dlrm_data.h"
#include <stdlib.h>
#include <string.h>

#ifndef DT_FUZZ_CHECK
#define DT_FUZZ_CHECK(cond, what)                                           \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "fuzz_tsv: check failed: %s (%s)\n", what, #cond); \
            abort();                                                        \
        }                                                                   \
    } while (0)
#endif

enum { DT_FUZZ_MAX_SAMPLES = 256 }; /* inputs are <= 4096 bytes, a sample >= 41 */

typedef struct dt_fuzz_run {
    dt_status st;
    int64_t n, lines, skipped;
    char msg[DT_ERROR_MAX];
    dt_dlrm_sample *s;
} dt_fuzz_run;

static void dt_fuzz_check_sample(const dt_dlrm_sample *s, const dt_dlrm_tsv_desc *d) {
    int j;
    DT_FUZZ_CHECK(s->label == 0.0f || s->label == 1.0f, "label is 0 or 1");
    for (j = 0; j < DT_DLRM_DENSE; j++) DT_FUZZ_CHECK(s->dense[j] >= 0.0f && s->dense[j] < 50.0f, "dense is a log count");
    for (j = 0; j < DT_DLRM_SPARSE; j++) {
        int64_t size = d->table_size[j] ? d->table_size[j] : dt_dlrm_default_cardinality(j);
        DT_FUZZ_CHECK(s->ids[j] >= 0 && s->ids[j] < size, "id inside its table");
    }
}

static void dt_fuzz_read(dt_ctx *ctx, dt_dlrm_tsv *r, const dt_dlrm_tsv_desc *d, dt_fuzz_run *out) {
    int got = 1;
    out->n = 0;
    out->st = DT_OK;
    while (out->n < DT_FUZZ_MAX_SAMPLES && !(out->st = dt_dlrm_tsv_next(ctx, r, &out->s[out->n], &got)) && got) {
        dt_fuzz_check_sample(&out->s[out->n], d);
        out->n++;
    }
    snprintf(out->msg, sizeof out->msg, "%s", out->st ? dt_ctx_error(ctx) : "");
    out->lines = r->line;
    out->skipped = r->skipped;
    dt_dlrm_tsv_close(ctx, r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int64_t max_lines[4] = {0, 40, 120, 1000};
    static const int64_t chunks[4] = {1, 3, 64, 4096};
    static const int64_t tables[4] = {0, 1, 2, (int64_t)1 << 62};
    dt_ctx ctx;
    dt_dlrm_tsv_desc d;
    dt_dlrm_tsv r;
    dt_fuzz_run strict, skip, stream;
    const char *text;
    size_t len;
    uint8_t opt;
    int f;
    FILE *tf;
    if (size < 1) return 0;
    opt = data[0];
    text = (const char *)data + 1;
    len = size - 1;
    memset(&d, 0, sizeof d);
    d.max_line = max_lines[opt & 3];
    d.read_chunk = chunks[(opt >> 2) & 3];
    for (f = 0; f < DT_DLRM_SPARSE; f++) d.table_size[f] = tables[((opt >> 4) + f) & 3];
    dt_ctx_init(&ctx, NULL);
    strict.s = (dt_dlrm_sample *)malloc(sizeof(dt_dlrm_sample) * DT_FUZZ_MAX_SAMPLES);
    skip.s = (dt_dlrm_sample *)malloc(sizeof(dt_dlrm_sample) * DT_FUZZ_MAX_SAMPLES);
    stream.s = (dt_dlrm_sample *)malloc(sizeof(dt_dlrm_sample) * DT_FUZZ_MAX_SAMPLES);

    d.skip_bad = 0;
    DT_FUZZ_CHECK(dt_dlrm_tsv_open_mem(&ctx, &r, text, len, "fuzz", &d) == DT_OK, "open_mem");
    dt_fuzz_read(&ctx, &r, &d, &strict);
    DT_FUZZ_CHECK(strict.st == DT_OK || (strict.st == DT_ERR_FORMAT && strstr(strict.msg, "fuzz: line ")),
                  "strict mode fails only with a named format error");

    d.skip_bad = 1;
    DT_FUZZ_CHECK(dt_dlrm_tsv_open_mem(&ctx, &r, text, len, "fuzz", &d) == DT_OK, "open_mem skip");
    dt_fuzz_read(&ctx, &r, &d, &skip);
    DT_FUZZ_CHECK(skip.st == DT_OK, "skip mode never fails on memory input");
    DT_FUZZ_CHECK(skip.n == DT_FUZZ_MAX_SAMPLES || skip.n + skip.skipped == skip.lines,
                  "every line is a sample or skipped");
    /* strict mode stops at the first bad line: its samples are skip mode's first ones */
    DT_FUZZ_CHECK(strict.n <= skip.n && !memcmp(strict.s, skip.s, sizeof(dt_dlrm_sample) * (size_t)strict.n),
                  "strict samples are a prefix of skip samples");
    DT_FUZZ_CHECK(strict.st != DT_OK || strict.n == skip.n, "no error means nothing skipped");

    /* the same bytes through a stream, in small reads */
    if ((tf = tmpfile()) != NULL) {
        if (len) DT_FUZZ_CHECK(fwrite(text, 1, len, tf) == len, "tmpfile write");
        rewind(tf);
        DT_FUZZ_CHECK(dt_dlrm_tsv_open_stream(&ctx, &r, tf, "fuzz", &d) == DT_OK, "open_stream");
        dt_fuzz_read(&ctx, &r, &d, &stream);
        fclose(tf);
        DT_FUZZ_CHECK(stream.st == DT_OK && stream.n == skip.n && stream.lines == skip.lines &&
                          stream.skipped == skip.skipped,
                      "stream and memory readers agree");
        DT_FUZZ_CHECK(!memcmp(stream.s, skip.s, sizeof(dt_dlrm_sample) * (size_t)skip.n), "stream samples equal memory samples");
    }
    free(strict.s);
    free(skip.s);
    free(stream.s);
    DT_FUZZ_CHECK(ctx.bytes_in_use == 0, "the reader gives back its memory");
    dt_ctx_shutdown(&ctx);
    return 0;
}
