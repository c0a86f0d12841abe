/* sub_file_impl.h - private to the file target: sub_file.c (load, save,
 * whole rewrites), sub_journal.c (the in-place writer and its journal),
 * sub_file_snapshot.c (the optional consistent copy).
 *
 * How the file moves one sync (DESIGN invariant 6 for a file updated in
 * place): the changes of the sync (the patches' new bits at their file
 * offsets) and the new header (the step claim) go into one transaction that
 * is appended to the journal `.<name>.journal` next to the file and synced;
 * only then are the file pages that hold changes written (pwrite, coalesced
 * runs of 4 KiB pages, from the state in memory), then the header. Not a
 * shared mapping: in a virtual machine each first write to a mapped page
 * after its write-back is a page fault that costs more than copying the
 * page (measured: 40-175 s against 0.2-0.5 s for 5 M changes in 500 MB on
 * the shared 2-core machine). The file's own pages are synced and the
 * journal emptied at a checkpoint (when
 * the journal outgrows the file, before a whole rewrite, at the next
 * attach; a close leaves the pages to the kernel), so a
 * step costs what changed and not the model's size. After a crash the next
 * attach replays every whole (checksummed) transaction in order (absolute
 * values: replaying twice is harmless) and drops a torn one, whose data was
 * never written: the file then holds exactly the last step synced. */
#ifndef PULSE_SUB_FILE_IMPL_H
#define PULSE_SUB_FILE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>

#include "bytebuf_impl.h"
#include "sub_impl.h"

struct sub_file {
  /* The file, opened read-write; fd -1 when it must be written whole (none
   * yet, unreadable, or not ours to patch in place). */
  int fd;
  uint8_t *map;         /* read-only mapping, while the file is loaded */
  uint64_t size;        /* of the file */
  uint64_t header_size; /* the 8-byte length and the header JSON */
  uint64_t *offset;     /* per target: where its data starts in the file */
  size_t noffset;

  char *journal_path;
  int jfd;               /* -1 until the first transaction */
  uint64_t journal_size; /* bytes of whole transactions in it */

  /* Changes committed since the last save, as journal records (file
   * offset, count, then gap and new bits per change). */
  pulse_bytebuf pending;
  uint64_t pending_changes;
  uint64_t pending_steps; /* patches committed since the last save */
  /* File pages (4 KiB) that hold pending changes: one bit each, for
   * size / 4096 + 1 pages; NULL until the first change. */
  uint64_t *dirty;

  /* --snapshot-every (sub_file_snapshot.c) */
  char *snapshot_path;
  uint64_t snapshot_every;   /* 0: none */
  uint64_t snapshot_step;    /* step of the last snapshot started */
  pthread_t snapshot_thread;
  int snapshot_running;
  atomic_int snapshot_done;
  pulse_status snapshot_status;
};

/* ------------------------------------------------------------ sub_file.c */

/** Test hook (PULSE_TEST_KILL_AFTER_BYTES=N in the environment): the
 * number of bytes the file target may still write (file, journal, whole
 * rewrites) before the process kills itself with SIGKILL, or -1 without
 * the hook. A write that would cross it writes the part up to it, then the
 * process dies: a crash at an exact byte. */
int64_t sub_file_kill_budget(void);
/** Counts n bytes written (figures; the hook's budget: past it, SIGKILL). */
void sub_file_wrote(pulse_sub *sub, uint64_t n);
/** A point between writes where the hook may stop the process (it costs
 * one unit of the budget). */
void sub_file_kill_point(void);
/** Writes n bytes at offset of fd, obeying the kill hook. */
pulse_status sub_file_pwrite(pulse_sub *sub, int fd, const void *data, uint64_t n,
                             uint64_t offset, const char *what);

/* --------------------------------------------------------- sub_journal.c */

/** Checks one transaction at t (n bytes there) for a file of file_size
 * bytes: magic, sizes, checksum, then every record inside the file's data
 * and every position inside its tensor (a journal is untrusted bytes).
 * @return 1 and *used (its size), or 0: torn, foreign or corrupt. */
int sub_journal_check(const uint8_t *t, size_t n, uint64_t file_size, size_t *used);
/** Applies the part of a transaction that passed sub_journal_check which
 * falls inside the file bytes [at, at + n), held in win (the header and the
 * changes, absolute values: applying twice leaves the same bytes). */
void sub_journal_apply_window(uint8_t *win, uint64_t at, uint64_t n, const uint8_t *t,
                              size_t size);

/** Replays the whole transactions of the journal of sub->file_path into
 * the file (before it is read), a window of the file at a time (pread,
 * apply, pwrite of the pages that differ), then syncs the file and removes
 * the journal; a torn or foreign transaction and everything after it is
 * dropped. *replayed gets the number of transactions replayed. */
pulse_status sub_journal_recover(pulse_sub *sub, uint64_t *replayed);
/** At attach, once the file's tensors are read into t[0, n) (at the file
 * offsets sub->file->offset; the file still mapped, for its header): when
 * there is no journal, *done = 1. When the journal's last whole transaction
 * claims the header the file holds (the last run wrote each step it
 * journaled to its end, the header last; a power cut may still have lost
 * pages) and every record is a whole tensor of t, the journal is replayed
 * into t, the pages that then differ from the file are written, the file
 * synced and the journal retired: *done = 1, and the file is read once.
 * Else (a step stopped in the middle, a file that cannot be written, a
 * journal of another layout) nothing is changed and *done = 0: the caller
 * uses sub_journal_recover, then reads the file again. */
pulse_status sub_journal_replay_loaded(pulse_sub *sub, sub_target *t, size_t n, int writable,
                                       int *done);
/** One transaction: the pending changes and `header` (header_size bytes,
 * the new claim) into the journal, synced, then the dirty pages from the
 * targets and the header into the file; a checkpoint when the journal
 * outgrew the file. */
pulse_status sub_journal_commit(pulse_sub *sub, const uint8_t *header);
/** Syncs the file's pages, then empties the journal (remove: also deletes
 * its file). */
pulse_status sub_journal_checkpoint(pulse_sub *sub, int remove);

/* -------------------------------------------------- sub_file_snapshot.c */

/** After a save: starts writing the snapshot when it is due. */
void sub_file_snapshot_maybe(pulse_sub *sub);
/** Waits for a snapshot being written. */
void sub_file_snapshot_wait(pulse_sub *sub);

#endif /* PULSE_SUB_FILE_IMPL_H */
