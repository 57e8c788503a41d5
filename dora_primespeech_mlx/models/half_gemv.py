"""float16-weight products with float32 accumulation on the CPU: the GPT decode step and prefill, RoBERTa.

A decode step reads every block weight once per token (~300 MB in float32 for v2): it is bound by memory
bandwidth. The released GPT checkpoints store their weights as float16, so keeping them in float16 loses
nothing — but numpy and BLAS have no float16 x float32 product, and upcasting the matrix per call costs
more than it saves (``models/storage.py``). This module's kernels read the float16 weights, convert them in
registers (F16C) and accumulate in float32 with FMA: half the bytes per token, the same weights.

The C library (compiled once with the system C compiler, the one ``mx.compile`` and the BLAS shim use, into
the package's cache directory; AVX-512 tiles where the CPU has them) holds:

- ``gemv_f16`` / ``gemv_f16_mt``: ``y = W x (+ b)``, rows split over threads;
- ``decode_layers``: every block of one GPT decode step (the gemvs, attention split by heads, LayerNorm, the KV
  cache row written in place) in one call (``t2s_numpy.NumpyDecodeState.step``);
- ``gemm_f16``: ``Y = act(X @ W.T + b)`` for small M (prefill rows, RoBERTa tokens): a tile of 4 weight rows
  (converted in registers, kept in L1) against 6 (AVX2: 3) rows of X, the next tile's rows prefetched while it
  computes (at RoBERTa's ~24 rows a tile is read from memory once and would otherwise wait at every row's start),
  the tile's four sums reduced in one add tree, ReLU or exact GELU fused, columns split over threads
  (``t2s_numpy`` prefill, ``bert_numpy``);
- a small thread pool (not OpenMP): the caller and up to ``threads() - 1`` workers claim chunks with one atomic
  ticket and the caller waits only for chunks a worker has claimed, never for a worker to wake up, so a busy
  neighbour process costs nothing but the second core. Work is split by rows (or columns), never inside a
  sum: every value is bit-identical whatever the thread count.

:func:`library` returns None where the kernels cannot be had (not x86-64 with AVX2/FMA/F16C, no compiler);
:func:`kernel` is the library for the GPT unless ``PRIMESPEECH_GPT_HALF=0``; callers then keep float32.
Threads: :func:`threads` (the package's BLAS thread count, i.e. ``PRIMESPEECH_THREADS``; :func:`set_threads`).
"""

from __future__ import annotations

import ctypes
import logging
import platform
import subprocess

import numpy as np

log = logging.getLogger(__name__)

ENV = "PRIMESPEECH_GPT_HALF"

_SOURCE = r"""
#include <stdint.h>
#include <math.h>
#include <immintrin.h>

/* ---- a small thread pool: the caller publishes a job of n chunks; the caller and up to threads-1 workers claim
   chunks with one atomic ticket (generation << 32 | next chunk) and the caller waits only for chunks claimed by
   others — never for a worker to wake up: a descheduled worker (a busy neighbour process) costs nothing, the
   caller then runs every chunk itself. Workers spin ~SPIN_NS after a job, then sleep on a condition variable. ---- */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#define MAX_WORKERS 63
#define SPIN_NS 200000L
typedef void (*chunk_fn)(const void *ctx, int64_t chunk);

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int nworkers;
  atomic_int sleepers;
  atomic_uint_fast64_t ticket;
  atomic_int_fast64_t done;
  chunk_fn fn;
  const void *ctx;
  int64_t nchunks;
  int active; /* workers allowed in the current job */
  atomic_int busy; /* a caller owns the pool */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0, 0, 0};

static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000L + t.tv_nsec;
}

/* claim and run chunks of generation gen; returns when none is left */
static void run_chunks(uint64_t gen, chunk_fn fn, const void *ctx, int64_t nchunks) {
  for (;;) {
    uint64_t t = atomic_load(&pool.ticket);
    if ((t >> 32) != gen || (int64_t)(t & 0xffffffffu) >= nchunks) return;
    if (!atomic_compare_exchange_weak(&pool.ticket, &t, t + 1)) continue;
    fn(ctx, (int64_t)(t & 0xffffffffu));
    atomic_fetch_add(&pool.done, 1);
  }
}

static void *worker(void *arg) {
  const int id = (int)(intptr_t)arg;
  uint64_t seen = atomic_load(&pool.ticket) >> 32;
  for (;;) {
    int64_t t0 = now_ns();
    uint64_t t;
    for (int i = 0;; i++) {
      t = atomic_load(&pool.ticket);
      if ((t >> 32) != seen) break;
      _mm_pause();
      if ((i & 63) == 63 && now_ns() - t0 > SPIN_NS) {
        pthread_mutex_lock(&pool.mu);
        atomic_fetch_add(&pool.sleepers, 1);
        while (((t = atomic_load(&pool.ticket)) >> 32) == seen) pthread_cond_wait(&pool.cv, &pool.mu);
        atomic_fetch_sub(&pool.sleepers, 1);
        pthread_mutex_unlock(&pool.mu);
        break;
      }
    }
    seen = t >> 32;
    /* the job's fields were written before the ticket was published */
    chunk_fn fn = pool.fn;
    const void *ctx = pool.ctx;
    int64_t nchunks = pool.nchunks;
    const int active = pool.active;
    atomic_thread_fence(memory_order_seq_cst);
    if (id < active) run_chunks(seen, fn, ctx, nchunks); /* claims fail unless seen is still the open job */
  }
  return NULL;
}

/* a forked child has no workers: start afresh (the caller would run every chunk itself anyway) */
static void after_fork(void) {
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
  pool.mu = mu;
  pool.cv = cv;
  pool.nworkers = 0;
  atomic_store(&pool.sleepers, 0);
  atomic_store(&pool.busy, 0);
}

/* run fn(ctx, 0 .. nchunks-1) on up to `threads` threads (the caller included); returns when all are done */
static void parallel(chunk_fn fn, const void *ctx, int64_t nchunks, int threads) {
  /* one job at a time: a second Python thread calling in meanwhile (ctypes releases the GIL) runs its own
     chunks inline */
  if (threads <= 1 || nchunks <= 1 || atomic_exchange(&pool.busy, 1)) {
    for (int64_t c = 0; c < nchunks; c++) fn(ctx, c);
    return;
  }
  static int atfork = 0;
  if (!atfork) atfork = 1 + pthread_atfork(NULL, NULL, after_fork);
  if (threads > MAX_WORKERS + 1) threads = MAX_WORKERS + 1;
  while (pool.nworkers < threads - 1) { /* started on first use */
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &attr, worker, (void *)(intptr_t)pool.nworkers) != 0) {
      pthread_attr_destroy(&attr);
      break;
    }
    pthread_attr_destroy(&attr);
    pool.nworkers++;
  }
  if (pool.nworkers == 0) {
    for (int64_t c = 0; c < nchunks; c++) fn(ctx, c);
    atomic_store(&pool.busy, 0);
    return;
  }
  /* close the previous generation (no claim can succeed, a late worker cannot mix two jobs' fields), then
     write the job and publish it */
  const uint64_t closed = (atomic_load(&pool.ticket) >> 32) + 1, gen = closed + 1;
  atomic_store(&pool.ticket, (closed << 32) | 0xffffffffu);
  atomic_thread_fence(memory_order_seq_cst);
  pool.fn = fn;
  pool.ctx = ctx;
  pool.nchunks = nchunks;
  pool.active = threads - 1;
  atomic_store(&pool.done, 0);
  atomic_store(&pool.ticket, gen << 32);
  if (atomic_load(&pool.sleepers) > 0) {
    pthread_mutex_lock(&pool.mu);
    pthread_cond_broadcast(&pool.cv);
    pthread_mutex_unlock(&pool.mu);
  }
  run_chunks(gen, fn, ctx, nchunks);
  for (int i = 0; atomic_load(&pool.done) < nchunks; i++) {
    if (i > 4096) sched_yield(); /* a worker holding a chunk was descheduled */
    else _mm_pause();
  }
  atomic_store(&pool.busy, 0);
}

/* ---- gemv: y[i] = sum_j W[i, j] x[j] (+ b[i]); W float16 row-major (n x k), x, b, y float32 ---- */
static void gemv_rows(const uint16_t *W, const float *x, const float *b, float *y, int64_t i0, int64_t i1,
                      int64_t k) {
  const int64_t k16 = k & ~(int64_t)15;
  for (int64_t i = i0; i < i1; i++) {
    const uint16_t *w = W + i * k;
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int64_t j = 0; j < k16; j += 16) {
      a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j))), _mm256_loadu_ps(x + j), a0);
      a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w + j + 8))),
                           _mm256_loadu_ps(x + j + 8), a1);
    }
    __m256 s = _mm256_add_ps(a0, a1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    h = _mm_hadd_ps(h, h);
    h = _mm_hadd_ps(h, h);
    float acc = _mm_cvtss_f32(h);
    for (int64_t j = k16; j < k; j++) acc += _cvtsh_ss(w[j]) * x[j];
    y[i] = b ? acc + b[i] : acc;
  }
}

void gemv_f16(const uint16_t *W, const float *x, const float *b, float *y, int64_t n, int64_t k) {
  gemv_rows(W, x, b, y, 0, n, k);
}

typedef struct {
  const uint16_t *W;
  const float *x, *b;
  float *y;
  int64_t n, k, rows;
  int relu;
} gemv_job;

static void gemv_chunk(const void *p, int64_t c) {
  const gemv_job *j = (const gemv_job *)p;
  const int64_t i0 = c * j->rows, i1 = i0 + j->rows < j->n ? i0 + j->rows : j->n;
  gemv_rows(j->W, j->x, j->b, j->y, i0, i1, j->k);
  if (j->relu)
    for (int64_t i = i0; i < i1; i++) j->y[i] = j->y[i] > 0.0f ? j->y[i] : 0.0f;
}

static void gemv_par(const uint16_t *W, const float *x, const float *b, float *y, int64_t n, int64_t k, int relu,
                     int threads) {
  if (threads <= 1 || n * k < (1 << 16)) threads = 1;
  int64_t rows = threads == 1 ? n : (n + 4 * threads - 1) / (4 * threads);
  rows = rows < 32 ? 32 : (rows + 15) & ~(int64_t)15;
  gemv_job j = {W, x, b, y, n, k, rows, relu};
  parallel(gemv_chunk, &j, (n + rows - 1) / rows, threads);
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

/* ---- small-M GEMM: Y[m, n] = act(sum_k X[m, k] W[n, k] + b[n]); W float16 (N x K), X, Y float32 ----
   A tile of NR weight rows (converted in registers, NR x K float16 stays in L1) against MR rows of X at a time;
   float32 accumulation; OpenMP over N. act: 0 none, 1 ReLU, 2 exact GELU (erf: the Eigen/XLA float32 rational
   approximation, as models/activations.py). */
#ifdef __AVX512F__
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
#else
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
#endif
#define NR 4

/* the four sums of a, b, c, d at once (one shared add tree: a third of four separate reductions' work) */
static inline void vsum4(vec a, vec b, vec c, vec d, float *out) {
  const __m256 ab = _mm256_hadd_ps(VHALF(a), VHALF(b)), cd = _mm256_hadd_ps(VHALF(c), VHALF(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
}

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
          for (int c = 0; c < NR; c++) _mm_prefetch((const char *)(next[c] + j), _MM_HINT_T0);
        vec wv[NR];
        for (int c = 0; c < NR; c++) wv[c] = VLOADW(w[c] + j);
        for (int r = 0; r < MR; r++) {
          const vec xv = VLOADX(x[r] + j);
          for (int c = 0; c < NR; c++) acc[r][c] = VFMA(xv, wv[c], acc[r][c]);
        }
      }
      for (int r = 0; r < MR && m + r < M; r++) {
        float sums[NR];
        vsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3], sums);
        for (int c = 0; c < NR && n + c < n1; c++) {
          float s = sums[c];
          for (int64_t j = kv; j < K; j++) s += x[r][j] * _cvtsh_ss(w[c][j]);
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

typedef struct {
  const uint16_t *W;
  const float *X, *b;
  float *Y;
  int64_t M, N, K, cols;
  int act;
} gemm_job;

static void gemm_chunk(const void *p, int64_t c) {
  const gemm_job *j = (const gemm_job *)p;
  const int64_t n0 = c * j->cols, n1 = n0 + j->cols < j->N ? n0 + j->cols : j->N;
  gemm_block(j->W, j->X, j->Y, j->M, j->N, j->K, n0, n1);
  epilogue(j->Y, j->b, j->M, j->N, n0, n1, j->act);
}

void gemm_f16(const uint16_t *W, const float *X, const float *b, float *Y, int64_t M, int64_t N, int64_t K, int act,
              int threads) {
  if (M <= 0 || N <= 0) return;
  if (threads <= 1 || M * N * K < (1 << 18)) threads = 1;
  int64_t cols = threads == 1 ? N : (N + 8 * threads - 1) / (8 * threads);
  cols = (cols + NR - 1) / NR * NR;
  gemm_job j = {W, X, b, Y, M, N, K, cols, act};
  parallel(gemm_chunk, &j, (N + cols - 1) / cols, threads);
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

static void attn_head(const void *p, int64_t h) {
  const attn_job *j = (const attn_job *)p;
  const float *q = j->qkv + h * j->hd;
  const float *K = j->K + h * j->cap * j->hd, *V = j->V + h * j->cap * j->hd;
  float *s = j->s + h * j->cap, *o = j->o + h * j->hd;
  float mx = -INFINITY;
  for (int64_t r = 0; r < j->n; r++) {
    float acc = 0.0f;
    for (int64_t c = 0; c < j->hd; c++) acc += K[r * j->hd + c] * q[c];
    s[r] = acc * j->scale;
    mx = s[r] > mx ? s[r] : mx;
  }
  float sum = 0.0f;
  for (int64_t r = 0; r < j->n; r++) {
    s[r] = expf(s[r] - mx);
    sum += s[r];
  }
  const float inv = 1.0f / sum;
  for (int64_t c = 0; c < j->hd; c++) o[c] = 0.0f;
  for (int64_t r = 0; r < j->n; r++) {
    const float w = s[r] * inv;
    for (int64_t c = 0; c < j->hd; c++) o[c] += w * V[r * j->hd + c];
  }
}

static void layer_norm_add(float *x, const float *y, const float *b, const float *w, const float *nb, int64_t D,
                           float eps) {
  double mu = 0.0;
  for (int64_t i = 0; i < D; i++) {
    x[i] = (x[i] + y[i]) + b[i];
    mu += x[i];
  }
  const float m = (float)(mu / (double)D);
  double var = 0.0;
  for (int64_t i = 0; i < D; i++) {
    const float d = x[i] - m;
    var += (double)d * d;
  }
  const float r = 1.0f / sqrtf((float)(var / (double)D) + eps);
  for (int64_t i = 0; i < D; i++) x[i] = (x[i] - m) * (w[i] * r) + nb[i];
}

void decode_layers(void *const *p, int64_t layers, int64_t cap, int64_t t, float *x, float *scratch, int64_t D,
                   int64_t H, int64_t F, float scale, float eps, int threads) {
  float *qkv = scratch, *o = qkv + 3 * D, *y = o + D, *h = y + D, *s = h + F;
  const int64_t hd = D / H;
  for (int64_t l = 0; l < layers; l++) {
    void *const *w = p + 14 * l;
    float *K = (float *)w[12], *V = (float *)w[13];
    gemv_par((const uint16_t *)w[0], x, (const float *)w[1], qkv, 3 * D, D, 0, threads);
    for (int64_t hh = 0; hh < H; hh++)
      for (int64_t c = 0; c < hd; c++) {
        K[(hh * cap + t) * hd + c] = qkv[D + hh * hd + c];
        V[(hh * cap + t) * hd + c] = qkv[2 * D + hh * hd + c];
      }
    attn_job aj = {qkv, K, V, o, s, cap, t + 1, hd, D, scale};
    parallel(attn_head, &aj, H, (t + 1) * D >= (1 << 16) ? threads : 1);
    gemv_par((const uint16_t *)w[2], o, NULL, y, D, D, 0, threads);
    layer_norm_add(x, y, (const float *)w[3], (const float *)w[4], (const float *)w[5], D, eps);
    gemv_par((const uint16_t *)w[6], x, (const float *)w[7], h, F, D, 1, threads);
    gemv_par((const uint16_t *)w[8], h, NULL, y, D, F, 0, threads);
    layer_norm_add(x, y, (const float *)w[9], (const float *)w[10], (const float *)w[11], D, eps);
  }
}

/* ---- the prefill's attention, one head per chunk: the new keys/values into the KV cache (H, cap, hd), then for
   each row i the scores against keys 0..len_i (len_i = n_text for text rows, i + 1 for audio rows: the prefix
   mask), softmax, and the weighted values into O (T x D). qkv: T x 3D. scratch: H (hd T + T) floats. ---- */
static inline float exp_neg(float x) { /* exp(x) for x <= 0 (Cephes expf: ~1 ulp); vectorizable */
  x = x < -87.3f ? -87.3f : x;
  const float n = floorf(fmaf(x, 1.44269504088896341f, 0.5f));
  const float r = fmaf(n, 2.12194440e-4f, fmaf(n, -0.693359375f, x));
  float p = 1.9875691500E-4f;
  p = p * r + 1.3981999507E-3f;
  p = p * r + 8.3334519073E-3f;
  p = p * r + 4.1665795894E-2f;
  p = p * r + 1.6666665459E-1f;
  p = p * r + 5.0000001201E-1f;
  const float e = fmaf(p * r, r, r) + 1.0f;
  union {
    uint32_t u;
    float f;
  } v;
  v.u = (uint32_t)((int32_t)n + 127) << 23;
  return e * v.f;
}

#ifdef __AVX512F__
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

static inline vec exp_neg_v(vec x) { /* exp_neg on a vector (the same operations) */
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
  for (; r < n; r++) {
    s[r] = exp_neg(s[r] - mx);
    sum += s[r];
  }
  return sum;
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
    for (; r + VW <= len; r += VW) { /* VW scores at a time, accumulated in a register */
      vec acc = VZERO();
      for (int64_t c = 0; c < hd; c++) acc = VFMA(VSET1(q[c]), VLOADX(kt + c * T + r), acc);
      VSTORE(s + r, VMULV(acc, VSET1(j->scale)));
    }
    for (; r < len; r++) {
      float acc = 0.0f;
      for (int64_t c = 0; c < hd; c++) acc += q[c] * kt[c * T + r];
      s[r] = acc * j->scale;
    }
    const float inv = 1.0f / softmax_exp(s, len);
    float *o = j->O + i * D + h * hd;
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
    } else {
      for (int64_t c = 0; c < hd; c++) o[c] = 0.0f;
      for (int64_t r2 = 0; r2 < len; r2++) {
        const float w = s[r2] * inv;
        const float *v = V + r2 * hd;
        for (int64_t c = 0; c < hd; c++) o[c] += w * v[c];
      }
    }
  }
}

void prefill_attention(const float *qkv, float *K, float *V, float *O, float *scratch, int64_t T, int64_t D, int64_t H,
                       int64_t cap, int64_t n_text, float scale, int threads) {
  pattn_job j = {qkv, K, V, O, scratch, T, D, D / H, cap, n_text, scale};
  parallel(pattn_head, &j, H, T * T * D >= (1 << 18) ? threads : 1);
}
"""
_FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c"]
_AVX512 = ["-mavx512f"]  # where the CPU has it: 16-wide tiles in gemm_f16 (twice the AVX2 rate)
_PTHREAD = ["-pthread"]
_STATE: dict[str, object] = {}  # the built kernel ("fn") and why not ("why"), once per process and mode
_LIB: dict[str, object] = {}  # the built library ("lib") and why not ("why"), once per process
_THREADS: dict[str, int] = {}


_CONFIGURED: dict[str, str] = {}


def configure(value: str) -> None:
    """Set the process-wide choice (the engine passes its ``Settings.gpt_half``): ``auto``, ``1`` or ``0``."""
    value = {"1": "on", "0": "off"}.get(str(value), str(value))
    if value not in ("auto", "on", "off"):
        raise ValueError(f"gpt_half {value!r}: expected auto, 1 or 0")
    if _CONFIGURED.get("mode") != value:
        _CONFIGURED["mode"] = value
        _STATE.clear()


def mode() -> str:
    """``PRIMESPEECH_GPT_HALF`` (or :func:`configure`): ``auto`` (default: on where the kernel builds and the
    weights are exactly float16), ``on`` (``1``: also rounds other weights; a warning when the kernel cannot
    be had), ``off`` (``0``: never)."""
    return _CONFIGURED.get("mode", "auto")


def set_threads(threads: int | None) -> None:
    """Threads for the kernels (None: back to the default, the package's BLAS thread count, which follows
    ``PRIMESPEECH_THREADS``: 1 on machines with <= 2 usable CPUs unless set)."""
    _THREADS.clear()
    if threads is not None:
        _THREADS["n"] = max(1, int(threads))


def threads() -> int:
    """The kernels' thread count now (see :func:`set_threads`)."""
    if "n" in _THREADS:
        return _THREADS["n"]
    from .. import _blas

    n = _blas.thread_settings().get("blas_threads")
    return n if isinstance(n, int) and n > 0 else max(1, _blas.usable_cpus())


def _cpu_flags() -> list[str] | str:
    """This CPU's flags, or why the kernels cannot run on it."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"{platform.machine()} is not x86-64"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return "cannot read /proc/cpuinfo"
    missing = [x for x in ("avx2", "fma", "f16c") if x not in flags]
    return f"CPU lacks {', '.join(missing)}" if missing else flags


def _cpu_ok() -> str | None:
    """None when this CPU runs the kernel, else why not."""
    flags = _cpu_flags()
    return flags if isinstance(flags, str) else None


def _build(flags: list[str]) -> str:
    from .._blas import compile_shared

    return compile_shared("gemv-f16", _SOURCE, flags)


def library():
    """The compiled kernels (:class:`_Kernel`) whatever ``PRIMESPEECH_GPT_HALF`` says, or None where they cannot be
    had (see :func:`library_status`). Built once per process, with AVX-512 where the CPU has it."""
    if "lib" in _LIB:
        return _LIB["lib"]
    lib, why = None, None
    cpu = _cpu_flags()
    if isinstance(cpu, str):
        why = cpu
    else:
        base = _FLAGS + (_AVX512 if "avx512f" in cpu else [])
        errors = []
        for flags in (base + _PTHREAD,):
            try:
                lib = _Kernel(ctypes.CDLL(_build(flags)), avx512="-mavx512f" in flags)
                if _self_check(lib):
                    break
                lib, why = None, "self-check failed"
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                errors.append(str(exc))
                lib, why = None, f"cannot build the kernel: {'; '.join(errors)}"
    _LIB.update(lib=lib, why=why)
    return lib


def library_status() -> dict[str, object]:
    lib = library()
    return {"kernel": lib is not None, "why_not": _LIB.get("why"), "threads": threads(),
            "avx512": bool(lib and lib.avx512)}


def kernel():
    """The kernels for the GPT decode (:class:`_Kernel`), or None (see :func:`status` for why): the
    :func:`library` unless ``PRIMESPEECH_GPT_HALF=0``."""
    if "fn" in _STATE:
        return _STATE["fn"]
    fn, why = None, None
    m = mode()
    if m == "off":
        why = f"{ENV}=0 (off)"
    else:
        fn = library()
        why = _LIB.get("why")
        if why and m == "on":  # asked for explicitly
            log.warning("%s=1 but float16 GPT decode weights are unavailable: %s", ENV, why)
    _STATE.update(fn=fn, why=why)
    return fn


def _fn(lib, name: str, *argtypes):
    f = getattr(lib, name)
    f.argtypes = list(argtypes)
    f.restype = None
    return f


_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


class _Kernel:
    """The compiled library: ``kernel(W, x, b, y, n, k)`` is ``gemv_f16`` on :func:`threads` threads (rows split,
    every result bit-identical to one thread's); ``gemm(W, X, b, Y, m, n, k, act)``; ``ffn(...)`` (the decode
    step's fc1 -> ReLU -> fc2 in one call); ``upcast(src, dst, n)``."""

    ACT = {None: 0, "relu": 1, "gelu": 2}

    def __init__(self, lib, avx512: bool = False):
        self.lib, self.avx512 = lib, avx512
        self.gemv1 = _fn(lib, "gemv_f16", _P, _P, _P, _P, _I64, _I64)
        self.gemv_mt = _fn(lib, "gemv_f16_mt", _P, _P, _P, _P, _I64, _I64, _INT)
        self.ffn_mt = _fn(lib, "ffn_f16_mt", _P, _P, _P, _P, _P, _P, _P, _I64, _I64, _INT)
        self.gemm_mt = _fn(lib, "gemm_f16", _P, _P, _P, _P, _I64, _I64, _I64, _INT, _INT)
        self.upcast = _fn(lib, "f16_to_f32", _P, _P, _I64)
        self.downcast_exact = _fn(lib, "f32_to_f16_exact", _P, _P, _I64)
        self.downcast_exact.restype = _INT
        self.prefill_attention = _fn(lib, "prefill_attention", _P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64,
                                     ctypes.c_float, _INT)
        self.decode_layers = _fn(lib, "decode_layers", _P, _I64, _I64, _I64, _P, _P, _I64, _I64, _I64,
                                 ctypes.c_float, ctypes.c_float, _INT)

    def __call__(self, W, x, b, y, n, k) -> None:
        self.gemv_mt(W, x, b, y, n, k, threads())

    def gemm(self, W, X, b, Y, m, n, k, act: str | None = None, nthreads: int | None = None) -> None:
        self.gemm_mt(W, X, b, Y, m, n, k, self.ACT[act], threads() if nthreads is None else nthreads)

    def ffn(self, W1, b1, W2, b2, x, h, y, k, n1) -> None:
        self.ffn_mt(W1, b1, W2, b2, x, h, y, k, n1, threads())


def _self_check(fn) -> bool:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((7, 37)).astype(np.float16)
    x = rng.standard_normal(37).astype(np.float32)
    b = rng.standard_normal(7).astype(np.float32)
    y = np.empty(7, np.float32)
    fn(w.ctypes.data, x.ctypes.data, b.ctypes.data, y.ctypes.data, 7, 37)
    up = np.empty(w.shape, np.float32)
    fn.upcast(w.ctypes.data, up.ctypes.data, w.size)
    exact = bool(np.array_equal(up, w.astype(np.float32)))
    xs = rng.standard_normal((5, 37)).astype(np.float32)
    ys = np.empty((5, 7), np.float32)
    fn.gemm(w.ctypes.data, xs.ctypes.data, b.ctypes.data, ys.ctypes.data, 5, 7, 37, None, 1)
    ref = w.astype(np.float32) @ x + b
    return exact and bool(np.allclose(y, ref, atol=1e-4)) and bool(np.allclose(ys, xs @ w.astype(np.float32).T + b,
                                                                               atol=1e-4))


def status() -> dict[str, object]:
    kernel()
    return {"mode": mode(), "kernel": _STATE.get("fn") is not None, "why_not": _STATE.get("why"),
            "threads": threads()}


def to_float16_exact(a: np.ndarray, fn) -> np.ndarray | None:
    """``a`` (float32) as a new float16 array when every value is a float16 value, else None (one pass, the
    kernel's conversion)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty(a.shape, dtype=np.float16)
    return out if fn.downcast_exact(a.ctypes.data, out.ctypes.data, a.size) else None


class HalfMatrix:
    """A float16 (n, k) weight used as ``W @ x`` (vector: the gemv kernel, float32 accumulation) and
    ``x @ W.T`` (matrix: the small-M GEMM kernel, :meth:`matmul_t`)."""

    __slots__ = ("w", "fn")

    def __init__(self, w: np.ndarray, fn):
        if w.dtype != np.float16 or w.ndim != 2:
            raise ValueError(f"HalfMatrix needs a 2-D float16 array, not {w.dtype} {w.shape}")
        self.w = np.ascontiguousarray(w)
        self.fn = fn

    @property
    def shape(self) -> tuple[int, int]:
        return self.w.shape

    def float32(self) -> np.ndarray:
        """The weight upcast to float32 (a new array), with the kernel's vectorised conversion."""
        out = np.empty(self.w.shape, dtype=np.float32)
        self.fn.upcast(self.w.ctypes.data, out.ctypes.data, self.w.size)
        return out

    @property
    def T(self) -> np.ndarray:  # noqa: N802  (numpy's name)
        return self.float32().T

    def matvec(self, x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, k = self.w.shape
        if x.shape != (k,):
            raise ValueError(f"matvec: x has shape {x.shape}, expected ({k},)")
        y = np.empty(n, dtype=np.float32)
        b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)  # alive during the call
        self.fn(self.w.ctypes.data, x.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data, n, k)
        return y

    def matmul_t(self, x: np.ndarray, bias: np.ndarray | None = None, act: str | None = None) -> np.ndarray:
        """``act(x @ W.T + bias)`` for x (..., k) float32 through the GEMM kernel (float32 accumulation, no
        float32 copy of the weight); ``act``: None, ``"relu"`` or ``"gelu"`` (exact, erf)."""
        n, k = self.w.shape
        if x.shape[-1] != k:
            raise ValueError(f"matmul_t: x has shape {x.shape}, expected (..., {k})")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, k)
        m = x2.shape[0]
        y = np.empty((m, n), dtype=np.float32)
        b = None if bias is None else np.ascontiguousarray(bias, dtype=np.float32)
        self.fn.gemm(self.w.ctypes.data, x2.ctypes.data, None if b is None else b.ctypes.data, y.ctypes.data, m, n, k,
                     act)
        return y.reshape(*lead, n)

    def __matmul__(self, x: np.ndarray) -> np.ndarray:
        if np.ndim(x) == 1:
            return self.matvec(x)
        return self.float32() @ x
