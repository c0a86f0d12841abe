/* pulse-inspect FILE: describes and checks a patch or a safetensors model.
 * Exit status 0 only when the file is valid. A patch's streams are decoded
 * (all but version 1 class-model ones) or, with --base, the patch is
 * applied to a copy of the base and checked
 * against every digest. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_args.h"
#include "cli_files.h"
#include "pulse_codec.h"
#include "pulse_safetensors.h"
#include "pulse_version.h"

static void usage(FILE *f) {
  fprintf(f, "usage: pulse-inspect FILE [--base BASE] [--quiet]\n"
             "       pulse-inspect --version\n"
             "  FILE         a pulse patch, a .safetensors file, a "
             "model.safetensors.index.json\n"
             "               or a model directory\n"
             "  --base BASE  for a patch: apply it to a copy of BASE and check "
             "every digest\n"
             "  --quiet      print only errors\n"
             "  --version    the library's version and the patch format "
             "versions it reads\n");
}

static int fail(const char *what, pulse_status st) {
  char invalid[4096];
  snprintf(invalid, sizeof invalid, "%s: invalid", what);
  return pulse_cli_fail("pulse-inspect", invalid, st);
}

static void print_shape(const pulse_tensor_info *info) {
  printf("[");
  for (uint32_t d = 0; d < info->ndim; d++)
    printf(d ? ", %" PRIu64 : "%" PRIu64, info->shape[d]);
  printf("]");
}

static int inspect_patch(const char *path, const pulse_buffer *bytes, const char *base_path, int quiet) {
  pulse_patch *p = NULL;
  pulse_status st = pulse_patch_open(bytes->data, bytes->size, &p);
  if (st != PULSE_OK)
    return fail(path, st);
  size_t n = pulse_patch_tensor_count(p);
  char base_hex[65], target_hex[65];
  pulse_state_digest_hex(pulse_patch_base_digest(p), base_hex);
  pulse_state_digest_hex(pulse_patch_target_digest(p), target_hex);
  if (!quiet) {
    printf("pulse patch v%u, %zu bytes\n", pulse_patch_format_version(p), bytes->size);
    if (pulse_patch_value_model_size(p) > 0)
      printf("  value model %zu bytes (in the tensor table)\n",
             pulse_patch_value_model_size(p));
    printf("  step %" PRIu64 " <- base step %" PRIu64 "\n", pulse_patch_step(p), pulse_patch_base_step(p));
    printf("  position model %s, chunks of 2^%u elements\n",
           pulse_patch_pos_model(p) == PULSE_POS_CLASS ? "class (old exponent)" : "plain",
           pulse_patch_chunk_log2(p));
    printf("  base state   %s\n  target state %s\n", base_hex, target_hex);
  }
  uint64_t numel = 0;
  int rc = 0;
  for (size_t i = 0; i < n; i++) {
    pulse_patch_tensor t;
    pulse_patch_tensor_get(p, i, &t);
    numel += t.numel;
    if (!quiet) {
      printf("  %-40s ", t.info.name);
      print_shape(&t.info);
      printf(" changed %" PRIu64 " (%.3f%%) in %" PRIu64 " bytes\n", t.changed,
             t.numel ? 100.0 * (double)t.changed / (double)t.numel : 0.0, t.section_size);
    }
  }
  /* Without weights: every stream that decodes without them (all but
   * version 1 class-model ones). */
  int streams_checked = 0;
  if (rc == 0 && base_path == NULL) {
    st = pulse_patch_check_streams(p, 0);
    if (st == PULSE_OK)
      streams_checked = 1;
    else if (st != PULSE_ERR_UNSUPPORTED)
      rc = fail(path, st);
  }
  uint64_t total = pulse_patch_total_changed(p);
  if (rc == 0 && !quiet)
    printf("  total: %zu tensors, %" PRIu64 " of %" PRIu64 " changed (%.3f%%), %.3f bytes/changed, "
           "%.1fx smaller than dense BF16\n",
           n, total, numel, numel ? 100.0 * (double)total / (double)numel : 0.0,
           total ? (double)bytes->size / (double)total : 0.0,
           bytes->size ? 2.0 * (double)numel / (double)bytes->size : 0.0);
  if (rc == 0 && base_path != NULL) {
    pulse_cli_state base;
    st = pulse_cli_state_load(base_path, 1, &base);
    if (st != PULSE_OK) {
      rc = fail(base_path, st);
    } else {
      pulse_host_tensor *tg = calloc(base.count + 1, sizeof *tg);
      for (size_t i = 0; tg && i < base.count; i++)
        tg[i] = (pulse_host_tensor){base.info[i].name, base.bits[i], base.numel[i], NULL};
      pulse_apply_opts o;
      pulse_apply_opts_init(&o);
      o.threads = 0;
      st = tg ? pulse_patch_apply(p, tg, base.count, &o) : PULSE_ERR_NOMEM;
      if (st != PULSE_OK)
        rc = fail(path, st);
      else if (!quiet)
        printf("  applies to %s: every base and target digest matches\n", base_path);
      free(tg);
      pulse_cli_state_free(&base);
    }
  } else if (rc == 0 && !quiet) {
    printf("  (%s; pass --base BASE to apply it and check every digest)\n",
           streams_checked ? "header, tables and every stream checked"
                           : "header and tables checked");
  }
  if (rc == 0 && !quiet)
    printf("valid\n");
  pulse_patch_free(p);
  return rc;
}

static int inspect_model(const char *path, int quiet) {
  pulse_st_model *m = NULL;
  pulse_status st = pulse_st_model_open(path, &m);
  if (st != PULSE_OK)
    return fail(path, st);
  size_t n = pulse_st_model_tensor_count(m);
  uint64_t numel = 0, bytes = 0;
  int all_bf16 = 1;
  if (!quiet)
    printf("safetensors model, %zu shard(s), %zu tensors\n", pulse_st_model_shard_count(m), n);
  for (size_t i = 0; i < pulse_st_model_metadata_count(m) && !quiet; i++) {
    const char *k, *v;
    if (pulse_st_model_metadata_at(m, i, &k, &v) == PULSE_OK)
      printf("  metadata %s = %s\n", k, v);
  }
  for (size_t i = 0; i < n; i++) {
    pulse_st_tensor t;
    pulse_st_model_tensor_get(m, i, &t);
    numel += t.numel;
    bytes += t.nbytes;
    all_bf16 &= t.dtype == PULSE_DTYPE_BF16 || t.dtype == PULSE_DTYPE_F32;
    if (!quiet) {
      pulse_tensor_info info = {t.name, t.dtype, t.ndim, {0}};
      memcpy(info.shape, t.shape, sizeof info.shape);
      printf("  %-40s %-4s ", t.name, pulse_dtype_name(t.dtype));
      print_shape(&info);
      printf("\n");
    }
  }
  pulse_st_model_close(m);
  if (!quiet)
    printf("  total: %" PRIu64 " parameters, %" PRIu64 " bytes\n", numel, bytes);
  if (all_bf16) {
    pulse_cli_state s;
    st = pulse_cli_state_load(path, 0, &s);
    if (st != PULSE_OK)
      return fail(path, st);
    pulse_tensor_digest *d = calloc(s.count + 1, sizeof *d);
    pulse_state_digest sd;
    st = d ? pulse_cli_state_digest(&s, d, &sd) : PULSE_ERR_NOMEM;
    free(d);
    pulse_cli_state_free(&s);
    if (st != PULSE_OK)
      return fail(path, st);
    char hex[65];
    pulse_state_digest_hex(&sd, hex);
    if (!quiet)
      printf("  BF16 state digest %s\n", hex);
  }
  if (!quiet)
    printf("valid\n");
  return 0;
}

int main(int argc, char **argv) {
  const char *path = NULL, *base = NULL, *v;
  int quiet = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_cli_opt_flag(argv[i], "--help") || pulse_cli_opt_flag(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if (pulse_cli_opt_flag(argv[i], "--version")) {
      unsigned oldest, newest;
      pulse_patch_versions_supported(&oldest, &newest);
      printf("pulse %s, patch format versions %u..%u (writes %u by default)\n",
             pulse_version(), oldest, newest, PULSE_PATCH_VERSION);
      return 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--base", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      base = v;
    } else if (pulse_cli_opt_flag(argv[i], "--quiet")) {
      quiet = 1;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "pulse-inspect: unknown option '%s'\n", argv[i]);
      return usage(stderr), 2;
    } else if (path == NULL) {
      path = argv[i];
    } else {
      return usage(stderr), 2;
    }
  }
  if (path == NULL)
    return usage(stderr), 2;
  /* A patch (by its magic) is read whole; anything else is opened as
   * safetensors, which maps rather than reads. */
  char magic[8] = {0};
  FILE *f = fopen(path, "rb");
  int is_patch = f != NULL && fread(magic, 1, 8, f) == 8 && memcmp(magic, "PULSEPCH", 8) == 0;
  if (f != NULL)
    fclose(f);
  if (!is_patch)
    return inspect_model(path, quiet);
  pulse_buffer bytes = {NULL, 0};
  pulse_status st = pulse_cli_read_file(path, &bytes);
  if (st != PULSE_OK)
    return fail(path, st);
  int rc = inspect_patch(path, &bytes, base, quiet);
  pulse_buffer_free(&bytes);
  return rc;
}
