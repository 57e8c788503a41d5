/* float16-weight products with float32 accumulation on the CPU (models/half_gemv.py loads this library).

   - gemv_f16 / gemv_f16_mt: y = W x (+ b), rows split over threads; ffn_f16_mt: the decode step's fc1 -> ReLU -> fc2;
   - decode_layers: every block of one GPT decode step in one call; decode_layers_batch: that step for several
     generations at once, each weight read once for all of them;
   - gemm_f16: Y = act(X @ W.T + b) for small M (prefill rows, RoBERTa tokens), columns split over threads;
     bias_act: the same bias and activation on a float32 product computed elsewhere (BLAS);
   - prefill_attention: the GPT prefill's attention, one head per chunk; add_layer_norm_rows: its residual + norm;
   - f16_to_f32, f32_to_f16_exact: conversions.

   Work is split by rows (or columns, heads), never inside a sum: every value is bit-identical whatever the
   thread count. simd.h picks the vector width from the compiler flags (AVX-512, AVX2 + FMA + F16C, portable);
   hg_isa() names the variant built. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "pool.h"
#include "simd.h"

const char *hg_isa(void) { return HG_ISA; }

/* ---- gemv: y[i] = sum_j W[i, j] x[j] (+ b[i]); W float16 row-major (n x k), x, b, y float32. One dot per output
   value, in one fixed order: a batch of rows (the batched decode step) gets each row's values bit for bit as alone. */
#if HG_X86
static inline float dot_f16(const uint16_t *w, const float *x, int64_t k) {
  const int64_t k16 = k & ~(int64_t)15;
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  for (int64_t j = 0; j < k16; j += 16) {
    a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j))), _mm256_loadu_ps(x + j), a0);
    a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j + 8))), _mm256_loadu_ps(x + j + 8),
                         a1);
  }
  __m256 s = _mm256_add_ps(a0, a1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_hadd_ps(h, h);
  h = _mm_hadd_ps(h, h);
  float acc = _mm_cvtss_f32(h);
  for (int64_t j = k16; j < k; j++) acc += _cvtsh_ss(w[j]) * x[j];
  return acc;
}
#else
static inline float dot_f16(const uint16_t *w, const float *x, int64_t k) {
  const int64_t k16 = k & ~(int64_t)15;
  vec a0 = VZERO(), a1 = VZERO();
  for (int64_t j = 0; j < k16; j += 16) {
    a0 = VFMA(VLOADW(w + j), VLOADX(x + j), a0);
    a1 = VFMA(VLOADW(w + j + 8), VLOADX(x + j + 8), a1);
  }
  float acc = VSUM(VADDV(a0, a1));
  for (int64_t j = k16; j < k; j++) acc += h2f(w[j]) * x[j];
  return acc;
}
#endif

/* dot_f16 of one weight row with 4 vectors at once: each weight vector is loaded and converted once for all of them,
   and every row accumulates in dot_f16's order (its value bit for bit as alone) */
#if HG_X86
static inline void dot4_f16(const uint16_t *w, const float *const *x, int64_t k, float *out) {
  const int64_t k16 = k & ~(int64_t)15;
  __m256 a0[4], a1[4];
  for (int r = 0; r < 4; r++) a0[r] = a1[r] = _mm256_setzero_ps();
  for (int64_t j = 0; j < k16; j += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j)));
    const __m256 w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j + 8)));
    for (int r = 0; r < 4; r++) {
      a0[r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x[r] + j), a0[r]);
      a1[r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x[r] + j + 8), a1[r]);
    }
  }
  for (int r = 0; r < 4; r++) {
    __m256 s = _mm256_add_ps(a0[r], a1[r]);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    float acc = _mm_cvtss_f32(h);
    for (int64_t j = k16; j < k; j++) acc += _cvtsh_ss(w[j]) * x[r][j];
    out[r] = acc;
  }
}
#else
static inline void dot4_f16(const uint16_t *w, const float *const *x, int64_t k, float *out) {
  const int64_t k16 = k & ~(int64_t)15;
  vec a0[4], a1[4];
  for (int r = 0; r < 4; r++) a0[r] = a1[r] = VZERO();
  for (int64_t j = 0; j < k16; j += 16) {
    const vec w0 = VLOADW(w + j), w1 = VLOADW(w + j + 8);
    for (int r = 0; r < 4; r++) {
      a0[r] = VFMA(w0, VLOADX(x[r] + j), a0[r]);
      a1[r] = VFMA(w1, VLOADX(x[r] + j + 8), a1[r]);
    }
  }
  for (int r = 0; r < 4; r++) {
    float acc = VSUM(VADDV(a0[r], a1[r]));
    for (int64_t j = k16; j < k; j++) acc += h2f(w[j]) * x[r][j];
    out[r] = acc;
  }
}
#endif

/* Software prefetch of the weight row bytes this far ahead of the row being read (more reads in flight than the
   hardware prefetcher keeps at the start of every chunk and page). Measured on the 2-core AVX2 EPYC with 24 layers of
   decode-shaped gemvs (151 MB), alternating with the same kernel without it in one process, medians of 12-20 rounds
   of best-of-6, three runs: 1 thread 11.37 / 12.00 / 12.56 ms -> 11.34 / 11.53 / 11.89 ms, 2 threads 6.94 / 7.50 /
   7.17 ms -> 6.77 / 7.02 / 7.05 ms (a few per cent; 1 KB ahead was no better). Prefetching never faults. */
#define PREFETCH_AHEAD 2048

static inline void prefetch_row(const uint16_t *w, int64_t k) {
  const uintptr_t end = (uintptr_t)w + PREFETCH_AHEAD + (uintptr_t)k * sizeof(uint16_t);
  for (uintptr_t p = (uintptr_t)w + PREFETCH_AHEAD; p < end; p += 64) PREFETCH(p);
}

/* rows i0..i1 of W against `nb` vectors xs[r] into ys[r]: each weight row is read from memory once for all of them
   (four vectors per pass share its conversion; it stays in L1 between passes) */
static void gemv_rows(const uint16_t *W, const float *const *xs, const float *b, float *const *ys, int64_t nb,
                      int64_t i0, int64_t i1, int64_t k) {
  if (nb == 1) { /* one vector: the plain loop */
    const float *x = xs[0];
    float *y = ys[0];
    for (int64_t i = i0; i < i1; i++) {
      prefetch_row(W + i * k, k);
      const float acc = dot_f16(W + i * k, x, k);
      y[i] = b ? acc + b[i] : acc;
    }
    return;
  }
  for (int64_t i = i0; i < i1; i++) {
    const uint16_t *w = W + i * k;
    prefetch_row(w, k);
    int64_t r = 0;
    for (; nb - r >= 2; r += 4) { /* pairs and triples fill the pass with repeats of their first vector */
      const float *x4[4];
      float acc[4];
      for (int q = 0; q < 4; q++) x4[q] = xs[r + q < nb ? r + q : r];
      dot4_f16(w, x4, k, acc);
      for (int q = 0; q < 4 && r + q < nb; q++) ys[r + q][i] = b ? acc[q] + b[i] : acc[q];
    }
    for (; r < nb; r++) {
      const float acc = dot_f16(w, xs[r], k);
      ys[r][i] = b ? acc + b[i] : acc;
    }
  }
}

void gemv_f16(const uint16_t *W, const float *x, const float *b, float *y, int64_t n, int64_t k) {
  gemv_rows(W, &x, b, &y, 1, 0, n, k);
}

typedef struct {
  const uint16_t *W;
  const float *const *xs;
  const float *b;
  float *const *ys;
  int64_t nb, n, k, rows;
  int relu;
} gemv_job;

static void gemv_chunk(const void *p, int64_t c) {
  const gemv_job *j = (const gemv_job *)p;
  const int64_t i0 = c * j->rows, i1 = i0 + j->rows < j->n ? i0 + j->rows : j->n;
  gemv_rows(j->W, j->xs, j->b, j->ys, j->nb, i0, i1, j->k);
  if (j->relu)
    for (int64_t r = 0; r < j->nb; r++)
      for (int64_t i = i0; i < i1; i++) j->ys[r][i] = j->ys[r][i] > 0.0f ? j->ys[r][i] : 0.0f;
}

/* ys[r] = W xs[r] (+ b) for r < nb, rows split over threads */
static void gemv_batch(const uint16_t *W, const float *const *xs, const float *b, float *const *ys, int64_t nb,
                       int64_t n, int64_t k, int relu, int threads) {
  if (threads <= 1 || n * k < (1 << 16)) threads = 1;
  int64_t rows = threads == 1 ? n : (n + 4 * threads - 1) / (4 * threads);
  rows = rows < 32 ? 32 : (rows + 15) & ~(int64_t)15;
  gemv_job j = {W, xs, b, ys, nb, n, k, rows, relu};
  parallel(gemv_chunk, &j, (n + rows - 1) / rows, threads);
}

static void gemv_par(const uint16_t *W, const float *x, const float *b, float *y, int64_t n, int64_t k, int relu,
                     int threads) {
  gemv_batch(W, &x, b, &y, 1, n, k, relu, threads);
}

/* gemv_f16 on `threads` threads (rows in chunks: every y[i] is bit-identical to gemv_f16's) */
void gemv_f16_mt(const uint16_t *W, const float *x, const float *b, float *y, int64_t n, int64_t k, int threads) {
  gemv_par(W, x, b, y, n, k, 0, threads);
}

/* the decode step's feed-forward: h = relu(W1 x + b1) (n1 x k), y = W2 h + b2 (k x n1) */
void ffn_f16_mt(const uint16_t *W1, const float *b1, const uint16_t *W2, const float *b2, const float *x, float *h,
                float *y, int64_t k, int64_t n1, int threads) {
  gemv_par(W1, x, b1, h, n1, k, 1, threads);
  gemv_par(W2, h, b2, y, k, n1, 0, threads);
}

#if HG_X86
/* dst[i] = (float)src[i]: the prefill's upcast of one weight (numpy's float16 astype is ~10x slower). */
void f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}

/* dst[i] = float16(src[i]) (round to nearest); returns 1 when every value converted exactly (src held float16
   values), checked in the same pass: the loaders' test for "the weights are float16" */
int f32_to_f16_exact(const float *src, uint16_t *dst, int64_t n) {
  int exact = 1;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)(dst + i), h);
    exact &= _mm256_movemask_ps(_mm256_cmp_ps(_mm256_cvtph_ps(h), v, _CMP_EQ_OQ)) == 0xff;
  }
  for (; i < n; i++) {
    dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    exact &= _cvtsh_ss(dst[i]) == src[i];
  }
  return exact;
}
#else
/* the same two conversions, portable */
void f16_to_f32(const uint16_t *src, float *dst, int64_t n) {
  int64_t i = 0;
  for (; i + VW <= n; i += VW) VSTORE(dst + i, VLOADW(src + i));
  for (; i < n; i++) dst[i] = h2f(src[i]);
}

int f32_to_f16_exact(const float *src, uint16_t *dst, int64_t n) {
  int exact = 1;
  for (int64_t i = 0; i < n; i++) {
    dst[i] = f2h(src[i]);
    exact &= h2f(dst[i]) == src[i];
  }
  return exact;
}
#endif

/* ---- small-M GEMM: Y[m, n] = act(sum_k X[m, k] W[n, k] + b[n]); W float16 (N x K), X, Y float32 ----
   Columns split over the pool's threads, float32 accumulation, two tilings chosen by M alone (so every value is
   bit-identical whatever the thread count):
   - fewer than BROADCAST_ROWS rows (RoBERTa's tokens on x86): dot tiles, NR weight rows converted in registers
     against MR rows of X, each sum over k in vector lanes, then across them;
   - more (the GPT prefill's ~200 rows): broadcast tiles, GN weight rows converted once into a float32 panel,
     against GM rows of X transposed once per call; each value one FMA chain over k in order.
   On the 2-core AVX-512 Xeon VM the broadcast tiles take 0.64 / 0.72 of the dot tiles' time on the prefill's four
   products at 2 / 1 threads, the AVX2 build 0.82 / 0.89 (tests/models/bench_kernel_revisions.py). act: 0 none,
   1 ReLU, 2 exact GELU (erf: the Eigen/XLA float32 rational approximation, as models/activations.py). */
#define NR 4

static inline float erf_f(float x) {
  x = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  const float x2 = x * x;
  float p = x2 * -2.72614225801306e-10f + 2.77068142495902e-08f;
  p = x2 * p + -2.10102402082508e-06f;
  p = x2 * p + -5.69250639462346e-05f;
  p = x2 * p + -7.34990630326855e-04f;
  p = x2 * p + -2.95459980854025e-03f;
  p = x2 * p + -1.60960333262415e-02f;
  p = x * p;
  float q = x2 * -1.45660718464996e-05f + -2.13374055278905e-04f;
  q = x2 * q + -1.68282697438203e-03f;
  q = x2 * q + -7.37332916720468e-03f;
  q = x2 * q + -1.42647390514189e-02f;
  return p / q;
}

static void gemm_block(const uint16_t *W, const float *X, float *Y, int64_t M, int64_t N, int64_t K,
                       int64_t n0, int64_t n1) {
  const int64_t kv = K - K % VW;
  for (int64_t n = n0; n < n1; n += NR) {
    const uint16_t *w[NR], *next[NR];
    for (int c = 0; c < NR; c++) {
      w[c] = W + (n + c < N ? n + c : N - 1) * K;
      next[c] = W + (n + NR + c < n1 ? n + NR + c : n1 - 1) * K;
    }
    for (int64_t m = 0; m < M; m += MR) {
      const float *x[MR];
      for (int r = 0; r < MR; r++) x[r] = X + (m + r < M ? m + r : M - 1) * K;
      vec acc[MR][NR];
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = VZERO();
      for (int64_t j = 0; j < kv; j += VW) {
        if (m == 0 && (j & 31) == 0) /* the next tile's weight rows on their way from memory while this one computes:
                                        a tile is read from DRAM once, so a small M waits on every new row's start */
          for (int c = 0; c < NR; c++) PREFETCH(next[c] + j);
        /* the MR rows of X in registers, then one weight vector at a time: MR NR accumulators + MR + 1 vectors
           live (AVX2: 12 + 3 + 1 = its 16 registers; holding all NR weight vectors instead spilled an
           accumulator to the stack: 1.6-1.8x slower on an AVX2 EPYC, same values) */
        vec xv[MR];
        for (int r = 0; r < MR; r++) xv[r] = VLOADX(x[r] + j);
        for (int c = 0; c < NR; c++) {
          const vec wv = VLOADW(w[c] + j);
          for (int r = 0; r < MR; r++) acc[r][c] = VFMA(xv[r], wv, acc[r][c]);
        }
      }
      for (int r = 0; r < MR && m + r < M; r++) {
        float sums[NR];
        vsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], sums);
        for (int c = 0; c < NR && n + c < n1; c++) {
          float s = sums[c];
          for (int64_t j = kv; j < K; j++) s += x[r][j] * h2f(w[c][j]);
          Y[(m + r) * N + n + c] = s;
        }
      }
    }
  }
}

static void epilogue(float *Y, const float *b, int64_t M, int64_t N, int64_t n0, int64_t n1, int act) {
  for (int64_t m = 0; m < M; m++) {
    float *y = Y + m * N;
    if (b)
      for (int64_t n = n0; n < n1; n++) y[n] += b[n];
    if (act == 1)
      for (int64_t n = n0; n < n1; n++) y[n] = y[n] > 0.0f ? y[n] : 0.0f;
    else if (act == 2)
      for (int64_t n = n0; n < n1; n++) y[n] = 0.5f * y[n] * (1.0f + erf_f(y[n] * 0.70710678118654752f));
  }
}

/* The broadcast tile: GN panel rows (output columns n..n+GN-1) against GM = GV vectors of X rows; each k adds GN
   broadcast weights times GV vectors of X: GN GV accumulators + GV + 1 vectors live (AVX-512: 24 + 3 of its 32
   registers; AVX2 and portable: 12 + 3 of 16). Rows past M are the zero rows of Xt (computed, never stored). */
#ifdef __AVX512F__
#define GN 12
#else
#define GN 6
#endif
#define GV 2
#define GM (GV * VW)
#if HG_X86
#define BROADCAST_ROWS 64 /* x86: fewer rows on the dot tiles (AVX2, 23 rows: broadcast 1.13-1.17x their time) */
#else
#define BROADCAST_ROWS (GM + 1) /* portable: a float16 conversion in software (x86-64 without F16C) costs most, and
                                   the broadcast tiles convert each weight once (23 rows: 0.2-0.3x the dot tiles) */
#endif

static void broadcast_tile(const float *wp, int64_t ws, const float *Xt, float *Y, int64_t M, int64_t N, int64_t K,
                           int64_t n, int nc) {
  for (int64_t m0 = 0; m0 < M; m0 += GM) {
    vec acc[GN][GV];
#pragma GCC unroll 12
    for (int c = 0; c < GN; c++)
#pragma GCC unroll 2
      for (int v = 0; v < GV; v++) acc[c][v] = VZERO();
    const float *xt = Xt + m0 * K; /* rows m0..m0+GM-1: K x GM floats in a row */
    for (int64_t k = 0; k < K; k++, xt += GM) {
      vec xv[GV];
#pragma GCC unroll 2
      for (int v = 0; v < GV; v++) xv[v] = VLOADX(xt + v * VW);
#pragma GCC unroll 12
      for (int c = 0; c < GN; c++) {
        const vec wv = VSET1(wp[c * ws + k]);
#pragma GCC unroll 2
        for (int v = 0; v < GV; v++) acc[c][v] = VFMA(xv[v], wv, acc[c][v]);
      }
    }
    const int64_t rows = M - m0 < GM ? M - m0 : GM;
    float out[GN][GM];
#pragma GCC unroll 12
    for (int c = 0; c < GN; c++)
#pragma GCC unroll 2
      for (int v = 0; v < GV; v++) VSTORE(out[c] + v * VW, acc[c][v]);
    for (int64_t i = 0; i < rows; i++) /* row by row: each row's nc values side by side in Y */
      for (int c = 0; c < nc; c++) Y[(m0 + i) * N + n + c] = out[c][i];
  }
}

typedef struct {
  const uint16_t *W;
  const float *X, *b;
  float *Y, *Xt, *panels; /* Xt, panels: the broadcast tiles' (NULL for the dot tiles) */
  int64_t M, N, K, cols, ws;
  int act;
} gemm_job;

static void gemm_chunk(const void *p, int64_t c) {
  const gemm_job *j = (const gemm_job *)p;
  const int64_t n0 = c * j->cols, n1 = n0 + j->cols < j->N ? n0 + j->cols : j->N, K = j->K;
  if (!j->Xt) {
    gemm_block(j->W, j->X, j->Y, j->M, j->N, K, n0, n1);
  } else {
    float *wp = j->panels + c * GN * j->ws; /* this chunk's panel */
    for (int64_t n = n0; n < n1; n += GN) {
      for (int r = 0; r < GN; r++) /* rows past the chunk repeat its last row (computed, never stored) */
        f16_to_f32(j->W + (n + r < n1 ? n + r : n1 - 1) * K, wp + r * j->ws, K);
      broadcast_tile(wp, j->ws, j->Xt, j->Y, j->M, j->N, K, n, (int)(n1 - n < GN ? n1 - n : GN));
    }
  }
  epilogue(j->Y, j->b, j->M, j->N, n0, n1, j->act);
}

#define TK 64 /* k per transpose chunk */
static void transpose_chunk(const void *p, int64_t c) { /* Xt[m0 K + k GM + i] = X[m0 + i, k], zero past M */
  const gemm_job *j = (const gemm_job *)p;
  const int64_t k0 = c * TK, k1 = k0 + TK < j->K ? k0 + TK : j->K, K = j->K;
  for (int64_t m0 = 0; m0 < j->M; m0 += GM) {
    float *t = j->Xt + m0 * K;
    for (int64_t k = k0; k < k1; k++)
      for (int64_t i = 0; i < GM; i++) t[k * GM + i] = m0 + i < j->M ? j->X[(m0 + i) * K + k] : 0.0f;
  }
}

/* returns 0, or -1 (nothing computed) when the broadcast tiles' buffers cannot be allocated */
int gemm_f16(const uint16_t *W, const float *X, const float *b, float *Y, int64_t M, int64_t N, int64_t K, int act,
             int threads) {
  if (M <= 0 || N <= 0) return 0;
  if (threads <= 1 || M * N * K < (1 << 18)) threads = 1;
  const int broadcast = M >= BROADCAST_ROWS;
  const int64_t tile = broadcast ? GN : NR;
  int64_t cols = threads == 1 && !broadcast ? N : (N + 8 * threads - 1) / (8 * threads);
  cols = (cols + tile - 1) / tile * tile;
  const int64_t chunks = (N + cols - 1) / cols;
  gemm_job j = {W, X, b, Y, NULL, NULL, M, N, K, cols, 0, act};
  if (broadcast) {
    j.ws = (K + 15) / 16 * 16 + 16; /* a panel row's stride: its rows one cache line apart modulo 4 KiB */
    const int64_t xt = (M + GM - 1) / GM * GM * K;
    j.Xt = (float *)aligned_alloc(64, (size_t)((xt + chunks * GN * j.ws) * 4 + 63) / 64 * 64);
    if (!j.Xt) return -1;
    j.panels = j.Xt + xt;
    parallel(transpose_chunk, &j, (K + TK - 1) / TK, threads);
  }
  parallel(gemm_chunk, &j, chunks, threads);
  free(j.Xt);
  return 0;
}

/* Y = act(Y + b) in place (Y: M x N float32, b: N or NULL): gemm_f16's epilogue for a product computed elsewhere
   (the float32 path: BLAS on weights upcast from float16) */
void bias_act(float *Y, const float *b, int64_t M, int64_t N, int act) {
  if (M > 0 && N > 0) epilogue(Y, b, M, N, 0, N, act);
}

/* ---- the whole GPT decode step's blocks in one call (models/t2s_numpy.py, float16 weights): per layer
   qkv = Wqkv x + b; the new k, v into cache row t; attention of each head over rows 0..t; x = LN1(x + Wo o + bo);
   x = LN2(x + W2 relu(W1 x + b1) + b2). The products on `threads` threads (the pool), the rest on the caller's.
   p: per layer 14 pointers (qkv_w, qkv_b, out_w, out_b, n1_w, n1_b, fc1_w, fc1_b, fc2_w, fc2_b, n2_w, n2_b, K, V);
   K, V (H, cap, hd) float32; scratch: 5 D + F + H cap floats. ---- */
typedef struct {
  const float *qkv;
  const float *K, *V;
  float *o, *s;
  int64_t cap, n, hd, D;
  float scale;
} attn_job;

static float softmax_exp(float *s, int64_t n);
static void weighted_rows(const float *s, float inv, const float *V, int64_t len, int64_t hd, float *o);

static void attn_head(const void *p, int64_t h) {
  const attn_job *j = (const attn_job *)p;
  const int64_t hd = j->hd, n = j->n;
  const float *q = j->qkv + h * hd;
  const float *K = j->K + h * j->cap * hd, *V = j->V + h * j->cap * hd;
  float *s = j->s + h * j->cap, *o = j->o + h * hd;
  if (hd % VW == 0 && hd <= 4 * VW) { /* a head's row in registers; four cache rows' scores at a time */
    const int nv = (int)(hd / VW);
    vec qv[4];
    for (int u = 0; u < nv; u++) qv[u] = VLOADX(q + u * VW);
    int64_t r = 0;
    for (; r + 4 <= n; r += 4) {
      const float *k = K + r * hd;
      vec a0 = VMULV(VLOADX(k), qv[0]), a1 = VMULV(VLOADX(k + hd), qv[0]);
      vec a2 = VMULV(VLOADX(k + 2 * hd), qv[0]), a3 = VMULV(VLOADX(k + 3 * hd), qv[0]);
      for (int u = 1; u < nv; u++) {
        a0 = VFMA(VLOADX(k + u * VW), qv[u], a0);
        a1 = VFMA(VLOADX(k + hd + u * VW), qv[u], a1);
        a2 = VFMA(VLOADX(k + 2 * hd + u * VW), qv[u], a2);
        a3 = VFMA(VLOADX(k + 3 * hd + u * VW), qv[u], a3);
      }
      float sums[4];
      vsum4(a0, a1, a2, a3, sums);
      for (int i = 0; i < 4; i++) s[r + i] = sums[i] * j->scale;
    }
    for (; r < n; r++) {
      vec a = VMULV(VLOADX(K + r * hd), qv[0]);
      for (int u = 1; u < nv; u++) a = VFMA(VLOADX(K + r * hd + u * VW), qv[u], a);
      s[r] = VSUM(a) * j->scale;
    }
    weighted_rows(s, 1.0f / softmax_exp(s, n), V, n, hd, o);
    return;
  }
  float mx = -INFINITY;
  for (int64_t r = 0; r < n; r++) {
    float acc = 0.0f;
    for (int64_t c = 0; c < hd; c++) acc += K[r * hd + c] * q[c];
    s[r] = acc * j->scale;
    mx = s[r] > mx ? s[r] : mx;
  }
  float sum = 0.0f;
  for (int64_t r = 0; r < n; r++) {
    s[r] = expf(s[r] - mx);
    sum += s[r];
  }
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < hd; c++) o[c] = 0.0f;
  for (int64_t r = 0; r < n; r++) {
    const float w = s[r] * inv;
    for (int64_t c = 0; c < hd; c++) o[c] += w * V[r * hd + c];
  }
}

/* x = LayerNorm(x) * w + nb in place for one row of D (mean and variance accumulated in double) */
static void norm_row(float *x, const float *w, const float *nb, int64_t D, float eps) {
  double mu = 0.0;
  for (int64_t i = 0; i < D; i++) mu += x[i];
  const float m = (float)(mu / (double)D);
  double var = 0.0;
  for (int64_t i = 0; i < D; i++) {
    const float d = x[i] - m;
    var += (double)d * d;
  }
  const float r = 1.0f / sqrtf((float)(var / (double)D) + eps);
  for (int64_t i = 0; i < D; i++) x[i] = (x[i] - m) * (w[i] * r) + nb[i];
}

static void layer_norm_add(float *x, const float *y, const float *b, const float *w, const float *nb, int64_t D,
                           float eps) {
  for (int64_t i = 0; i < D; i++) x[i] = (x[i] + y[i]) + b[i];
  norm_row(x, w, nb, D, eps);
}

/* ---- x[i] = LayerNorm(x[i] + y[i]) * w + nb for M rows of D (the prefill's residual and norm), rows split over
   threads (norm_row, as the decode step's layer_norm_add) ---- */
typedef struct {
  float *x;
  const float *y, *w, *nb;
  int64_t M, D, rows;
  float eps;
} add_norm_job;

static void add_norm_chunk(const void *p, int64_t c) {
  const add_norm_job *j = (const add_norm_job *)p;
  const int64_t D = j->D, r1 = (c + 1) * j->rows < j->M ? (c + 1) * j->rows : j->M;
  for (int64_t r = c * j->rows; r < r1; r++) {
    float *x = j->x + r * D;
    const float *y = j->y + r * D;
    for (int64_t i = 0; i < D; i++) x[i] += y[i];
    norm_row(x, j->w, j->nb, D, j->eps);
  }
}

void add_layer_norm_rows(float *x, const float *y, const float *w, const float *nb, int64_t M, int64_t D, float eps,
                         int threads) {
  const int64_t rows = 8;
  add_norm_job j = {x, y, w, nb, M, D, rows, eps};
  if (M > 0 && D > 0) parallel(add_norm_chunk, &j, (M + rows - 1) / rows, M * D >= (1 << 15) ? threads : 1);
}

typedef struct {
  const attn_job *rows;
  int64_t H;
} attn_batch;

static void attn_batch_head(const void *p, int64_t c) {
  const attn_batch *j = (const attn_batch *)p;
  attn_head(j->rows + c / j->H, c % j->H);
}

#define MAX_BATCH 16

/* ---- int8 weights, one float32 scale per row (the opt-in reduced-precision decode step, PRIMESPEECH_PRECISION=int8):
   y[i] = S[i] * sum_j Q[i, j] x[j] (+ b[i]), Q the row rounded to S[i] = max|W[i, :]| / 127 steps. Half the bytes of
   float16 per token for a step bound by reading its weights; x and the sums stay float32 (each weight converted in
   registers, like the float16 path), so the only change is the weights' rounding: |W - S Q| <= S / 2 per value. ---- */
#if HG_X86 && defined(__AVX512F__)
#define VLOADQ(p) _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(p))))
#elif HG_X86
#define VLOADQ(p) _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(p))))
#else
typedef int8_t qvec __attribute__((vector_size(VW)));
static inline vec VLOADQ(const int8_t *p) {
  qvec q;
  memcpy(&q, p, sizeof q);
  return __builtin_convertvector(q, vec);
}
#endif

static inline float dot_q8(const int8_t *w, const float *x, int64_t k) {
  const int64_t k4 = k & ~(int64_t)(4 * VW - 1);
  vec a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
  int64_t j = 0;
  for (; j < k4; j += 4 * VW) {
    a0 = VFMA(VLOADQ(w + j), VLOADX(x + j), a0);
    a1 = VFMA(VLOADQ(w + j + VW), VLOADX(x + j + VW), a1);
    a2 = VFMA(VLOADQ(w + j + 2 * VW), VLOADX(x + j + 2 * VW), a2);
    a3 = VFMA(VLOADQ(w + j + 3 * VW), VLOADX(x + j + 3 * VW), a3);
  }
  for (; j + VW <= k; j += VW) a0 = VFMA(VLOADQ(w + j), VLOADX(x + j), a0);
  float acc = VSUM(VADDV(VADDV(a0, a1), VADDV(a2, a3)));
  for (; j < k; j++) acc += (float)w[j] * x[j];
  return acc;
}

static inline void prefetch_q8(const int8_t *w, int64_t k) {
  const uintptr_t end = (uintptr_t)w + PREFETCH_AHEAD + (uintptr_t)k;
  for (uintptr_t p = (uintptr_t)w + PREFETCH_AHEAD; p < end; p += 64) PREFETCH(p);
}

typedef struct {
  const int8_t *Q;
  const float *S;
  const float *const *xs;
  const float *b;
  float *const *ys;
  int64_t nb, n, k, rows;
  int relu;
} q8_job;

static void q8_chunk(const void *p, int64_t c) {
  const q8_job *j = (const q8_job *)p;
  const int64_t i0 = c * j->rows, i1 = i0 + j->rows < j->n ? i0 + j->rows : j->n, k = j->k;
  for (int64_t i = i0; i < i1; i++) {
    const int8_t *w = j->Q + i * k;
    prefetch_q8(w, k);
    for (int64_t r = 0; r < j->nb; r++) { /* the row stays in L1 for the other vectors */
      float v = j->S[i] * dot_q8(w, j->xs[r], k);
      if (j->b) v += j->b[i];
      j->ys[r][i] = j->relu && v < 0.0f ? 0.0f : v;
    }
  }
}

static void gemv_batch_q8(const int8_t *Q, const float *S, const float *const *xs, const float *b, float *const *ys,
                          int64_t nb, int64_t n, int64_t k, int relu, int threads) {
  if (threads <= 1 || n * k < (1 << 17)) threads = 1;
  int64_t rows = threads == 1 ? n : (n + 4 * threads - 1) / (4 * threads);
  rows = rows < 32 ? 32 : (rows + 15) & ~(int64_t)15;
  q8_job j = {Q, S, xs, b, ys, nb, n, k, rows, relu};
  parallel(q8_chunk, &j, (n + rows - 1) / rows, threads);
}

/* y = S * (Q x) (+ b) on `threads` threads (rows split: every value as on one thread) */
void gemv_q8_mt(const int8_t *Q, const float *S, const float *x, const float *b, float *y, int64_t n, int64_t k,
                int threads) {
  gemv_batch_q8(Q, S, &x, b, &y, 1, n, k, 0, threads);
}

/* Q[i, :] = round(W[i, :] / S[i]) with S[i] = max|W[i, :]| / 127 (0 for a zero row); W float32 (n x k) */
void quantize_rows_q8(const float *W, int8_t *Q, float *S, int64_t n, int64_t k) {
  for (int64_t i = 0; i < n; i++) {
    const float *w = W + i * k;
    float m = 0.0f;
    for (int64_t j = 0; j < k; j++) m = fabsf(w[j]) > m ? fabsf(w[j]) : m;
    const float s = m / 127.0f, inv = m > 0.0f ? 127.0f / m : 0.0f;
    S[i] = s;
    for (int64_t j = 0; j < k; j++) {
      const float q = nearbyintf(w[j] * inv);
      Q[i * k + j] = (int8_t)(q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q);
    }
  }
}

/* one decode step for nb generations of the same model at once (the batched decode of queued sentences): row r has
   its own pointer table tables[r] (its weights are tables[0]'s: one weight read per step for all rows; its own KV
   cache at entries 12, 13 of each layer), cache capacity caps[r], filled rows ts[r], state xs[r] (D) and scratch
   scratch[r] (5 D + F + H caps[r] floats). Every row's values are bit-identical to its decode_layers step alone.
   q8: the four products' weights are int8 (entries 0, 2, 6, 8) with their row scales at entries 14-17, 18 entries
   per layer; otherwise float16, 14 entries. */
static void layer_gemv(void *const *w, int q8, int wi, int si, const float *const *xs, const float *b,
                       float *const *ys, int64_t nb, int64_t n, int64_t k, int relu, int threads) {
  if (q8)
    gemv_batch_q8((const int8_t *)w[wi], (const float *)w[si], xs, b, ys, nb, n, k, relu, threads);
  else
    gemv_batch((const uint16_t *)w[wi], xs, b, ys, nb, n, k, relu, threads);
}

static int decode_core(void *const *const *tables, int q8, int64_t nb, const int64_t *caps, const int64_t *ts,
                       float *const *xs, float *const *scratch, int64_t layers, int64_t D, int64_t H, int64_t F,
                       float scale, float eps, int threads) {
  if (nb < 1 || nb > MAX_BATCH) return -1;
  const int64_t hd = D / H, stride = q8 ? 18 : 14;
  float *qkv[MAX_BATCH], *o[MAX_BATCH], *y[MAX_BATCH], *h[MAX_BATCH];
  const float *cx[MAX_BATCH], *co[MAX_BATCH], *ch[MAX_BATCH];
  attn_job aj[MAX_BATCH];
  int64_t work = 0;
  for (int64_t r = 0; r < nb; r++) {
    qkv[r] = scratch[r];
    o[r] = qkv[r] + 3 * D;
    y[r] = o[r] + D;
    h[r] = y[r] + D;
    cx[r] = xs[r];
    co[r] = o[r];
    ch[r] = h[r];
    work += (ts[r] + 1) * D;
  }
  for (int64_t l = 0; l < layers; l++) {
    void *const *w = tables[0] + stride * l;
    layer_gemv(w, q8, 0, 14, cx, (const float *)w[1], qkv, nb, 3 * D, D, 0, threads);
    for (int64_t r = 0; r < nb; r++) {
      float *K = (float *)tables[r][stride * l + 12], *V = (float *)tables[r][stride * l + 13];
      const int64_t cap = caps[r], t = ts[r];
      for (int64_t hh = 0; hh < H; hh++)
        for (int64_t c = 0; c < hd; c++) {
          K[(hh * cap + t) * hd + c] = qkv[r][D + hh * hd + c];
          V[(hh * cap + t) * hd + c] = qkv[r][2 * D + hh * hd + c];
        }
      attn_job j = {qkv[r], K, V, o[r], h[r] + F, cap, t + 1, hd, D, scale};
      aj[r] = j;
    }
    attn_batch ab = {aj, H};
    parallel(attn_batch_head, &ab, nb * H, work >= (1 << 16) ? threads : 1);
    layer_gemv(w, q8, 2, 15, co, NULL, y, nb, D, D, 0, threads);
    for (int64_t r = 0; r < nb; r++)
      layer_norm_add(xs[r], y[r], (const float *)w[3], (const float *)w[4], (const float *)w[5], D, eps);
    layer_gemv(w, q8, 6, 16, cx, (const float *)w[7], h, nb, F, D, 1, threads);
    layer_gemv(w, q8, 8, 17, ch, NULL, y, nb, D, F, 0, threads);
    for (int64_t r = 0; r < nb; r++)
      layer_norm_add(xs[r], y[r], (const float *)w[9], (const float *)w[10], (const float *)w[11], D, eps);
  }
  return 0;
}

int decode_layers_batch(void *const *const *tables, int64_t nb, const int64_t *caps, const int64_t *ts,
                        float *const *xs, float *const *scratch, int64_t layers, int64_t D, int64_t H, int64_t F,
                        float scale, float eps, int threads) {
  return decode_core(tables, 0, nb, caps, ts, xs, scratch, layers, D, H, F, scale, eps, threads);
}

/* the same step on int8 weights (tables of 18 entries per layer, see decode_core) */
int decode_layers_batch_q8(void *const *const *tables, int64_t nb, const int64_t *caps, const int64_t *ts,
                           float *const *xs, float *const *scratch, int64_t layers, int64_t D, int64_t H, int64_t F,
                           float scale, float eps, int threads) {
  return decode_core(tables, 1, nb, caps, ts, xs, scratch, layers, D, H, F, scale, eps, threads);
}

/* one generation's step: the batch of one */
void decode_layers(void *const *p, int64_t layers, int64_t cap, int64_t t, float *x, float *scratch, int64_t D,
                   int64_t H, int64_t F, float scale, float eps, int threads) {
  decode_layers_batch(&p, 1, &cap, &t, &x, &scratch, layers, D, H, F, scale, eps, threads);
}

void decode_layers_q8(void *const *p, int64_t layers, int64_t cap, int64_t t, float *x, float *scratch, int64_t D,
                      int64_t H, int64_t F, float scale, float eps, int threads) {
  decode_layers_batch_q8(&p, 1, &cap, &t, &x, &scratch, layers, D, H, F, scale, eps, threads);
}

/* ---- the prefill's attention, one head per chunk: the new keys/values into the KV cache (H, cap, hd), then for
   each row i the scores against keys 0..len_i (len_i = n_text for text rows, i + 1 for audio rows: the prefix
   mask), softmax, and the weighted values into O (T x D). qkv: T x 3D. scratch: H (hd T + T) floats. ---- */
static inline vec exp_neg_v(vec x) { /* exp(x) for x <= 0 on a vector (Cephes expf: ~1 ulp) */
  x = VMAXV(x, VSET1(-87.3f));
  const vec n = VFLOOR(VFMA(x, VSET1(1.44269504088896341f), VSET1(0.5f)));
  const vec r = VFMA(n, VSET1(2.12194440e-4f), VFMA(n, VSET1(-0.693359375f), x));
  vec p = VSET1(1.9875691500E-4f);
  p = VFMA(p, r, VSET1(1.3981999507E-3f));
  p = VFMA(p, r, VSET1(8.3334519073E-3f));
  p = VFMA(p, r, VSET1(4.1665795894E-2f));
  p = VFMA(p, r, VSET1(1.6666665459E-1f));
  p = VFMA(p, r, VSET1(5.0000001201E-1f));
  const vec e = VADDV(VFMA(VMULV(p, r), r, r), VSET1(1.0f));
  return VMULV(e, VPOW2(n));
}

/* s[0..n) = exp(s - max(s)); returns their sum */
static float softmax_exp(float *s, int64_t n) {
  float buf[VW];
  vec m = VSET1(-INFINITY);
  int64_t r = 0;
  for (; r + VW <= n; r += VW) m = VMAXV(m, VLOADX(s + r));
  VSTORE(buf, m);
  float mx = -INFINITY;
  for (int u = 0; u < VW; u++) mx = buf[u] > mx ? buf[u] : mx;
  for (; r < n; r++) mx = s[r] > mx ? s[r] : mx;
  const vec mv = VSET1(mx);
  vec acc = VZERO();
  for (r = 0; r + VW <= n; r += VW) {
    const vec e = exp_neg_v(VSUBV(VLOADX(s + r), mv));
    VSTORE(s + r, e);
    acc = VADDV(acc, e);
  }
  float sum = VSUM(acc);
  if (r < n) { /* the tail as one vector (padded with the max), its values added in order */
    for (int u = 0; u < VW; u++) buf[u] = r + u < n ? s[r + u] : mx;
    VSTORE(buf, exp_neg_v(VSUBV(VLOADX(buf), mv)));
    for (int u = 0; r < n; u++, r++) {
      s[r] = buf[u];
      sum += s[r];
    }
  }
  return sum;
}

/* o[0..hd) = inv * sum_r s[r] V[r]: the softmax-weighted values of one head's row (V: len rows of hd) */
static void weighted_rows(const float *s, float inv, const float *V, int64_t len, int64_t hd, float *o) {
  if (hd == 2 * VW) { /* the output row in two registers, four rows of V at a time: eight independent sums */
    vec a0 = VZERO(), a1 = VZERO(), b0 = VZERO(), b1 = VZERO(), c0 = VZERO(), c1 = VZERO(), d0 = VZERO(),
        d1 = VZERO();
    int64_t r = 0;
    for (; r + 4 <= len; r += 4) {
      const float *v = V + r * hd;
      const vec w0 = VSET1(s[r] * inv), w1 = VSET1(s[r + 1] * inv), w2 = VSET1(s[r + 2] * inv),
                w3 = VSET1(s[r + 3] * inv);
      a0 = VFMA(w0, VLOADX(v), a0);
      a1 = VFMA(w0, VLOADX(v + VW), a1);
      b0 = VFMA(w1, VLOADX(v + hd), b0);
      b1 = VFMA(w1, VLOADX(v + hd + VW), b1);
      c0 = VFMA(w2, VLOADX(v + 2 * hd), c0);
      c1 = VFMA(w2, VLOADX(v + 2 * hd + VW), c1);
      d0 = VFMA(w3, VLOADX(v + 3 * hd), d0);
      d1 = VFMA(w3, VLOADX(v + 3 * hd + VW), d1);
    }
    for (; r < len; r++) {
      const vec w0 = VSET1(s[r] * inv);
      a0 = VFMA(w0, VLOADX(V + r * hd), a0);
      a1 = VFMA(w0, VLOADX(V + r * hd + VW), a1);
    }
    VSTORE(o, VADDV(VADDV(a0, b0), VADDV(c0, d0)));
    VSTORE(o + VW, VADDV(VADDV(a1, b1), VADDV(c1, d1)));
    return;
  }
  if (hd % VW == 0 && hd <= 4 * VW) { /* the output row in registers, two rows of V at a time */
    const int nv = (int)(hd / VW);
    vec a[4], b[4];
    for (int u = 0; u < 4; u++) a[u] = b[u] = VZERO();
    int64_t r2 = 0;
    for (; r2 + 2 <= len; r2 += 2) {
      const vec w0 = VSET1(s[r2] * inv), w1 = VSET1(s[r2 + 1] * inv);
      for (int u = 0; u < nv; u++) {
        a[u] = VFMA(w0, VLOADX(V + r2 * hd + u * VW), a[u]);
        b[u] = VFMA(w1, VLOADX(V + (r2 + 1) * hd + u * VW), b[u]);
      }
    }
    if (r2 < len) {
      const vec w0 = VSET1(s[r2] * inv);
      for (int u = 0; u < nv; u++) a[u] = VFMA(w0, VLOADX(V + r2 * hd + u * VW), a[u]);
    }
    for (int u = 0; u < nv; u++) VSTORE(o + u * VW, VADDV(a[u], b[u]));
    return;
  }
  for (int64_t c = 0; c < hd; c++) o[c] = 0.0f;
  for (int64_t r2 = 0; r2 < len; r2++) {
    const float w = s[r2] * inv;
    const float *v = V + r2 * hd;
    for (int64_t c = 0; c < hd; c++) o[c] += w * v[c];
  }
}

typedef struct {
  const float *qkv;
  float *K, *V, *O, *scratch;
  int64_t T, D, hd, cap, n_text;
  float scale;
} pattn_job;

static void pattn_head(const void *p, int64_t h) {
  const pattn_job *j = (const pattn_job *)p;
  const int64_t T = j->T, D = j->D, hd = j->hd, cap = j->cap;
  float *kt = j->scratch + h * (hd * T + T), *s = kt + hd * T;
  float *K = j->K + h * cap * hd, *V = j->V + h * cap * hd;
  for (int64_t t = 0; t < T; t++) {
    const float *row = j->qkv + t * 3 * D + h * hd;
    for (int64_t c = 0; c < hd; c++) {
      K[t * hd + c] = row[D + c];
      kt[c * T + t] = row[D + c];
      V[t * hd + c] = row[2 * D + c];
    }
  }
  for (int64_t i = 0; i < T; i++) {
    const int64_t len = i < j->n_text ? (j->n_text < T ? j->n_text : T) : i + 1;
    const float *q = j->qkv + i * 3 * D + h * hd;
    int64_t r = 0;
    for (; r + 4 * VW <= len; r += 4 * VW) { /* 4 VW scores at a time: four independent sums over c */
      vec a0 = VZERO(), a1 = VZERO(), a2 = VZERO(), a3 = VZERO();
      for (int64_t c = 0; c < hd; c++) {
        const vec qc = VSET1(q[c]);
        const float *k = kt + c * T + r;
        a0 = VFMA(qc, VLOADX(k), a0);
        a1 = VFMA(qc, VLOADX(k + VW), a1);
        a2 = VFMA(qc, VLOADX(k + 2 * VW), a2);
        a3 = VFMA(qc, VLOADX(k + 3 * VW), a3);
      }
      const vec sc = VSET1(j->scale);
      VSTORE(s + r, VMULV(a0, sc));
      VSTORE(s + r + VW, VMULV(a1, sc));
      VSTORE(s + r + 2 * VW, VMULV(a2, sc));
      VSTORE(s + r + 3 * VW, VMULV(a3, sc));
    }
    for (; r + VW <= len; r += VW) { /* VW scores at a time, accumulated in a register */
      vec acc = VZERO();
      for (int64_t c = 0; c < hd; c++) acc = VFMA(VSET1(q[c]), VLOADX(kt + c * T + r), acc);
      VSTORE(s + r, VMULV(acc, VSET1(j->scale)));
    }
    if (r < len && T >= VW) { /* the last len - r scores as one vector (its other lanes read within this head's
                                 scratch: kt's next row, or s after kt's last; each lane is its own sum) */
      vec acc = VZERO();
      for (int64_t c = 0; c < hd; c++) acc = VFMA(VSET1(q[c]), VLOADX(kt + c * T + r), acc);
      float buf[VW];
      VSTORE(buf, VMULV(acc, VSET1(j->scale)));
      for (const int64_t r0 = r; r < len; r++) s[r] = buf[r - r0];
    }
    for (; r < len; r++) {
      float acc = 0.0f;
      for (int64_t c = 0; c < hd; c++) acc += q[c] * kt[c * T + r];
      s[r] = acc * j->scale;
    }
    const float inv = 1.0f / softmax_exp(s, len);
    float *o = j->O + i * D + h * hd;
    weighted_rows(s, inv, V, len, hd, o);
  }
}

void prefill_attention(const float *qkv, float *K, float *V, float *O, float *scratch, int64_t T, int64_t D, int64_t H,
                       int64_t cap, int64_t n_text, float scale, int threads) {
  pattn_job j = {qkv, K, V, O, scratch, T, D, D / H, cap, n_text, scale};
  parallel(pattn_head, &j, H, T * T * D >= (1 << 18) ? threads : 1);
}
