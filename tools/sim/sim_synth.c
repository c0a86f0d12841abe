/* sim_synth.c - synthetic RL trajectory: tensor table, pretrained state,
 * Adam on synthetic gradients, BF16 view. */
#include "sim_synth.h"

#include "pulse_log.h"
#include "status_impl.h"
#include "rng_impl.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Elements per work unit; each unit draws from its own random stream, so the
 * result does not depend on how units are spread over threads. */
#define SYNTH_UNIT 65536u
/* Per-step correlation of the gradient direction of a parameter. */
#define SYNTH_DIR_RHO 0.95
/* Heavy tail of the noise: this fraction of draws is TAIL_SCALE times wider. */
#define SYNTH_TAIL_PROB 0.05
#define SYNTH_TAIL_SCALE 4.0

/* Random stream purposes (part of the stream key). */
enum { STREAM_TABLE = 1, STREAM_INIT = 2, STREAM_STEP = 3 };

typedef enum {
  KIND_EMBED,  /* token embedding: N(0, 1) */
  KIND_MATRIX, /* linear weights and position embedding: N(0, std^2) */
  KIND_NORM_W, /* layernorm weight: 1 + N(0, std^2) */
  KIND_BIAS    /* biases: N(0, std^2) */
} tensor_kind;

typedef struct {
  double mean, std; /* of the pretrained weights */
  double gscale;    /* gradient magnitude */
  double snr;       /* weight of the persistent direction in the gradient */
} tensor_model;

typedef struct {
  uint32_t tensor;
  uint64_t start, len; /* element range within the tensor */
} work_unit;

struct pulse_synth {
  pulse_synth_opts opts;
  size_t count;
  pulse_synth_tensor *tensors;
  tensor_model *models;
  char *names; /* one allocation holding every name */
  uint64_t total;
  float *w, *m, *v, *dir;
  uint16_t *bf16;
  uint64_t step;
  work_unit *units;
  size_t unit_count;
  int threads;
};

/* ------------------------------------------------------------ randomness */

/* The bulk draws come from xoshiro256** rather than the project's
 * generator (pulse_rng_next, splitmix64): it is the stream every synthetic
 * trajectory, test and published figure was made with, and each block's
 * 256-bit state is keyed independently. Its seeding goes through
 * pulse_rng_next. */
typedef struct {
  uint64_t s[4];
} xoshiro;

static uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

static uint64_t xoshiro_next(xoshiro *r) {
  uint64_t *s = r->s;
  uint64_t result = rotl(s[1] * 5, 7) * 9;
  uint64_t t = s[1] << 17;
  s[2] ^= s[0];
  s[3] ^= s[1];
  s[1] ^= s[2];
  s[0] ^= s[3];
  s[2] ^= t;
  s[3] = rotl(s[3], 45);
  return result;
}

/* A stream keyed by (seed, purpose, step, tensor, start): every key word goes
 * through splitmix64 (pulse_rng_next) so nearby keys give unrelated streams. */
static void xoshiro_seed(xoshiro *r, uint64_t seed, uint64_t purpose,
                         uint64_t step, uint64_t tensor, uint64_t start) {
  uint64_t x = seed;
  uint64_t key[4] = {purpose, step, tensor, start};
  for (int i = 0; i < 4; i++) {
    uint64_t h = pulse_rng_next(&x);
    x = h ^ key[i];
  }
  for (int i = 0; i < 4; i++)
    r->s[i] = pulse_rng_next(&x);
}

/* Uniform in [0, 1). */
static double uniform01(xoshiro *r) {
  return (double)(xoshiro_next(r) >> 11) * 0x1.0p-53;
}

/* Two independent standard normals (Box-Muller). */
static void normal_pair(xoshiro *r, double *z1, double *z2) {
  double u1 = ((double)(xoshiro_next(r) >> 11) + 1.0) * 0x1.0p-53; /* (0,1] */
  double u2 = uniform01(r);
  double rad = sqrt(-2.0 * log(u1));
  double ang = 6.283185307179586 * u2;
  *z1 = rad * cos(ang);
  *z2 = rad * sin(ang);
}

/* Log-uniform in [lo, hi]. */
static double log_uniform(xoshiro *r, double lo, double hi) {
  return lo * exp(log(hi / lo) * uniform01(r));
}

/* ------------------------------------------------------------ the table */

typedef struct {
  uint64_t width, layers, vocab, context;
} table_shape;

static uint64_t fixed_params(uint64_t d, uint64_t layers, uint64_t context) {
  /* position embedding, per layer (qkv 3d*d+3d, out d*d+d, up 4d*d+4d,
   * down d*4d+d, two layernorms 4d), final layernorm 2d */
  return context * d + layers * (12 * d * d + 13 * d) + 2 * d;
}

/* The widest shape (width a multiple of 16, depth ~width/64, context =
 * width) whose vocabulary, filling the rest with embedding + head, still has
 * at least 4*width rows. */
static int choose_shape(uint64_t params, table_shape *out) {
  int found = 0;
  for (uint64_t d = 16; d <= 65536; d += 16) {
    uint64_t layers = (d + 32) / 64;
    if (layers < 1)
      layers = 1;
    uint64_t fixed = fixed_params(d, layers, d);
    if (fixed >= params)
      continue;
    uint64_t vocab = (params - fixed) / (2 * d);
    if (vocab < 4 * d)
      continue;
    out->width = d;
    out->layers = layers;
    out->vocab = vocab;
    out->context = d;
    found = 1;
  }
  return found;
}

typedef struct {
  char name[64];
  uint32_t ndim;
  uint64_t shape[2];
  tensor_kind kind;
  double std_lo, std_hi; /* log-uniform range of the weight std */
} tensor_spec;

static size_t add_spec(tensor_spec *specs, size_t n, const char *name,
                       uint32_t ndim, uint64_t d0, uint64_t d1,
                       tensor_kind kind, double lo, double hi) {
  if (specs != NULL) {
    tensor_spec *t = &specs[n];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->kind = kind;
    t->std_lo = lo;
    t->std_hi = hi;
  }
  return n + 1;
}

/* Lists the tensors of a shape into specs (NULL: only counts them). */
static size_t list_specs(const table_shape *sh, tensor_spec *specs) {
  uint64_t d = sh->width;
  size_t n = 0;
  char name[64];
  n = add_spec(specs, n, "tok_emb.weight", 2, sh->vocab, d, KIND_EMBED, 1.0,
               1.0);
  n = add_spec(specs, n, "pos_emb.weight", 2, sh->context, d, KIND_MATRIX, 0.02,
               0.02);
  for (uint64_t l = 0; l < sh->layers; l++) {
#define LAYER_TENSOR(suffix, ndim, d0, d1, kind, lo, hi)                       \
  do {                                                                         \
    snprintf(name, sizeof name, "blocks.%llu.%s", (unsigned long long)l,       \
             suffix);                                                          \
    n = add_spec(specs, n, name, ndim, d0, d1, kind, lo, hi);                  \
  } while (0)
    LAYER_TENSOR("ln1.weight", 1, d, 0, KIND_NORM_W, 0.01, 0.01);
    LAYER_TENSOR("ln1.bias", 1, d, 0, KIND_BIAS, 0.005, 0.02);
    LAYER_TENSOR("attn.qkv.weight", 2, 3 * d, d, KIND_MATRIX, 0.03, 0.06);
    LAYER_TENSOR("attn.qkv.bias", 1, 3 * d, 0, KIND_BIAS, 0.005, 0.04);
    LAYER_TENSOR("attn.out.weight", 2, d, d, KIND_MATRIX, 0.02, 0.05);
    LAYER_TENSOR("attn.out.bias", 1, d, 0, KIND_BIAS, 0.005, 0.04);
    LAYER_TENSOR("ln2.weight", 1, d, 0, KIND_NORM_W, 0.01, 0.01);
    LAYER_TENSOR("ln2.bias", 1, d, 0, KIND_BIAS, 0.005, 0.02);
    LAYER_TENSOR("mlp.up.weight", 2, 4 * d, d, KIND_MATRIX, 0.03, 0.05);
    LAYER_TENSOR("mlp.up.bias", 1, 4 * d, 0, KIND_BIAS, 0.01, 0.04);
    LAYER_TENSOR("mlp.down.weight", 2, d, 4 * d, KIND_MATRIX, 0.02, 0.035);
    LAYER_TENSOR("mlp.down.bias", 1, d, 0, KIND_BIAS, 0.005, 0.04);
#undef LAYER_TENSOR
  }
  n = add_spec(specs, n, "ln_f.weight", 1, d, 0, KIND_NORM_W, 0.01, 0.01);
  n = add_spec(specs, n, "ln_f.bias", 1, d, 0, KIND_BIAS, 0.005, 0.03);
  n = add_spec(specs, n, "head.weight", 2, sh->vocab, d, KIND_MATRIX, 0.03,
               0.06);
  return n;
}

/* ------------------------------------------------------------ the workers */

typedef struct {
  pulse_synth *s;
  int init; /* 1: draw the pretrained state; 0: one optimizer step */
  atomic_size_t next;
  /* step constants (PyTorch Adam, FP32) */
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, step_size,
      bc2_sqrt, decay;
} work_job;

static void run_unit_init(const pulse_synth *s, const work_unit *u) {
  const pulse_synth_tensor *t = &s->tensors[u->tensor];
  const tensor_model *tm = &s->models[u->tensor];
  xoshiro r;
  xoshiro_seed(&r, s->opts.seed, STREAM_INIT, 0, u->tensor, u->start);
  uint64_t base = t->offset + u->start;
  for (uint64_t i = 0; i < u->len; i++) {
    double z1, z2;
    normal_pair(&r, &z1, &z2);
    s->w[base + i] = (float)(tm->mean + tm->std * z1);
    s->dir[base + i] = (float)z2;
    s->m[base + i] = 0.0f;
    s->v[base + i] = 0.0f;
  }
  pulse_bf16_cast_f32(s->w + base, s->bf16 + base, u->len);
}

static void run_unit_step(const pulse_synth *s, const work_job *job,
                          const work_unit *u) {
  const pulse_synth_tensor *t = &s->tensors[u->tensor];
  const tensor_model *tm = &s->models[u->tensor];
  xoshiro r;
  xoshiro_seed(&r, s->opts.seed, STREAM_STEP, s->step + 1, u->tensor, u->start);
  const double rho = SYNTH_DIR_RHO;
  const double innov = sqrt(1.0 - SYNTH_DIR_RHO * SYNTH_DIR_RHO);
  uint64_t base = t->offset + u->start;
  float *w = s->w + base, *m = s->m + base, *v = s->v + base,
        *dir = s->dir + base;
  for (uint64_t i = 0; i < u->len; i++) {
    double z1, z2;
    normal_pair(&r, &z1, &z2);
    double tail = uniform01(&r) < SYNTH_TAIL_PROB ? SYNTH_TAIL_SCALE : 1.0;
    double d = rho * (double)dir[i] + innov * z1;
    dir[i] = (float)d;
    float g = (float)(tm->gscale * (tm->snr * d + tail * z2));
    /* PyTorch Adam(W): decay, moments, then p -= step_size * m / denom. */
    float p = w[i] * job->decay;
    float mi = job->beta1 * m[i] + job->one_minus_beta1 * g;
    float vi = job->beta2 * v[i] + job->one_minus_beta2 * g * g;
    float denom = sqrtf(vi) / job->bc2_sqrt + job->eps;
    p = p - job->step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    w[i] = p;
  }
  /* The project's one rounding (pulse_elem.h), vectorized. */
  pulse_bf16_cast_f32(w, s->bf16 + base, u->len);
}

static void *work_main(void *arg) {
  work_job *job = arg;
  pulse_synth *s = job->s;
  for (;;) {
    size_t k = atomic_fetch_add(&job->next, 1);
    if (k >= s->unit_count)
      break;
    if (job->init)
      run_unit_init(s, &s->units[k]);
    else
      run_unit_step(s, job, &s->units[k]);
  }
  return NULL;
}

static pulse_status run_job(pulse_synth *s, work_job *job) {
  atomic_init(&job->next, 0);
  int n = s->threads;
  if ((size_t)n > s->unit_count)
    n = (int)s->unit_count;
  if (n <= 1) {
    work_main(job);
    return PULSE_OK;
  }
  pthread_t *tids = calloc((size_t)n, sizeof *tids);
  if (tids == NULL)
    return PULSE_ERR_NOMEM;
  int started = 0;
  for (; started < n - 1; started++)
    if (pthread_create(&tids[started], NULL, work_main, job) != 0)
      break;
  work_main(job); /* this thread works too, and finishes what others could
                     not start for */
  for (int i = 0; i < started; i++)
    pthread_join(tids[i], NULL);
  free(tids);
  return PULSE_OK;
}

/* ------------------------------------------------------------ public API */

void pulse_synth_free(pulse_synth *s) {
  if (s == NULL)
    return;
  free(s->tensors);
  free(s->models);
  free(s->names);
  free(s->w);
  free(s->m);
  free(s->v);
  free(s->dir);
  free(s->bf16);
  free(s->units);
  free(s);
}

static void model_for(const tensor_spec *sp, xoshiro *r, tensor_model *tm) {
  double std = sp->std_lo == sp->std_hi
                   ? sp->std_lo
                   : log_uniform(r, sp->std_lo, sp->std_hi);
  tm->mean = sp->kind == KIND_NORM_W ? 1.0 : 0.0;
  tm->std = std;
  tm->gscale = log_uniform(r, 1e-4, 1e-2);
  tm->snr = log_uniform(r, 0.4, 1.2);
}

void pulse_synth_opts_init(pulse_synth_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_SYNTH_OPTS_VERSION;
  o->params = 10000000u;
  o->seed = 1u;
  o->lr = 2e-6;
  o->beta1 = 0.9;
  o->beta2 = 0.999;
  o->eps = 1e-8;
}

pulse_status pulse_synth_create(const pulse_synth_opts *opts,
                                pulse_synth **out) {
  if (opts == NULL || out == NULL)
    return PULSE_ERR_ARG;
  *out = NULL;
  pulse_status vst = PULSE_OPTS_CHECK("synth", opts, PULSE_SYNTH_OPTS_VERSION);
  if (vst != PULSE_OK) {
    PULSE_LOG_AT(PULSE_LOG_ERROR, "%s", pulse_error_detail());
    return vst;
  }
  if (opts->params < PULSE_SYNTH_MIN_PARAMS || opts->params > (1ull << 40) ||
      !(opts->lr >= 0.0) || !(opts->beta1 >= 0.0 && opts->beta1 < 1.0) ||
      !(opts->beta2 >= 0.0 && opts->beta2 < 1.0) || !(opts->eps > 0.0) ||
      !(opts->weight_decay >= 0.0) || opts->threads < 0) {
    PULSE_LOG_AT(PULSE_LOG_ERROR,
                 "synth: bad options (params %llu, at least %u; lr %g; "
                 "betas %g %g; eps %g; weight decay %g; threads %d)",
                 (unsigned long long)opts->params, PULSE_SYNTH_MIN_PARAMS,
                 opts->lr, opts->beta1, opts->beta2, opts->eps,
                 opts->weight_decay, opts->threads);
    return PULSE_ERR_ARG;
  }
  table_shape sh;
  if (!choose_shape(opts->params, &sh)) {
    PULSE_LOG_AT(PULSE_LOG_ERROR, "synth: no table shape for %llu params",
                 (unsigned long long)opts->params);
    return PULSE_ERR_ARG;
  }
  pulse_synth *s = calloc(1, sizeof *s);
  if (s == NULL)
    return PULSE_ERR_NOMEM;
  s->opts = *opts;
  s->count = list_specs(&sh, NULL);
  tensor_spec *specs = calloc(s->count, sizeof *specs);
  s->tensors = calloc(s->count, sizeof *s->tensors);
  s->models = calloc(s->count, sizeof *s->models);
  s->names = calloc(s->count, sizeof specs->name);
  if (specs == NULL || s->tensors == NULL || s->models == NULL ||
      s->names == NULL)
    goto nomem;
  list_specs(&sh, specs);

  xoshiro table_rng;
  xoshiro_seed(&table_rng, opts->seed, STREAM_TABLE, 0, 0, 0);
  uint64_t offset = 0;
  for (size_t i = 0; i < s->count; i++) {
    pulse_synth_tensor *t = &s->tensors[i];
    char *name = s->names + i * sizeof specs->name;
    memcpy(name, specs[i].name, sizeof specs->name);
    t->info.name = name;
    t->info.dtype = PULSE_DTYPE_BF16;
    t->info.ndim = specs[i].ndim;
    t->numel = 1;
    for (uint32_t k = 0; k < specs[i].ndim; k++) {
      t->info.shape[k] = specs[i].shape[k];
      t->numel *= specs[i].shape[k];
    }
    t->offset = offset;
    offset += t->numel;
    s->unit_count += (size_t)((t->numel + SYNTH_UNIT - 1) / SYNTH_UNIT);
    model_for(&specs[i], &table_rng, &s->models[i]);
  }
  s->total = offset;
  free(specs);
  specs = NULL;

  s->units = calloc(s->unit_count, sizeof *s->units);
  size_t bytes32 = (size_t)s->total * sizeof(float);
  s->w = malloc(bytes32);
  s->m = malloc(bytes32);
  s->v = malloc(bytes32);
  s->dir = malloc(bytes32);
  s->bf16 = malloc((size_t)s->total * sizeof(uint16_t));
  if (s->units == NULL || s->w == NULL || s->m == NULL || s->v == NULL ||
      s->dir == NULL || s->bf16 == NULL)
    goto nomem;
  size_t k = 0;
  for (size_t i = 0; i < s->count; i++)
    for (uint64_t st = 0; st < s->tensors[i].numel; st += SYNTH_UNIT) {
      uint64_t left = s->tensors[i].numel - st;
      s->units[k].tensor = (uint32_t)i;
      s->units[k].start = st;
      s->units[k].len = left < SYNTH_UNIT ? left : SYNTH_UNIT;
      k++;
    }

  s->threads = opts->threads;
  if (s->threads == 0) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    s->threads = cores > 0 ? (int)cores : 1;
  }
  work_job job = {.s = s, .init = 1};
  pulse_status st = run_job(s, &job);
  if (st != PULSE_OK) {
    pulse_synth_free(s);
    return st;
  }
  *out = s;
  return PULSE_OK;

nomem:
  free(specs);
  pulse_synth_free(s);
  PULSE_LOG_AT(PULSE_LOG_ERROR, "synth: out of memory for %llu params",
               (unsigned long long)opts->params);
  return PULSE_ERR_NOMEM;
}

pulse_status pulse_synth_step(pulse_synth *s) {
  if (s == NULL)
    return PULSE_ERR_ARG;
  const pulse_synth_opts *o = &s->opts;
  double t = (double)(s->step + 1);
  double bc1 = 1.0 - pow(o->beta1, t);
  double bc2 = 1.0 - pow(o->beta2, t);
  work_job job = {.s = s, .init = 0};
  job.beta1 = (float)o->beta1;
  job.beta2 = (float)o->beta2;
  job.one_minus_beta1 = (float)(1.0 - o->beta1);
  job.one_minus_beta2 = (float)(1.0 - o->beta2);
  job.eps = (float)o->eps;
  job.step_size = (float)(o->lr / bc1);
  job.bc2_sqrt = (float)sqrt(bc2);
  job.decay = (float)(1.0 - o->lr * o->weight_decay);
  pulse_status st = run_job(s, &job);
  if (st == PULSE_OK)
    s->step++;
  return st;
}

uint64_t pulse_synth_step_index(const pulse_synth *s) {
  return s ? s->step : 0;
}

uint64_t pulse_synth_param_count(const pulse_synth *s) {
  return s ? s->total : 0;
}

size_t pulse_synth_tensor_count(const pulse_synth *s) {
  return s ? s->count : 0;
}

const pulse_synth_tensor *pulse_synth_tensor_get(const pulse_synth *s,
                                                 size_t i) {
  if (s == NULL || i >= s->count)
    return NULL;
  return &s->tensors[i];
}

const float *pulse_synth_master(const pulse_synth *s) {
  return s ? s->w : NULL;
}

const uint16_t *pulse_synth_bf16(const pulse_synth *s) {
  return s ? s->bf16 : NULL;
}
