/* sub_targets.c - attaching the tensors a subscriber keeps current: host
 * buffers, device buffers, or a safetensors file (sub_file.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_log.h"
#include "status_impl.h"
#include "sub_impl.h"

static pulse_status add_target(pulse_sub *sub, const char *name, uint32_t ndim,
                               const uint64_t *shape, uint16_t *data,
                               uint16_t *data_d, sub_mem mem) {
  if (sub == NULL || name == NULL || name[0] == '\0' ||
      strlen(name) > PULSE_MAX_NAME || ndim > PULSE_MAX_DIMS ||
      (ndim > 0 && shape == NULL))
    return pulse_fail(PULSE_ERR_ARG,
                      "attach: NULL subscriber, bad name or shape");
  if (sub->mem != SUB_MEM_NONE && sub->mem != mem)
    return pulse_fail(PULSE_ERR_ARG, "attach '%s': %s", name,
                      sub->mem == SUB_MEM_FILE
                          ? "a file target holds the whole table already"
                          : "host and device targets do not mix");
  for (size_t i = 0; i < sub->ntargets; i++)
    if (strcmp(sub->targets[i].name, name) == 0)
      return pulse_fail(PULSE_ERR_ARG, "attach: '%s' is attached already",
                        name);
  uint64_t numel;
  PULSE_TRY(pulse_shape_numel(shape, ndim, &numel));
  sub_index_stop(sub); /* the table moves */
  if (numel > 0 && data == NULL && data_d == NULL)
    return pulse_fail(PULSE_ERR_ARG, "attach '%s': NULL data", name);
  if ((uintptr_t)(data ? (void *)data : (void *)data_d) % 2 != 0)
    return pulse_fail(PULSE_ERR_ARG, "attach '%s': data not 2-byte aligned",
                      name);
  if (sub->ntargets == sub->cap) {
    size_t cap = sub->cap ? 2 * sub->cap : 16;
    sub_target *t = realloc(sub->targets, cap * sizeof *t);
    if (t == NULL)
      return pulse_fail(PULSE_ERR_NOMEM, "attach '%s'", name);
    sub->targets = t;
    sub->cap = cap;
  }
  sub_target *t = &sub->targets[sub->ntargets];
  memset(t, 0, sizeof *t);
  t->name = strdup(name);
  if (t->name == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "attach '%s'", name);
  t->ndim = ndim;
  if (ndim > 0)
    memcpy(t->shape, shape, ndim * sizeof *shape);
  t->numel = numel;
  t->data = data;
  t->data_d = data_d;
  if (mem == SUB_MEM_HOST) {
    t->digest = pulse_digest_bf16(data, numel);
  } else {
    pulse_cuda_bf16_tensor one = {data_d, numel};
    pulse_status st =
        pulse_cuda_digest(sub->ws, &one, 1, &t->digest, sub->opts.cuda_stream);
    if (st != PULSE_OK) {
      free(t->name);
      return st;
    }
  }
  sub->ntargets++;
  sub->mem = mem;
  /* New contents of unknown step. */
  sub_forget_step(sub);
  return PULSE_OK;
}

pulse_status pulse_sub_attach_host(pulse_sub *sub, const char *name,
                                   uint32_t ndim, const uint64_t *shape,
                                   uint16_t *data) {
  pulse_status st =
      add_target(sub, name, ndim, shape, data, NULL, SUB_MEM_HOST);
  return sub != NULL ? sub_keep_error(sub, st) : st;
}

pulse_status pulse_sub_attach_device(pulse_sub *sub, const char *name,
                                     uint32_t ndim, const uint64_t *shape,
                                     uint16_t *data_d) {
  if (sub == NULL)
    return pulse_fail(PULSE_ERR_ARG, "attach: NULL subscriber");
  if (!pulse_cuda_available()) {
    const char *why = pulse_cuda_unavailable_reason();
    pulse_status st = strstr(why, "without CUDA") != NULL ? PULSE_ERR_NOT_BUILT
                                                          : PULSE_ERR_CUDA;
    return sub_keep_error(sub, pulse_fail(st, "attach '%s' on the device: %s",
                                          name ? name : "", why));
  }
  if (sub->ws == NULL) {
    pulse_status st = pulse_cuda_workspace_create(&sub->ws);
    if (st != PULSE_OK)
      return sub_keep_error(sub, st);
  }
  return sub_keep_error(
      sub, add_target(sub, name, ndim, shape, NULL, data_d, SUB_MEM_DEVICE));
}

pulse_status pulse_sub_attach_file(pulse_sub *sub, const char *path) {
  if (sub == NULL || path == NULL || path[0] == '\0')
    return pulse_fail(PULSE_ERR_ARG, "attach: NULL subscriber or path");
  if (sub->mem != SUB_MEM_NONE)
    return sub_keep_error(
        sub, pulse_fail(PULSE_ERR_ARG, "attach %s: other targets are attached",
                        path));
  sub->file_path = strdup(path);
  if (sub->file_path == NULL)
    return pulse_fail(PULSE_ERR_NOMEM, "attach %s", path);
  sub->mem = SUB_MEM_FILE;
  return sub_keep_error(sub, sub_file_load(sub));
}

pulse_status pulse_sub_assume_step(pulse_sub *sub, uint64_t step) {
  if (sub == NULL || sub->ntargets == 0 || sub->mem == SUB_MEM_FILE ||
      step == PULSE_SUB_NO_STEP)
    return pulse_fail(PULSE_ERR_ARG,
                      "assume step: no host or device targets attached");
  pthread_rwlock_wrlock(&sub->rw);
  sub_set_step(sub, step, NULL);
  sub->step_claimed = 1;
  pthread_rwlock_unlock(&sub->rw);
  return PULSE_OK;
}

pulse_status pulse_sub_tensor(pulse_sub *sub, const char *name,
                              const uint16_t **data, uint64_t *numel) {
  if (sub == NULL || name == NULL || data == NULL)
    return pulse_fail(PULSE_ERR_ARG, "tensor: NULL argument");
  if (sub->mem == SUB_MEM_DEVICE || sub->mem == SUB_MEM_REGION)
    return pulse_fail(PULSE_ERR_UNSUPPORTED,
                      "tensor '%s': %s targets are the caller's", name,
                      sub->mem == SUB_MEM_DEVICE ? "device" : "region");
  for (size_t i = 0; i < sub->ntargets; i++)
    if (strcmp(sub->targets[i].name, name) == 0) {
      if (sub->step == PULSE_SUB_NO_STEP && sub->mem == SUB_MEM_FILE)
        break;
      *data = sub->targets[i].data;
      if (numel != NULL)
        *numel = sub->targets[i].numel;
      return PULSE_OK;
    }
  return pulse_fail(PULSE_ERR_NOT_FOUND, "no tensor '%s' held", name);
}
