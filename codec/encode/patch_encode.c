/* patch_encode.c - writes a patch (docs/formats/patch.md): checks the input, derives the
 * digests, codes the chunks in parallel and lays out header, table and body. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bytebuf_impl.h"
#include "chunk_impl.h"
#include "chunk_v3_impl.h"
#include "parallel_impl.h"
#include "patch_impl.h"
#include "pulse_elem.h"
#include "status_impl.h"

typedef struct {
  size_t tensor;
  uint64_t chunk;
  uint64_t first_change; /* index into the tensor's change list */
  uint32_t changes;
} encode_item;

typedef struct {
  unsigned version;
  const pulse_v3_model *values; /* version 3 */
  pulse_pos_model model;
  uint32_t chunk_log2;
  const pulse_encode_tensor *tensors;
  const uint64_t *numel;
  encode_item *items;
  pulse_bytebuf *streams;
  pulse_status *status;
  char (*detail)[160];
} encode_job;

/* A rank form that no decoder could invert is refused here, not shipped:
 * class counts must cover the chunk, ranks fit their class and increase. */
static pulse_status check_rank_form(const pulse_encode_tensor *t, const encode_item *it,
                                    uint32_t n) {
  const uint32_t *hist = t->chunk_hist + it->chunk * PULSE_CLASS_COUNT;
  uint64_t total = 0;
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    total += hist[c];
  if (total != n)
    return pulse_fail(PULSE_ERR_ARG, "encode: tensor '%s' chunk %llu: class counts cover %llu of %u",
                      t->info.name, (unsigned long long)it->chunk, (unsigned long long)total, n);
  int64_t last[PULSE_CLASS_COUNT];
  for (unsigned c = 0; c < PULSE_CLASS_COUNT; c++)
    last[c] = -1;
  for (uint32_t j = 0; j < it->changes; j++) {
    unsigned c = t->change_class[it->first_change + j];
    uint32_t r = t->change_rank[it->first_change + j];
    if (r >= hist[c] || (int64_t)r <= last[c])
      return pulse_fail(PULSE_ERR_ARG, "encode: tensor '%s' chunk %llu: rank %u of class %u is not valid",
                        t->info.name, (unsigned long long)it->chunk, r, c);
    last[c] = r;
  }
  return PULSE_OK;
}

static void encode_one(void *ctx, size_t i) {
  encode_job *job = ctx;
  const encode_item *it = &job->items[i];
  const pulse_encode_tensor *t = &job->tensors[it->tensor];
  const pulse_changes *ch = t->changes;
  uint64_t first = it->chunk << job->chunk_log2;
  uint64_t left = job->numel[it->tensor] - first;
  uint32_t n = (uint32_t)(left < (1ull << job->chunk_log2) ? left : (1ull << job->chunk_log2));
  /* The rank form needs no positions: its ranks stand for them. */
  int rank_form = t->base == NULL && job->model == PULSE_POS_CLASS;
  uint32_t *pos = rank_form ? NULL : malloc((size_t)it->changes * sizeof *pos);
  uint16_t *delta = malloc((size_t)it->changes * sizeof *delta);
  pulse_status st = PULSE_OK;
  if ((pos == NULL && !rank_form) || delta == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "encode: chunk of %u changes", it->changes);
  } else {
    for (uint32_t j = 0; j < it->changes; j++) {
      uint64_t c = it->first_change + j;
      delta[j] = pulse_bf16_delta(ch->old_bits[c], ch->new_bits[c]);
    }
    for (uint32_t j = 0; pos != NULL && j < it->changes; j++)
      pos[j] = (uint32_t)(ch->pos[it->first_change + j] - first);
    if (!rank_form)
      st = pulse_chunk_encode(job->version, job->values, job->model,
                              t->base ? t->base + first : NULL, n, pos, delta,
                              it->changes, &job->streams[i]);
    else if ((st = check_rank_form(t, it, n)) == PULSE_OK)
      st = pulse_chunk_encode_ranks(
          job->version, job->values, job->model,
          t->chunk_hist + it->chunk * PULSE_CLASS_COUNT, n, it->changes,
          t->change_class + it->first_change, t->change_rank + it->first_change,
          delta, &job->streams[i]);
  }
  job->status[i] = st;
  if (st != PULSE_OK)
    memcpy(job->detail[i], pulse_error_detail(), sizeof job->detail[i] - 1);
  free(pos);
  free(delta);
}

typedef struct {
  const pulse_encode_tensor *tensors;
  const uint64_t *numel;
  pulse_tensor_digest *digest;
  const pulse_tensor_digest *target_in; /* the caller's, or NULL */
  pulse_tensor_digest *target;
} digest_job;

/* Tensor i's base digest and, from its changes, its target digest (a pass
 * over millions of changes at model scale: on the threads too). */
static void digest_one(void *ctx, size_t i) {
  digest_job *job = ctx;
  const pulse_encode_tensor *t = &job->tensors[i];
  job->digest[i] = t->base_digest ? *t->base_digest : pulse_digest_bf16(t->base, job->numel[i]);
  job->target[i] = job->target_in ? job->target_in[i]
                                  : pulse_digest_apply_changes(job->digest[i], t->changes);
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Rejects a table entry that would make a patch no decoder accepts. */
static pulse_status check_tensor(const pulse_encode_tensor *t, size_t i,
                                 pulse_pos_model model, uint64_t *numel) {
  const char *name = t->info.name;
  if (name == NULL || name[0] == '\0' || strlen(name) > PULSE_MAX_NAME)
    return pulse_fail(PULSE_ERR_ARG, "encode: tensor %zu: name empty or longer than %d bytes",
                      i, PULSE_MAX_NAME);
  if (t->info.dtype != PULSE_DTYPE_BF16)
    return pulse_fail(PULSE_ERR_DTYPE, "encode: tensor '%s': patches carry BF16 state, not %s",
                      name, pulse_dtype_name(t->info.dtype));
  if (t->info.ndim > PULSE_MAX_DIMS)
    return pulse_fail(PULSE_ERR_ARG, "encode: tensor '%s': %u dimensions", name, t->info.ndim);
  PULSE_TRY(pulse_shape_numel(t->info.shape, t->info.ndim, numel));
  int rank_form = t->chunk_hist != NULL && t->change_class != NULL && t->change_rank != NULL;
  if (t->base == NULL && *numel > 0 &&
      ((model == PULSE_POS_CLASS && !rank_form) || t->base_digest == NULL))
    return pulse_fail(PULSE_ERR_ARG, "encode: tensor '%s': no base (nor its digest and rank form)",
                      name);
  return PULSE_OK;
}

/* Rejects changes that would make a patch no decoder accepts. */
static pulse_status check_changes(const pulse_encode_tensor *t, uint64_t numel) {
  const char *name = t->info.name;
  const pulse_changes *ch = t->changes;
  uint64_t k = ch ? ch->count : 0;
  for (uint64_t j = 0; j < k; j++) {
    if (ch->pos[j] >= numel || (j > 0 && ch->pos[j] <= ch->pos[j - 1]))
      return pulse_fail(PULSE_ERR_POSITION, "encode: tensor '%s': change %llu at %llu",
                        name, (unsigned long long)j, (unsigned long long)ch->pos[j]);
    if (ch->old_bits[j] == ch->new_bits[j])
      return pulse_fail(PULSE_ERR_ARG, "encode: tensor '%s': change at %llu keeps its bits",
                        name, (unsigned long long)ch->pos[j]);
    if (t->base != NULL && t->base[ch->pos[j]] != ch->old_bits[j])
      return pulse_fail(PULSE_ERR_BASE_DIGEST,
                        "encode: tensor '%s': old bits at %llu are not the base's", name,
                        (unsigned long long)ch->pos[j]);
  }
  return PULSE_OK;
}

typedef struct {
  const pulse_encode_tensor *tensors;
  const uint64_t *numel;
  pulse_status *status;
  char (*detail)[160];
  digest_job *digests;
} check_job;

/* Checks tensor i's changes, then derives its digests while they are in
 * cache (two passes over memory were one more than needed: at 1 B
 * parameters and 1% the change lists are 120 MB). */
static void check_one(void *ctx, size_t i) {
  check_job *job = ctx;
  job->status[i] = check_changes(&job->tensors[i], job->numel[i]);
  if (job->status[i] != PULSE_OK)
    snprintf(job->detail[i], sizeof job->detail[i], "%s", pulse_error_detail());
  else
    digest_one(job->digests, i);
}

void pulse_encode_opts_init(pulse_encode_opts *o) {
  memset(o, 0, sizeof *o);
  o->struct_version = PULSE_ENCODE_OPTS_VERSION;
  o->step = 1;
  o->pos_model = PULSE_POS_CLASS;
  o->chunk_log2 = PULSE_CHUNK_LOG2_DEFAULT;
}

pulse_status pulse_patch_encode(const pulse_encode_opts *opts,
                                const pulse_encode_tensor *tensors,
                                size_t count, pulse_buffer *out) {
  return patch_encode_digests(opts, tensors, count, NULL, out);
}

static pulse_status check_opts(const pulse_encode_opts *opts, const pulse_encode_tensor *tensors,
                               size_t count, unsigned *version) {
  PULSE_TRY(PULSE_OPTS_CHECK("encode", opts, PULSE_ENCODE_OPTS_VERSION));
  if (opts->pos_model != PULSE_POS_PLAIN && opts->pos_model != PULSE_POS_CLASS)
    return pulse_fail(PULSE_ERR_ARG, "encode: unknown position model %d", (int)opts->pos_model);
  *version = opts->format_version ? opts->format_version : PULSE_PATCH_VERSION;
  if (*version < PULSE_PATCH_VERSION_MIN || *version > PULSE_PATCH_VERSION_MAX)
    return pulse_fail(
        PULSE_ERR_ARG,
        "encode: no format version %u (this library writes %u..%u)", *version,
        PULSE_PATCH_VERSION_MIN, PULSE_PATCH_VERSION_MAX);
  if (opts->chunk_log2 < PULSE_CHUNK_LOG2_MIN || opts->chunk_log2 > PULSE_CHUNK_LOG2_MAX)
    return pulse_fail(PULSE_ERR_ARG, "encode: chunk_log2 %u outside %u..%u", opts->chunk_log2,
                      PULSE_CHUNK_LOG2_MIN, PULSE_CHUNK_LOG2_MAX);
  if (count > 0 && tensors == NULL)
    return pulse_fail(PULSE_ERR_ARG, "encode: NULL tensors");
  return PULSE_OK;
}

/* What one encode call derives from its input, freed by plan_free. */
typedef struct {
  const pulse_encode_opts *opts;
  const pulse_encode_tensor *tensors;
  size_t count;
  uint64_t *numel;
  pulse_tensor_info *infos;
  pulse_tensor_digest *base_d, *target_d;
  const char **names;
  uint64_t total_changed, chunk_entries;
  /* one work item per chunk that holds changes, in table then chunk order */
  encode_item *items;
  size_t item_count;
  pulse_bytebuf *streams;
  pulse_status *item_st;
  char (*detail)[160];
  pulse_v3_model *values; /* version 3: built from every change's token */
  unsigned version;       /* the format version written */
} encode_plan;

static void plan_free(encode_plan *pl) {
  for (size_t i = 0; pl->streams && i < pl->item_count; i++)
    pulse_bytebuf_free(&pl->streams[i]);
  free(pl->streams), free(pl->item_st), free(pl->detail), free(pl->items);
  pulse_v3_model_free(pl->values);
  free(pl->numel), free(pl->infos), free(pl->base_d), free(pl->target_d), free(pl->names);
}

/* Checks every tensor and their names, counts changes and chunks, and
 * derives the digests (with the given target digests, or NULL). */
static pulse_status plan_tensors(encode_plan *pl, const pulse_tensor_digest *target_digests) {
  size_t count = pl->count;
  pl->numel = calloc(count + 1, sizeof *pl->numel);
  pl->infos = calloc(count + 1, sizeof *pl->infos);
  pl->base_d = calloc(count + 1, sizeof *pl->base_d);
  pl->target_d = calloc(count + 1, sizeof *pl->target_d);
  pl->names = calloc(count + 1, sizeof *pl->names);
  if (!pl->numel || !pl->infos || !pl->base_d || !pl->target_d || !pl->names)
    return pulse_fail(PULSE_ERR_NOMEM, "encode: table of %zu tensors", count);
  /* The table serially up to its first bad entry; the changes of the
   * entries before it on the threads (millions of them at model scale).
   * The first error in table order is reported, as one pass would. */
  size_t good = 0;
  pulse_status table_st = PULSE_OK;
  char table_detail[160] = "";
  for (; good < count; good++) {
    const pulse_encode_tensor *t = &pl->tensors[good];
    table_st = check_tensor(t, good, pl->opts->pos_model, &pl->numel[good]);
    if (table_st != PULSE_OK) {
      snprintf(table_detail, sizeof table_detail, "%s", pulse_error_detail());
      break;
    }
    pl->infos[good] = t->info;
    pl->names[good] = t->info.name;
    uint64_t k = t->changes ? t->changes->count : 0;
    pl->total_changed += k;
    if (k > 0)
      pl->chunk_entries += ((pl->numel[good] - 1) >> pl->opts->chunk_log2) + 1;
  }
  pulse_status *status = calloc(good + 1, sizeof *status);
  char(*detail)[160] = calloc(good + 1, sizeof *detail);
  if (status == NULL || detail == NULL) {
    free(status), free(detail);
    return pulse_fail(PULSE_ERR_NOMEM, "encode: table of %zu tensors", count);
  }
  digest_job dj = {pl->tensors, pl->numel, pl->base_d, target_digests, pl->target_d};
  check_job cj = {pl->tensors, pl->numel, status, detail, &dj};
  pulse_parallel_for(pl->opts->threads, good, check_one, &cj);
  size_t bad = 0;
  while (bad < good && status[bad] == PULSE_OK)
    bad++;
  pulse_status st = PULSE_OK;
  if (bad < good)
    st = pulse_fail(status[bad], "%s", detail[bad]);
  else if (table_st != PULSE_OK)
    st = pulse_fail(table_st, "%s", table_detail);
  free(status), free(detail);
  if (st != PULSE_OK)
    return st;
  qsort(pl->names, count, sizeof *pl->names, name_cmp);
  for (size_t i = 1; i < count; i++)
    if (strcmp(pl->names[i - 1], pl->names[i]) == 0)
      return pulse_fail(PULSE_ERR_DUPLICATE, "encode: tensor name '%s' appears twice",
                        pl->names[i]);
  return PULSE_OK;
}

/* Version 3's value model: the tokens of every change by the class its
 * chunk codes it in (the old exponent's, or 0 in the plain model), so that
 * the CPU path (classes from the base) and the rank form (classes given,
 * the device publisher's) build the same model from the same changes. */
static pulse_status plan_value_model(encode_plan *pl) {
  pulse_v3_counts *counts = calloc(1, sizeof *counts);
  if (counts == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "encode: value model counts");
  for (size_t i = 0; i < pl->count; i++) {
    const pulse_encode_tensor *t = &pl->tensors[i];
    const pulse_changes *ch = t->changes;
    uint64_t k = ch ? ch->count : 0;
    int rank_form = t->base == NULL && pl->opts->pos_model == PULSE_POS_CLASS;
    for (uint64_t j = 0; j < k; j++) {
      uint32_t raw;
      unsigned nraw;
      unsigned c = pl->opts->pos_model == PULSE_POS_PLAIN ? 0u
                   : rank_form                            ? t->change_class[j]
                               : pulse_bf16_class(ch->old_bits[j]);
      counts->count[c][pulse_v3_token(
          pulse_bf16_delta(ch->old_bits[j], ch->new_bits[j]), &raw, &nraw)]++;
    }
  }
  pulse_status st = pulse_v3_model_build(counts, &pl->values);
  free(counts);
  return st;
}

/* One work item per chunk that holds changes, coded in parallel. */
static pulse_status plan_code_chunks(encode_plan *pl, unsigned version) {
  const pulse_encode_opts *opts = pl->opts;
  pl->items = calloc(pl->chunk_entries + 1, sizeof *pl->items);
  if (pl->items == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "encode: %llu chunks",
                      (unsigned long long)pl->chunk_entries);
  for (size_t i = 0; i < pl->count; i++) {
    const pulse_changes *ch = pl->tensors[i].changes;
    uint64_t k = ch ? ch->count : 0;
    for (uint64_t j = 0; j < k;) {
      uint64_t chunk = ch->pos[j] >> opts->chunk_log2;
      /* The chunk's end by bisection (positions increase): a walk over
       * every change was a serial pass of 10 M at 1 B parameters. */
      uint64_t lo = j + 1, hi = k;
      while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((ch->pos[mid] >> opts->chunk_log2) == chunk)
          lo = mid + 1;
        else
          hi = mid;
      }
      pl->items[pl->item_count++] = (encode_item){i, chunk, j, (uint32_t)(lo - j)};
      j = lo;
    }
  }
  pl->streams = calloc(pl->item_count + 1, sizeof *pl->streams);
  pl->item_st = calloc(pl->item_count + 1, sizeof *pl->item_st);
  pl->detail = calloc(pl->item_count + 1, sizeof *pl->detail);
  if (!pl->streams || !pl->item_st || !pl->detail)
    return pulse_fail(PULSE_ERR_NOMEM, "encode: %zu chunk streams", pl->item_count);
  if (version == 3 && pl->total_changed > 0) /* no changes, no model */
    PULSE_TRY(plan_value_model(pl));
  encode_job job = {version,     pl->values, opts->pos_model, opts->chunk_log2,
                    pl->tensors, pl->numel,  pl->items,       pl->streams,
                    pl->item_st, pl->detail};
  pulse_parallel_for(opts->threads, pl->item_count, encode_one, &job);
  for (size_t i = 0; i < pl->item_count; i++)
    if (pl->item_st[i] != PULSE_OK)
      return pulse_fail(pl->item_st[i], "%s", pl->detail[i]);
  return PULSE_OK;
}

/* The tensor table (docs/formats/patch.md); *body_size gets the sum of the sections. */
static pulse_status plan_write_table(const encode_plan *pl, pulse_bytebuf *table,
                                     uint64_t *body_size) {
  const encode_item *items = pl->items;
  size_t next_item = 0, item_count = pl->item_count;
  uint32_t chunk_log2 = pl->opts->chunk_log2;
  *body_size = 0;
  for (size_t i = 0; i < pl->count; i++) {
    const pulse_tensor_info *info = &pl->tensors[i].info;
    size_t name_len = strlen(info->name);
    pulse_bytebuf_varint(table, name_len);
    pulse_bytebuf_put(table, info->name, name_len);
    pulse_bytebuf_byte(table, (uint8_t)info->dtype);
    pulse_bytebuf_byte(table, (uint8_t)info->ndim);
    for (uint32_t d = 0; d < info->ndim; d++)
      pulse_bytebuf_varint(table, info->shape[d]);
    uint64_t k = pl->tensors[i].changes ? pl->tensors[i].changes->count : 0;
    pulse_bytebuf_varint(table, k);
    uint64_t section = 0;
    for (size_t it = next_item; it < item_count && items[it].tensor == i; it++)
      section += pl->streams[it].size;
    uint64_t chunks = k > 0 ? ((pl->numel[i] - 1) >> chunk_log2) + 1 : 0;
    /* Version 3 leaves out what the decoder derives: the section size but
     * of one chunk with changes, the target digest of no change, and the
     * one chunk's entry (the tensor's counts). */
    const int v3 = pl->version == 3;
    if (!v3 || chunks == 1)
      pulse_bytebuf_varint(table, section);
    pulse_bytebuf_u64(table, pl->base_d[i].a);
    pulse_bytebuf_u64(table, pl->base_d[i].b);
    if (!v3 || k > 0) {
      pulse_bytebuf_u64(table, pl->target_d[i].a);
      pulse_bytebuf_u64(table, pl->target_d[i].b);
    }
    const int entries = !v3 || chunks > 1;
    for (uint64_t c = 0; c < chunks; c++) {
      if (next_item < item_count && items[next_item].tensor == i && items[next_item].chunk == c) {
        if (entries) {
          pulse_bytebuf_varint(table, items[next_item].changes);
          pulse_bytebuf_varint(table, pl->streams[next_item].size);
        }
        next_item++;
      } else if (entries) {
        pulse_bytebuf_varint(table, 0);
        pulse_bytebuf_varint(table, 0);
      }
    }
    *body_size += section;
  }
  if (pl->values != NULL) /* version 3: the value model closes the table */
    PULSE_TRY(pulse_v3_model_write(pl->values, table));
  if (table->failed || table->size > UINT32_MAX)
    return pulse_fail(PULSE_ERR_NOMEM, "encode: tensor table");
  return PULSE_OK;
}

/* Header, table, body into buf. */
static pulse_status plan_write_patch(const encode_plan *pl, unsigned version,
                                     const pulse_bytebuf *table, uint64_t body_size,
                                     pulse_bytebuf *buf) {
  const pulse_encode_opts *opts = pl->opts;
  pulse_state_digest base_state, target_state;
  PULSE_TRY(pulse_state_digest_compute(pl->infos, pl->base_d, pl->count, &base_state));
  PULSE_TRY(pulse_state_digest_compute(pl->infos, pl->target_d, pl->count, &target_state));
  /* The whole patch at once: grown by doubling, a 12 MB patch was copied
   * twice over and faulted in page by page. */
  size_t head = PULSE_PATCH_FIXED_HEADER + table->size;
  if (body_size <= (uint64_t)(SIZE_MAX / 2 - head)) { /* else the puts fail */
    size_t whole = head + (size_t)body_size;
    (void)pulse_bytebuf_reserve(buf, whole, whole); /* a failure shows below */
  }
  pulse_bytebuf_put(buf, PULSE_PATCH_MAGIC, 8);
  pulse_bytebuf_u16(buf, (uint16_t)version);
  pulse_bytebuf_byte(buf, (uint8_t)opts->pos_model);
  pulse_bytebuf_byte(buf, (uint8_t)opts->chunk_log2);
  pulse_bytebuf_u32(buf, (uint32_t)table->size);
  pulse_bytebuf_u64(buf, opts->step);
  pulse_bytebuf_u64(buf, opts->base_step);
  pulse_bytebuf_put(buf, base_state.bytes, 32);
  pulse_bytebuf_put(buf, target_state.bytes, 32);
  pulse_bytebuf_u64(buf, (uint64_t)pl->count);
  pulse_bytebuf_u64(buf, pl->total_changed);
  pulse_bytebuf_u64(buf, body_size);
  pulse_bytebuf_put(buf, table->data, table->size);
  for (size_t i = 0; i < pl->item_count; i++)
    pulse_bytebuf_put(buf, pl->streams[i].data, pl->streams[i].size);
  if (buf->failed)
    return pulse_fail(PULSE_ERR_NOMEM, "encode: patch of %zu bytes", buf->size);
  return PULSE_OK;
}

pulse_status patch_encode_digests(const pulse_encode_opts *opts,
                                  const pulse_encode_tensor *tensors, size_t count,
                                  const pulse_tensor_digest *target_digests,
                                  pulse_buffer *out) {
  if (out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "encode: NULL output");
  out->data = NULL;
  out->size = 0;
  unsigned version = 0;
  PULSE_TRY(check_opts(opts, tensors, count, &version));
  encode_plan pl;
  memset(&pl, 0, sizeof pl);
  pl.opts = opts;
  pl.version = version;
  pl.tensors = tensors;
  pl.count = count;
  pulse_bytebuf table = PULSE_BYTEBUF_INIT, buf = PULSE_BYTEBUF_INIT;
  uint64_t body_size = 0;
  pulse_status st = plan_tensors(&pl, target_digests);
  if (st == PULSE_OK)
    st = plan_code_chunks(&pl, version);
  if (st == PULSE_OK)
    st = plan_write_table(&pl, &table, &body_size);
  if (st == PULSE_OK)
    st = plan_write_patch(&pl, version, &table, body_size, &buf);
  if (st == PULSE_OK) {
    out->data = buf.data;
    out->size = buf.size;
    buf = (pulse_bytebuf)PULSE_BYTEBUF_INIT;
  }
  pulse_bytebuf_free(&table);
  pulse_bytebuf_free(&buf);
  plan_free(&pl);
  return st;
}
