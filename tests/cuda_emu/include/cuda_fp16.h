/* tests/cuda_emu/include/cuda_fp16.h - the CUDA emulator's stand-in for <cuda_fp16.h>: __half, __half2
   and the conversions a kernel needs, under the real header's names. Test-only (see cuda_runtime.h).

   Conversions are those of the real header's host path, which the hardware's cvt.rn agrees with:
   round to nearest even, subnormal halves kept, >= 65520 to inf, and every NaN to the canonical
   NaN 0x7fff (dt_tensor.h's dt_f32_to_f16 keeps the sign instead: sign | 0x7e00; every other input
   gives the same bits, tests/cuda_emu/k_mma.cpp checks it). Arithmetic operators on __half are
   deleted: the real header rounds each one to half, a silent conversion to float here would not;
   convert with __half2float and compute in float. */
#ifndef DT_CUDA_EMU_FP16_H
#define DT_CUDA_EMU_FP16_H

#include "cuda_runtime.h"

struct __half_raw { unsigned short x; };

static inline unsigned short dt_emu_f32_to_f16_bits(float f) {
    unsigned int u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return 0x7fffu;                       /* NaN: canonical, as the hardware */
    if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {                                     /* a subnormal half: count 2^-24 units */
        float scaled = __uint_as_float(a) * 16777216.0f;       /* exact: a power of two */
        unsigned int q = (unsigned int)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        return (unsigned short)(sign | q);
    }
    return (unsigned short)(sign | (((a + 0xfffu + ((a >> 13) & 1u)) >> 13) - ((127u - 15u) << 10)));
}

static inline float dt_emu_f16_bits_to_f32(unsigned short h) {
    unsigned int sign = (unsigned int)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact */
        float f = (float)m * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (e == 31) return __uint_as_float(m ? 0x7fffffffu : sign | 0x7f800000u);
    return __uint_as_float(sign | ((e + 112u) << 23) | (m << 13));
}

struct __align__(2) __half {
    unsigned short __x;
    __half() = default;
    __half(const __half_raw &r) : __x(r.x) {}
    __half(float f) : __x(dt_emu_f32_to_f16_bits(f)) {}
    __half(double) = delete; /* one rounding on the GPU, two through float here */
    operator float() const { return dt_emu_f16_bits_to_f32(__x); }
    operator __half_raw() const { __half_raw r = {__x}; return r; }
};
struct __align__(4) __half2 { __half x, y; };

__half operator+(const __half &, const __half &) = delete;
__half operator-(const __half &, const __half &) = delete;
__half operator*(const __half &, const __half &) = delete;
__half operator/(const __half &, const __half &) = delete;

static inline __half __ushort_as_half(unsigned short u) { __half_raw r = {u}; return __half(r); }
static inline unsigned short __half_as_ushort(__half h) { return h.__x; }
static inline __half __float2half(float f) { return __ushort_as_half(dt_emu_f32_to_f16_bits(f)); }
static inline __half __float2half_rn(float f) { return __float2half(f); }
static inline float __half2float(__half h) { return dt_emu_f16_bits_to_f32(h.__x); }
static inline __half2 __halves2half2(__half lo, __half hi) { __half2 v = {lo, hi}; return v; }
static inline __half2 make_half2(__half x, __half y) { return __halves2half2(x, y); }
static inline __half2 __floats2half2_rn(float lo, float hi) {
    return __halves2half2(__float2half(lo), __float2half(hi));
}
static inline __half2 __float22half2_rn(float2 f) { return __floats2half2_rn(f.x, f.y); }
static inline __half2 __float2half2_rn(float f) { return __floats2half2_rn(f, f); }
static inline float2 __half22float2(__half2 h) { return make_float2(__half2float(h.x), __half2float(h.y)); }
static inline float __low2float(__half2 h) { return __half2float(h.x); }
static inline float __high2float(__half2 h) { return __half2float(h.y); }
static inline __half __low2half(__half2 h) { return h.x; }
static inline __half __high2half(__half2 h) { return h.y; }

#endif /* DT_CUDA_EMU_FP16_H */
