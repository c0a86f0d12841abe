/* Crash-safe file replacement (pulse_file.h). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pulse_file.h"

static char *make_dir(void) {
  char tmpl[] = "/tmp/pulse-file-XXXXXX";
  char *d = mkdtemp(tmpl);
  cr_assert_not_null(d);
  return strdup(d);
}

static int entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; (e = readdir(d)) != NULL;)
    n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
  closedir(d);
  return n;
}

static char *slurp(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "%s", path);
  char *buf = calloc(1, 4096);
  *len = fread(buf, 1, 4096, f);
  fclose(f);
  return buf;
}

Test(file, write_then_replace_leaves_only_the_new_content) {
  char *dir = make_dir(), path[512];
  snprintf(path, sizeof path, "%s/out.bin", dir);
  cr_assert_eq(pulse_file_write_atomic(path, "old", 3), PULSE_OK);
  cr_assert_eq(pulse_file_write_atomic(path, "newer", 5), PULSE_OK);
  size_t len;
  char *got = slurp(path, &len);
  cr_assert_eq(len, 5);
  cr_assert_eq(memcmp(got, "newer", 5), 0);
  cr_assert_eq(entries(dir), 1, "no temporary file may remain");
  unlink(path), rmdir(dir), free(got), free(dir);
}

Test(file, abort_keeps_the_old_file_and_removes_the_temporary) {
  char *dir = make_dir(), path[512];
  snprintf(path, sizeof path, "%s/out.bin", dir);
  cr_assert_eq(pulse_file_write_atomic(path, "old", 3), PULSE_OK);
  pulse_atomic_file *f = NULL;
  cr_assert_eq(pulse_atomic_file_create(path, &f), PULSE_OK);
  cr_assert_eq(pulse_atomic_file_write(f, "partial", 7), PULSE_OK);
  cr_assert_eq(entries(dir), 2, "the temporary file exists while writing");
  pulse_atomic_file_abort(f);
  size_t len;
  char *got = slurp(path, &len);
  cr_assert_eq(len, 3);
  cr_assert_eq(memcmp(got, "old", 3), 0);
  cr_assert_eq(entries(dir), 1);
  unlink(path), rmdir(dir), free(got), free(dir);
}

Test(file, missing_directory_and_bad_paths_are_refused) {
  cr_assert_eq(pulse_file_write_atomic("/nonexistent-pulse-dir/x", "a", 1), PULSE_ERR_IO);
  cr_assert_eq(pulse_file_write_atomic("", "a", 1), PULSE_ERR_ARG);
  cr_assert_eq(pulse_file_write_atomic("/tmp/", "a", 1), PULSE_ERR_ARG);
  pulse_atomic_file_abort(NULL);
}
