/* safetensors_index.c - models: one safetensors file, or the shards named by
 * a model.safetensors.index.json, as one tensor table. */
#include "json_impl.h"
#include "pulse_safetensors.h"
#include "status_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define QUOTE_MAX 200
#define INDEX_NAME "model.safetensors.index.json"
#define SINGLE_NAME "model.safetensors"

typedef struct {
  char *key;
  char *value;
} model_kv;

struct pulse_st_model {
  size_t shard_count;
  pulse_st_file **shards; /* ascending file name order */
  size_t count;
  pulse_st_tensor *tensors;        /* model order */
  const pulse_st_tensor **by_name; /* strcmp order of names */
  size_t meta_count;
  model_kv *meta; /* strcmp order of keys; owned copies */
};

/* Re-raises the current detail, less its "safetensors: ", after a prefix
 * made from fmt, a and b. */
static pulse_status fail_prefixed(pulse_status st, const char *fmt,
                                  const char *a, const char *b) {
  char inner[512];
  const char *d = pulse_error_detail();
  if (strncmp(d, "safetensors: ", 13) == 0)
    d += 13;
  snprintf(inner, sizeof inner, "%s", d);
  char prefix[512];
  snprintf(prefix, sizeof prefix, fmt, a, b);
  return pulse_fail(st, "%s%s", prefix, inner);
}

void pulse_st_model_close(pulse_st_model *model) {
  if (model == NULL)
    return;
  for (size_t i = 0; i < model->shard_count; i++)
    pulse_st_close(model->shards[i]);
  free(model->shards);
  free(model->tensors);
  free(model->by_name);
  for (size_t i = 0; i < model->meta_count; i++) {
    free(model->meta[i].key);
    free(model->meta[i].value);
  }
  free(model->meta);
  free(model);
}

static int tensor_name_cmp(const void *a, const void *b) {
  return strcmp((*(const pulse_st_tensor *const *)a)->name,
                (*(const pulse_st_tensor *const *)b)->name);
}

static int kv_cmp(const void *a, const void *b) {
  return strcmp(((const model_kv *)a)->key, ((const model_kv *)b)->key);
}

static pulse_status meta_push(pulse_st_model *m, const char *key,
                              const char *value) {
  model_kv *kv = &m->meta[m->meta_count];
  kv->key = strdup(key);
  kv->value = strdup(value);
  if (kv->key == NULL || kv->value == NULL) {
    free(kv->key);
    free(kv->value);
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: metadata");
  }
  m->meta_count++;
  return PULSE_OK;
}

/* Builds the model table from its opened shards, in shard order. */
static pulse_status model_build_table(pulse_st_model *m) {
  size_t total = 0;
  for (size_t s = 0; s < m->shard_count; s++)
    total += pulse_st_tensor_count(m->shards[s]);
  if (total == 0)
    return PULSE_OK;
  m->tensors = malloc(total * sizeof *m->tensors);
  m->by_name = malloc(total * sizeof *m->by_name);
  if (m->tensors == NULL || m->by_name == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: table of %zu tensors",
                      total);
  size_t n = 0;
  for (size_t s = 0; s < m->shard_count; s++)
    for (size_t i = 0; i < pulse_st_tensor_count(m->shards[s]); i++)
      PULSE_TRY(pulse_st_tensor_get(m->shards[s], i, &m->tensors[n++]));
  for (size_t i = 0; i < total; i++)
    m->by_name[i] = &m->tensors[i];
  qsort(m->by_name, total, sizeof *m->by_name, tensor_name_cmp);
  m->count = total;
  return PULSE_OK;
}

static pulse_status model_from_file(const char *path, pulse_st_model *m) {
  m->shards = malloc(sizeof *m->shards);
  if (m->shards == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: model");
  PULSE_TRY(pulse_st_open(path, &m->shards[0]));
  m->shard_count = 1;
  const pulse_st_file *f = m->shards[0];
  size_t mc = pulse_st_metadata_count(f);
  if (mc > 0) {
    m->meta = calloc(mc, sizeof *m->meta);
    if (m->meta == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "safetensors: metadata");
    for (size_t i = 0; i < mc; i++) {
      const char *k, *v;
      PULSE_TRY(pulse_st_metadata_at(f, i, &k, &v));
      PULSE_TRY(meta_push(m, k, v));
    }
  }
  return model_build_table(m);
}

/* ------------------------------------------------------------------ index */

/* Reads a whole (small) file into a malloc'd buffer. */
static pulse_status read_file(const char *path, char **data, size_t *size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "safetensors: %s: %s", path, strerror(errno));
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return pulse_fail(PULSE_ERR_IO, "safetensors: %s: not a regular file",
                      path);
  }
  if ((uint64_t)sb.st_size > PULSE_ST_MAX_HEADER) {
    close(fd);
    return pulse_fail(PULSE_ERR_OVERFLOW,
                      "safetensors: %s: index larger than %llu bytes", path,
                      (unsigned long long)PULSE_ST_MAX_HEADER);
  }
  size_t cap = (size_t)sb.st_size;
  char *buf = malloc(cap > 0 ? cap : 1);
  if (buf == NULL) {
    close(fd);
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: %s", path);
  }
  size_t n = 0;
  while (n < cap) {
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      pulse_status st = pulse_fail(PULSE_ERR_IO, "safetensors: %s: %s", path,
                                   strerror(errno));
      free(buf);
      close(fd);
      return st;
    }
    if (r == 0)
      break; /* shrank while reading: parse what is there */
    n += (size_t)r;
  }
  close(fd);
  *data = buf;
  *size = n;
  return PULSE_OK;
}

/* A shard file name must stay in the index's directory. */
static int shard_name_ok(const char *s, size_t len) {
  return len > 0 && memchr(s, '\0', len) == NULL &&
         memchr(s, '/', len) == NULL && strcmp(s, ".") != 0 &&
         strcmp(s, "..") != 0;
}

static int member_by_value_cmp(const void *a, const void *b) {
  const pulse_json *x = *(const pulse_json *const *)a;
  const pulse_json *y = *(const pulse_json *const *)b;
  return strcmp(x->text, y->text);
}

static int member_by_key_cmp(const void *a, const void *b) {
  return strcmp((*(const pulse_json *const *)a)->key,
                (*(const pulse_json *const *)b)->key);
}

static const pulse_json *member_lookup(const pulse_json **by_key, size_t n,
                                       const char *key) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(by_key[mid]->key, key);
    if (c == 0)
      return by_key[mid];
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

static pulse_status index_metadata(pulse_st_model *m, const pulse_json *meta) {
  if (meta == NULL || meta->type == PULSE_JSON_NULL)
    return PULSE_OK;
  if (meta->type != PULSE_JSON_OBJECT)
    return pulse_fail(PULSE_ERR_JSON,
                      "safetensors: index: \"metadata\" is not an object");
  const pulse_json *dup;
  PULSE_TRY(pulse_json_find_duplicate(meta, &dup));
  if (dup != NULL)
    return pulse_fail(PULSE_ERR_DUPLICATE,
                      "safetensors: index: metadata key '%.*s' repeated",
                      QUOTE_MAX, dup->key);
  if (meta->len == 0)
    return PULSE_OK;
  m->meta = calloc(meta->len, sizeof *m->meta);
  if (m->meta == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: metadata");
  for (size_t i = 0; i < meta->len; i++) {
    const pulse_json *v = &meta->items[i];
    const char *text = NULL;
    if (v->type == PULSE_JSON_STRING) {
      if (memchr(v->text, '\0', v->len) != NULL)
        return pulse_fail(PULSE_ERR_JSON,
                          "safetensors: index: metadata '%.*s' holds a NUL",
                          QUOTE_MAX, v->key);
      text = v->text;
    } else if (v->type == PULSE_JSON_NUMBER) {
      text = v->text;
    } else if (v->type == PULSE_JSON_TRUE) {
      text = "true";
    } else if (v->type == PULSE_JSON_FALSE) {
      text = "false";
    }
    if (text != NULL)
      PULSE_TRY(meta_push(m, v->key, text));
  }
  return PULSE_OK;
}

/* Joins dir (may be "") and name into a malloc'd path. */
static char *path_join(const char *dir, size_t dir_len, const char *name) {
  size_t n = strlen(name);
  char *p = malloc(dir_len + n + 2);
  if (p == NULL)
    return NULL;
  memcpy(p, dir, dir_len);
  size_t at = dir_len;
  if (dir_len > 0 && dir[dir_len - 1] != '/')
    p[at++] = '/';
  memcpy(p + at, name, n + 1);
  return p;
}

/* Opens the shards named by an index whose weight_map is `wm`, checks the
 * map against them both ways and builds the table. */
static pulse_status index_open_shards(pulse_st_model *m, const char *index_path,
                                      const pulse_json *wm) {
  const char *slash = strrchr(index_path, '/');
  size_t dir_len = slash == NULL ? 0 : (size_t)(slash - index_path) + 1;
  size_t n = wm->len;
  if (n == 0)
    return PULSE_OK;
  const pulse_json **by_key = malloc(n * sizeof *by_key);
  const pulse_json **by_shard = malloc(n * sizeof *by_shard);
  m->shards = calloc(n, sizeof *m->shards);
  pulse_status st = PULSE_OK;
  if (by_key == NULL || by_shard == NULL || m->shards == NULL) {
    st = pulse_fail(PULSE_ERR_NOMEM, "safetensors: index of %zu tensors", n);
    goto done;
  }
  for (size_t i = 0; i < n; i++)
    by_key[i] = by_shard[i] = &wm->items[i];
  qsort(by_key, n, sizeof *by_key, member_by_key_cmp);
  qsort(by_shard, n, sizeof *by_shard, member_by_value_cmp);

  /* Open each distinct shard once, in file name order. */
  for (size_t i = 0; i < n; i++) {
    if (i > 0 && strcmp(by_shard[i]->text, by_shard[i - 1]->text) == 0)
      continue;
    const char *name = by_shard[i]->text;
    char *path = path_join(index_path, dir_len, name);
    if (path == NULL) {
      st = pulse_fail(PULSE_ERR_NOMEM, "safetensors: shard path");
      goto done;
    }
    st = pulse_st_open(path, &m->shards[m->shard_count]);
    free(path);
    if (st != PULSE_OK) {
      st = fail_prefixed(st, "safetensors: index %s: shard '%s': ", index_path,
                         name);
      goto done;
    }
    m->shard_count++;
  }

  /* Every weight_map entry is in its shard, and every shard tensor is
   * mapped to its shard. */
  for (size_t s = 0, i = 0; s < m->shard_count; s++) {
    /* by_shard groups entries by shard, in the shards' order. */
    const char *shard_name = by_shard[i]->text;
    for (; i < n && strcmp(by_shard[i]->text, shard_name) == 0; i++) {
      pulse_st_tensor t;
      if (pulse_st_tensor_find(m->shards[s], by_shard[i]->key, &t) !=
          PULSE_OK) {
        st = pulse_fail(PULSE_ERR_NOT_FOUND,
                        "safetensors: index %s: tensor '%.*s' is mapped to "
                        "shard '%s', which does not hold it",
                        index_path, QUOTE_MAX, by_shard[i]->key, shard_name);
        goto done;
      }
    }
    const pulse_st_file *f = m->shards[s];
    for (size_t k = 0; k < pulse_st_tensor_count(f); k++) {
      pulse_st_tensor t;
      st = pulse_st_tensor_get(f, k, &t);
      if (st != PULSE_OK)
        goto done;
      const pulse_json *e = member_lookup(by_key, n, t.name);
      if (e == NULL || strcmp(e->text, shard_name) != 0) {
        st = pulse_fail(PULSE_ERR_CORRUPT,
                        "safetensors: index %s: shard '%s' holds tensor "
                        "'%.*s', which the weight_map %s%s",
                        index_path, shard_name, QUOTE_MAX, t.name,
                        e == NULL ? "does not list" : "puts in shard ",
                        e == NULL ? "" : e->text);
        goto done;
      }
    }
  }
  st = model_build_table(m);
done:
  free(by_key);
  free(by_shard);
  return st;
}

static pulse_status model_from_index(const char *path, pulse_st_model *m) {
  char *text = NULL;
  size_t size = 0;
  PULSE_TRY(read_file(path, &text, &size));
  pulse_json_limits limits = PULSE_JSON_LIMITS_INIT;
  limits.max_bytes = size * PULSE_ST_JSON_MEMORY_RATIO + ((size_t)1 << 20);
  pulse_json_doc *doc = NULL;
  pulse_status st = pulse_json_parse(text, size, &limits, &doc);
  free(text);
  if (st != PULSE_OK)
    return fail_prefixed(st, "safetensors: index %s: %s", path, "");
  const pulse_json *root = pulse_json_doc_root(doc);
  const pulse_json *wm = pulse_json_get(root, "weight_map");
  const pulse_json *dup = NULL;
  if (root->type != PULSE_JSON_OBJECT) {
    st = pulse_fail(PULSE_ERR_JSON, "safetensors: index %s: not an object",
                    path);
    goto done;
  }
  st = pulse_json_find_duplicate(root, &dup);
  if (st == PULSE_OK && dup != NULL)
    st = pulse_fail(PULSE_ERR_JSON,
                    "safetensors: index %s: member '%.*s' "
                    "repeated",
                    path, QUOTE_MAX, dup->key);
  if (st != PULSE_OK)
    goto done;
  if (wm == NULL || wm->type != PULSE_JSON_OBJECT) {
    st = pulse_fail(PULSE_ERR_JSON,
                    "safetensors: index %s: \"weight_map\" is %s", path,
                    wm == NULL ? "missing" : "not an object");
    goto done;
  }
  st = pulse_json_find_duplicate(wm, &dup);
  if (st == PULSE_OK && dup != NULL)
    st = pulse_fail(PULSE_ERR_DUPLICATE,
                    "safetensors: index %s: tensor '%.*s' listed twice", path,
                    QUOTE_MAX, dup->key);
  if (st != PULSE_OK)
    goto done;
  for (size_t i = 0; i < wm->len; i++) {
    const pulse_json *e = &wm->items[i];
    if (e->type != PULSE_JSON_STRING) {
      st = pulse_fail(PULSE_ERR_JSON,
                      "safetensors: index %s: shard of tensor '%.*s' is not "
                      "a string",
                      path, QUOTE_MAX, e->key);
      goto done;
    }
    if (!shard_name_ok(e->text, e->len)) {
      st = pulse_fail(PULSE_ERR_CORRUPT,
                      "safetensors: index %s: shard '%.*s' of tensor '%.*s' "
                      "is not a file name in the index's directory",
                      path, QUOTE_MAX, e->text, QUOTE_MAX, e->key);
      goto done;
    }
  }
  st = index_metadata(m, pulse_json_get(root, "metadata"));
  if (st == PULSE_OK)
    st = index_open_shards(m, path, wm);
done:
  pulse_json_doc_free(doc);
  return st;
}

/* -------------------------------------------------------------- model API */

static int has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int is_regular(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Picks the model file of a directory into *out (malloc'd). */
static pulse_status dir_pick(const char *dir, char **out) {
  size_t dir_len = strlen(dir);
  char *p = path_join(dir, dir_len, INDEX_NAME);
  if (p == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: path");
  if (is_regular(p)) {
    *out = p;
    return PULSE_OK;
  }
  free(p);
  p = path_join(dir, dir_len, SINGLE_NAME);
  if (p == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: path");
  if (is_regular(p)) {
    *out = p;
    return PULSE_OK;
  }
  free(p);
  DIR *d = opendir(dir);
  if (d == NULL)
    return pulse_fail(PULSE_ERR_IO, "safetensors: %s: %s", dir,
                      strerror(errno));
  char *found = NULL;
  size_t candidates = 0;
  const struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] == '.' || !has_suffix(de->d_name, ".safetensors"))
      continue;
    char *q = path_join(dir, dir_len, de->d_name);
    if (q == NULL || !is_regular(q)) {
      free(q);
      continue;
    }
    candidates++;
    free(found);
    found = q;
  }
  closedir(d);
  if (candidates == 1) {
    *out = found;
    return PULSE_OK;
  }
  free(found);
  if (candidates == 0)
    return pulse_fail(PULSE_ERR_NOT_FOUND,
                      "safetensors: %s: no " INDEX_NAME ", " SINGLE_NAME
                      " or other .safetensors file",
                      dir);
  return pulse_fail(PULSE_ERR_ARG,
                    "safetensors: %s: %zu .safetensors files and no " INDEX_NAME
                    ": name one",
                    dir, candidates);
}

pulse_status pulse_st_model_open(const char *path, pulse_st_model **out) {
  if (path == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: NULL argument");
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0)
    return pulse_fail(errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO,
                      "safetensors: %s: %s", path, strerror(errno));
  char *picked = NULL;
  if (S_ISDIR(sb.st_mode))
    PULSE_TRY(dir_pick(path, &picked));
  const char *file = picked != NULL ? picked : path;
  pulse_st_model *m = calloc(1, sizeof *m);
  if (m == NULL) {
    free(picked);
    return pulse_fail(PULSE_ERR_NOMEM, "safetensors: model");
  }
  pulse_status st = has_suffix(file, ".json") ? model_from_index(file, m)
                                              : model_from_file(file, m);
  if (st == PULSE_OK && m->meta_count > 1)
    qsort(m->meta, m->meta_count, sizeof *m->meta, kv_cmp);
  free(picked);
  if (st != PULSE_OK) {
    pulse_st_model_close(m);
    return st;
  }
  *out = m;
  return PULSE_OK;
}

size_t pulse_st_model_tensor_count(const pulse_st_model *model) {
  return model == NULL ? 0 : model->count;
}

pulse_status pulse_st_model_tensor_get(const pulse_st_model *model, size_t i,
                                       pulse_st_tensor *out) {
  if (model == NULL || out == NULL || i >= model->count)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: no tensor %zu", i);
  *out = model->tensors[i];
  return PULSE_OK;
}

pulse_status pulse_st_model_tensor_find(const pulse_st_model *model,
                                        const char *name,
                                        pulse_st_tensor *out) {
  if (model == NULL || name == NULL || out == NULL)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: NULL argument");
  size_t lo = 0, hi = model->count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(model->by_name[mid]->name, name);
    if (c == 0) {
      *out = *model->by_name[mid];
      return PULSE_OK;
    }
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return pulse_fail(PULSE_ERR_NOT_FOUND, "safetensors: no tensor '%.*s'",
                    QUOTE_MAX, name);
}

const char *pulse_st_model_metadata_get(const pulse_st_model *model,
                                        const char *key) {
  if (model == NULL || key == NULL)
    return NULL;
  size_t lo = 0, hi = model->meta_count;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(model->meta[mid].key, key);
    if (c == 0)
      return model->meta[mid].value;
    if (c < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return NULL;
}

size_t pulse_st_model_metadata_count(const pulse_st_model *model) {
  return model == NULL ? 0 : model->meta_count;
}

pulse_status pulse_st_model_metadata_at(const pulse_st_model *model, size_t i,
                                        const char **key, const char **value) {
  if (model == NULL || i >= model->meta_count)
    return pulse_fail(PULSE_ERR_ARG, "safetensors: no metadata entry %zu", i);
  if (key != NULL)
    *key = model->meta[i].key;
  if (value != NULL)
    *value = model->meta[i].value;
  return PULSE_OK;
}

size_t pulse_st_model_shard_count(const pulse_st_model *model) {
  return model == NULL ? 0 : model->shard_count;
}

const pulse_st_file *pulse_st_model_shard(const pulse_st_model *model,
                                          size_t i) {
  if (model == NULL || i >= model->shard_count)
    return NULL;
  return model->shards[i];
}
