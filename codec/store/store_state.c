/* store_state.c - rebuilding a whole BF16 state from an anchor and the
 * patches after it (pulse_store.h). */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fail_impl.h"
#include "pulse_safetensors.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_state_impl.h"

void pulse_store_state_free(pulse_store_state *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->count; i++) {
    if (s->info)
      free((char *)s->info[i].name);
    if (s->bits)
      free(s->bits[i]);
  }
  free(s->info), free(s->numel), free(s->bits), free(s->digests);
  pulse_store_state init = PULSE_STORE_STATE_INIT;
  *s = init;
}

pulse_status store_anchor_open(const char *dir,
                               const pulse_store_object *anchor,
                               pulse_st_file **file,
                               pulse_state_digest *named) {
  *file = NULL;
  char path[4096];
  if (store_join(path, sizeof path, dir, anchor->path) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  pulse_st_file *f = NULL;
  pulse_status st = pulse_st_open(path, &f);
  if (st != PULSE_OK)
    return pulse_fail_context(st, "store: anchor %s", anchor->path);
  const char *step_s = pulse_st_metadata_get(f, "step");
  const char *digest_s = pulse_st_metadata_get(f, "state_digest");
  char want[32];
  snprintf(want, sizeof want, "%" PRIu64, anchor->step);
  if (step_s == NULL || strcmp(step_s, want) != 0 || digest_s == NULL ||
      store_unhex(digest_s, strlen(digest_s), named->bytes, 32) != 0) {
    pulse_st_close(f);
    return pulse_fail(
        PULSE_ERR_CORRUPT,
        "store: anchor %s: metadata does not name step %s and a state digest",
        anchor->path, want);
  }
  *file = f;
  return PULSE_OK;
}

pulse_status store_anchor_tensor(const pulse_st_file *f,
                                 const pulse_store_object *anchor, size_t i,
                                 pulse_st_tensor *t) {
  PULSE_TRY(pulse_st_tensor_get(f, i, t));
  if (t->dtype != PULSE_DTYPE_BF16)
    return pulse_fail(PULSE_ERR_DTYPE,
                      "store: anchor %s: tensor '%s' is %s, not BF16",
                      anchor->path, t->name, pulse_dtype_name(t->dtype));
  return PULSE_OK;
}

pulse_status store_anchor_digest_check(const pulse_store_object *anchor,
                                       const pulse_state_digest *computed,
                                       const pulse_state_digest *named) {
  if (memcmp(computed, named, sizeof *named) != 0)
    return pulse_fail(
        PULSE_ERR_CORRUPT,
        "store: anchor %s: its tensors do not give the state digest it names",
        anchor->path);
  return PULSE_OK;
}

pulse_status store_anchor_load(const char *dir,
                               const pulse_store_object *anchor, int keep_bits,
                               pulse_store_state *out) {
  pulse_store_state init = PULSE_STORE_STATE_INIT;
  *out = init;
  pulse_st_file *f = NULL;
  pulse_state_digest named;
  PULSE_TRY(store_anchor_open(dir, anchor, &f, &named));
  pulse_status st = PULSE_OK;
  size_t n = pulse_st_tensor_count(f);
  out->step = anchor->step;
  out->info = calloc(n + 1, sizeof *out->info);
  out->numel = calloc(n + 1, sizeof *out->numel);
  out->bits = calloc(n + 1, sizeof *out->bits);
  out->digests = calloc(n + 1, sizeof *out->digests);
  if (!out->info || !out->numel || !out->bits || !out->digests) {
    pulse_st_close(f);
    pulse_store_state_free(out);
    return pulse_fail(PULSE_ERR_NOMEM, "store: anchor %s", anchor->path);
  }
  out->count = n;
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    pulse_st_tensor t;
    st = store_anchor_tensor(f, anchor, i, &t);
    if (st != PULSE_OK)
      break;
    out->info[i].name = strdup(t.name);
    out->info[i].dtype = PULSE_DTYPE_BF16;
    out->info[i].ndim = t.ndim;
    memcpy(out->info[i].shape, t.shape, sizeof t.shape);
    out->numel[i] = t.numel;
    const uint16_t *bits = t.data;
    uint16_t *copy = NULL;
    if (keep_bits || ((uintptr_t)t.data & 1u) != 0) {
      copy = malloc(t.nbytes + 2);
      if (copy != NULL && t.nbytes > 0)
        memcpy(copy, t.data, t.nbytes);
      bits = copy;
    }
    if (out->info[i].name == NULL || bits == NULL) {
      free(copy);
      st = pulse_fail(PULSE_ERR_NOMEM, "store: anchor %s: tensor '%s'",
                      anchor->path, t.name);
      break;
    }
    out->digests[i] = pulse_digest_bf16(bits, t.numel);
    if (keep_bits)
      out->bits[i] = copy;
    else
      free(copy);
  }
  pulse_st_close(f);
  if (st == PULSE_OK)
    st = pulse_state_digest_compute(out->info, out->digests, n,
                                    &out->state_digest);
  if (st == PULSE_OK)
    st = store_anchor_digest_check(anchor, &out->state_digest, &named);
  if (st != PULSE_OK)
    pulse_store_state_free(out);
  return st;
}

pulse_status store_patch_read(const char *dir, const pulse_store_object *o,
                              pulse_buffer *out) {
  out->data = NULL;
  out->size = 0;
  char path[4096];
  if (store_join(path, sizeof path, dir, o->path) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "store: patch %s (step %" PRIu64 ") is missing", o->path,
                      o->step);
  if (o->size > SIZE_MAX - 1) {
    fclose(f);
    return pulse_fail(PULSE_ERR_OVERFLOW, "store: patch %s", o->path);
  }
  uint8_t *buf = malloc((size_t)o->size + 1);
  if (buf == NULL) {
    fclose(f);
    return pulse_fail(PULSE_ERR_NOMEM, "store: patch %s: %" PRIu64 " bytes",
                      o->path, o->size);
  }
  /* One byte more than named: a longer file must not pass. */
  size_t got = fread(buf, 1, (size_t)o->size + 1, f);
  fclose(f);
  uint8_t sha[32];
  if (got == o->size)
    store_sha256(buf, got, sha);
  if (got != o->size || memcmp(sha, o->sha256, 32) != 0) {
    free(buf);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "store: patch %s does not match its size and SHA-256",
                      o->path);
  }
  out->data = buf;
  out->size = got;
  return PULSE_OK;
}

pulse_status store_patch_map(const char *dir, const pulse_store_object *o,
                             store_patch_mapping *out) {
  out->data = NULL;
  out->size = 0;
  char path[4096];
  if (store_join(path, sizeof path, dir, o->path) != 0)
    return pulse_fail(PULSE_ERR_ARG, "store: folder name too long");
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "store: patch %s (step %" PRIu64 ") is missing", o->path,
                      o->step);
  struct stat sb;
  int sized = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) &&
              (uint64_t)sb.st_size == o->size && o->size <= SIZE_MAX;
  void *map = NULL;
  if (sized && o->size > 0) {
    map = mmap(NULL, (size_t)o->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
      close(fd);
      return pulse_fail(PULSE_ERR_IO, "store: patch %s: cannot map it",
                        o->path);
    }
  }
  close(fd);
  uint8_t sha[32];
  if (sized)
    store_sha256(map, (size_t)o->size, sha);
  if (!sized || memcmp(sha, o->sha256, 32) != 0) {
    if (map != NULL)
      munmap(map, (size_t)o->size);
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "store: patch %s does not match its size and SHA-256",
                      o->path);
  }
  out->data = map;
  out->size = (size_t)o->size;
  return PULSE_OK;
}

void store_patch_unmap(store_patch_mapping *m) {
  if (m != NULL && m->data != NULL)
    munmap((void *)m->data, m->size);
  if (m != NULL)
    m->data = NULL, m->size = 0;
}

pulse_status store_patch_steps_check(const pulse_store_object *o,
                                     const pulse_patch *p, uint64_t at) {
  if (pulse_patch_step(p) != o->step ||
      pulse_patch_base_step(p) != o->base_step ||
      pulse_patch_base_step(p) != at)
    return pulse_fail(PULSE_ERR_BASE_STEP,
                      "store: patch %s goes %" PRIu64 " -> %" PRIu64
                      ", expected %" PRIu64 " -> %" PRIu64,
                      o->path, pulse_patch_base_step(p), pulse_patch_step(p),
                      at, o->step);
  return PULSE_OK;
}

pulse_status store_state_apply_patch(pulse_store_state *s,
                                     const pulse_store_object *o,
                                     const uint8_t *bytes, size_t size,
                                     int threads) {
  pulse_patch *p = NULL;
  pulse_status st = pulse_patch_open(bytes, size, &p);
  if (st != PULSE_OK)
    return pulse_fail_context(st, "store: patch %s", o->path);
  if ((st = store_patch_steps_check(o, p, s->step)) != PULSE_OK) {
    pulse_patch_free(p);
    return st;
  }
  pulse_host_tensor *t = calloc(s->count + 1, sizeof *t);
  if (t == NULL) {
    pulse_patch_free(p);
    return pulse_fail(PULSE_ERR_NOMEM, "store: apply");
  }
  for (size_t i = 0; i < s->count; i++) {
    t[i].name = s->info[i].name;
    t[i].data = s->bits[i];
    t[i].numel = s->numel[i];
    t[i].digest = &s->digests[i];
  }
  pulse_apply_opts ao;
  pulse_apply_opts_init(&ao);
  ao.threads = threads;
  st = pulse_patch_apply(p, t, s->count, &ao);
  free(t);
  if (st != PULSE_OK) {
    pulse_patch_free(p);
    return pulse_fail_context(st, "store: applying %s (step %" PRIu64 ")",
                              o->path, o->step);
  }
  /* Every tensor is in the table (a full apply checks that): take the
   * target digests from it. */
  for (size_t i = 0; i < s->count; i++) {
    size_t k;
    pulse_patch_tensor pt;
    if (pulse_patch_tensor_find(p, s->info[i].name, &k) == PULSE_OK &&
        pulse_patch_tensor_get(p, k, &pt) == PULSE_OK)
      s->digests[i] = pt.target_digest;
  }
  s->state_digest = *pulse_patch_target_digest(p);
  s->step = o->step;
  pulse_patch_free(p);
  return PULSE_OK;
}

pulse_status store_replay_end_check(const pulse_store_head *head, uint64_t step,
                                    uint64_t reached,
                                    const pulse_state_digest *digest) {
  if (reached != step)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "store: step %" PRIu64 " is not a retained step", step);
  if (step == head->step &&
      memcmp(digest, &head->digest, sizeof head->digest) != 0)
    return pulse_fail(PULSE_ERR_CORRUPT,
                      "store: the rebuilt head state does not match the "
                      "head's state digest");
  return PULSE_OK;
}

pulse_status store_state_replay(const char *dir, const pulse_store_head *head,
                                size_t anchor, uint64_t step, int threads,
                                store_step_hook hook, void *ctx,
                                pulse_store_state *out) {
  const pulse_store_object *a = &head->anchors[anchor];
  PULSE_TRY(store_anchor_load(dir, a, 1, out));
  pulse_status st = PULSE_OK;
  for (size_t i = 0; i < head->npatches && st == PULSE_OK && out->step < step;
       i++) {
    const pulse_store_object *o = &head->patches[i];
    if (o->base_step < a->step)
      continue;
    pulse_buffer bytes = {NULL, 0};
    st = store_patch_read(dir, o, &bytes);
    if (st == PULSE_OK)
      st = store_state_apply_patch(out, o, bytes.data, bytes.size, threads);
    pulse_buffer_free(&bytes);
    if (st == PULSE_OK && hook != NULL)
      st = hook(ctx, out);
  }
  if (st == PULSE_OK)
    st = store_replay_end_check(head, step, out->step, &out->state_digest);
  if (st != PULSE_OK)
    pulse_store_state_free(out);
  return st;
}

pulse_status store_replay_anchor(const pulse_store_head *head, uint64_t step,
                                 size_t *anchor) {
  if (!pulse_store_head_has_step(head, step))
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "store: step %" PRIu64 " is not retained (oldest %" PRIu64
                      ", head %" PRIu64 ")",
                      step, pulse_store_head_oldest_step(head), head->step);
  *anchor = 0;
  for (size_t i = 0; i < head->nanchors; i++)
    if (head->anchors[i].step <= step)
      *anchor = i;
  return PULSE_OK;
}

pulse_status pulse_store_state_rebuild(const char *dir,
                                       const pulse_store_head *head,
                                       uint64_t step, int threads,
                                       pulse_store_state *out) {
  if (dir == NULL || head == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "store: NULL argument");
  pulse_store_state init = PULSE_STORE_STATE_INIT;
  *out = init;
  size_t anchor = 0;
  PULSE_TRY(store_replay_anchor(head, step, &anchor));
  return store_state_replay(dir, head, anchor, step, threads, NULL, NULL, out);
}
