/* Self-test of half_gemv.c on the machine (or emulator) it was built for: every exported product against a
   scalar double-precision reference on pseudo-random float16 weights, on 1 and 2 threads, and one GPT decode step
   (decode_layers, two layers) against a double-precision step. Prints the ISA variant and one line per check;
   exits 0 when all pass. Build: cc -O2 -pthread half_gemv_selftest.c -lm */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  enum { N = 67, K = 133, M = 11, MB = 70 }; /* M rows: the dot tiles (x86); MB >= BROADCAST_ROWS: the broadcast ones */
  static uint16_t W[N * K];
  static float Wf[N * K], x[K], X[MB * K], b[N], y[N], Y[MB * N], up[N * K];
  static double ref[MB * N];
  for (int i = 0; i < N * K; i++) {
    W[i] = f2h(frand());
    Wf[i] = h2f(W[i]);
  }
  for (int i = 0; i < K; i++) x[i] = frand();
  for (int i = 0; i < MB * K; i++) X[i] = frand();
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
    for (int rows = M; rows <= MB; rows += MB - M)
      for (int act = 0; act <= 2; act++) {
        for (int m = 0; m < rows; m++)
          for (int n = 0; n < N; n++) {
            double s = b[n];
            for (int j = 0; j < K; j++) s += (double)X[m * K + j] * Wf[n * K + j];
            if (act == 1) s = s > 0 ? s : 0;
            if (act == 2) s = 0.5 * s * (1.0 + erf_ref(s / sqrt(2.0)));
            ref[m * N + n] = s;
          }
        if (gemm_f16(W, X, b, Y, rows, N, K, act, threads) != 0) {
          printf("gemm_f16: out of memory\n");
          failures++;
        }
        snprintf(what, sizeof what, "gemm_f16 %d rows, act %d, %d thread(s)", rows, act, threads);
        check(what, Y, ref, rows * N, 1e-5);
      }
  }

  /* int8 rows: quantize_rows_q8 rounds each value to within half a step; gemv_q8_mt is the product of those
     dequantized weights (float32 sums) */
  {
    static int8_t Q[N * K];
    static float S[N];
    quantize_rows_q8(Wf, Q, S, N, K);
    int within = 1;
    for (int i = 0; i < N; i++)
      for (int j = 0; j < K; j++) within &= fabsf(Wf[i * K + j] - S[i] * Q[i * K + j]) <= 0.5001f * S[i];
    printf("%-36s %s\n", "quantize_rows_q8 within half a step", within ? "ok" : "FAIL");
    failures += !within;
    for (int threads = 1; threads <= 2; threads++) {
      char what[64];
      for (int i = 0; i < N; i++) {
        double s = b[i], d = 0.0;
        for (int j = 0; j < K; j++) d += (double)Q[i * K + j] * x[j];
        ref[i] = s + (double)S[i] * d;
      }
      gemv_q8_mt(Q, S, x, b, y, N, K, threads);
      snprintf(what, sizeof what, "gemv_q8_mt, %d thread(s)", threads);
      check(what, y, ref, N, 1e-5);
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

  /* one GPT decode step through every block (decode_layers) against a double-precision step */
  {
    enum { LAYERS = 2, DD = 32, HH = 2, HDD = DD / HH, FF = 64, CAPD = 8, TT = 3 };
    static uint16_t wq[LAYERS][3 * DD * DD], wo[LAYERS][DD * DD], w1[LAYERS][FF * DD], w2[LAYERS][DD * FF];
    static float bq[LAYERS][3 * DD], bo[LAYERS][DD], b1[LAYERS][FF], b2[LAYERS][DD];
    static float n1w[LAYERS][DD], n1b[LAYERS][DD], n2w[LAYERS][DD], n2b[LAYERS][DD];
    static float kc[LAYERS][HH * CAPD * HDD], vc[LAYERS][HH * CAPD * HDD], xs[DD];
    static float step_scratch[5 * DD + FF + HH * CAPD];
    static double kr[LAYERS][HH * CAPD * HDD], vr[LAYERS][HH * CAPD * HDD], xr[DD];
    void *ptrs[LAYERS * 14];
    for (int l = 0; l < LAYERS; l++) {
      for (int i = 0; i < 3 * DD * DD; i++) wq[l][i] = f2h(0.2f * frand());
      for (int i = 0; i < DD * DD; i++) wo[l][i] = f2h(0.2f * frand());
      for (int i = 0; i < FF * DD; i++) w1[l][i] = f2h(0.2f * frand());
      for (int i = 0; i < DD * FF; i++) w2[l][i] = f2h(0.2f * frand());
      for (int i = 0; i < 3 * DD; i++) bq[l][i] = frand();
      for (int i = 0; i < FF; i++) b1[l][i] = frand();
      for (int i = 0; i < DD; i++) {
        bo[l][i] = frand(), b2[l][i] = frand();
        n1w[l][i] = 1.0f + 0.1f * frand(), n1b[l][i] = 0.1f * frand();
        n2w[l][i] = 1.0f + 0.1f * frand(), n2b[l][i] = 0.1f * frand();
      }
      for (int i = 0; i < HH * CAPD * HDD; i++) {
        kr[l][i] = kc[l][i] = frand();
        vr[l][i] = vc[l][i] = frand();
      }
      void *q[14] = {wq[l], bq[l], wo[l], bo[l], n1w[l], n1b[l], w1[l],
                     b1[l], w2[l], b2[l], n2w[l], n2b[l], kc[l], vc[l]};
      for (int i = 0; i < 14; i++) ptrs[l * 14 + i] = q[i];
    }
    for (int i = 0; i < DD; i++) xr[i] = xs[i] = frand();
    const double sc = 1.0 / sqrt((double)HDD), eps = 1e-5;
    for (int l = 0; l < LAYERS; l++) {
      double qkvr[3 * DD], orr[DD], yr[DD], hr[FF];
      for (int i = 0; i < 3 * DD; i++) {
        double a = bq[l][i];
        for (int j = 0; j < DD; j++) a += (double)h2f(wq[l][i * DD + j]) * xr[j];
        qkvr[i] = a;
      }
      for (int h = 0; h < HH; h++) {
        for (int c = 0; c < HDD; c++) {
          kr[l][(h * CAPD + TT) * HDD + c] = qkvr[DD + h * HDD + c];
          vr[l][(h * CAPD + TT) * HDD + c] = qkvr[2 * DD + h * HDD + c];
        }
        double sr[TT + 1], mx = -INFINITY, sum = 0.0;
        for (int r = 0; r <= TT; r++) {
          double a = 0.0;
          for (int c = 0; c < HDD; c++) a += kr[l][(h * CAPD + r) * HDD + c] * qkvr[h * HDD + c];
          sr[r] = a * sc;
          mx = sr[r] > mx ? sr[r] : mx;
        }
        for (int r = 0; r <= TT; r++) sum += (sr[r] = exp(sr[r] - mx));
        for (int c = 0; c < HDD; c++) {
          double o = 0.0;
          for (int r = 0; r <= TT; r++) o += sr[r] / sum * vr[l][(h * CAPD + r) * HDD + c];
          orr[h * HDD + c] = o;
        }
      }
      for (int pass = 0; pass < 2; pass++) {
        if (pass == 0) {
          for (int i = 0; i < DD; i++) {
            double a = bo[l][i];
            for (int j = 0; j < DD; j++) a += (double)h2f(wo[l][i * DD + j]) * orr[j];
            yr[i] = a;
          }
        } else {
          for (int i = 0; i < FF; i++) {
            double a = b1[l][i];
            for (int j = 0; j < DD; j++) a += (double)h2f(w1[l][i * DD + j]) * xr[j];
            hr[i] = a > 0 ? a : 0;
          }
          for (int i = 0; i < DD; i++) {
            double a = b2[l][i];
            for (int j = 0; j < FF; j++) a += (double)h2f(w2[l][i * FF + j]) * hr[j];
            yr[i] = a;
          }
        }
        double mu = 0.0, var = 0.0;
        for (int i = 0; i < DD; i++) mu += (xr[i] += yr[i]);
        mu /= DD;
        for (int i = 0; i < DD; i++) var += (xr[i] - mu) * (xr[i] - mu);
        const double rs = 1.0 / sqrt(var / DD + eps);
        const float *nw = pass == 0 ? n1w[l] : n2w[l], *nb = pass == 0 ? n1b[l] : n2b[l];
        for (int i = 0; i < DD; i++) xr[i] = (xr[i] - mu) * rs * nw[i] + nb[i];
      }
    }
    static float kc0[LAYERS][HH * CAPD * HDD], vc0[LAYERS][HH * CAPD * HDD], x0[DD];
    memcpy(kc0, kc, sizeof kc);
    memcpy(vc0, vc, sizeof vc);
    memcpy(x0, xs, sizeof xs);
    decode_layers(ptrs, LAYERS, CAPD, TT, xs, step_scratch, DD, HH, FF, (float)sc, (float)eps, 2);
    check("decode_layers (2 layers, 2 threads)", xs, xr, DD, 1e-5);

    /* the batched step (decode_layers_batch): row 0 = the state above again, row 1 another generation (its own cache,
       another length); each row's values bit for bit as its step alone */
    static float ka[LAYERS][HH * CAPD * HDD], va[LAYERS][HH * CAPD * HDD], kb[LAYERS][HH * CAPD * HDD],
        vb[LAYERS][HH * CAPD * HDD], kb0[LAYERS][HH * CAPD * HDD], vb0[LAYERS][HH * CAPD * HDD];
    static float xa[DD], xb[DD], xb1[DD], sa[5 * DD + FF + HH * CAPD], sb[5 * DD + FF + HH * CAPD];
    void *pa[LAYERS * 14], *pb[LAYERS * 14];
    memcpy(ka, kc0, sizeof ka);
    memcpy(va, vc0, sizeof va);
    for (int i = 0; i < HH * CAPD * HDD; i++)
      for (int l = 0; l < LAYERS; l++) kb0[l][i] = frand(), vb0[l][i] = frand();
    memcpy(kb, kb0, sizeof kb);
    memcpy(vb, vb0, sizeof vb);
    for (int i = 0; i < DD; i++) xb1[i] = xb[i] = frand();
    memcpy(xa, x0, sizeof xa);
    for (int l = 0; l < LAYERS * 14; l++) pa[l] = pb[l] = ptrs[l];
    for (int l = 0; l < LAYERS; l++) {
      pb[l * 14 + 12] = kb[l], pb[l * 14 + 13] = vb[l];
    }
    decode_layers(pb, LAYERS, CAPD, 1, xb1, sb, DD, HH, FF, (float)sc, (float)eps, 1); /* row 1 alone */
    memcpy(kb, kb0, sizeof kb);
    memcpy(vb, vb0, sizeof vb);
    for (int l = 0; l < LAYERS; l++) {
      pa[l * 14 + 12] = ka[l], pa[l * 14 + 13] = va[l];
    }
    void *const *tables[2] = {pa, pb};
    const int64_t caps[2] = {CAPD, CAPD}, ts[2] = {TT, 1};
    float *xsb[2] = {xa, xb}, *scr[2] = {sa, sb};
    const int rc = decode_layers_batch(tables, 2, caps, ts, xsb, scr, LAYERS, DD, HH, FF, (float)sc, (float)eps, 2);
    const int same = rc == 0 && !memcmp(xa, xs, sizeof xa) && !memcmp(xb, xb1, sizeof xb);
    printf("%-40s %s\n", "decode_layers_batch (2 rows) == alone", same ? "ok" : "FAILED");
    failures += !same;

    /* the int8 step (decode_layers_q8): the same weights rounded per row; within the rounding of the f16 step above,
       and its batch bit for bit as alone */
    static int8_t qq[LAYERS][3 * DD * DD], qo[LAYERS][DD * DD], q1[LAYERS][FF * DD], q2[LAYERS][DD * FF];
    static float sq[LAYERS][3 * DD], so[LAYERS][DD], s1[LAYERS][FF], s2[LAYERS][DD], tmp[3 * DD * DD + FF * DD];
    void *p8[LAYERS * 18];
    for (int l = 0; l < LAYERS; l++) {
      for (int i = 0; i < 3 * DD * DD; i++) tmp[i] = h2f(wq[l][i]);
      quantize_rows_q8(tmp, qq[l], sq[l], 3 * DD, DD);
      for (int i = 0; i < DD * DD; i++) tmp[i] = h2f(wo[l][i]);
      quantize_rows_q8(tmp, qo[l], so[l], DD, DD);
      for (int i = 0; i < FF * DD; i++) tmp[i] = h2f(w1[l][i]);
      quantize_rows_q8(tmp, q1[l], s1[l], FF, DD);
      for (int i = 0; i < DD * FF; i++) tmp[i] = h2f(w2[l][i]);
      quantize_rows_q8(tmp, q2[l], s2[l], DD, FF);
      void *q[18] = {qq[l], bq[l], qo[l], bo[l], n1w[l], n1b[l], q1[l], b1[l], q2[l], b2[l],
                     n2w[l], n2b[l], kc[l], vc[l], sq[l], so[l], s1[l], s2[l]};
      for (int i = 0; i < 18; i++) p8[l * 18 + i] = q[i];
    }
    memcpy(kc, kc0, sizeof kc);
    memcpy(vc, vc0, sizeof vc);
    static float x8[DD], x8b[DD], s8[5 * DD + FF + HH * CAPD];
    memcpy(x8, x0, sizeof x8);
    decode_layers_q8(p8, LAYERS, CAPD, TT, x8, s8, DD, HH, FF, (float)sc, (float)eps, 2);
    check("decode_layers_q8 (vs float16 weights)", x8, xr, DD, 5e-2);
    memcpy(kc, kc0, sizeof kc);
    memcpy(vc, vc0, sizeof vc);
    memcpy(x8b, x0, sizeof x8b);
    void *const *t8[1] = {p8};
    const int64_t cap8[1] = {CAPD}, ts8[1] = {TT};
    float *xs8[1] = {x8b}, *sc8[1] = {s8};
    const int rc8 = decode_layers_batch_q8(t8, 1, cap8, ts8, xs8, sc8, LAYERS, DD, HH, FF, (float)sc, (float)eps, 1);
    const int same8 = rc8 == 0 && !memcmp(x8, x8b, sizeof x8);
    printf("%-40s %s\n", "decode_layers_batch_q8 == decode_layers_q8", same8 ? "ok" : "FAILED");
    failures += !same8;
  }

  printf(failures ? "%d check(s) FAILED\n" : "all checks passed\n", failures);
  return failures ? 1 : 0;
}
