/* publisher_sections.c - the section index beside each patch (issue 34):
 * sections/<patch sha256>, so that a worker holding some tensors fetches
 * and verifies only their sections. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "publisher_sections_impl.h"
#include "status_impl.h"
#include "store_impl.h"
#include "store_sections_impl.h"

/* Makes sections/ once, durably (the store folder fsynced after). */
static pulse_status sections_folder(const char *dir, const char *folder) {
  struct stat sb;
  if (stat(folder, &sb) == 0 && S_ISDIR(sb.st_mode))
    return PULSE_OK;
  if (mkdir(folder, 0777) != 0 && errno != EEXIST)
    return pulse_fail(PULSE_ERR_IO, "publisher: %s: %s", folder, strerror(errno));
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int ok = fd >= 0 && (fsync(fd) == 0 || errno == EINVAL);
  if (fd >= 0)
    close(fd);
  return ok ? PULSE_OK
            : pulse_fail(PULSE_ERR_IO, "publisher: %s: fsync: %s", dir, strerror(errno));
}

pulse_status pub_sections_write(const pulse_pub *pub, const pulse_buffer *patch,
                                const pulse_store_object *obj) {
  pulse_patch *p = NULL;
  PULSE_TRY(pulse_patch_open(patch->data, patch->size, &p));
  int wanted = store_sections_wanted(p);
  pulse_patch_free(p);
  if (!wanted)
    return PULSE_OK;
  pulse_buffer b = {NULL, 0};
  PULSE_TRY(store_sections_build(patch->data, patch->size, obj->sha256,
                                 pub->opts.key, &b));
  char folder[4096], rel[PULSE_STORE_PATH_MAX + 16], path[4096];
  pulse_status st = PULSE_OK;
  store_sections_path(obj->sha256, rel, sizeof rel);
  if (store_join(folder, sizeof folder, pub->dir, STORE_SECTIONS_DIR) != 0 ||
      store_join(path, sizeof path, pub->dir, rel) != 0)
    st = pulse_fail(PULSE_ERR_ARG, "publisher: folder name too long");
  if (st == PULSE_OK)
    st = sections_folder(pub->dir, folder);
  pub_staged staged;
  memset(&staged, 0, sizeof staged);
  int renamed = 0;
  if (st == PULSE_OK)
    st = pub_staged_write(folder, "sections", b.data, b.size, &staged);
  if (st == PULSE_OK)
    st = pub_staged_publish(&staged, path, &renamed);
  pulse_buffer_free(&b);
  return st;
}
