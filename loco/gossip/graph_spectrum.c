/* graph_spectrum.c - what a mixing matrix predicts for the replicas'
 * variance (pulse_gossip.h): its eigenvalues (cyclic Jacobi rotations on
 * the dense symmetric W) and the stationary variance of x <- W (x + xi). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "graph_impl.h"
#include "status_impl.h"

static int cmp_desc(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x > y ? -1 : x < y;
}

/* Eigenvalues of the symmetric n x n matrix A (destroyed) into eig. */
static void jacobi(double *A, size_t n, double *eig) {
  for (int sweep = 0; sweep < 100; sweep++) {
    double off = 0.0;
    for (size_t p = 0; p < n; p++)
      for (size_t q = p + 1; q < n; q++)
        off += A[p * n + q] * A[p * n + q];
    if (off < 1e-30)
      break;
    for (size_t p = 0; p < n; p++)
      for (size_t q = p + 1; q < n; q++) {
        double apq = A[p * n + q];
        if (fabs(apq) < 1e-300)
          continue;
        double theta = (A[q * n + q] - A[p * n + p]) / (2.0 * apq);
        double t = (theta >= 0 ? 1.0 : -1.0) /
                   (fabs(theta) + sqrt(theta * theta + 1.0));
        double c = 1.0 / sqrt(t * t + 1.0), s = t * c;
        for (size_t k = 0; k < n; k++) { /* columns p, q */
          double akp = A[k * n + p], akq = A[k * n + q];
          A[k * n + p] = c * akp - s * akq;
          A[k * n + q] = s * akp + c * akq;
        }
        for (size_t k = 0; k < n; k++) { /* rows p, q */
          double apk = A[p * n + k], aqk = A[q * n + k];
          A[p * n + k] = c * apk - s * aqk;
          A[q * n + k] = s * apk + c * aqk;
        }
      }
  }
  for (size_t i = 0; i < n; i++)
    eig[i] = A[i * n + i];
  qsort(eig, n, sizeof *eig, cmp_desc);
}

pulse_status pulse_gossip_graph_eigenvalues(const pulse_gossip_graph *g,
                                            double *eig) {
  if (g == NULL || eig == NULL)
    return pulse_fail(PULSE_ERR_ARG, "gossip spectrum: NULL argument");
  double *A = graph_dense(g);
  if (A == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "gossip spectrum");
  jacobi(A, g->n, eig);
  free(A);
  return PULSE_OK;
}

double pulse_gossip_graph_predicted_variance(const pulse_gossip_graph *g) {
  if (g == NULL)
    return NAN;
  double *eig = malloc(g->n * sizeof *eig);
  if (eig == NULL || pulse_gossip_graph_eigenvalues(g, eig) != PULSE_OK) {
    free(eig);
    return NAN;
  }
  double sum = 0.0;
  /* eig[0] = 1 belongs to the mean (the all-ones vector); the others to the
   * disagreement, each an AR(1) with coefficient l. */
  for (uint32_t k = 1; k < g->n; k++) {
    double l2 = eig[k] * eig[k];
    sum += l2 >= 1.0 - 1e-12 ? INFINITY : l2 / (1.0 - l2);
  }
  free(eig);
  return sum / (double)g->n;
}

/* C <- W C W^T for dense n x n matrices (tmp: n x n scratch). */
static void conjugate(const double *W, double *C, double *tmp, size_t n) {
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) {
      double s = 0.0;
      for (size_t k = 0; k < n; k++)
        s += W[i * n + k] * C[k * n + j];
      tmp[i * n + j] = s;
    }
  for (size_t i = 0; i < n; i++)
    for (size_t j = 0; j < n; j++) {
      double s = 0.0;
      for (size_t k = 0; k < n; k++)
        s += tmp[i * n + k] * W[j * n + k];
      C[i * n + j] = s;
    }
}

double pulse_gossip_predicted_variance_seq(const pulse_gossip_graph *const *seq,
                                           size_t period) {
  if (seq == NULL || period == 0 || seq[0] == NULL)
    return NAN;
  size_t n = seq[0]->n;
  for (size_t t = 0; t < period; t++)
    if (seq[t] == NULL || seq[t]->n != n)
      return NAN;
  double **W = calloc(period, sizeof *W);
  double *C = calloc(n * n, sizeof *C), *tmp = malloc(n * n * sizeof *tmp);
  int ok = W && C && tmp;
  for (size_t t = 0; ok && t < period; t++)
    ok = (W[t] = graph_dense(seq[t])) != NULL;
  double result = NAN;
  if (ok) {
    /* C is the covariance of the deviation from the mean; the noise adds
     * I - J (its projection off the mean), then the round mixes. */
    double inv = 1.0 / (double)n, acc = 0.0, prev = -1.0;
    for (size_t it = 0; it < 100000; it++) {
      acc = 0.0;
      for (size_t t = 0; t < period; t++) {
        for (size_t i = 0; i < n; i++)
          for (size_t j = 0; j < n; j++)
            C[i * n + j] += (i == j ? 1.0 : 0.0) - inv;
        conjugate(W[t], C, tmp, n);
        double tr = 0.0;
        for (size_t i = 0; i < n; i++)
          tr += C[i * n + i];
        acc += tr * inv;
      }
      acc /= (double)period;
      if (!isfinite(acc) || (it > 8 && fabs(acc - prev) <= 1e-13 * acc))
        break;
      if (acc > 1e12) { /* no decay: a disconnected sequence */
        acc = INFINITY;
        break;
      }
      prev = acc;
    }
    result = acc;
  }
  for (size_t t = 0; W && t < period; t++)
    free(W[t]);
  free(W), free(C), free(tmp);
  return result;
}
