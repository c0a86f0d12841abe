/* fp8_quant.c - the reference block quantizer over a whole tensor
 * (pulse_fp8.h): a plain loop over the element functions of
 * pulse_fp8_elem.h, in two passes over bands of 128 rows (amax and the
 * finite check, then the quantization), so that nothing is written before
 * every value has been checked. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_impl.h"
#include "parallel_impl.h"
#include "pulse_fp8_elem.h"
#include "status_impl.h"

pulse_status pulse_fp8_scale_count(uint64_t rows, uint64_t cols, pulse_fp8_scale scale,
                                   uint64_t *count) {
  if (count == NULL)
    return pulse_fail(PULSE_ERR_ARG, "fp8 scale count: NULL count");
  pulse_fp8_tensor t = {rows, cols, NULL, NULL, scale};
  fp8_grid g;
  PULSE_TRY(fp8_grid_make(&t, &g));
  *count = g.blocks;
  return PULSE_OK;
}

pulse_status fp8_grid_make(const pulse_fp8_tensor *t, fp8_grid *g) {
  if (t->scale != PULSE_FP8_SCALE_BLOCK && t->scale != PULSE_FP8_SCALE_TENSOR)
    return pulse_fail(PULSE_ERR_ARG, "fp8: unknown scale kind %d", (int)t->scale);
  if (t->cols != 0 && t->rows > UINT64_MAX / t->cols)
    return pulse_fail(PULSE_ERR_OVERFLOW, "fp8: %" PRIu64 " x %" PRIu64 " elements overflow",
                      t->rows, t->cols);
  memset(g, 0, sizeof *g);
  g->rows = t->rows;
  g->cols = t->cols;
  if (t->scale == PULSE_FP8_SCALE_TENSOR) {
    g->brows = t->rows ? t->rows : 1;
    g->bcols = t->cols ? t->cols : 1;
    g->grid_rows = g->grid_cols = g->blocks = 1;
    return PULSE_OK;
  }
  g->brows = g->bcols = PULSE_FP8_BLOCK;
  if (t->rows == 0 || t->cols == 0)
    return PULSE_OK;
  g->grid_rows = (t->rows - 1) / PULSE_FP8_BLOCK + 1;
  g->grid_cols = (t->cols - 1) / PULSE_FP8_BLOCK + 1;
  g->blocks = g->grid_rows * g->grid_cols; /* at most numel */
  return PULSE_OK;
}

void fp8_block_box(const fp8_grid *g, uint64_t b, uint64_t *row0, uint64_t *col0,
                   uint64_t *nrows, uint64_t *ncols) {
  *row0 = (b / g->grid_cols) * g->brows;
  *col0 = (b % g->grid_cols) * g->bcols;
  *nrows = g->rows - *row0 < g->brows ? g->rows - *row0 : g->brows;
  *ncols = g->cols - *col0 < g->bcols ? g->cols - *col0 : g->bcols;
}

uint64_t fp8_block_of(const fp8_grid *g, uint64_t offset) {
  uint64_t r = offset / g->cols, c = offset % g->cols;
  return (r / g->brows) * g->grid_cols + c / g->bcols;
}

void fp8_store_scale(float *at, uint32_t bits) { memcpy(at, &bits, sizeof bits); }

pulse_status pulse_fp8_check_finite(const uint16_t *bf16, uint64_t rows, uint64_t cols,
                                    uint64_t stride, const char *what) {
  if ((bf16 == NULL && rows > 0 && cols > 0) || stride < cols)
    return pulse_fail(PULSE_ERR_ARG, "fp8 check: NULL data or stride below cols");
  for (uint64_t r = 0; r < rows; r++) {
    const uint16_t *row = bf16 + r * stride;
    for (uint64_t c = 0; c < cols; c++)
      if (!pulse_fp8_bf16_finite(row[c]))
        return pulse_fail(PULSE_ERR_UNSUPPORTED,
                          "%s: element (%" PRIu64 ", %" PRIu64 ") is %s (BF16 0x%04x): E4M3FN "
                          "weights take finite values only",
                          what ? what : "fp8", r, c,
                          (row[c] & 0x7Fu) ? "NaN" : "infinite", (unsigned)row[c]);
  }
  return PULSE_OK;
}

/* One band of brows rows: its blocks' amax (or, per tensor, the band's),
 * and the first value that is not finite. */
typedef struct {
  const uint16_t *bf16;
  const pulse_fp8_tensor *t;
  const fp8_grid *g;
  uint16_t *band_amax;  /* bands x grid_cols */
  uint32_t *scale;      /* grid entries */
  uint64_t *bad;        /* per band: first bad offset + 1, or 0 */
} quant_job;

static void band_amax(void *ctx, size_t band) {
  quant_job *j = ctx;
  const fp8_grid *g = j->g;
  uint64_t r0 = (uint64_t)band * g->brows;
  uint64_t r1 = g->rows - r0 < g->brows ? g->rows : r0 + g->brows;
  uint16_t *amax = j->band_amax + (uint64_t)band * g->grid_cols;
  for (uint64_t r = r0; r < r1; r++) {
    const uint16_t *row = j->bf16 + r * g->cols;
    for (uint64_t bc = 0; bc < g->grid_cols; bc++) {
      uint64_t c0 = bc * g->bcols, c1 = g->cols - c0 < g->bcols ? g->cols : c0 + g->bcols;
      uint16_t m = amax[bc], seen = 0;
      for (uint64_t c = c0; c < c1; c++) {
        uint16_t a = pulse_fp8_bf16_abs(row[c]);
        seen |= (uint16_t)(a >= 0x7F80u); /* NaN or infinity */
        m = a > m ? a : m;
      }
      amax[bc] = m;
      if (seen && j->bad[band] == 0)
        for (uint64_t c = c0; c < c1; c++)
          if (!pulse_fp8_bf16_finite(row[c])) {
            j->bad[band] = r * g->cols + c + 1;
            break;
          }
    }
  }
}

static void band_quantize(void *ctx, size_t band) {
  quant_job *j = ctx;
  const fp8_grid *g = j->g;
  uint64_t r0 = (uint64_t)band * g->brows;
  uint64_t r1 = g->rows - r0 < g->brows ? g->rows : r0 + g->brows;
  uint64_t srow = g->grid_rows == 1 ? 0 : band; /* per tensor: one scale */
  for (uint64_t r = r0; r < r1; r++) {
    const uint16_t *row = j->bf16 + r * g->cols;
    uint8_t *out = j->t->q + r * g->cols;
    for (uint64_t bc = 0; bc < g->grid_cols; bc++) {
      uint32_t s = j->scale[srow * g->grid_cols + bc];
      uint64_t c0 = bc * g->bcols, c1 = g->cols - c0 < g->bcols ? g->cols : c0 + g->bcols;
      for (uint64_t c = c0; c < c1; c++)
        out[c] = pulse_fp8_quantize_elem(row[c], s);
    }
  }
}

pulse_status fp8_quantize_all(const uint16_t *bf16, const pulse_fp8_tensor *t,
                              const fp8_grid *g, int threads, uint16_t *amax) {
  uint64_t numel = g->rows * g->cols;
  if (numel > 0 && (bf16 == NULL || t->q == NULL))
    return pulse_fail(PULSE_ERR_ARG, "fp8 quantize: NULL data");
  if (g->blocks > 0 && t->scale_inv == NULL)
    return pulse_fail(PULSE_ERR_ARG, "fp8 quantize: NULL scale_inv");
  /* Bands of brows rows; per tensor, bands of 128 rows reduced after. */
  uint64_t band_rows = g->grid_rows == 1 && g->rows > PULSE_FP8_BLOCK ? PULSE_FP8_BLOCK : g->brows;
  fp8_grid bg = *g;
  bg.brows = band_rows;
  uint64_t bands = g->rows ? (g->rows - 1) / band_rows + 1 : 0;
  if (bands > SIZE_MAX / 8 || (g->grid_cols && bands > SIZE_MAX / 2 / g->grid_cols))
    return pulse_fail(PULSE_ERR_OVERFLOW, "fp8 quantize: %" PRIu64 " row bands", bands);
  uint16_t *band_max = calloc((size_t)(bands * g->grid_cols) + 1, sizeof *band_max);
  uint64_t *bad = calloc((size_t)bands + 1, sizeof *bad);
  uint32_t *scale = calloc((size_t)g->blocks + 1, sizeof *scale);
  if (band_max == NULL || bad == NULL || scale == NULL) {
    free(band_max), free(bad), free(scale);
    return pulse_fail(PULSE_ERR_NOMEM, "fp8 quantize: %" PRIu64 " bands", bands);
  }
  quant_job job = {bf16, t, &bg, band_max, scale, bad};
  if (numel > 0)
    pulse_parallel_for(threads, (size_t)bands, band_amax, &job);
  for (uint64_t b = 0; b < bands; b++)
    if (bad[b] != 0) {
      uint64_t at = bad[b] - 1;
      uint16_t x = bf16[at];
      free(band_max), free(bad), free(scale);
      return pulse_fail(PULSE_ERR_UNSUPPORTED,
                        "fp8: element (%" PRIu64 ", %" PRIu64 ") is %s (BF16 0x%04x): "
                        "E4M3FN weights take finite values only; nothing written",
                        at / g->cols, at % g->cols, (x & 0x7Fu) ? "NaN" : "infinite",
                        (unsigned)x);
    }
  if (g->grid_rows == 1 && g->grid_cols == 1 && g->blocks == 1) {
    uint16_t m = 0; /* per tensor (or one block): the bands' max */
    for (uint64_t b = 0; b < bands; b++)
      m = band_max[b] > m ? band_max[b] : m;
    band_max[0] = m;
  }
  for (uint64_t b = 0; b < g->blocks; b++) {
    scale[b] = pulse_fp8_scale_bits(band_max[b]);
    if (amax != NULL)
      amax[b] = band_max[b];
  }
  if (numel > 0)
    pulse_parallel_for(threads, (size_t)bands, band_quantize, &job);
  for (uint64_t b = 0; b < g->blocks; b++)
    fp8_store_scale(&t->scale_inv[b], scale[b]);
  free(band_max), free(bad), free(scale);
  return PULSE_OK;
}

pulse_status pulse_fp8_quantize_ref(const uint16_t *bf16, const pulse_fp8_tensor *t,
                                    int threads) {
  if (t == NULL)
    return pulse_fail(PULSE_ERR_ARG, "fp8 quantize: NULL tensor");
  fp8_grid g;
  PULSE_TRY(fp8_grid_make(t, &g));
  return fp8_quantize_all(bf16, t, &g, threads, NULL);
}
