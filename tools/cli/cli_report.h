/* cli_report.h - `pulse-bench MODE --report DIR`: named tables of a
 * benchmark's figures, written as DIR/<table>.csv, and one self-contained
 * DIR/report.html (inline CSS, charts as inline SVG, no script, no external
 * resource). Output is deterministic for the same data, except the date line.
 *
 * Usage: create a report, add tables (columns), append rows cell by cell,
 * add chart specs over the tables, then close. Adding never fails loudly: an
 * allocation failure is kept and returned by pulse_report_close, so a mode
 * collects rows where it prints them without checking each call.
 * Not thread-safe: one thread uses one report. Nothing here prints to
 * stdout. */
#ifndef PULSE_CLI_REPORT_H
#define PULSE_CLI_REPORT_H

#include <stddef.h>

#include "pulse_codec.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct pulse_report pulse_report;
typedef struct pulse_report_table pulse_report_table;

typedef enum { PULSE_REPORT_LINE = 0, PULSE_REPORT_BAR = 1 } pulse_report_kind;

/* One chart over one table. Column names must be columns of the table;
 * strings are copied by pulse_report_chart. A LINE chart plots each y
 * column against the numeric x column (rows whose x is text are placed by
 * row index); a BAR chart groups one bar per y column at each row, labelled
 * by the x column. Non-numeric, non-finite (and on a log axis, non-positive)
 * y cells are left out. */
typedef struct {
  pulse_report_kind kind;
  const char *table;
  const char *title;
  const char *x_column;
  const char *x_label; /* with units, e.g. "step" or "link speed (Gbit/s)" */
  const char *y_label; /* with units, e.g. "bytes per step (B)" */
  const char *const *y_columns;
  size_t y_count;
  int log_x; /* LINE only */
  int log_y;
} pulse_report_chart_spec;

/** Starts a report for `dir` (created if missing, with its parent). `mode`
 * names the pulse-bench mode; argv[0..argc) is the mode's command line (as
 * the mode received it: argv[0] is the mode name), shown in the header.
 * `*out` is owned by the caller: pulse_report_close frees it.
 * @return PULSE_OK, PULSE_ERR_IO (dir cannot be made), PULSE_ERR_NOMEM. */
pulse_status pulse_report_create(const char *dir, const char *mode, int argc, char **argv,
                                 pulse_report **out);

/** Adds a table named `name` (also its CSV file name: letters, digits, '_',
 * '-' only) with `ncols` column names. The table belongs to the report.
 * @return the table, or NULL (bad name, no memory: the error is kept and
 * the other calls accept NULL and do nothing). */
pulse_report_table *pulse_report_table_add(pulse_report *r, const char *name,
                                           const char *const *columns, size_t ncols);

/** Starts a new row; the cells that follow fill it left to right. Cells
 * past the last column are dropped; missing cells are empty. */
void pulse_report_row(pulse_report_table *t);

/** Appends a number to the current row (NaN prints as an empty cell). */
void pulse_report_num(pulse_report_table *t, double v);

/** Appends a text cell (copied) to the current row. */
void pulse_report_text(pulse_report_table *t, const char *s);

/** Adds a chart (the spec and its strings are copied). */
void pulse_report_chart(pulse_report *r, const pulse_report_chart_spec *spec);

/** Adds a paragraph of text (copied) under the header, e.g. why a mode
 * measured nothing. */
void pulse_report_note(pulse_report *r, const char *text);

/** Writes DIR/<table>.csv for each table and DIR/report.html, then frees the
 * report (NULL is fine: PULSE_OK). On failure, a line saying what failed
 * goes to `detail` (detail_size bytes, may be NULL).
 * @return PULSE_OK, PULSE_ERR_NOMEM (an earlier call ran out of memory;
 * files are still written when possible), PULSE_ERR_IO, PULSE_ERR_ARG (a
 * bad table name or a chart naming a missing table or column). */
pulse_status pulse_report_close(pulse_report *r, char *detail, size_t detail_size);

#ifdef __cplusplus
}
#endif
#endif /* PULSE_CLI_REPORT_H */
