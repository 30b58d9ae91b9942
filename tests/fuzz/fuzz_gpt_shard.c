/* tests/fuzz/fuzz_gpt_shard.c - libFuzzer target for the file reader of examples/gpt/gpt_data.h:
   llm.c token shards (dt_gpt_data_open, dt_gpt_data_check_shard) and text files.

   Build and run (tests/fuzz/run.sh 240 gpt_shard does both):
       clang -g -O1 -fsanitize=fuzzer,address,undefined -I. tests/fuzz/fuzz_gpt_shard.c -o build/fuzz/fuzz_gpt_shard -lm
       build/fuzz/fuzz_gpt_shard -max_total_time=240 build/fuzz/corpus_gpt_shard tests/fuzz/corpus_gpt_shard
   tests/test_fuzz_files_replay.c runs every file of tests/fuzz/corpus_gpt_shard through the
   same function without libFuzzer (gcc, plain and ASan+UBSan), as a normal test.

   Input: byte 0 picks the options (bit 0: read the file as text, not as a shard; bit 1: the
   shard twice, as two files; bits 2-3: the window length T), the rest is the file. Beyond "no
   crash, no sanitizer report", it checks what must hold for any input:
     - a shard that fails to open returns DT_ERR_FORMAT or DT_ERR_RANGE with a message that
       starts with the function's name and names the file, keeps no memory, and
       dt_gpt_data_check_shard fails on it the same way;
     - an opened shard holds (size - 1024) / 2 tokens a copy, each < 50257, as check_shard
       counts them; a text file holds its bytes;
     - a window of T tokens is drawn from the data (targets are the inputs shifted by one,
       every token within the vocab), or refused as DT_ERR_ARG when no file holds T + 1;
     - close gives back every byte. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#endif
#define DT_IMPLEMENTATION
#include "dt_tensor.h"
#include "examples/gpt/gpt_data.h"
#include "tests/fuzz/fuzz_files.h"

/* A window of T: drawn from the data, or refused when no file is longer than T. */
static void dt_fuzz_gpt_window(dt_ctx *ctx, const dt_gpt_data *d, int64_t T) {
    dt_tensor in, tg;
    dt_tensor_desc td;
    int64_t f, t, longest = 0;
    dt_status st;
    memset(&td, 0, sizeof td);
    td.dtype = DT_I32;
    td.shape[0] = T;
    DT_FUZZ_CHECK(dt_tensor_create(ctx, &in, &td) == DT_OK && dt_tensor_create(ctx, &tg, &td) == DT_OK,
                  "window tensors");
    for (f = 0; f < d->n_files; f++)
        if (d->file_first[f + 1] - d->file_first[f] > longest) longest = d->file_first[f + 1] - d->file_first[f];
    st = dt_gpt_data_window(ctx, &in, &tg, d, 1234, 5);
    if (longest > T) {
        const int32_t *a = (const int32_t *)in.data, *b = (const int32_t *)tg.data;
        DT_FUZZ_CHECK(st == DT_OK, "a window fits a file longer than T");
        for (t = 0; !st && t < T; t++) {
            DT_FUZZ_CHECK(a[t] >= 0 && a[t] < d->vocab && b[t] >= 0 && b[t] < d->vocab, "window tokens in the vocab");
            DT_FUZZ_CHECK(t + 1 == T || b[t] == a[t + 1], "targets are the inputs shifted by one");
        }
    } else {
        DT_FUZZ_CHECK(st == DT_ERR_ARG && strstr(dt_ctx_error(ctx), "a window needs T + 1"),
                      "no file long enough is a named DT_ERR_ARG");
    }
    dt_tensor_free(ctx, &in);
    dt_tensor_free(ctx, &tg);
}

/* The check of one input; returns the open's status. */
static dt_status dt_fuzz_gpt_one(const uint8_t *data, size_t size) {
    static const int64_t windows[4] = {1, 7, 64, 600};
    char path[1024], msg[DT_ERROR_MAX];
    const char *paths[2];
    dt_ctx ctx;
    dt_gpt_data d;
    dt_gpt_data_desc desc;
    dt_status st, cst;
    int64_t i, n = -1;
    size_t before;
    int copies;
    uint8_t opt;
    dt_fuzz_input = data;
    dt_fuzz_input_size = size;
    if (size < 1) return DT_ERR_ARG;
    opt = data[0];
    data++;
    size--;
    copies = opt & 2 ? 2 : 1;
    dt_fuzz_path(path, sizeof path, "shard.bin");
    dt_fuzz_write(path, data, size);
    dt_ctx_init(&ctx, NULL);
    memset(&desc, 0, sizeof desc);
    paths[0] = paths[1] = path;
    if (opt & 1) desc.text = path;
    else { desc.shards = paths; desc.n_shards = copies; }
    before = ctx.bytes_in_use;
    st = dt_gpt_data_open(&ctx, &d, &desc);
    if (opt & 1) {
        DT_FUZZ_CHECK(st == DT_OK, "any file opens as text");
        DT_FUZZ_CHECK(!st && d.n_tokens == (int64_t)size && d.vocab == 256 && d.n_files == 1 &&
                          (size == 0 || !memcmp(d.bytes, data, size)),
                      "a text file is its bytes");
    } else if (st) {
        DT_FUZZ_CHECK(st == DT_ERR_FORMAT || st == DT_ERR_RANGE, "a bad shard is DT_ERR_FORMAT or DT_ERR_RANGE");
        dt_fuzz_check_failure(&ctx, st, before, "dt_gpt_data_open", path, NULL);
        DT_FUZZ_CHECK(!d.tokens && !d.file_first && !d.n_tokens, "a failed open leaves d empty");
        memcpy(msg, ctx.last_error, sizeof msg);
        cst = dt_gpt_data_check_shard(&ctx, &n, path);
        DT_FUZZ_CHECK(cst == st, "check_shard fails as open does");
        dt_fuzz_check_failure(&ctx, cst, before, "dt_gpt_data_check_shard", path, NULL);
        DT_FUZZ_CHECK(!strcmp(dt_ctx_error(&ctx) + strlen("dt_gpt_data_check_shard"), msg + strlen("dt_gpt_data_open")),
                      "check_shard says what open says");
    } else {
        DT_FUZZ_CHECK(size >= 1024 && (size - 1024) % 2 == 0, "a shard is a header and whole tokens");
        DT_FUZZ_CHECK(d.n_files == copies && d.n_tokens == copies * (int64_t)(size - 1024) / 2 &&
                          d.vocab == DT_GPT2_VOCAB && d.vocab_padded == DT_GPT2_VOCAB_PADDED,
                      "a shard holds (size - 1024) / 2 tokens");
        for (i = 0; i < d.n_tokens; i++) DT_FUZZ_CHECK(d.tokens[i] < DT_GPT2_VOCAB, "a token is in the vocab");
        for (i = 0; i < d.n_files; i++)
            DT_FUZZ_CHECK(d.file_first[i + 1] - d.file_first[i] == d.n_tokens / copies, "each copy is one file");
        cst = dt_gpt_data_check_shard(&ctx, &n, path);
        DT_FUZZ_CHECK(cst == DT_OK && n * copies == d.n_tokens, "check_shard counts what open read");
    }
    if (!st) {
        dt_fuzz_gpt_window(&ctx, &d, windows[(opt >> 2) & 3]);
        dt_gpt_data_close(&ctx, &d);
    }
    DT_FUZZ_CHECK(ctx.bytes_in_use == 0, "close gives back every byte");
    dt_ctx_shutdown(&ctx);
    return st;
}

#ifndef DT_FUZZ_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dt_fuzz_gpt_one(data, size);
    return 0;
}
#endif
