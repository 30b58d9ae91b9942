/* tests/test_gpt_data.c - examples/gpt/gpt_data.h: llm.c shards load with their tokens (checked
   against the values written), every malformed shard is a named error (truncated header or
   body, trailing bytes, wrong magic, wrong version, a token >= 50257), text is bytes with vocab
   256, and the window of sample i is a pure function of (seed, i): the same whatever was drawn
   before, inside the data, its targets the inputs shifted by one, never across two shards, and
   spread over the stream (every quarter of it is hit). */
#define _POSIX_C_SOURCE 200809L
#define DT_GPT_DATA_IMPLEMENTATION
#include "dt_tensor.h"
#include "examples/gpt/gpt_data.h"
#include "dt_test.h"

#include <stdio.h>
#include <string.h>

static dt_ctx g_ctx;

/* A shard with `count` in its header and `body` tokens 1000 + i (token 7 = tok7 when >= 0). */
static void write_shard(const char *path, int32_t magic, int32_t version, int32_t count, int body, int tok7,
                        int extra_bytes) {
    int32_t h[256];
    int i;
    FILE *fp = fopen(path, "wb");
    memset(h, 0, sizeof h);
    h[0] = magic; h[1] = version; h[2] = count;
    fwrite(h, sizeof h, 1, fp);
    for (i = 0; i < body; i++) {
        unsigned v = i == 7 && tok7 >= 0 ? (unsigned)tok7 : 1000u + (unsigned)i;
        unsigned char b[2];
        b[0] = (unsigned char)(v & 255); b[1] = (unsigned char)(v >> 8);
        fwrite(b, 1, 2, fp);
    }
    for (i = 0; i < extra_bytes; i++) fputc(0, fp);
    fclose(fp);
}

static void shard_error(const char *name, int32_t magic, int32_t version, int32_t count, int body, int tok7, int extra,
                        int status, const char *must_contain) {
    char path[512];
    const char *paths[1];
    dt_gpt_data d;
    dt_gpt_data_desc dd = {0};
    snprintf(path, sizeof path, "%s/%s.bin", dt_test_tmpdir(), name);
    write_shard(path, magic, version, count, body, tok7, extra);
    paths[0] = path;
    dd.shards = paths; dd.n_shards = 1;
    dt_test_error(name, dt_gpt_data_open(&g_ctx, &d, &dd), dt_ctx_error(&g_ctx), must_contain);
    DT_TEST_CHECK(name, g_ctx.last_status == (dt_status)status);
}

static void shards(void) {
    char p1[512], p2[512];
    const char *paths[2];
    dt_gpt_data d;
    dt_gpt_data_desc dd = {0};
    dt_tensor in, tg;
    dt_tensor_desc td = {0};
    int64_t i, t, n_tok;
    int ok = 1;
    snprintf(p1, sizeof p1, "%s/a.bin", dt_test_tmpdir());
    snprintf(p2, sizeof p2, "%s/b.bin", dt_test_tmpdir());
    write_shard(p1, 20240520, 1, 40, 40, -1, 0);
    write_shard(p2, 20240520, 1, 20, 20, -1, 0);
    paths[0] = p1; paths[1] = p2;
    dd.shards = paths; dd.n_shards = 2;
    if (!DT_TEST_CHECK("gpt_data_shards_open", dt_gpt_data_open(&g_ctx, &d, &dd) == DT_OK)) {
        printf("  %s\n", dt_ctx_error(&g_ctx));
        return;
    }
    DT_TEST_CHECK("gpt_data_shards_vocab_is_gpt2_padded_as_llmc", d.vocab == 50257 && d.vocab_padded == 50304);
    DT_TEST_CHECK("gpt_data_shards_token_count", d.n_tokens == 60 && d.file_first[1] == 40 && d.file_first[2] == 60);
    DT_TEST_CHECK("gpt_data_shard_tokens_as_written", d.tokens[0] == 1000 && d.tokens[39] == 1039 && d.tokens[40] == 1000
                  && d.tokens[59] == 1019);
    DT_TEST_CHECK("gpt_data_check_shard_counts", dt_gpt_data_check_shard(&g_ctx, &n_tok, p2) == DT_OK && n_tok == 20);
    td.dtype = DT_I32; td.shape[0] = 16;
    dt_tensor_create(&g_ctx, &in, &td);
    dt_tensor_create(&g_ctx, &tg, &td);
    /* windows of 17 tokens: shard a has 24 starts, b has 4; a window is 1000+p .. consecutive */
    for (i = 0; i < 500 && ok; i++) {
        const int32_t *x = (const int32_t *)in.data, *y = (const int32_t *)tg.data;
        if (dt_gpt_data_window(&g_ctx, &in, &tg, &d, 9, i)) { ok = 0; break; }
        for (t = 0; t < 16; t++)
            if (y[t] != x[t] + 1 || (t && x[t] != x[t - 1] + 1)) ok = 0; /* never across the two shards */
    }
    DT_TEST_CHECK("gpt_data_shard_windows_never_cross_files", ok);
    dt_tensor_free(&g_ctx, &in);
    dt_tensor_free(&g_ctx, &tg);
    dt_gpt_data_close(&g_ctx, &d);
    shard_error("gpt_data_shard_bad_magic_named", 123, 1, 10, 10, -1, 0, DT_ERR_FORMAT, "has magic 123, expected 20240520");
    shard_error("gpt_data_shard_bad_version_named", 20240520, 2, 10, 10, -1, 0, DT_ERR_FORMAT, "has version 2, expected 1");
    shard_error("gpt_data_shard_truncated_body_named", 20240520, 1, 10, 6, -1, 0, DT_ERR_FORMAT, "is truncated");
    shard_error("gpt_data_shard_trailing_bytes_named", 20240520, 1, 10, 10, -1, 3, DT_ERR_FORMAT, "longer than its header says");
    shard_error("gpt_data_shard_token_too_big_named", 20240520, 1, 10, 10, 50257, 0, DT_ERR_RANGE,
                "token 7 is 50257, expected < 50257");
    shard_error("gpt_data_shard_negative_count_named", 20240520, 1, -5, 0, -1, 0, DT_ERR_FORMAT, "header[2] (token count) = -5");
    {   /* a header cut short */
        char path[512];
        const char *ps[1];
        dt_gpt_data_desc d2 = {0};
        FILE *fp;
        snprintf(path, sizeof path, "%s/short.bin", dt_test_tmpdir());
        fp = fopen(path, "wb");
        fputs("tiny", fp);
        fclose(fp);
        ps[0] = path; d2.shards = ps; d2.n_shards = 1;
        dt_test_error("gpt_data_shard_short_header_named", dt_gpt_data_open(&g_ctx, &d, &d2), dt_ctx_error(&g_ctx),
                      "the header alone is 1024");
    }
}

static void text(void) {
    char path[512];
    FILE *fp;
    dt_gpt_data d;
    dt_gpt_data_desc dd = {0};
    dt_tensor in, tg, in2, tg2;
    dt_tensor_desc td = {0};
    int i, quarter[4] = {0, 0, 0, 0}, same, inside = 1;
    snprintf(path, sizeof path, "%s/text.txt", dt_test_tmpdir());
    fp = fopen(path, "wb");
    {   /* LCG bytes: every 32-byte window occurs once, so a window tells where it was cut */
        uint32_t x = 12345;
        for (i = 0; i < 4000; i++) { x = x * 1664525u + 1013904223u; fputc((int)(x >> 24), fp); }
    }
    fclose(fp);
    dd.text = path;
    if (!DT_TEST_CHECK("gpt_data_text_opens", dt_gpt_data_open(&g_ctx, &d, &dd) == DT_OK)) return;
    DT_TEST_CHECK("gpt_data_text_is_bytes_vocab_256", d.vocab == 256 && d.vocab_padded == 256 && d.n_tokens == 4000);
    td.dtype = DT_I32; td.shape[0] = 32;
    dt_tensor_create(&g_ctx, &in, &td); dt_tensor_create(&g_ctx, &tg, &td);
    dt_tensor_create(&g_ctx, &in2, &td); dt_tensor_create(&g_ctx, &tg2, &td);
    for (i = 0; i < 400; i++) {
        const int32_t *x = (const int32_t *)in.data, *y = (const int32_t *)tg.data;
        int64_t j, k, pos = -1;
        dt_gpt_data_window(&g_ctx, &in, &tg, &d, 5, i);
        for (j = 0; j + 32 < 4000 && pos < 0; j++) { /* where it was cut */
            for (k = 0; k < 32 && d.bytes[j + k] == x[k]; k++) {}
            if (k == 32) pos = j;
        }
        if (pos < 0) { inside = 0; continue; }
        for (k = 0; k < 32; k++) if (y[k] != d.bytes[pos + k + 1]) inside = 0;
        quarter[pos * 4 / (4000 - 32)]++;
    }
    DT_TEST_CHECK("gpt_data_text_window_is_the_file_bytes_and_targets_shift_by_one", inside);
    if (!DT_TEST_CHECK("gpt_data_text_windows_spread_over_the_stream", quarter[0] > 50 && quarter[1] > 50 &&
                       quarter[2] > 50 && quarter[3] > 50))
        printf("  windows per quarter of the file: %d %d %d %d (of 400)\n", quarter[0], quarter[1], quarter[2], quarter[3]);
    /* purity: sample 123 drawn first, or after 1000 others, or with another seed in between */
    dt_gpt_data_window(&g_ctx, &in, &tg, &d, 5, 123);
    for (i = 0; i < 1000; i++) dt_gpt_data_window(&g_ctx, &in2, &tg2, &d, i % 7, i);
    dt_gpt_data_window(&g_ctx, &in2, &tg2, &d, 5, 123);
    same = !memcmp(in.data, in2.data, 32 * 4) && !memcmp(tg.data, tg2.data, 32 * 4);
    DT_TEST_CHECK("gpt_data_window_is_a_pure_function_of_seed_and_index", same);
    dt_gpt_data_window(&g_ctx, &in2, &tg2, &d, 6, 123);
    DT_TEST_CHECK("gpt_data_window_depends_on_the_seed", memcmp(in.data, in2.data, 32 * 4) != 0);
    /* bad calls */
    {
        dt_tensor big;
        td.shape[0] = 4000;
        dt_tensor_create(&g_ctx, &big, &td);
        dt_test_error("gpt_data_window_longer_than_data_named", dt_gpt_data_window(&g_ctx, &big, &big, &d, 1, 0),
                      dt_ctx_error(&g_ctx), "a window needs T + 1 = 4001");
        dt_tensor_free(&g_ctx, &big);
        dt_test_error("gpt_data_window_negative_sample_named", dt_gpt_data_window(&g_ctx, &in, &tg, &d, 1, -1),
                      dt_ctx_error(&g_ctx), "sample = -1");
        td.shape[0] = 31;
        dt_tensor_create(&g_ctx, &big, &td);
        dt_test_error("gpt_data_window_shape_mismatch_named", dt_gpt_data_window(&g_ctx, &in, &big, &d, 1, 0),
                      dt_ctx_error(&g_ctx), "targets 31");
        dt_tensor_free(&g_ctx, &big);
    }
    dt_tensor_free(&g_ctx, &in); dt_tensor_free(&g_ctx, &tg); dt_tensor_free(&g_ctx, &in2); dt_tensor_free(&g_ctx, &tg2);
    dt_gpt_data_close(&g_ctx, &d);
    {
        dt_gpt_data_desc both = {0};
        const char *ps[1];
        ps[0] = path;
        both.text = path; both.shards = ps; both.n_shards = 1;
        dt_test_error("gpt_data_text_and_shards_both_named", dt_gpt_data_open(&g_ctx, &d, &both), dt_ctx_error(&g_ctx),
                      "exactly one of desc.text and desc.shards");
        both.shards = NULL; both.text = "/nonexistent/file.txt";
        dt_test_error("gpt_data_missing_text_named", dt_gpt_data_open(&g_ctx, &d, &both), dt_ctx_error(&g_ctx),
                      "cannot open text '/nonexistent/file.txt'");
    }
}

int main(void) {
    dt_ctx_init(&g_ctx, NULL);
    shards();
    text();
    dt_ctx_shutdown(&g_ctx);
    return dt_test_finish();
}
