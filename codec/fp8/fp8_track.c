/* fp8_track.c - an FP8 tensor kept equal to the reference quantizer of a
 * BF16 tensor step by step (pulse_fp8.h), requantizing only what a step's
 * changes move.
 *
 * Why each block's amax is kept: at RL learning rates about 1% of the
 * weights change per step, spread evenly, so nearly every 128 x 128 block
 * (16384 weights) has changes; what matters is that a block's scale moves
 * only when its largest magnitude does. The kept amax and the changes give
 * the new amax in O(changes), except when an element that held the amax
 * went down: only that block is read again. A block whose scale stays gets
 * its changed elements requantized; one whose scale moved, all of it. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "fp8_impl.h"
#include "pulse_fp8_elem.h"
#include "status_impl.h"

struct pulse_fp8_track {
  const uint16_t *bf16;
  pulse_fp8_tensor t;
  fp8_grid g;
  uint16_t *amax; /* per block, of what bf16 holds */
};

/* One change, grouped by block. */
typedef struct {
  uint64_t off;
  uint16_t bits;
} fp8_change;

/* A block the step touches. */
typedef struct {
  uint64_t b;
  uint16_t amax;
  uint32_t scale;
  int rescaled;     /* its q bytes are at q_at in res_q, block row-major */
  uint64_t q_at;
} fp8_touched;

struct pulse_fp8_staged {
  pulse_fp8_track *tr;
  fp8_touched *blocks;
  uint64_t nblocks;
  uint64_t *elem_at; /* changed elements of blocks whose scale stays */
  uint8_t *elem_q;
  uint64_t nelem;
  uint8_t *res_q; /* the blocks requantized whole */
  pulse_fp8_stage_figures fig;
};

pulse_status pulse_fp8_track_create(const uint16_t *bf16, const pulse_fp8_tensor *t,
                                    int threads, pulse_fp8_track **out) {
  if (t == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "fp8 track: NULL argument");
  *out = NULL;
  fp8_grid g;
  PULSE_TRY(fp8_grid_make(t, &g));
  pulse_fp8_track *tr = calloc(1, sizeof *tr);
  uint16_t *amax = tr ? calloc((size_t)g.blocks + 1, sizeof *amax) : NULL;
  if (amax == NULL) {
    free(tr);
    return pulse_fail(PULSE_ERR_NOMEM, "fp8 track of %" PRIu64 " blocks", g.blocks);
  }
  pulse_status st = fp8_quantize_all(bf16, t, &g, threads, amax);
  if (st != PULSE_OK) {
    free(amax), free(tr);
    return st;
  }
  tr->bf16 = bf16;
  tr->t = *t;
  tr->g = g;
  tr->amax = amax;
  *out = tr;
  return PULSE_OK;
}

void pulse_fp8_track_free(pulse_fp8_track *track) {
  if (track == NULL)
    return;
  free(track->amax);
  free(track);
}

pulse_status pulse_fp8_track_requantize(pulse_fp8_track *track, int threads) {
  if (track == NULL)
    return pulse_fail(PULSE_ERR_ARG, "fp8 requantize: NULL track");
  return fp8_quantize_all(track->bf16, &track->t, &track->g, threads, track->amax);
}

static int change_cmp(const void *a, const void *b) {
  uint64_t x = ((const fp8_change *)a)->off, y = ((const fp8_change *)b)->off;
  return x < y ? -1 : x > y;
}

/* Walks block b's elements in row-major order with its changes (sorted by
 * offset) laid over the BF16 tensor: the block's new amax when q is NULL,
 * else its E4M3FN bytes at scale s into q (block row-major). */
static uint16_t block_walk(const pulse_fp8_track *tr, uint64_t b, const fp8_change *ch,
                           uint64_t n, uint32_t s, uint8_t *q) {
  uint64_t r0, c0, nr, nc, k = 0;
  uint16_t m = 0;
  fp8_block_box(&tr->g, b, &r0, &c0, &nr, &nc);
  for (uint64_t r = 0; r < nr; r++) {
    uint64_t first = (r0 + r) * tr->g.cols + c0;
    const uint16_t *row = tr->bf16 + first;
    for (uint64_t c = 0; c < nc; c++) {
      uint16_t x = row[c];
      if (k < n && ch[k].off == first + c)
        x = ch[k++].bits;
      if (q != NULL)
        q[r * nc + c] = pulse_fp8_quantize_elem(x, s);
      else if (pulse_fp8_bf16_abs(x) > m)
        m = pulse_fp8_bf16_abs(x);
    }
  }
  return m;
}

static uint64_t block_elems(const fp8_grid *g, uint64_t b) {
  uint64_t r0, c0, nr, nc;
  fp8_block_box(g, b, &r0, &c0, &nr, &nc);
  return nr * nc;
}

/* Groups the changes by block (a counting sort; within a block by offset)
 * into *grouped, with first[b] .. first[b + 1] the changes of block b. */
static pulse_status group_changes(const pulse_fp8_track *tr, const uint64_t *offset,
                                  const uint16_t *new_bits, uint64_t count,
                                  fp8_change **grouped, uint64_t **first) {
  const fp8_grid *g = &tr->g;
  uint64_t *start = calloc((size_t)g->blocks + 2, sizeof *start);
  fp8_change *out = malloc((size_t)count * sizeof *out + 1);
  if (start == NULL || out == NULL) {
    free(start), free(out);
    return pulse_fail(PULSE_ERR_NOMEM, "fp8 stage: %" PRIu64 " changes", count);
  }
  for (uint64_t i = 0; i < count; i++)
    start[fp8_block_of(g, offset[i]) + 2]++;
  for (uint64_t b = 0; b < g->blocks; b++)
    start[b + 2] += start[b + 1];
  for (uint64_t i = 0; i < count; i++) {
    uint64_t b = fp8_block_of(g, offset[i]);
    out[start[b + 1]++] = (fp8_change){offset[i], new_bits[i]};
  }
  /* start[b] .. start[b + 1] is block b's now. */
  for (uint64_t b = 0; b < g->blocks; b++) {
    fp8_change *c = out + start[b];
    uint64_t n = start[b + 1] - start[b];
    for (uint64_t i = 1; i < n; i++)
      if (c[i - 1].off > c[i].off) { /* regions arrive in their own order */
        qsort(c, (size_t)n, sizeof *c, change_cmp);
        break;
      }
  }
  *grouped = out;
  *first = start;
  return PULSE_OK;
}

static pulse_status check_changes(const pulse_fp8_track *tr, const uint64_t *offset,
                                  const uint16_t *new_bits, uint64_t count) {
  uint64_t numel = tr->g.rows * tr->g.cols;
  for (uint64_t i = 0; i < count; i++) {
    if (offset[i] >= numel)
      return pulse_fail(PULSE_ERR_ARG, "fp8 stage: offset %" PRIu64 " outside %" PRIu64
                        " elements", offset[i], numel);
    if (!pulse_fp8_bf16_finite(new_bits[i]))
      return pulse_fail(PULSE_ERR_UNSUPPORTED,
                        "fp8: element (%" PRIu64 ", %" PRIu64 ") would be %s (BF16 0x%04x): "
                        "E4M3FN weights take finite values only",
                        offset[i] / tr->g.cols, offset[i] % tr->g.cols,
                        (new_bits[i] & 0x7Fu) ? "NaN" : "infinite", (unsigned)new_bits[i]);
  }
  return PULSE_OK;
}

void pulse_fp8_staged_free(pulse_fp8_staged *staged) {
  if (staged == NULL)
    return;
  free(staged->blocks), free(staged->elem_at), free(staged->elem_q), free(staged->res_q);
  free(staged);
}

pulse_status pulse_fp8_track_stage(pulse_fp8_track *track, const uint64_t *offset,
                                   const uint16_t *new_bits, uint64_t count,
                                   pulse_fp8_staged **out) {
  if (track == NULL || out == NULL || (count > 0 && (offset == NULL || new_bits == NULL)))
    return pulse_fail(PULSE_ERR_ARG, "fp8 stage: NULL argument");
  *out = NULL;
  if (count > SIZE_MAX / sizeof(fp8_change) / 2)
    return pulse_fail(PULSE_ERR_OVERFLOW, "fp8 stage: %" PRIu64 " changes", count);
  PULSE_TRY(check_changes(track, offset, new_bits, count));
  const fp8_grid *g = &track->g;
  fp8_change *ch = NULL;
  uint64_t *first = NULL;
  PULSE_TRY(group_changes(track, offset, new_bits, count, &ch, &first));
  pulse_status st = PULSE_OK;
  uint64_t touched = 0;
  for (uint64_t b = 0; b < g->blocks; b++)
    touched += first[b + 1] > first[b];
  pulse_fp8_staged *s = calloc(1, sizeof *s);
  if (s != NULL) {
    s->blocks = calloc((size_t)touched + 1, sizeof *s->blocks);
    s->elem_at = malloc((size_t)count * sizeof *s->elem_at + 1);
    s->elem_q = malloc((size_t)count + 1);
  }
  if (s == NULL || s->blocks == NULL || s->elem_at == NULL || s->elem_q == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "fp8 stage: %" PRIu64 " changes", count);
    goto done;
  }
  s->tr = track;
  s->fig.changes = count;
  /* New amax and scale of each touched block. */
  uint64_t res_bytes = 0;
  for (uint64_t b = 0; b < g->blocks; b++) {
    const fp8_change *c = ch + first[b];
    uint64_t n = first[b + 1] - first[b];
    if (n == 0)
      continue;
    uint16_t old = track->amax[b], hi = 0;
    int went_down = 0;
    for (uint64_t i = 0; i < n; i++) {
      uint16_t was = pulse_fp8_bf16_abs(track->bf16[c[i].off]);
      uint16_t now = pulse_fp8_bf16_abs(c[i].bits);
      hi = now > hi ? now : hi;
      went_down |= was == old && now < old;
    }
    fp8_touched *t = &s->blocks[s->nblocks++];
    t->b = b;
    if (hi >= old) {
      t->amax = hi;
    } else if (went_down) { /* the old largest element went down */
      t->amax = block_walk(track, b, c, n, 0, NULL);
      s->fig.blocks_rescanned++;
    } else {
      t->amax = old;
    }
    t->scale = pulse_fp8_scale_bits(t->amax);
    t->rescaled = t->scale != pulse_fp8_scale_bits(old);
    if (t->rescaled) {
      t->q_at = res_bytes;
      res_bytes += block_elems(g, b);
    }
  }
  s->fig.blocks_touched = s->nblocks;
  if (res_bytes > 0 && (res_bytes > SIZE_MAX - 1 || (s->res_q = malloc((size_t)res_bytes)) == NULL)) {
    st = pulse_fail(PULSE_ERR_NOMEM, "fp8 stage: %" PRIu64 " bytes of requantized blocks",
                    res_bytes);
    goto done;
  }
  /* The E4M3FN bytes: whole blocks where the scale moved, else the
   * changed elements. */
  for (uint64_t k = 0; k < s->nblocks; k++) {
    const fp8_touched *t = &s->blocks[k];
    const fp8_change *c = ch + first[t->b];
    uint64_t n = first[t->b + 1] - first[t->b];
    if (t->rescaled) {
      block_walk(track, t->b, c, n, t->scale, s->res_q + t->q_at);
      s->fig.blocks_rescaled++;
      s->fig.elements_quantized += block_elems(g, t->b);
      continue;
    }
    for (uint64_t i = 0; i < n; i++) {
      s->elem_at[s->nelem] = c[i].off;
      s->elem_q[s->nelem++] = pulse_fp8_quantize_elem(c[i].bits, t->scale);
    }
    s->fig.elements_quantized += n;
  }
done:
  free(ch), free(first);
  if (st != PULSE_OK) {
    pulse_fp8_staged_free(s);
    return st;
  }
  *out = s;
  return PULSE_OK;
}

void pulse_fp8_staged_commit(pulse_fp8_staged *staged) {
  if (staged == NULL)
    return;
  pulse_fp8_track *tr = staged->tr;
  for (uint64_t i = 0; i < staged->nelem; i++)
    tr->t.q[staged->elem_at[i]] = staged->elem_q[i];
  for (uint64_t k = 0; k < staged->nblocks; k++) {
    const fp8_touched *t = &staged->blocks[k];
    if (t->rescaled) {
      uint64_t r0, c0, nr, nc;
      fp8_block_box(&tr->g, t->b, &r0, &c0, &nr, &nc);
      for (uint64_t r = 0; r < nr; r++)
        memcpy(tr->t.q + (r0 + r) * tr->g.cols + c0, staged->res_q + t->q_at + r * nc,
               (size_t)nc);
    }
    fp8_store_scale(&tr->t.scale_inv[t->b], t->scale);
    tr->amax[t->b] = t->amax;
  }
}

pulse_fp8_stage_figures pulse_fp8_staged_figures_get(const pulse_fp8_staged *staged) {
  pulse_fp8_stage_figures none = {0, 0, 0, 0, 0};
  return staged != NULL ? staged->fig : none;
}
