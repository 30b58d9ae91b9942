/* bench/gpu/mkshard.c - writes a synthetic llm.c token shard, the input of the GPT-2 124M run of
   `./build.sh gpu` (examples/gpt --shards). The format is llm.c's (examples/gpt/gpt_data.h reads
   and validates it): a header of 256 little-endian int32, header[0] = 20240520 (magic),
   header[1] = 1 (version: uint16 GPT-2 tokens), header[2] = the token count n, then n
   little-endian uint16 tokens, each below GPT-2's vocabulary of 50257.
   The tokens are uniform (xorshift64 from the seed): throughput does not depend on what the
   tokens say, and a loss near ln(50257) = 10.8 that does not fall is what such data gives.

   usage: mkshard PATH N_TOKENS [SEED]      (exit 0, or 2 with a message naming the bad argument) */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAGIC = 20240520, VERSION = 1, VOCAB = 50257, HEADER_INTS = 256 };

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v, p[1] = (unsigned char)(v >> 8), p[2] = (unsigned char)(v >> 16), p[3] = (unsigned char)(v >> 24);
}

static int bad(const char *what, const char *value, const char *want) {
    fprintf(stderr, "mkshard: %s is '%s', expected %s\n", what, value, want);
    return 2;
}

int main(int argc, char **argv) {
    unsigned char header[HEADER_INTS * 4], buf[1 << 16];
    uint64_t x = 88172645463325252ull;
    long long n;
    char *end;
    FILE *f;
    size_t fill = 0;
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: mkshard PATH N_TOKENS [SEED]\n");
        return 2;
    }
    errno = 0;
    n = strtoll(argv[2], &end, 10);
    /* header[2] is an int32, and a shard needs at least one token */
    if (errno || *end || end == argv[2] || n < 1 || n > INT32_MAX) return bad("N_TOKENS", argv[2], "an integer in [1, 2^31 - 1]");
    if (argc == 4) {
        unsigned long long s;
        errno = 0;
        s = strtoull(argv[3], &end, 10);
        if (errno || *end || end == argv[3] || argv[3][0] == '-') return bad("SEED", argv[3], "a non-negative integer");
        x ^= s * 0x9e3779b97f4a7c15ull;
        if (!x) x = 1; /* xorshift's one fixed point */
    }
    memset(header, 0, sizeof header);
    put32(header, MAGIC);
    put32(header + 4, VERSION);
    put32(header + 8, (uint32_t)n);
    f = fopen(argv[1], "wb");
    if (!f) {
        fprintf(stderr, "mkshard: cannot create '%s': %s\n", argv[1], strerror(errno));
        return 2;
    }
    if (fwrite(header, 1, sizeof header, f) != sizeof header) goto fail;
    while (n-- > 0) {
        uint16_t t;
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        t = (uint16_t)((x >> 32) % VOCAB);
        buf[fill++] = (unsigned char)t, buf[fill++] = (unsigned char)(t >> 8);
        if (fill == sizeof buf) {
            if (fwrite(buf, 1, fill, f) != fill) goto fail;
            fill = 0;
        }
    }
    if (fill && fwrite(buf, 1, fill, f) != fill) goto fail;
    if (fclose(f) != 0) {
        fprintf(stderr, "mkshard: writing '%s' failed: %s\n", argv[1], strerror(errno));
        return 2;
    }
    return 0;
fail:
    fprintf(stderr, "mkshard: writing '%s' failed: %s\n", argv[1], strerror(errno));
    fclose(f);
    return 2;
}
