/* The vector layer of half_gemv.c: one set of names per instruction set, chosen by the compiler flags.

   - AVX-512F (with AVX2, FMA, F16C): vectors of VW = 16 floats, MR = 6 rows of X per GEMM tile;
   - AVX2 + FMA + F16C: VW = 8, MR = 3;
   - portable (any other target, e.g. aarch64 or x86-64 without F16C): GCC/Clang vector extensions and
     _Float16, VW = 8, MR = 3; the compiler maps them to the target's vectors (NEON on aarch64).

   vec: VW float lanes. VLOADW converts VW float16 weights to floats; h2f / f2h convert one value (f2h rounds to
   nearest even). Every path accumulates in float32. */
#ifndef PRIMESPEECH_SIMD_H
#define PRIMESPEECH_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define PREFETCH(p) __builtin_prefetch((const void *)(p), 0, 3)

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define HG_X86 1
#include <immintrin.h>

static inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t f2h(float f) { return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }

#ifdef __AVX512F__
#define HG_ISA "avx512"
#define VW 16
#define MR 6
typedef __m512 vec;
#define VZERO() _mm512_setzero_ps()
#define VLOADX(p) _mm512_loadu_ps(p)
#define VLOADW(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define VFMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define VSUM(a) _mm512_reduce_add_ps(a)
static inline __m256 half8(__m512 a) { /* lanes 0-7 + lanes 8-15 */
  return _mm256_add_ps(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}
#define VHALF(a) half8(a)
#define VSET1 _mm512_set1_ps
#define VMAXV _mm512_max_ps
#define VADDV _mm512_add_ps
#define VSUBV _mm512_sub_ps
#define VMULV _mm512_mul_ps
#define VSTORE _mm512_storeu_ps
#define VFLOOR(x) _mm512_roundscale_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define VPOW2(n) \
  _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23))
#else
#define HG_ISA "avx2"
#define VW 8
#define MR 3
typedef __m256 vec;
#define VZERO() _mm256_setzero_ps()
#define VLOADX(p) _mm256_loadu_ps(p)
#define VLOADW(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)))
#define VFMA(a, b, c) _mm256_fmadd_ps(a, b, c)
static inline float VSUM(__m256 s) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_hadd_ps(h, h);
  h = _mm_hadd_ps(h, h);
  return _mm_cvtss_f32(h);
}
#define VHALF(a) (a)
#define VSET1 _mm256_set1_ps
#define VMAXV _mm256_max_ps
#define VADDV _mm256_add_ps
#define VSUBV _mm256_sub_ps
#define VMULV _mm256_mul_ps
#define VSTORE _mm256_storeu_ps
#define VFLOOR(x) _mm256_floor_ps(x)
#define VPOW2(n) \
  _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23))
#endif

/* the four sums of a, b, c, d at once (one shared add tree: a third of four separate reductions' work) */
static inline void vsum4(vec a, vec b, vec c, vec d, float *out) {
  const __m256 ab = _mm256_hadd_ps(VHALF(a), VHALF(b)), cd = _mm256_hadd_ps(VHALF(c), VHALF(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

#else /* portable: GCC / Clang vector extensions */
#define HG_X86 0
#define HG_ISA "generic"
#define VW 8
#define MR 3
typedef float vec __attribute__((vector_size(VW * sizeof(float))));
typedef _Float16 hvec __attribute__((vector_size(VW * sizeof(_Float16))));
typedef int32_t ivec __attribute__((vector_size(VW * sizeof(int32_t))));

static inline float h2f(uint16_t h) {
  _Float16 f;
  memcpy(&f, &h, sizeof f);
  return (float)f;
}
static inline uint16_t f2h(float x) {
  const _Float16 f = (_Float16)x;
  uint16_t h;
  memcpy(&h, &f, sizeof h);
  return h;
}
static inline vec VSET1(float x) { return (vec){x, x, x, x, x, x, x, x}; }
#define VZERO() VSET1(0.0f)
static inline vec VLOADX(const float *p) {
  vec v;
  memcpy(&v, p, sizeof v);
  return v;
}
static inline vec VLOADW(const uint16_t *p) {
  hvec h;
  memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, vec);
}
static inline void VSTORE(float *p, vec v) { memcpy(p, &v, sizeof v); }
static inline vec VFMA(vec a, vec b, vec c) { return a * b + c; }
static inline vec VADDV(vec a, vec b) { return a + b; }
static inline vec VSUBV(vec a, vec b) { return a - b; }
static inline vec VMULV(vec a, vec b) { return a * b; }
static inline vec VMAXV(vec a, vec b) {
  vec r;
  for (int i = 0; i < VW; i++) r[i] = a[i] > b[i] ? a[i] : b[i];
  return r;
}
static inline vec VFLOOR(vec a) {
  vec r;
  for (int i = 0; i < VW; i++) r[i] = floorf(a[i]);
  return r;
}
static inline vec VPOW2(vec n) { /* 2^n for integer-valued n in the normal range */
  const ivec e = (__builtin_convertvector(n, ivec) + 127) << 23;
  vec r;
  memcpy(&r, &e, sizeof r);
  return r;
}
static inline float VSUM(vec a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}
static inline void vsum4(vec a, vec b, vec c, vec d, float *out) {
  out[0] = VSUM(a);
  out[1] = VSUM(b);
  out[2] = VSUM(c);
  out[3] = VSUM(d);
}
#endif

#endif
