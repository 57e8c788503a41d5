/* Self-test of half_gemv.c on the machine (or emulator) it was built for: every exported product against a
   scalar double-precision reference on pseudo-random float16 weights, on 1 and 2 threads. Prints the ISA
   variant and one line per check; exits 0 when all pass. Build: cc -O2 -pthread half_gemv_selftest.c -lm */
#include <stdio.h>
#include <stdlib.h>

#include "half_gemv.c"

static uint32_t rng_state = 12345u;
static float frand(void) { /* uniform in [-1, 1) */
  rng_state = rng_state * 1664525u + 1013904223u;
  return (float)((rng_state >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

static int failures = 0;
static void check(const char *what, const float *got, const double *want, int64_t n, double tol) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double err = fabs((double)got[i] - want[i]) / (1.0 + fabs(want[i]));
    if (!(err <= worst)) worst = err; /* NaN counts as a failure */
  }
  const int ok = worst <= tol;
  failures += !ok;
  printf("%-36s max rel err %.2e (tol %.0e) %s\n", what, worst, tol, ok ? "ok" : "FAIL");
}

static double erf_ref(double x) { return erf(x); }

int main(void) {
  enum { N = 67, K = 133, M = 11 };
  static uint16_t W[N * K];
  static float Wf[N * K], x[K], X[M * K], b[N], y[N], Y[M * N], up[N * K];
  static double ref[M * N];
  for (int i = 0; i < N * K; i++) {
    W[i] = f2h(frand());
    Wf[i] = h2f(W[i]);
  }
  for (int i = 0; i < K; i++) x[i] = frand();
  for (int i = 0; i < M * K; i++) X[i] = frand();
  for (int i = 0; i < N; i++) b[i] = frand();
  printf("half_gemv variant: %s\n", hg_isa());

  f16_to_f32(W, up, N * K);
  int exact = 1;
  for (int i = 0; i < N * K; i++) exact &= up[i] == Wf[i];
  uint16_t back[N * K];
  exact &= f32_to_f16_exact(up, back, N * K);
  for (int i = 0; i < N * K; i++) exact &= back[i] == W[i];
  const float half_third = 1.0f / 3.0f; /* not a float16 value */
  uint16_t h1;
  exact &= !f32_to_f16_exact(&half_third, &h1, 1);
  printf("%-36s %s\n", "f16_to_f32 / f32_to_f16_exact", exact ? "ok" : "FAIL");
  failures += !exact;

  for (int threads = 1; threads <= 2; threads++) {
    char what[64];
    for (int i = 0; i < N; i++) {
      double s = b[i];
      for (int j = 0; j < K; j++) s += (double)Wf[i * K + j] * x[j];
      ref[i] = s;
    }
    gemv_f16_mt(W, x, b, y, N, K, threads);
    snprintf(what, sizeof what, "gemv_f16_mt, %d thread(s)", threads);
    check(what, y, ref, N, 1e-5);
    for (int act = 0; act <= 2; act++) {
      for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
          double s = b[n];
          for (int j = 0; j < K; j++) s += (double)X[m * K + j] * Wf[n * K + j];
          if (act == 1) s = s > 0 ? s : 0;
          if (act == 2) s = 0.5 * s * (1.0 + erf_ref(s / sqrt(2.0)));
          ref[m * N + n] = s;
        }
      gemm_f16(W, X, b, Y, M, N, K, act, threads);
      snprintf(what, sizeof what, "gemm_f16 act %d, %d thread(s)", act, threads);
      check(what, Y, ref, M * N, 1e-5);
    }
  }

  /* the prefill attention: T rows, H heads of hd, the first n_text rows attend to the text keys only */
  enum { T = 19, H = 2, HD = 16, D = H * HD, CAP = 24, NT = 7 };
  static float qkv[T * 3 * D], Kc[H * CAP * HD], Vc[H * CAP * HD], O[T * D], scratch[H * (HD * T + T)];
  static double oref[T * D];
  for (int i = 0; i < T * 3 * D; i++) qkv[i] = frand();
  const float scale = 0.25f;
  for (int h = 0; h < H; h++)
    for (int i = 0; i < T; i++) {
      const int len = i < NT ? NT : i + 1;
      double s[T], mx = -INFINITY, sum = 0.0;
      for (int r = 0; r < len; r++) {
        double a = 0.0;
        for (int c = 0; c < HD; c++) a += (double)qkv[i * 3 * D + h * HD + c] * qkv[r * 3 * D + D + h * HD + c];
        s[r] = a * scale;
        mx = s[r] > mx ? s[r] : mx;
      }
      for (int r = 0; r < len; r++) sum += (s[r] = exp(s[r] - mx));
      for (int c = 0; c < HD; c++) {
        double o = 0.0;
        for (int r = 0; r < len; r++) o += s[r] / sum * qkv[r * 3 * D + 2 * D + h * HD + c];
        oref[i * D + h * HD + c] = o;
      }
    }
  prefill_attention(qkv, Kc, Vc, O, scratch, T, D, H, CAP, NT, scale, 2);
  check("prefill_attention", O, oref, T * D, 1e-5);

  printf(failures ? "%d check(s) FAILED\n" : "all checks passed\n", failures);
  return failures ? 1 : 0;
}
