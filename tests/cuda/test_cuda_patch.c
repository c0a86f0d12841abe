/* test_cuda_patch.c - patches from and to device tensors against the CPU:
 * pulse_cuda_patch_encode gives the bytes of pulse_patch_encode (both
 * position models, F32 and BF16 weights, edge values, densities 0..100%,
 * multi-tensor tables) and updates the snapshots only once the patch exists;
 * pulse_cuda_patch_apply gives the tensors of pulse_patch_apply, and on any
 * error writes nothing; so does the streamed apply, fed in random slices. */
#include "cuda_testutil.h"
#include "parallel_impl.h"
#include "pulse_codec_stream.h"

/* A trainer's table: current weights and snapshots, host and device. */
typedef struct {
  size_t count;
  char (*name)[32];
  pulse_tensor_info *info;
  pulse_dtype *dtype;
  uint64_t *numel;
  void **cur;
  uint16_t **snap;
  void **cur_d;
  uint16_t **snap_d;
} pt_table;

static pt_table pt_make(uint64_t seed, size_t count, const uint64_t *numel,
                        tu_values kind, double density, int upload) {
  pt_table p = {count,
                tu_alloc((count + 1) * 32),
                tu_alloc((count + 1) * sizeof(pulse_tensor_info)),
                tu_alloc((count + 1) * sizeof(pulse_dtype)),
                tu_alloc((count + 1) * 8),
                tu_alloc((count + 1) * sizeof(void *)),
                tu_alloc((count + 1) * sizeof(uint16_t *)),
                tu_alloc((count + 1) * sizeof(void *)),
                tu_alloc((count + 1) * sizeof(uint16_t *))};
  for (size_t t = 0; t < count; t++) {
    uint64_t n = numel[t];
    snprintf(p.name[t], 32, "layer.%u.weight", (unsigned)(t % 1000000u));
    p.dtype[t] = (seed + t) % 3 == 0 ? PULSE_DTYPE_BF16 : PULSE_DTYPE_F32;
    p.numel[t] = n;
    pulse_tensor_info info = {p.name[t], PULSE_DTYPE_BF16, 1, {n}};
    if (n % 64 == 0 && n > 0) { /* some two-dimensional */
      info.ndim = 2;
      info.shape[0] = n / 64;
      info.shape[1] = 64;
    }
    p.info[t] = info;
    p.cur[t] = tu_alloc((size_t)n * pulse_dtype_size(p.dtype[t]));
    p.snap[t] = tu_alloc((size_t)n * 2);
    tu_make_case(seed * 1000 + t, n, p.dtype[t], kind, density, p.cur[t],
                 p.snap[t]);
    if (upload) {
      p.cur_d[t] =
          dev_upload(p.cur[t], (size_t)n * pulse_dtype_size(p.dtype[t]));
      p.snap_d[t] = dev_upload(p.snap[t], (size_t)n * 2);
    }
  }
  return p;
}

static void pt_free(pt_table *p) {
  for (size_t t = 0; t < p->count; t++) {
    free(p->cur[t]), free(p->snap[t]);
    pulse_cuda_free(p->cur_d[t]), pulse_cuda_free(p->snap_d[t]);
  }
  free(p->name), free(p->info), free(p->dtype), free(p->numel), free(p->cur),
      free(p->snap);
  free(p->cur_d), free(p->snap_d);
}

/* The CPU patch of a table (snapshots as base, unchanged) and its changes. */
typedef struct {
  pulse_changes *ch;
  pulse_encode_tensor *enc;
} cpu_patch;

static void cpu_encode(const pt_table *p, const pulse_encode_opts *o, int fast,
                       pulse_buffer *out, cpu_patch *cp) {
  cp->ch = tu_alloc((p->count + 1) * sizeof *cp->ch);
  cp->enc = tu_alloc((p->count + 1) * sizeof *cp->enc);
  for (size_t t = 0; t < p->count; t++) {
    uint16_t *scratch = tu_alloc((size_t)p->numel[t] * 2);
    memcpy(scratch, p->snap[t], (size_t)p->numel[t] * 2);
    cp->ch[t] = (pulse_changes)PULSE_CHANGES_INIT;
    if (fast)
      OK(pulse_detect_fast(p->cur[t], p->dtype[t], scratch, p->numel[t], 0, 0,
                           &cp->ch[t]));
    else
      OK(pulse_detect_ref(p->cur[t], p->dtype[t], scratch, p->numel[t], 0,
                          &cp->ch[t]));
    free(scratch);
    cp->enc[t] = (pulse_encode_tensor){p->info[t], p->snap[t], &cp->ch[t], NULL,
                                       NULL,       NULL,       NULL};
  }
  OK(pulse_patch_encode(o, cp->enc, p->count, out));
}

static void cpu_patch_free(cpu_patch *cp, size_t count) {
  for (size_t t = 0; t < count; t++)
    pulse_changes_free(&cp->ch[t]);
  free(cp->ch), free(cp->enc);
}

/* Encodes on the device (update_snapshot on) and checks bytes, digests and
 * the snapshots against the CPU. */
static void check_encode(pulse_cuda_workspace *ws, pt_table *p,
                         const pulse_encode_opts *o, int give_digests,
                         int large, const char *what) {
  pulse_buffer want, got;
  cpu_patch cp;
  cpu_encode(p, o, large, &want, &cp);
  pulse_cuda_encode_tensor *dt = tu_alloc((p->count + 1) * sizeof *dt);
  pulse_tensor_digest *base = tu_alloc((p->count + 1) * sizeof *base);
  pulse_tensor_digest *target = tu_alloc((p->count + 1) * sizeof *target);
  for (size_t t = 0; t < p->count; t++) {
    base[t] = pulse_digest_bf16(p->snap[t], p->numel[t]);
    dt[t] = (pulse_cuda_encode_tensor){p->info[t], p->cur_d[t], p->dtype[t],
                                       p->snap_d[t],
                                       give_digests && t % 2 ? &base[t] : NULL};
  }
  OK(pulse_cuda_patch_encode(ws, o, dt, p->count, 1, NULL, &got, target));
  cr_assert_eq(got.size, want.size, "%s: %zu bytes, CPU %zu", what, got.size,
               want.size);
  cr_assert_eq(tu_memdiff(got.data, want.data, got.size), -1,
               "%s: bytes differ", what);
  for (size_t t = 0; t < p->count; t++) {
    pulse_tensor_digest d = pulse_digest_apply_changes(base[t], &cp.ch[t]);
    cr_assert(target[t].a == d.a && target[t].b == d.b,
              "%s: tensor %zu target digest", what, t);
    uint16_t *snap = dev_download(p->snap_d[t], (size_t)p->numel[t] * 2);
    for (uint64_t j = 0; j < cp.ch[t].count; j++)
      p->snap[t][cp.ch[t].pos[j]] = cp.ch[t].new_bits[j];
    cr_assert_eq(tu_memdiff(snap, p->snap[t], (size_t)p->numel[t] * 2), -1,
                 "%s: tensor %zu snapshot after the step", what, t);
    free(snap);
  }
  pulse_buffer_free(&want), pulse_buffer_free(&got);
  cpu_patch_free(&cp, p->count);
  free(dt), free(base), free(target);
}

Test(cuda_patch, encode_gives_the_cpu_bytes) {
  GPU_TEST_START();
  static const uint64_t sizes[] = {0, 1, 640, 1000, 4096, 8193, 33000, 70001};
  static const double densities[] = {0.0, 0.01, 0.2, 1.0};
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  for (size_t di = 0; di < COUNT_OF(densities); di++)
    for (int model = 0; model < 2; model++)
      for (int kind = 0; kind < 4; kind += 1 + (di % 2)) {
        pulse_encode_opts o;
        pulse_encode_opts_init(&o);
        o.pos_model = model ? PULSE_POS_CLASS : PULSE_POS_PLAIN;
        o.format_version =
            kind == 2 ? 3 : 0; /* version 3's model from the rank form */
        o.chunk_log2 = (di + (size_t)kind) % 2 ? 10 : 14;
        o.threads = 0;
        o.step = 7 + di;
        o.base_step = 6 + di;
        char what[96];
        snprintf(what, sizeof what, "density %g model %d kind %d chunk 2^%u",
                 densities[di], model, kind, o.chunk_log2);
        pt_table p = pt_make(10 * di + (size_t)kind, COUNT_OF(sizes), sizes,
                             (tu_values)kind, densities[di], 1);
        check_encode(ws, &p, &o, kind % 2, 0, what);
        /* A second step from the updated snapshots: nothing changed. */
        check_encode(ws, &p, &o, 1, 0, what);
        pt_free(&p);
      }
  pulse_cuda_workspace_free(ws);
}

/* ------------------------------------------------------------------ apply */

/* A patch from a base table to random targets, made on the CPU. */
typedef struct {
  pt_table base; /* snap: the base bits; cur unused on the device */
  pulse_buffer bytes;
  pulse_patch *patch;
} apply_case;

static apply_case apply_make_version(uint64_t seed, size_t count, const uint64_t *numel,
                                     tu_values kind, double density, pulse_pos_model model,
                                     uint32_t chunk_log2, unsigned version) {
  apply_case ac;
  ac.base = pt_make(seed, count, numel, kind, density, 0);
  pulse_encode_opts o;
  pulse_encode_opts_init(&o);
  o.pos_model = model;
  o.chunk_log2 = chunk_log2;
  o.format_version = version;
  o.threads = 0;
  cpu_patch cp;
  cpu_encode(&ac.base, &o, 0, &ac.bytes, &cp);
  cpu_patch_free(&cp, count);
  OK(pulse_patch_open(ac.bytes.data, ac.bytes.size, &ac.patch));
  for (size_t t = 0; t < count; t++)
    ac.base.snap_d[t] = dev_upload(ac.base.snap[t], (size_t)numel[t] * 2);
  return ac;
}

static apply_case apply_make(uint64_t seed, size_t count, const uint64_t *numel,
                             tu_values kind, double density,
                             pulse_pos_model model, uint32_t chunk_log2) {
  return apply_make_version(seed, count, numel, kind, density, model, chunk_log2, 0);
}

static void apply_free(apply_case *ac) {
  pulse_patch_free(ac->patch);
  pulse_buffer_free(&ac->bytes);
  pt_free(&ac->base);
}

/* Applies on the CPU (to host copies) and the device, compares tensors and
 * digests. Targets come in another order than the table's; `partial` drops
 * every third (a shard holder); `give_digests` passes some current digests. */
static void check_apply(pulse_cuda_workspace *ws, apply_case *ac,
                        int give_digests, int partial, const char *what) {
  size_t n = ac->base.count;
  pulse_host_tensor *host = tu_alloc((n + 1) * sizeof *host);
  pulse_cuda_target *dev = tu_alloc((n + 1) * sizeof *dev);
  pulse_tensor_digest *given = tu_alloc((n + 1) * sizeof *given);
  pulse_tensor_digest *after = tu_alloc((n + 1) * sizeof *after);
  size_t m = 0;
  for (size_t k = 0; k < n; k++) {
    size_t t =
        (k * 7 + 3) %
        n; /* another order than the table's (n is not a multiple of 7) */
    if (partial && t % 3 == 1)
      continue;
    uint16_t *copy = tu_alloc((size_t)ac->base.numel[t] * 2);
    memcpy(copy, ac->base.snap[t], (size_t)ac->base.numel[t] * 2);
    given[m] = pulse_digest_bf16(copy, ac->base.numel[t]);
    host[m] =
        (pulse_host_tensor){ac->base.name[t], copy, ac->base.numel[t], NULL};
    dev[m] = (pulse_cuda_target){ac->base.name[t], ac->base.snap_d[t],
                                 ac->base.numel[t],
                                 give_digests && t % 2 ? &given[m] : NULL};
    m++;
  }
  pulse_apply_opts o;
  pulse_apply_opts_init(&o);
  o.threads = 0;
  o.partial_table = partial;
  OK(pulse_patch_apply(ac->patch, host, m, &o));
  OK(pulse_cuda_patch_apply(ws, ac->patch, dev, m, &o, NULL, after));
  for (size_t j = 0; j < m; j++) {
    uint16_t *got = dev_download(dev[j].data_d, (size_t)dev[j].numel * 2);
    cr_assert_eq(tu_memdiff(got, host[j].data, (size_t)dev[j].numel * 2), -1,
                 "%s: tensor %s", what, dev[j].name);
    pulse_tensor_digest d = pulse_digest_bf16(host[j].data, host[j].numel);
    cr_assert(after[j].a == d.a && after[j].b == d.b, "%s: tensor %s digest",
              what, dev[j].name);
    free(got);
    free(host[j].data);
  }
  free(host), free(dev), free(given), free(after);
}

static const uint64_t apply_sizes[] = {1,     640,   1000, 4096, 8193,
                                       33000, 70001, 0,    129};

Test(cuda_patch, apply_gives_the_cpu_tensors) {
  GPU_TEST_START();
  static const double densities[] = {0.0, 0.01, 0.3, 1.0};
  pulse_cuda_workspace *ws = NULL;
  OK(pulse_cuda_workspace_create(&ws));
  for (size_t di = 0; di < COUNT_OF(densities); di++)
    for (int model = 0; model < 2; model++)
      for (int variant = 0; variant < 3; variant++) {
        uint32_t chunk_log2 = (di + (size_t)variant) % 2 ? 10 : 15;
        apply_case ac =
            apply_make(50 + di * 8 + (size_t)model * 3 + (size_t)variant,
                       COUNT_OF(apply_sizes), apply_sizes,
                       (tu_values)((di + (size_t)variant) % 4), densities[di],
                       model ? PULSE_POS_CLASS : PULSE_POS_PLAIN, chunk_log2);
        char what[96];
        snprintf(what, sizeof what, "density %g model %d variant %d chunk 2^%u",
                 densities[di], model, variant, chunk_log2);
        check_apply(variant == 2 ? NULL : ws, &ac, variant == 1, variant == 2,
                    what);
        apply_free(&ac);
      }
  pulse_cuda_workspace_free(ws);
}

/* Every target as it was. */
static void check_untouched(apply_case *ac, const char *what) {
  for (size_t t = 0; t < ac->base.count; t++) {
    uint16_t *got =
        dev_download(ac->base.snap_d[t], (size_t)ac->base.numel[t] * 2);
    cr_assert_eq(
        tu_memdiff(got, ac->base.snap[t], (size_t)ac->base.numel[t] * 2), -1,
        "%s: tensor %zu was written", what, t);
    free(got);
  }
}

static pulse_status apply_all(apply_case *ac,
                              const pulse_tensor_digest *claimed) {
  size_t n = ac->base.count;
  pulse_cuda_target *dev = tu_alloc((n + 1) * sizeof *dev);
  for (size_t t = 0; t < n; t++)
    dev[t] =
        (pulse_cuda_target){ac->base.name[t], ac->base.snap_d[t],
                            ac->base.numel[t], claimed ? &claimed[t] : NULL};
  pulse_status st =
      pulse_cuda_patch_apply(NULL, ac->patch, dev, n, NULL, NULL, NULL);
  free(dev);
  return st;
}

Test(cuda_patch, a_failed_apply_writes_nothing) {
  GPU_TEST_START();
  for (int model = 0; model < 2; model++) {
    apply_case ac = apply_make(900 + (uint64_t)model, COUNT_OF(apply_sizes),
                               apply_sizes, TU_NORMAL, 0.05,
                               model ? PULSE_POS_CLASS : PULSE_POS_PLAIN, 10);
    size_t n = ac.base.count;
    /* Another base: one bit flipped at a position the patch changes. */
    pulse_changes ch = PULSE_CHANGES_INIT;
    OK(pulse_patch_decode_tensor(ac.patch, 5, ac.base.snap[5], ac.base.numel[5],
                                 &ch));
    cr_assert_gt(ch.count, 0);
    uint64_t where = ch.pos[0];
    pulse_changes_free(&ch);
    uint16_t good = ac.base.snap[5][where];
    ac.base.snap[5][where] ^= 1; /* same class: the class counts agree */
    OK(pulse_cuda_upload(ac.base.snap_d[5] + where, &ac.base.snap[5][where], 2,
                         NULL));
    cr_assert_eq(apply_all(&ac, NULL), PULSE_ERR_BASE_DIGEST);
    check_untouched(&ac, "another base");
    /* The same, with the caller claiming the patch's base digests: the
     * result is checked before anything is written. */
    pulse_tensor_digest *claimed = tu_alloc((n + 1) * sizeof *claimed);
    for (size_t t = 0; t < n; t++) {
      pulse_patch_tensor pt;
      OK(pulse_patch_tensor_get(ac.patch, t, &pt));
      claimed[t] = pt.base_digest;
    }
    cr_assert_eq(apply_all(&ac, claimed), PULSE_ERR_TARGET_DIGEST, "model %d",
                 model);
    check_untouched(&ac, "claimed base digests");
    ac.base.snap[5][where] = good;
    OK(pulse_cuda_upload(ac.base.snap_d[5] + where, &good, 2, NULL));
    /* A damaged chunk stream: the first damage (from the end of the body)
     * that the CPU refuses must be refused on the device too. */
    int refused = 0;
    for (size_t back = 1; back < 200 && back < ac.bytes.size && !refused;
         back += 3) {
      pulse_patch_free(ac.patch);
      ac.patch = NULL;
      ac.bytes.data[ac.bytes.size - back] ^= 0x55;
      if (pulse_patch_open(ac.bytes.data, ac.bytes.size, &ac.patch) ==
          PULSE_OK) {
        pulse_host_tensor *host = tu_alloc((n + 1) * sizeof *host);
        for (size_t t = 0; t < n; t++) {
          host[t] = (pulse_host_tensor){
              ac.base.name[t], tu_alloc((size_t)ac.base.numel[t] * 2 + 2),
              ac.base.numel[t], NULL};
          memcpy(host[t].data, ac.base.snap[t], (size_t)ac.base.numel[t] * 2);
        }
        pulse_status cpu = pulse_patch_apply(ac.patch, host, n, NULL);
        if (cpu != PULSE_OK) {
          refused = 1;
          cr_assert_eq(apply_all(&ac, NULL), cpu, "model %d: damage at -%zu",
                       model, back);
          check_untouched(&ac, "damaged stream");
        }
        for (size_t t = 0; t < n; t++)
          free(host[t].data);
        free(host);
        pulse_patch_free(ac.patch);
        ac.patch = NULL;
      }
      ac.bytes.data[ac.bytes.size - back] ^= 0x55;
    }
    cr_assert(refused, "model %d: no damage was refused", model);
    OK(pulse_patch_open(ac.bytes.data, ac.bytes.size, &ac.patch));
    /* A missing target. */
    pulse_cuda_target none = {"nothing", ac.base.snap_d[0], ac.base.numel[0],
                              NULL};
    cr_assert_eq(
        pulse_cuda_patch_apply(NULL, ac.patch, &none, 1, NULL, NULL, NULL),
        PULSE_ERR_NOT_FOUND);
    free(claimed);
    apply_free(&ac);
  }
}

/* ----------------------------------------------------------- streamed apply */

/* The CPU's result (or status) for `bytes` on host copies of the base. */
static pulse_status cpu_result(apply_case *ac, const uint8_t *bytes, uint16_t **out) {
  size_t n = ac->base.count;
  pulse_host_tensor *host = tu_alloc((n + 1) * sizeof *host);
  for (size_t t = 0; t < n; t++) {
    out[t] = tu_alloc((size_t)ac->base.numel[t] * 2 + 2);
    memcpy(out[t], ac->base.snap[t], (size_t)ac->base.numel[t] * 2);
    host[t] = (pulse_host_tensor){ac->base.name[t], out[t], ac->base.numel[t], NULL};
  }
  pulse_patch *p = NULL;
  pulse_status st = pulse_patch_open(bytes, ac->bytes.size, &p);
  if (st == PULSE_OK)
    st = pulse_patch_apply(p, host, n, NULL);
  pulse_patch_free(p);
  free(host);
  return st;
}

/* Streams `bytes` into the device targets: they arrive in random slices
 * into a buffer holding garbage past them, the patch opens once its table
 * is there, and finish is tried once before the last byte. */
static pulse_status stream_to_device(apply_case *ac, const uint8_t *bytes, uint64_t seed) {
  size_t n = ac->base.count, size = ac->bytes.size;
  pulse_cuda_target *dev = tu_alloc((n + 1) * sizeof *dev);
  for (size_t t = 0; t < n; t++)
    dev[t] = (pulse_cuda_target){ac->base.name[t], ac->base.snap_d[t], ac->base.numel[t], NULL};
  uint8_t *buf = tu_alloc(size + 1);
  memset(buf, 0xA5, size);
  pulse_patch *p = NULL;
  pulse_cuda_patch_stream *s = NULL;
  pulse_status st = PULSE_OK;
  size_t avail = 0, need = 0;
  int early_finish = 0;
  pulse_apply_opts o;
  pulse_apply_opts_init(&o);
  o.threads = 1 + (int)(seed % 3);
  while (st == PULSE_OK && avail < size) {
    size_t slice = 1 + (size_t)(pulse_rng_next(&seed) % 700);
    if (slice > size - avail)
      slice = size - avail;
    memcpy(buf + avail, bytes + avail, slice);
    avail += slice;
    if (p == NULL) {
      st = pulse_patch_stream_need(buf, avail, &need);
      if (st == PULSE_OK && avail >= need) {
        st = pulse_patch_open(buf, size, &p);
        if (st == PULSE_OK)
          st = pulse_cuda_patch_stream_begin(NULL, p, dev, n, &o, NULL, &s);
      }
    }
    if (s != NULL)
      pulse_cuda_patch_stream_feed(s, avail);
    if (s != NULL && !early_finish && avail < size) {
      early_finish = 1;
      cr_assert_eq(pulse_cuda_patch_stream_finish(s), PULSE_ERR_TRUNCATED);
    }
  }
  if (st == PULSE_OK)
    st = pulse_cuda_patch_stream_finish(s);
  if (st == PULSE_OK)
    st = pulse_cuda_patch_stream_commit(s, NULL);
  pulse_cuda_patch_stream_free(s);
  pulse_patch_free(p);
  free(buf), free(dev);
  return st;
}

/* Back to the base on the device. */
static void reset_device(apply_case *ac) {
  for (size_t t = 0; t < ac->base.count; t++)
    OK(pulse_cuda_upload(ac->base.snap_d[t], ac->base.snap[t], (size_t)ac->base.numel[t] * 2,
                         NULL));
}

/* Streamed, the device ends where the CPU does, for both position models
 * and both format versions; a flipped byte anywhere fails where the CPU
 * fails, writing nothing, and otherwise ends where the CPU ends. */
Test(cuda_patch, streamed_apply_gives_the_cpu_result_and_refuses_what_it_refuses) {
  GPU_TEST_START();
  static const char *const names[] = {"plain", "class", "class v1", "class v3",
                                      "plain v3"};
  static const unsigned versions[] = {0, 0, 1, 3, 3};
  for (int coding = 0; coding < 5; coding++) {
    apply_case ac = apply_make_version(
        1300 + (uint64_t)coding, COUNT_OF(apply_sizes), apply_sizes, TU_NORMAL,
        0.03, coding == 0 || coding == 4 ? PULSE_POS_PLAIN : PULSE_POS_CLASS,
        10, versions[coding]);
    size_t n = ac.base.count;
    uint16_t **want = tu_alloc((n + 1) * sizeof *want);
    OK(cpu_result(&ac, ac.bytes.data, want));
    OK(stream_to_device(&ac, ac.bytes.data, 7 + (uint64_t)coding));
    for (size_t t = 0; t < n; t++) {
      uint16_t *got = dev_download(ac.base.snap_d[t], (size_t)ac.base.numel[t] * 2);
      cr_assert_eq(tu_memdiff(got, want[t], (size_t)ac.base.numel[t] * 2), -1,
                   "%s: tensor %zu", names[coding], t);
      free(got), free(want[t]);
    }
    reset_device(&ac);
    uint8_t *flipped = tu_alloc(ac.bytes.size + 1);
    uint64_t r = 99 + (uint64_t)coding;
    size_t refused = 0;
    for (int k = 0; k < 40; k++) {
      size_t at = (size_t)(pulse_rng_next(&r) % ac.bytes.size);
      memcpy(flipped, ac.bytes.data, ac.bytes.size);
      flipped[at] ^= (uint8_t)(1u << (k % 8));
      pulse_status cpu = cpu_result(&ac, flipped, want);
      pulse_status gpu = stream_to_device(&ac, flipped, r);
      /* The statuses may differ (the device checks class ranks against the
       * class counts as it decodes, the CPU's version 2 decoder later). */
      cr_assert_eq(gpu == PULSE_OK, cpu == PULSE_OK,
                   "%s: byte %zu: %s on the device, %s on the CPU", names[coding], at,
                   pulse_status_name(gpu), pulse_status_name(cpu));
      if (gpu != PULSE_OK) {
        refused++;
        check_untouched(&ac, "a refused streamed patch");
      } else {
        for (size_t t = 0; t < n; t++) {
          uint16_t *got = dev_download(ac.base.snap_d[t], (size_t)ac.base.numel[t] * 2);
          cr_assert_eq(tu_memdiff(got, want[t], (size_t)ac.base.numel[t] * 2), -1,
                       "%s: byte %zu: tensor %zu", names[coding], at, t);
          free(got);
        }
        reset_device(&ac);
      }
      for (size_t t = 0; t < n; t++)
        free(want[t]);
    }
    cr_assert_gt(refused, 20, "%s: most flips are refused", names[coding]);
    free(flipped), free(want);
    apply_free(&ac);
  }
}

/* ------------------------------------------------ 10^9 parameters (large) */

typedef struct {
  pt_table *p;
  uint64_t seed;
  double density;
} large_job;

static void large_fill(void *ctx, size_t t) {
  large_job *job = ctx;
  tu_make_case(job->seed + t, job->p->numel[t], job->p->dtype[t], TU_NORMAL,
               job->density, job->p->cur[t], job->p->snap[t]);
}

Test(cuda_patch, a_billion_parameters_round_trip, .timeout = 900) {
  GPU_TEST_START();
  if (!gpu_large())
    cr_skip_test(
        "10^9 parameters only with PULSE_GPU_LARGE=1 (tests/gpu/check.sh)");
  enum { T = 64 };
  uint64_t numel[T], total = 1000000000ull;
  for (size_t t = 0; t < T; t++)
    numel[t] = total / T + (t < total % T ? 1 : 0);
  /* pt_make without filling (the fill runs in parallel below). */
  pt_table p = pt_make(1, T, (uint64_t[T]){0}, TU_NORMAL, 0.0, 0);
  for (size_t t = 0; t < T; t++) {
    p.numel[t] = numel[t];
    p.info[t].ndim = 1;
    p.info[t].shape[0] = numel[t];
    p.dtype[t] = PULSE_DTYPE_F32;
    free(p.cur[t]), free(p.snap[t]);
    p.cur[t] = malloc((size_t)numel[t] * 4);
    p.snap[t] = malloc((size_t)numel[t] * 2);
    cr_assert(p.cur[t] && p.snap[t]);
  }
  large_job job = {&p, 777, 0.01};
  pulse_parallel_for(0, T, large_fill, &job);
  uint16_t **base = tu_alloc(T * sizeof *base);
  for (size_t t = 0; t < T; t++) {
    p.cur_d[t] = dev_upload(p.cur[t], (size_t)numel[t] * 4);
    p.snap_d[t] = dev_upload(p.snap[t], (size_t)numel[t] * 2);
    base[t] = malloc((size_t)numel[t] * 2);
    memcpy(base[t], p.snap[t], (size_t)numel[t] * 2);
  }
  pulse_encode_opts o;
  pulse_encode_opts_init(&o);
  o.threads = 0;
  check_encode(NULL, &p, &o, 0, 1,
               "10^9 F32 at 1%"); /* p.snap is now the target */
  /* Apply that patch to a device copy of the base. */
  pulse_buffer bytes;
  for (size_t t = 0; t < T; t++) { /* the base again, for the CPU encoder */
    uint16_t *tmp = p.snap[t];
    p.snap[t] = base[t];
    base[t] = tmp;
  }
  cpu_patch cp;
  cpu_encode(&p, &o, 1, &bytes, &cp);
  cpu_patch_free(&cp, T);
  pulse_patch *patch = NULL;
  OK(pulse_patch_open(bytes.data, bytes.size, &patch));
  pulse_cuda_target *dev = tu_alloc(T * sizeof *dev);
  for (size_t t = 0; t < T; t++) {
    pulse_cuda_free(p.cur_d[t]);
    p.cur_d[t] = dev_upload(p.snap[t],
                            (size_t)numel[t] * 2); /* base, in the F32 buffer */
    dev[t] = (pulse_cuda_target){p.name[t], p.cur_d[t], numel[t], NULL};
  }
  OK(pulse_cuda_patch_apply(NULL, patch, dev, T, NULL, NULL, NULL));
  for (size_t t = 0; t < T; t++) {
    uint16_t *got = dev_download(p.cur_d[t], (size_t)numel[t] * 2);
    cr_assert_eq(tu_memdiff(got, base[t], (size_t)numel[t] * 2), -1,
                 "tensor %zu after apply", t);
    free(got);
    free(base[t]);
  }
  free(base), free(dev);
  pulse_patch_free(patch);
  pulse_buffer_free(&bytes);
  pt_free(&p);
}
