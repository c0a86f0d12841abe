/* sim_text.c - next-character prediction on real text (sim_text.h).
 * Built with -O3 like sim_problem.c (tools/CMakeLists.txt): the loops
 * are axpy rows or 8-lane dot products, vectorized without reassociation,
 * and the heavy ones are also built for AVX2 (same bits: -ffp-contract=off
 * forbids fused multiply-adds). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rng_impl.h"
#include "status_impl.h"
#include "sim_mlp_impl.h"
#include "sim_text.h"

#define V 256u /* byte vocabulary */

struct pulse_sim_text {
  pulse_sim_problem_opts o;
  uint8_t *text;
  uint64_t len, digest;
  uint32_t *train; /* positions (of the predicted byte) in training blocks */
  uint64_t ntrain;
  uint32_t *tune; /* text SFT: positions in the fine-tuning blocks */
  uint64_t ntune;
  int phase_tune; /* learners draw from tune (pulse_sim_text_set_phase) */
  uint32_t *test; /* test_count held-out positions */
  uint32_t k, d, H, kd;
  uint64_t P, e, w1, b1, w2, b2; /* offsets in theta */
  float s1, s2;                  /* 1/sqrt(fan-in) */
};

struct pulse_sim_text_scratch {
  uint32_t *pos;             /* batch positions */
  float *x, *z, *h, *l, *dz; /* batch x kd, H, H, V, H */
  float *dx;                 /* kd */
};

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TEXT_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define TEXT_SIMD
#endif

/* ------------------------------------------------------------------ data */

/* Appends one file to *buf. */
static pulse_status read_file(const char *path, uint8_t **buf, uint64_t *len,
                              uint64_t *cap) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "text problem: cannot read %s: %s (the default text "
                      "is base-files' licences in " PULSE_SIM_TEXT_DIR ")",
                      path, strerror(errno));
  for (;;) {
    if (*cap - *len < 65536) {
      uint64_t ncap = *cap * 2 + 65536;
      uint8_t *nb = realloc(*buf, (size_t)ncap);
      if (nb == NULL) {
        fclose(f);
        return pulse_fail(PULSE_ERR_NOMEM, "text problem: %s", path);
      }
      *buf = nb, *cap = ncap;
    }
    size_t got = fread(*buf + *len, 1, (size_t)(*cap - *len), f);
    *len += got;
    if (got == 0)
      break;
  }
  int bad = ferror(f);
  fclose(f);
  if (bad)
    return pulse_fail(PULSE_ERR_IO, "text problem: error reading %s", path);
  return PULSE_OK;
}

static pulse_status load_text(pulse_sim_text *t) {
  static const char *const files[] = {PULSE_SIM_TEXT_FILES};
  uint64_t cap = 0;
  pulse_status st = PULSE_OK;
  if (t->o.text_path != NULL) {
    st = read_file(t->o.text_path, &t->text, &t->len, &cap);
  } else {
    for (size_t i = 0; i < sizeof files / sizeof files[0] && st == PULSE_OK;
         i++) {
      char path[256];
      snprintf(path, sizeof path, "%s%s", PULSE_SIM_TEXT_DIR, files[i]);
      st = read_file(path, &t->text, &t->len, &cap);
    }
  }
  if (st != PULSE_OK)
    return st;
  /* Two blocks at least: one to learn from, one held out. */
  if (t->len < 2u * PULSE_SIM_TEXT_BLOCK || t->len > UINT32_MAX)
    return pulse_fail(PULSE_ERR_ARG,
                      "text problem: %llu bytes of text; needs %u to 2^32",
                      (unsigned long long)t->len, 2u * PULSE_SIM_TEXT_BLOCK);
  uint64_t h = 0x7E47ull;
  for (uint64_t i = 0; i < t->len; i++)
    h = pulse_digest_lane_a(h ^ t->text[i]);
  t->digest = h;
  return PULSE_OK;
}

/* Block b is held out: a tenth of the blocks, chosen by the seed; block 1
 * and block 0 settle the case where the draw left a side empty. */
static int held_out(const pulse_sim_text *t, uint64_t b, uint64_t nblocks,
                    int any_test, int any_train) {
  if (!any_test && b == nblocks - 1)
    return 1;
  if (!any_train && b == nblocks - 1)
    return 0;
  return pulse_rng_at(t->o.seed ^ 0x5B117ull, b) % 10u == 0;
}

static pulse_status split(pulse_sim_text *t) {
  uint64_t nblocks = (t->len + PULSE_SIM_TEXT_BLOCK - 1) / PULSE_SIM_TEXT_BLOCK;
  uint32_t *test_pos = malloc((size_t)t->len * sizeof *test_pos);
  t->train = malloc((size_t)t->len * sizeof *t->train);
  t->tune = malloc((size_t)t->len * sizeof *t->tune);
  t->test = malloc((size_t)t->o.test_count * sizeof *t->test);
  int sft = t->o.kind == PULSE_SIM_PROBLEM_TEXT_SFT;
  if (!test_pos || !t->train || !t->tune || !t->test) {
    free(test_pos);
    return pulse_fail(PULSE_ERR_NOMEM, "text problem: split");
  }
  uint64_t ntest = 0;
  for (uint64_t b = 0; b < nblocks; b++) {
    int out = held_out(t, b, nblocks, ntest > 0, t->ntrain > 0);
    /* Text SFT: a third of the others is left for fine-tuning (the last
     * block when the draw left none). */
    int tune = sft && !out &&
               (pulse_rng_at(t->o.seed ^ 0x5F75ull, b) % 3u == 0 ||
                (t->ntune == 0 && b + 2 >= nblocks));
    uint64_t end = (b + 1) * PULSE_SIM_TEXT_BLOCK;
    if (end > t->len)
      end = t->len;
    /* A position predicts text[i] from the k bytes before it. */
    for (uint64_t i = b * PULSE_SIM_TEXT_BLOCK; i < end; i++) {
      if (i < t->k)
        continue;
      if (out)
        test_pos[ntest++] = (uint32_t)i;
      else if (tune)
        t->tune[t->ntune++] = (uint32_t)i;
      else
        t->train[t->ntrain++] = (uint32_t)i;
    }
  }
  if (ntest == 0 || t->ntrain == 0 || (sft && t->ntune == 0)) {
    free(test_pos);
    return pulse_fail(PULSE_ERR_ARG, "text problem: text too short to split");
  }
  uint64_t s = t->o.seed ^ 0x7E57ull;
  for (uint32_t i = 0; i < t->o.test_count; i++)
    t->test[i] = test_pos[pulse_rng_below(&s, ntest)];
  free(test_pos);
  return PULSE_OK;
}

void pulse_sim_text_set_phase(pulse_sim_text *t, int tune) {
  t->phase_tune = tune && t->ntune > 0;
}

/* ---------------------------------------------------------------- model */

uint32_t pulse_sim_text_hidden_for(const pulse_sim_problem_opts *o,
                                  uint64_t params) {
  uint64_t fixed = (uint64_t)V * o->embed + V;
  uint64_t per = (uint64_t)o->context * o->embed + 1u + V;
  uint64_t h = params > fixed ? (params - fixed + per - 1) / per : 1;
  return h < 1 ? 1u : h > 1u << 20 ? 1u << 20 : (uint32_t)h;
}

pulse_status pulse_sim_text_create(const pulse_sim_problem_opts *o,
                                  pulse_sim_text **out) {
  *out = NULL;
  if (o->context == 0 || o->context > 64 || o->embed == 0 || o->embed > 1024 ||
      o->hidden > 1u << 20)
    return pulse_fail(PULSE_ERR_ARG,
                      "text problem: context 1..64, embed 1..1024, hidden "
                      "up to 2^20");
  pulse_sim_text *t = calloc(1, sizeof *t);
  if (t == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "text problem");
  t->o = *o;
  t->k = o->context, t->d = o->embed, t->H = o->hidden;
  t->kd = t->k * t->d;
  t->e = 0;
  t->w1 = (uint64_t)V * t->d;
  t->b1 = t->w1 + (uint64_t)t->kd * t->H;
  t->w2 = t->b1 + t->H;
  t->b2 = t->w2 + (uint64_t)t->H * V;
  t->P = t->b2 + V;
  t->s1 = 1.0f / sqrtf((float)t->kd);
  t->s2 = 1.0f / sqrtf((float)t->H);
  pulse_status st = load_text(t);
  if (st == PULSE_OK)
    st = split(t);
  if (st != PULSE_OK) {
    pulse_sim_text_free(t);
    return st;
  }
  *out = t;
  return PULSE_OK;
}

void pulse_sim_text_free(pulse_sim_text *t) {
  if (t == NULL)
    return;
  free(t->text), free(t->train), free(t->tune), free(t->test);
  free(t);
}

uint64_t pulse_sim_text_param_count(const pulse_sim_text *t) {
  return t->P;
}

uint64_t pulse_sim_text_bytes(const pulse_sim_text *t) {
  return t->len;
}

uint64_t pulse_sim_text_digest(const pulse_sim_text *t) {
  return t->digest;
}

void pulse_sim_text_init(const pulse_sim_text *t, float *theta) {
  uint64_t s = t->o.seed ^ 0x7E47141ull;
  pulse_sim_normals(&s, theta + t->e, t->b1 - t->e);        /* E, W1 */
  pulse_sim_normals(&s, theta + t->w2, (uint64_t)t->H * V); /* W2 */
  for (uint64_t i = 0; i < t->P; i++)
    theta[i] *= t->o.init_scale;
  memset(theta + t->b1, 0, t->H * sizeof *theta);
  memset(theta + t->b2, 0, V * sizeof *theta);
}

/* Sum of a[i] b[i] in 8 fixed lanes, added in a fixed tree: the same bits
 * in any vector width. */
static inline float dot8(const float *a, const float *b, uint32_t n) {
  float acc[8] = {0};
  uint32_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int q = 0; q < 8; q++)
      acc[q] += a[i + q] * b[i + q];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
            ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; i++)
    s += a[i] * b[i];
  return s;
}

/* Forward of the samples at positions pos[0..n): x (n x kd), z and h
 * (n x H), logits (n x V). */
TEXT_SIMD static void forward(const pulse_sim_text *t, const float *theta,
                              const uint32_t *pos, size_t n, float *x, float *z,
                              float *h, float *logits) {
  uint32_t d = t->d, H = t->H, kd = t->kd;
  const float *E = theta + t->e, *W1 = theta + t->w1, *B1 = theta + t->b1,
              *W2 = theta + t->w2, *B2 = theta + t->b2;
  for (size_t b = 0; b < n; b++) {
    float *xb = x + b * kd;
    for (uint32_t c = 0; c < t->k; c++)
      memcpy(xb + c * d, E + (size_t)t->text[pos[b] - t->k + c] * d,
             d * sizeof *xb);
    pulse_sim_mlp_forward_row(xb, kd, t->s1, W1, B1, H, t->s2, W2, B2, V, z + b * H,
                             h + b * H, logits + b * V);
  }
}

/* -log softmax(l)[y] in double; turns l into the probabilities when
 * probs is set. */
static double xent(float *l, uint32_t y, int probs, uint32_t *argmax) {
  float mx = l[0];
  uint32_t am = 0;
  for (uint32_t c = 1; c < V; c++)
    if (l[c] > mx)
      mx = l[c], am = c;
  double sum = 0.0;
  for (uint32_t c = 0; c < V; c++)
    sum += exp((double)(l[c] - mx));
  double loss = log(sum) - (double)(l[y] - mx);
  if (probs)
    for (uint32_t c = 0; c < V; c++)
      l[c] = (float)(exp((double)(l[c] - mx)) / sum);
  if (argmax)
    *argmax = am;
  return loss;
}

void pulse_sim_text_eval(const pulse_sim_text *t, const float *theta,
                        double *loss, double *accuracy) {
  enum { BLOCK = 32 };
  uint32_t H = t->H, kd = t->kd;
  float *x = malloc((size_t)BLOCK * kd * sizeof *x),
        *z = malloc((size_t)BLOCK * H * sizeof *z),
        *h = malloc((size_t)BLOCK * H * sizeof *h),
        *l = malloc((size_t)BLOCK * V * sizeof *l);
  double total = 0.0;
  uint64_t right = 0;
  uint32_t T = t->o.test_count;
  if (x && z && h && l) {
    for (uint32_t a = 0; a < T; a += BLOCK) {
      size_t n = T - a < BLOCK ? T - a : BLOCK;
      forward(t, theta, t->test + a, n, x, z, h, l);
      for (size_t b = 0; b < n; b++) {
        uint32_t y = t->text[t->test[a + b]], am;
        total += xent(l + b * V, y, 0, &am);
        right += am == y;
      }
    }
  } else {
    total = NAN;
  }
  free(x), free(z), free(h), free(l);
  if (loss)
    *loss = total / T;
  if (accuracy)
    *accuracy = (double)right / T;
}

/* -------------------------------------------------------------- learner */

pulse_status pulse_sim_text_scratch_create(const pulse_sim_text *t,
                                          pulse_sim_text_scratch **out) {
  pulse_sim_text_scratch *s = calloc(1, sizeof *s);
  size_t B = t->o.batch;
  if (s != NULL) {
    s->pos = malloc(B * sizeof *s->pos);
    s->x = malloc(B * t->kd * sizeof *s->x);
    s->z = malloc(B * t->H * sizeof *s->z);
    s->h = malloc(B * t->H * sizeof *s->h);
    s->dz = malloc(t->H * sizeof *s->dz);
    s->l = malloc(B * V * sizeof *s->l);
    s->dx = malloc(t->kd * sizeof *s->dx);
  }
  if (s == NULL || !s->pos || !s->x || !s->z || !s->h || !s->dz || !s->l ||
      !s->dx) {
    pulse_sim_text_scratch_free(s);
    return pulse_fail(PULSE_ERR_NOMEM, "text problem: learner buffers");
  }
  *out = s;
  return PULSE_OK;
}

void pulse_sim_text_scratch_free(pulse_sim_text_scratch *s) {
  if (s == NULL)
    return;
  free(s->pos), free(s->x), free(s->z), free(s->h), free(s->dz), free(s->l),
      free(s->dx);
  free(s);
}

TEXT_SIMD double pulse_sim_text_grad(const pulse_sim_text *t,
                                    pulse_sim_text_scratch *s, uint64_t *rng,
                                    const float *theta, float *grad) {
  uint32_t B = t->o.batch, H = t->H, kd = t->kd, d = t->d;
  const uint32_t *from = t->phase_tune ? t->tune : t->train;
  uint64_t n = t->phase_tune ? t->ntune : t->ntrain;
  for (uint32_t b = 0; b < B; b++)
    s->pos[b] = from[pulse_rng_below(rng, n)];
  forward(t, theta, s->pos, B, s->x, s->z, s->h, s->l);
  memset(grad, 0, (size_t)t->P * sizeof *grad);
  float *gE = grad + t->e, *gW1 = grad + t->w1, *gB1 = grad + t->b1,
        *gW2 = grad + t->w2, *gB2 = grad + t->b2;
  const float *W1 = theta + t->w1, *W2 = theta + t->w2;
  float invB = 1.0f / (float)B;
  double loss = 0.0;
  for (uint32_t b = 0; b < B; b++) {
    uint32_t y = t->text[s->pos[b]];
    float *lb = s->l + (size_t)b * V; /* becomes d loss / d logits */
    loss += xent(lb, y, 1, NULL);
    lb[y] -= 1.0f;
    for (uint32_t c = 0; c < V; c++) {
      lb[c] *= invB;
      gB2[c] += lb[c];
    }
    const float *hb = s->h + (size_t)b * H, *xb = s->x + (size_t)b * kd;
    for (uint32_t j = 0; j < H; j++) {
      if (hb[j] == 0.0f) { /* ReLU off: no gradient through j */
        s->dz[j] = 0.0f;
        continue;
      }
      float hj = t->s2 * hb[j];
      float *grow = gW2 + (size_t)j * V;
      for (uint32_t c = 0; c < V; c++)
        grow[c] += hj * lb[c];
      s->dz[j] = t->s2 * dot8(W2 + (size_t)j * V, lb, V);
      gB1[j] += s->dz[j];
    }
    for (uint32_t i = 0; i < kd; i++) {
      float xi = t->s1 * xb[i];
      float *grow = gW1 + (size_t)i * H;
      for (uint32_t j = 0; j < H; j++)
        grow[j] += xi * s->dz[j];
      s->dx[i] = t->s1 * dot8(W1 + (size_t)i * H, s->dz, H);
    }
    for (uint32_t c = 0; c < t->k; c++) {
      float *ge = gE + (size_t)t->text[s->pos[b] - t->k + c] * d;
      for (uint32_t i = 0; i < d; i++)
        ge[i] += s->dx[c * d + i];
    }
  }
  return loss / B;
}
