/* cblas_sgemm / cblas_dgemm forwarded to numpy's bundled OpenBLAS (scipy_openblas64_: prefixed symbols, 64-bit
   integers), so MLX binds a fast BLAS (_blas.py). */
#include <stdint.h>
extern void scipy_cblas_sgemm64_(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                                 const float *, int64_t, float, float *, int64_t);
extern void scipy_cblas_dgemm64_(int, int, int, int64_t, int64_t, int64_t, double, const double *, int64_t,
                                 const double *, int64_t, double, double *, int64_t);
void cblas_sgemm(int o, int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
                 const float *b, int ldb, float beta, float *c, int ldc) {
  scipy_cblas_sgemm64_(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
void cblas_dgemm(int o, int ta, int tb, int m, int n, int k, double alpha, const double *a, int lda,
                 const double *b, int ldb, double beta, double *c, int ldc) {
  scipy_cblas_dgemm64_(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}
