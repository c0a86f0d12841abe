/* pulse-apply BASE PATCH -o OUT: writes the patch's target state as a BF16
 * safetensors file. The base is checked against the patch's base digests and
 * the result against its target digests before OUT is written; on any error
 * the program exits non-zero with a message and OUT does not appear. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pulse_codec.h"
#include "pulse_safetensors.h"
#include "cli_args.h"
#include "cli_files.h"
#include "cli_time.h"

static void usage(FILE *f) {
  fprintf(f, "usage: pulse-apply BASE PATCH -o OUT [--threads N]\n"
             "  BASE    safetensors checkpoint at the patch's base step (file, index.json or directory)\n"
             "  PATCH   a pulse patch (pulse-diff, or a publisher's store)\n"
             "  OUT     the target checkpoint (one BF16 safetensors file, written atomically)\n");
}

static int fail(const char *what, pulse_status st) { return pulse_cli_fail("pulse-apply", what, st); }

int main(int argc, char **argv) {
  const char *paths[2] = {NULL, NULL}, *out_path = NULL, *v;
  int npaths = 0, threads = 0;
  for (int i = 1; i < argc; i++) {
    int r;
    if (pulse_cli_opt_flag(argv[i], "--help") || pulse_cli_opt_flag(argv[i], "-h")) {
      usage(stdout);
      return 0;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "-o", &v)) != 0) {
      if (r < 0)
        return usage(stderr), 2;
      out_path = v;
    } else if ((r = pulse_cli_opt_value(argc, argv, &i, "--threads", &v)) != 0) {
      if (r < 0 || pulse_cli_parse_int(v, 0, 256, &threads) != 0)
        return fprintf(stderr, "pulse-apply: --threads needs an integer in 0..256\n"), 2;
    } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
      fprintf(stderr, "pulse-apply: unknown option '%s'\n", argv[i]);
      return usage(stderr), 2;
    } else if (npaths < 2) {
      paths[npaths++] = argv[i];
    } else {
      return usage(stderr), 2;
    }
  }
  if (npaths != 2 || out_path == NULL)
    return usage(stderr), 2;

  double t0 = pulse_cli_now();
  pulse_buffer bytes = {NULL, 0};
  pulse_status st = pulse_cli_read_file(paths[1], &bytes);
  if (st != PULSE_OK)
    return fail(paths[1], st);
  pulse_patch *patch = NULL;
  st = pulse_patch_open(bytes.data, bytes.size, &patch);
  if (st != PULSE_OK) {
    pulse_buffer_free(&bytes);
    return fail(paths[1], st);
  }
  pulse_cli_state base;
  st = pulse_cli_state_load(paths[0], 1, &base);
  if (st != PULSE_OK) {
    pulse_patch_free(patch);
    pulse_buffer_free(&bytes);
    return fail(paths[0], st);
  }
  int rc = 0;
  size_t n = base.count;
  pulse_host_tensor *targets = calloc(n + 1, sizeof *targets);
  pulse_st_write_tensor *wt = calloc(n + 1, sizeof *wt);
  if (targets == NULL || wt == NULL) {
    rc = fail("memory", PULSE_ERR_NOMEM);
    goto done;
  }
  for (size_t i = 0; i < n; i++) {
    size_t idx;
    if (pulse_patch_tensor_find(patch, base.info[i].name, &idx) != PULSE_OK) {
      fprintf(stderr, "pulse-apply: BASE has tensor '%s', which the patch does not know: "
                      "not the patch's model\n", base.info[i].name);
      rc = 1;
      goto done;
    }
    targets[i] = (pulse_host_tensor){base.info[i].name, base.bits[i], base.numel[i], NULL};
  }
  pulse_apply_opts opts;
  pulse_apply_opts_init(&opts);
  opts.threads = threads;
  st = pulse_patch_apply(patch, targets, n, &opts);
  if (st != PULSE_OK) {
    rc = fail("apply", st);
    goto done;
  }
  char step_text[32], digest_hex[65];
  snprintf(step_text, sizeof step_text, "%" PRIu64, pulse_patch_step(patch));
  pulse_state_digest_hex(pulse_patch_target_digest(patch), digest_hex);
  pulse_st_kv meta[2] = {{"step", step_text}, {"pulse_state_digest", digest_hex}};
  for (size_t i = 0; i < n; i++) {
    wt[i].name = base.info[i].name;
    wt[i].dtype = PULSE_DTYPE_BF16;
    wt[i].ndim = base.info[i].ndim;
    memcpy(wt[i].shape, base.info[i].shape, sizeof wt[i].shape);
    wt[i].data = base.bits[i];
  }
  st = pulse_st_write(out_path, wt, n, meta, 2);
  if (st != PULSE_OK) {
    rc = fail(out_path, st);
    goto done;
  }
  printf("pulse-apply: step %" PRIu64 " <- %" PRIu64 ": %" PRIu64 " parameters changed, "
         "state %s, %.2f s\n",
         pulse_patch_step(patch), pulse_patch_base_step(patch), pulse_patch_total_changed(patch),
         digest_hex, pulse_cli_now() - t0);
done:
  free(targets), free(wt);
  pulse_cli_state_free(&base);
  pulse_patch_free(patch);
  pulse_buffer_free(&bytes);
  return rc;
}
