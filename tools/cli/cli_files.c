/* cli_files.c - file helpers and BF16 model states for the programs. */
#include "cli_files.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli_args.h"

/* The library's pulse_fail is private: programs report through their own
 * messages, so these helpers return plain statuses and print nothing. */

pulse_status pulse_cli_read_file(const char *path, pulse_buffer *out) {
  out->data = NULL;
  out->size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return errno == ENOENT ? PULSE_ERR_NOT_FOUND : PULSE_ERR_IO;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return PULSE_ERR_IO;
  }
  size_t size = (size_t)st.st_size;
  uint8_t *data = malloc(size ? size : 1);
  if (data == NULL) {
    close(fd);
    return PULSE_ERR_NOMEM;
  }
  size_t got = 0;
  while (got < size) {
    ssize_t n = read(fd, data + got, size - got);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      free(data);
      close(fd);
      return PULSE_ERR_IO;
    }
    got += (size_t)n;
  }
  close(fd);
  out->data = data;
  out->size = size;
  return PULSE_OK;
}

void pulse_cli_state_free(pulse_cli_state *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->count; i++)
    if (s->owned && s->owned[i])
      free(s->bits[i]);
  free(s->info), free(s->bits), free(s->numel), free(s->owned);
  pulse_st_model_close(s->model);
  memset(s, 0, sizeof *s);
}

pulse_status pulse_cli_state_load(const char *path, int writable, pulse_cli_state *out) {
  memset(out, 0, sizeof *out);
  pulse_status st = pulse_st_model_open(path, &out->model);
  if (st != PULSE_OK)
    return st;
  size_t n = pulse_st_model_tensor_count(out->model);
  out->info = calloc(n + 1, sizeof *out->info);
  out->bits = calloc(n + 1, sizeof *out->bits);
  out->numel = calloc(n + 1, sizeof *out->numel);
  out->owned = calloc(n + 1, 1);
  if (!out->info || !out->bits || !out->numel || !out->owned) {
    pulse_cli_state_free(out);
    return PULSE_ERR_NOMEM;
  }
  out->count = n;
  for (size_t i = 0; i < n && st == PULSE_OK; i++) {
    pulse_st_tensor t;
    st = pulse_st_model_tensor_get(out->model, i, &t);
    if (st != PULSE_OK)
      break;
    out->info[i].name = t.name;
    out->info[i].dtype = PULSE_DTYPE_BF16;
    out->info[i].ndim = t.ndim;
    memcpy(out->info[i].shape, t.shape, sizeof t.shape);
    out->numel[i] = t.numel;
    if (t.dtype == PULSE_DTYPE_BF16 && !writable && ((uintptr_t)t.data & 1u) == 0) {
      out->bits[i] = (uint16_t *)(uintptr_t)t.data; /* read-only map */
      continue;
    }
    out->bits[i] = malloc(t.numel * 2 + 2);
    if (out->bits[i] == NULL) {
      st = PULSE_ERR_NOMEM;
      break;
    }
    out->owned[i] = 1;
    if (t.dtype == PULSE_DTYPE_BF16) {
      memcpy(out->bits[i], t.data, t.numel * 2);
    } else if (t.dtype == PULSE_DTYPE_F32) {
      float *tmp = malloc(t.numel * 4 + 4); /* the map may be unaligned */
      if (tmp == NULL) {
        st = PULSE_ERR_NOMEM;
        break;
      }
      memcpy(tmp, t.data, t.numel * 4);
      pulse_bf16_cast_f32(tmp, out->bits[i], t.numel);
      free(tmp);
    } else {
      st = PULSE_ERR_DTYPE;
    }
  }
  if (st != PULSE_OK)
    pulse_cli_state_free(out);
  return st;
}

int pulse_cli_state_step(const pulse_cli_state *s, uint64_t *step) {
  const char *v = pulse_st_model_metadata_get(s->model, "step");
  return v != NULL && pulse_cli_parse_u64(v, step) == 0;
}

pulse_status pulse_cli_state_digest(const pulse_cli_state *s, pulse_tensor_digest *per_tensor,
                                   pulse_state_digest *out) {
  for (size_t i = 0; i < s->count; i++)
    per_tensor[i] = pulse_digest_bf16(s->bits[i], s->numel[i]);
  return pulse_state_digest_compute(s->info, per_tensor, s->count, out);
}
