/* cli_report.c - tables, CSV and a self-contained HTML page with SVG
 * charts for `pulse-bench --report DIR` (see cli_report.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli_report.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { CELL_EMPTY = 0, CELL_NUM, CELL_TEXT };

typedef struct {
  int kind;
  double num;
  char *text;
} cell;

struct pulse_report_table {
  pulse_report *owner;
  char *name;
  char **cols;
  size_t ncols;
  cell *cells; /* nrows * ncols, row-major */
  size_t nrows, cap_rows;
  size_t fill; /* next column of the current row */
};

typedef struct {
  pulse_report_kind kind;
  char *table, *title, *x, *x_label, *y_label;
  char **ys;
  size_t ny;
  int log_x, log_y;
} chart;

struct pulse_report {
  char *dir, *mode, *cmdline;
  pulse_report_table **tables;
  size_t ntables;
  chart *charts;
  size_t ncharts;
  char **notes;
  size_t nnotes;
  pulse_status err;
};

/* ------------------------------------------------------------- helpers */

static char *dup_str(pulse_report *r, const char *s) {
  char *d = strdup(s ? s : "");
  if (d == NULL && r)
    r->err = PULSE_ERR_NOMEM;
  return d;
}

/* Grows *arr (element size `size`) to hold n + 1 elements; 0 on success. */
static int grow(pulse_report *r, void **arr, size_t n, size_t size) {
  void *p = realloc(*arr, (n + 1) * size);
  if (p == NULL) {
    r->err = PULSE_ERR_NOMEM;
    return -1;
  }
  *arr = p;
  return 0;
}

static int mkdir_p(const char *dir) {
  char path[4096];
  size_t n = strlen(dir);
  if (n == 0 || n >= sizeof path)
    return -1;
  memcpy(path, dir, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (path[i] == '/' || path[i] == '\0') {
      char c = path[i];
      path[i] = '\0';
      if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return -1;
      path[i] = c;
    }
  }
  struct stat st;
  return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) ? 0 : -1;
}

static int name_ok(const char *s) {
  if (s == NULL || *s == '\0' || strlen(s) > 100)
    return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          *s == '_' || *s == '-'))
      return 0;
  return 1;
}

/* A number as text: integers exactly, others with `digits` significant. */
static void fmt_num(double v, int digits, char *buf, size_t size) {
  if (!isfinite(v))
    snprintf(buf, size, "%s", isnan(v) ? "" : (v > 0 ? "inf" : "-inf"));
  else if (v == floor(v) && fabs(v) < 1e15)
    snprintf(buf, size, "%.0f", v);
  else
    snprintf(buf, size, "%.*g", digits, v);
}

static void put_html(FILE *f, const char *s) {
  for (; s && *s; s++) {
    switch (*s) {
    case '&': fputs("&amp;", f); break;
    case '<': fputs("&lt;", f); break;
    case '>': fputs("&gt;", f); break;
    case '"': fputs("&quot;", f); break;
    case '\'': fputs("&#39;", f); break;
    default: fputc(*s, f);
    }
  }
}

/* Column names read better in legends with spaces for underscores. */
static void put_label(FILE *f, const char *s) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", s);
  for (char *p = buf; *p; p++)
    if (*p == '_')
      *p = ' ';
  put_html(f, buf);
}

static void put_csv(FILE *f, const char *s) {
  if (strpbrk(s, ",\"\r\n") == NULL) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"')
      fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

/* ---------------------------------------------------------------- build */

pulse_status pulse_report_create(const char *dir, const char *mode, int argc, char **argv,
                                 pulse_report **out) {
  *out = NULL;
  if (dir == NULL || mode == NULL)
    return PULSE_ERR_ARG;
  if (mkdir_p(dir) != 0)
    return PULSE_ERR_IO;
  pulse_report *r = calloc(1, sizeof *r);
  if (r == NULL)
    return PULSE_ERR_NOMEM;
  size_t len = strlen("pulse-bench") + 1;
  for (int i = 0; i < argc; i++)
    len += strlen(argv[i]) + 1;
  r->cmdline = malloc(len);
  r->dir = dup_str(r, dir);
  r->mode = dup_str(r, mode);
  if (r->cmdline == NULL || r->err != PULSE_OK) {
    free(r->cmdline), free(r->dir), free(r->mode), free(r);
    return PULSE_ERR_NOMEM;
  }
  strcpy(r->cmdline, "pulse-bench");
  for (int i = 0; i < argc; i++)
    strcat(strcat(r->cmdline, " "), argv[i]);
  *out = r;
  return PULSE_OK;
}

pulse_report_table *pulse_report_table_add(pulse_report *r, const char *name,
                                           const char *const *columns, size_t ncols) {
  if (r == NULL)
    return NULL;
  if (!name_ok(name) || ncols == 0) {
    if (r->err == PULSE_OK)
      r->err = PULSE_ERR_ARG;
    return NULL;
  }
  pulse_report_table *t = calloc(1, sizeof *t);
  if (t == NULL || grow(r, (void **)&r->tables, r->ntables, sizeof *r->tables) != 0) {
    r->err = PULSE_ERR_NOMEM;
    free(t);
    return NULL;
  }
  r->tables[r->ntables++] = t;
  t->owner = r;
  t->name = dup_str(r, name);
  t->cols = calloc(ncols, sizeof *t->cols);
  if (t->cols == NULL) {
    r->err = PULSE_ERR_NOMEM;
    return NULL;
  }
  t->ncols = ncols;
  for (size_t i = 0; i < ncols; i++)
    t->cols[i] = dup_str(r, columns[i]);
  t->fill = ncols; /* no current row yet */
  return t;
}

void pulse_report_row(pulse_report_table *t) {
  if (t == NULL)
    return;
  if (t->nrows == t->cap_rows) {
    size_t cap = t->cap_rows ? 2 * t->cap_rows : 16;
    cell *c = realloc(t->cells, cap * t->ncols * sizeof *c);
    if (c == NULL) {
      t->owner->err = PULSE_ERR_NOMEM;
      t->fill = t->ncols;
      return;
    }
    t->cells = c;
    t->cap_rows = cap;
  }
  memset(t->cells + t->nrows * t->ncols, 0, t->ncols * sizeof *t->cells);
  t->nrows++;
  t->fill = 0;
}

static cell *next_cell(pulse_report_table *t) {
  if (t == NULL || t->nrows == 0 || t->fill >= t->ncols)
    return NULL;
  return &t->cells[(t->nrows - 1) * t->ncols + t->fill++];
}

void pulse_report_num(pulse_report_table *t, double v) {
  cell *c = next_cell(t);
  if (c != NULL && !isnan(v)) {
    c->kind = CELL_NUM;
    c->num = v;
  }
}

void pulse_report_text(pulse_report_table *t, const char *s) {
  cell *c = next_cell(t);
  if (c != NULL) {
    c->text = dup_str(t->owner, s);
    c->kind = c->text ? CELL_TEXT : CELL_EMPTY;
  }
}

void pulse_report_chart(pulse_report *r, const pulse_report_chart_spec *s) {
  if (r == NULL || s == NULL || grow(r, (void **)&r->charts, r->ncharts, sizeof *r->charts) != 0)
    return;
  chart *c = &r->charts[r->ncharts++];
  memset(c, 0, sizeof *c);
  c->kind = s->kind;
  c->table = dup_str(r, s->table);
  c->title = dup_str(r, s->title);
  c->x = dup_str(r, s->x_column);
  c->x_label = dup_str(r, s->x_label);
  c->y_label = dup_str(r, s->y_label);
  c->log_x = s->log_x;
  c->log_y = s->log_y;
  c->ys = calloc(s->y_count ? s->y_count : 1, sizeof *c->ys);
  if (c->ys == NULL) {
    r->err = PULSE_ERR_NOMEM;
    return;
  }
  c->ny = s->y_count;
  for (size_t i = 0; i < s->y_count; i++)
    c->ys[i] = dup_str(r, s->y_columns[i]);
}

void pulse_report_note(pulse_report *r, const char *text) {
  if (r == NULL || grow(r, (void **)&r->notes, r->nnotes, sizeof *r->notes) != 0)
    return;
  r->notes[r->nnotes++] = dup_str(r, text);
}

/* ---------------------------------------------------------------- axes */

#define CHART_W 960
#define PLOT_L 96
#define PLOT_R (CHART_W - 230)
#define PLOT_T 48

typedef struct {
  double lo, hi; /* in axis space (log10 when log) */
  int log;
  double ticks[64];
  int nticks;
} axis;

static double nice_step(double range) {
  double e = pow(10, floor(log10(range)));
  double f = range / e;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * e;
}

/* An axis over [mn, mx] (data space, finite; > 0 when log). */
static void axis_make(axis *a, double mn, double mx, int log, int from_zero) {
  a->log = log;
  a->nticks = 0;
  if (log) {
    a->lo = floor(log10(mn));
    a->hi = ceil(log10(mx));
    if (a->hi <= a->lo)
      a->hi = a->lo + 1;
    int decades = (int)(a->hi - a->lo);
    for (int d = (int)a->lo; d <= (int)a->hi && a->nticks < 60; d++) {
      a->ticks[a->nticks++] = pow(10, d);
      if (decades <= 2 && d < (int)a->hi) {
        a->ticks[a->nticks++] = 2 * pow(10, d);
        a->ticks[a->nticks++] = 5 * pow(10, d);
      }
    }
    return;
  }
  if (from_zero) {
    if (mn > 0)
      mn = 0;
    if (mx < 0)
      mx = 0;
  }
  if (mx <= mn) {
    double pad = mn != 0 ? fabs(mn) * 0.1 : 1;
    mn -= pad, mx += pad;
  }
  double step = nice_step((mx - mn) / 5);
  a->lo = floor(mn / step) * step;
  a->hi = ceil(mx / step) * step;
  for (double v = a->lo; v <= a->hi + step * 1e-9 && a->nticks < 60; v += step)
    a->ticks[a->nticks++] = fabs(v) < step * 1e-9 ? 0 : v;
}

/* Fraction 0..1 of the way along the axis. */
static double axis_frac(const axis *a, double v) {
  double x = a->log ? log10(v) : v;
  return (x - a->lo) / (a->hi - a->lo);
}

/* Tick text: k/M/G/T for large values, plain %g otherwise. */
static void fmt_tick(double v, char *buf, size_t size) {
  static const char *suffix[] = {"", "k", "M", "G", "T", "P"};
  int k = 0;
  double a = fabs(v);
  while (a >= 1000 && k < 5)
    a /= 1000, v /= 1000, k++;
  snprintf(buf, size, "%.3g%s", v, suffix[k]);
}

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                      "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};
static const char *const dashes[] = {"", " stroke-dasharray=\"6,3\"",
                                     " stroke-dasharray=\"2,2\"", " stroke-dasharray=\"8,3,2,3\""};
#define PALETTE_N (sizeof palette / sizeof palette[0])

static int col_index(const pulse_report_table *t, const char *name) {
  for (size_t i = 0; i < t->ncols; i++)
    if (strcmp(t->cols[i], name) == 0)
      return (int)i;
  return -1;
}

static const pulse_report_table *find_table(const pulse_report *r, const char *name) {
  for (size_t i = 0; i < r->ntables; i++)
    if (r->tables[i]->name && strcmp(r->tables[i]->name, name) == 0)
      return r->tables[i];
  return NULL;
}

static const cell *cell_at(const pulse_report_table *t, size_t row, int col) {
  return &t->cells[row * t->ncols + (size_t)col];
}

static int y_ok(const cell *c, int log) {
  return c->kind == CELL_NUM && isfinite(c->num) && (!log || c->num > 0);
}

/* The cell's text for a category label. */
static void cell_label(const cell *c, char *buf, size_t size) {
  if (c->kind == CELL_NUM)
    fmt_num(c->num, 6, buf, size);
  else
    snprintf(buf, size, "%s", c->kind == CELL_TEXT ? c->text : "");
}

static void svg_text(FILE *f, double x, double y, const char *anchor, const char *extra,
                     const char *text) {
  fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>", x, y, anchor, extra);
  put_html(f, text);
  fputs("</text>\n", f);
}

static void svg_legend(FILE *f, const chart *c, int bars) {
  for (size_t s = 0; s < c->ny; s++) {
    double y = PLOT_T + 10 + 22.0 * (double)s;
    const char *col = palette[s % PALETTE_N];
    if (bars)
      fprintf(f, "<rect x=\"%d\" y=\"%.1f\" width=\"18\" height=\"12\" fill=\"%s\"/>\n",
              PLOT_R + 16, y - 6, col);
    else
      fprintf(f,
              "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\""
              "%s/><circle cx=\"%d\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n",
              PLOT_R + 12, y, PLOT_R + 40, y, col, dashes[(s / PALETTE_N) % 4], PLOT_R + 26, y, col);
    fprintf(f, "<text x=\"%d\" y=\"%.1f\" class=\"leg\">", PLOT_R + 48, y + 4.5);
    put_label(f, c->ys[s]);
    fputs("</text>\n", f);
  }
}

/* What svg_chart works out before drawing: the table, its columns, the
 * ranges and the layout. */
typedef struct {
  const pulse_report_table *t;
  int xc, yc[64];
  int bars, x_num, cat_labels, rotate;
  double ymn, ymx, xmn, xmx, group;
  int plot_b, height;
} chart_frame;

/* Finds the chart's table and columns and lays it out; 0, or -1 when it
 * names what is missing. */
static int chart_frame_make(const pulse_report *r, const chart *c, chart_frame *fr,
                            char *detail, size_t dsize) {
  const pulse_report_table *t = find_table(r, c->table);
  if (t == NULL) {
    snprintf(detail, dsize, "chart '%s': no table '%s'", c->title, c->table);
    return -1;
  }
  fr->t = t;
  fr->xc = col_index(t, c->x);
  if (fr->xc < 0 || c->ny == 0 || c->ny > 64) {
    snprintf(detail, dsize, "chart '%s': bad x column '%s' or y columns", c->title, c->x);
    return -1;
  }
  for (size_t s = 0; s < c->ny; s++)
    if ((fr->yc[s] = col_index(t, c->ys[s])) < 0) {
      snprintf(detail, dsize, "chart '%s': no column '%s' in '%s'", c->title, c->ys[s], t->name);
      return -1;
    }
  fr->bars = c->kind == PULSE_REPORT_BAR;
  /* x numeric when every row's x is a number (and > 0 on a log axis) */
  fr->x_num = !fr->bars && t->nrows > 0;
  for (size_t i = 0; fr->x_num && i < t->nrows; i++)
    fr->x_num = y_ok(cell_at(t, i, fr->xc), c->log_x);
  fr->ymn = INFINITY, fr->ymx = -INFINITY, fr->xmn = INFINITY, fr->xmx = -INFINITY;
  for (size_t i = 0; i < t->nrows; i++) {
    double xv = fr->x_num ? cell_at(t, i, fr->xc)->num : (double)i;
    fr->xmn = fmin(fr->xmn, xv), fr->xmx = fmax(fr->xmx, xv);
    for (size_t s = 0; s < c->ny; s++) {
      const cell *y = cell_at(t, i, fr->yc[s]);
      if (y_ok(y, c->log_y))
        fr->ymn = fmin(fr->ymn, y->num), fr->ymx = fmax(fr->ymx, y->num);
    }
  }
  /* Category labels below a bar chart turn when they would overlap. */
  size_t longest = 0;
  for (size_t i = 0; i < t->nrows; i++) {
    char lab[128];
    cell_label(cell_at(t, i, fr->xc), lab, sizeof lab);
    longest = strlen(lab) > longest ? strlen(lab) : longest;
  }
  fr->group = t->nrows ? (double)(PLOT_R - PLOT_L) / (double)t->nrows : 1;
  fr->cat_labels = fr->bars || !fr->x_num;
  fr->rotate = fr->cat_labels && (double)longest * 7.5 > fr->group;
  fr->plot_b = 300 + PLOT_T;
  fr->height = fr->plot_b + 64 + (fr->rotate ? (int)longest * 5 : 0);
  if (fr->height < PLOT_T + 22 * (int)c->ny + 40)
    fr->height = PLOT_T + 22 * (int)c->ny + 40;
  return 0;
}

/* The SVG element's start, its title and the axis labels. */
static void svg_chart_head(FILE *f, const chart *c, const chart_frame *fr) {
  fprintf(f, "<svg width=\"%d\" height=\"%d\" "
             "viewBox=\"0 0 %d %d\" role=\"img\">\n<title>",
          CHART_W, fr->height, CHART_W, fr->height);
  put_html(f, c->title);
  fputs("</title>\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n", f);
  svg_text(f, CHART_W / 2.0, 26, "middle", " class=\"ttl\"", c->title);
  char ylab[300];
  snprintf(ylab, sizeof ylab, "%s%s", c->y_label, c->log_y ? " - log scale" : "");
  fprintf(f, "<text transform=\"translate(20,%.1f) rotate(-90)\" text-anchor=\"middle\" "
             "class=\"ax\">",
          (PLOT_T + fr->plot_b) / 2.0);
  put_html(f, ylab);
  fputs("</text>\n", f);
  char xlab[300];
  snprintf(xlab, sizeof xlab, "%s%s", c->x_label, c->log_x && fr->x_num ? " - log scale" : "");
  svg_text(f, (PLOT_L + PLOT_R) / 2.0, fr->height - 12, "middle", " class=\"ax\"", xlab);
}

/* The x position of every row into px, with the x labels or ticks. */
static void svg_chart_x(FILE *f, const chart *c, const chart_frame *fr, double *px) {
  const pulse_report_table *t = fr->t;
  double pw = PLOT_R - PLOT_L;
  int plot_b = fr->plot_b;
  if (fr->cat_labels) {
    for (size_t i = 0; i < t->nrows; i++)
      px[i] = fr->bars ? PLOT_L + fr->group * ((double)i + 0.5)
                       : PLOT_L + 20 +
                             (pw - 40) * (t->nrows > 1 ? (double)i / (double)(t->nrows - 1) : 0.5);
    for (size_t i = 0; i < t->nrows; i++) {
      char lab[128];
      cell_label(cell_at(t, i, fr->xc), lab, sizeof lab);
      if (fr->rotate) {
        fprintf(f, "<text transform=\"translate(%.1f,%d) rotate(-35)\" text-anchor=\"end\" "
                   "class=\"tick\">",
                px[i] + 4, plot_b + 14);
        put_html(f, lab);
        fputs("</text>\n", f);
      } else {
        svg_text(f, px[i], plot_b + 18, "middle", " class=\"tick\"", lab);
      }
    }
    return;
  }
  axis xa;
  double xmn = fr->xmn, xmx = fr->xmx;
  /* integers spanning few values get one tick each */
  int per_value = !c->log_x && xmx - xmn <= 12 && floor(xmn) == xmn && floor(xmx) == xmx;
  if (per_value) {
    xa.log = 0, xa.nticks = 0;
    xa.lo = xmn - 0.5, xa.hi = xmx + 0.5;
    if (xmx == xmn)
      xa.lo = xmn - 1, xa.hi = xmx + 1;
    for (double v = xmn; v <= xmx && xa.nticks < 60; v += 1)
      xa.ticks[xa.nticks++] = v;
  } else {
    axis_make(&xa, xmn, xmx, c->log_x, 0);
  }
  for (size_t i = 0; i < t->nrows; i++)
    px[i] = PLOT_L + axis_frac(&xa, cell_at(t, i, fr->xc)->num) * pw;
  for (int k = 0; k < xa.nticks; k++) {
    double x = PLOT_L + axis_frac(&xa, xa.ticks[k]) * pw;
    char lab[32];
    fmt_tick(xa.ticks[k], lab, sizeof lab);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" class=\"grid\"/>\n", x, PLOT_T,
            x, plot_b);
    svg_text(f, x, plot_b + 18, "middle", " class=\"tick\"", lab);
  }
}

/* Series s: bars, or a line that breaks where a value is missing. */
static void svg_chart_series(FILE *f, const chart *c, const chart_frame *fr, const axis *ya,
                             const double *px, size_t s) {
  const pulse_report_table *t = fr->t;
  const char *col = palette[s % PALETTE_N];
  double ph = fr->plot_b - PLOT_T;
  int plot_b = fr->plot_b;
  if (fr->bars) {
    double bw = fr->group * 0.8 / (double)c->ny;
    for (size_t i = 0; i < t->nrows; i++) {
      const cell *y = cell_at(t, i, fr->yc[s]);
      if (!y_ok(y, c->log_y))
        continue;
      double base = c->log_y ? plot_b : plot_b - axis_frac(ya, 0) * ph;
      double top = plot_b - axis_frac(ya, y->num) * ph;
      double x = px[i] - fr->group * 0.4 + bw * (double)s;
      fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n", x,
              fmin(top, base), bw * 0.92, fabs(base - top), col);
      if (t->nrows * c->ny <= 40) {
        char lab[32];
        fmt_tick(y->num, lab, sizeof lab);
        svg_text(f, x + bw * 0.46, fmin(top, base) - 4, "middle", " class=\"val\"", lab);
      }
    }
    return;
  }
  int open = 0;
  for (size_t i = 0; i < t->nrows; i++) {
    const cell *y = cell_at(t, i, fr->yc[s]);
    if (!y_ok(y, c->log_y)) {
      if (open)
        fputs("\"/>\n", f);
      open = 0;
      continue;
    }
    if (!open)
      fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2.5\" "
                 "%s points=\"",
              col, dashes[(s / PALETTE_N) % 4]);
    fprintf(f, "%s%.1f,%.1f", open ? " " : "", px[i], plot_b - axis_frac(ya, y->num) * ph);
    open = 1;
  }
  if (open)
    fputs("\"/>\n", f);
  for (size_t i = 0; i < t->nrows; i++) {
    const cell *y = cell_at(t, i, fr->yc[s]);
    if (y_ok(y, c->log_y))
      fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"/>\n", px[i],
              plot_b - axis_frac(ya, y->num) * ph, col);
  }
}

/* Writes one chart as inline SVG; 0, or -1 when it names what is missing. */
static int svg_chart(FILE *f, const pulse_report *r, const chart *c, char *detail, size_t dsize) {
  chart_frame fr;
  if (chart_frame_make(r, c, &fr, detail, dsize) != 0)
    return -1;
  const pulse_report_table *t = fr.t;
  int plot_b = fr.plot_b;
  svg_chart_head(f, c, &fr);
  if (t->nrows == 0 || !(fr.ymn <= fr.ymx)) {
    svg_text(f, (PLOT_L + PLOT_R) / 2.0, (PLOT_T + plot_b) / 2.0, "middle", " class=\"ax\"",
             "no data");
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" "
               "stroke=\"#444\"/>\n</svg>\n",
            PLOT_L, PLOT_T, PLOT_R - PLOT_L, plot_b - PLOT_T);
    return 0;
  }
  axis ya;
  axis_make(&ya, fr.ymn, fr.ymx, c->log_y, fr.bars);
  double ph = plot_b - PLOT_T;
  for (int k = 0; k < ya.nticks; k++) {
    double y = plot_b - axis_frac(&ya, ya.ticks[k]) * ph;
    char lab[32];
    fmt_tick(ya.ticks[k], lab, sizeof lab);
    fprintf(f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" class=\"grid\"/>\n", PLOT_L, y,
            PLOT_R, y);
    svg_text(f, PLOT_L - 6, y + 4, "end", " class=\"tick\"", lab);
  }
  double *px = calloc(t->nrows, sizeof *px);
  if (px == NULL) {
    snprintf(detail, dsize, "out of memory");
    return -1;
  }
  svg_chart_x(f, c, &fr, px);
  for (size_t s = 0; s < c->ny; s++)
    svg_chart_series(f, c, &fr, &ya, px, s);
  free(px);
  fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#444\"/>\n",
          PLOT_L, PLOT_T, PLOT_R - PLOT_L, plot_b - PLOT_T);
  svg_legend(f, c, fr.bars);
  fputs("</svg>\n", f);
  return 0;
}

/* ---------------------------------------------------------------- write */

static void cpu_model(char *buf, size_t size) {
  snprintf(buf, size, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f == NULL)
    return;
  char line[512];
  while (fgets(line, sizeof line, f) != NULL) {
    if (strncmp(line, "model name", 10) == 0) {
      char *v = strchr(line, ':');
      if (v != NULL) {
        v++;
        while (*v == ' ' || *v == '\t')
          v++;
        v[strcspn(v, "\n")] = '\0';
        snprintf(buf, size, "%s", v);
      }
      break;
    }
  }
  fclose(f);
}

static int write_csv(const pulse_report *r, const pulse_report_table *t) {
  char path[4400];
  snprintf(path, sizeof path, "%s/%s.csv", r->dir, t->name);
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return -1;
  for (size_t j = 0; j < t->ncols; j++) {
    if (j)
      fputc(',', f);
    put_csv(f, t->cols[j]);
  }
  fputc('\n', f);
  for (size_t i = 0; i < t->nrows; i++) {
    for (size_t j = 0; j < t->ncols; j++) {
      const cell *c = cell_at(t, i, (int)j);
      char num[64];
      if (j)
        fputc(',', f);
      if (c->kind == CELL_NUM) {
        fmt_num(c->num, 9, num, sizeof num);
        fputs(num, f);
      } else if (c->kind == CELL_TEXT) {
        put_csv(f, c->text);
      }
    }
    fputc('\n', f);
  }
  int bad = ferror(f);
  return (fclose(f) != 0 || bad) ? -1 : 0;
}

static const char *const css =
    "body{font-family:'DejaVu Sans',Arial,sans-serif;margin:24px;color:#222;max-width:1000px}"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px}"
    ".meta{font-size:13px;color:#444}.meta td{padding:1px 10px 1px 0;vertical-align:top}"
    ".meta code{font-size:12px;word-break:break-all}"
    ".note{background:#fff4d6;border-left:4px solid #e0a800;padding:8px 12px}"
    "figure{margin:18px 0;border:1px solid #ddd}"
    "svg{display:block;font-family:'DejaVu Sans',Arial,sans-serif}"
    "svg .ttl{font-size:17px;font-weight:bold}svg .ax{font-size:14px}"
    "svg .tick{font-size:12px;fill:#333}svg .leg{font-size:13px}svg .val{font-size:10px;fill:#333}"
    "svg .grid{stroke:#e3e3e3;stroke-width:1}"
    "table.data{border-collapse:collapse;font-size:12px;margin-bottom:12px}"
    "table.data th,table.data td{border:1px solid #ccc;padding:2px 6px;text-align:right}"
    "table.data th{background:#f0f0f0}";

static int write_html(const pulse_report *r, char *detail, size_t dsize) {
  char path[4400];
  snprintf(path, sizeof path, "%s/report.html", r->dir);
  FILE *f = fopen(path, "w");
  if (f == NULL) {
    snprintf(detail, dsize, "cannot write %.400s", path);
    return -1;
  }
  char date[64], cpu[256];
  time_t now = time(NULL);
  struct tm tmv;
  strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", localtime_r(&now, &tmv));
  cpu_model(cpu, sizeof cpu);
  fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>pulse-bench ", f);
  put_html(f, r->mode);
  fprintf(f, " report</title>\n<style>%s</style>\n</head><body>\n<h1>pulse-bench ", css);
  put_html(f, r->mode);
  fputs("</h1>\n<table class=\"meta\">\n<tr><td>mode</td><td>", f);
  put_html(f, r->mode);
  fputs("</td></tr>\n<tr><td>command</td><td><code>", f);
  put_html(f, r->cmdline);
  fputs("</code></td></tr>\n<tr><td>date</td><td>", f);
  put_html(f, date);
  fprintf(f, "</td></tr>\n<tr><td>machine</td><td>%ld CPUs (nproc), ",
          sysconf(_SC_NPROCESSORS_ONLN));
  put_html(f, cpu);
  fputs("</td></tr>\n</table>\n", f);
  for (size_t i = 0; i < r->nnotes; i++) {
    fputs("<p class=\"note\">", f);
    put_html(f, r->notes[i]);
    fputs("</p>\n", f);
  }
  int rc = 0;
  if (r->ncharts)
    fputs("<h2>Charts</h2>\n", f);
  for (size_t i = 0; i < r->ncharts && rc == 0; i++) {
    fputs("<figure>\n", f);
    rc = svg_chart(f, r, &r->charts[i], detail, dsize);
    fputs("</figure>\n", f);
  }
  for (size_t k = 0; k < r->ntables; k++) {
    const pulse_report_table *t = r->tables[k];
    fputs("<h2>Table ", f);
    put_html(f, t->name);
    fputs(" (<a href=\"", f);
    put_html(f, t->name);
    fputs(".csv\">", f);
    put_html(f, t->name);
    fputs(".csv</a>)</h2>\n<table class=\"data\">\n<tr>", f);
    for (size_t j = 0; j < t->ncols; j++) {
      fputs("<th>", f);
      put_html(f, t->cols[j]);
      fputs("</th>", f);
    }
    fputs("</tr>\n", f);
    for (size_t i = 0; i < t->nrows; i++) {
      fputs("<tr>", f);
      for (size_t j = 0; j < t->ncols; j++) {
        const cell *c = cell_at(t, i, (int)j);
        char num[64] = "";
        fputs("<td>", f);
        if (c->kind == CELL_NUM) {
          fmt_num(c->num, 6, num, sizeof num);
          fputs(num, f);
        } else if (c->kind == CELL_TEXT) {
          put_html(f, c->text);
        }
        fputs("</td>", f);
      }
      fputs("</tr>\n", f);
    }
    fputs("</table>\n", f);
  }
  fputs("</body></html>\n", f);
  int bad = ferror(f);
  if (fclose(f) != 0 || bad) {
    snprintf(detail, dsize, "cannot write %.400s", path);
    return -1;
  }
  return rc;
}

static void report_free(pulse_report *r) {
  for (size_t k = 0; k < r->ntables; k++) {
    pulse_report_table *t = r->tables[k];
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
      free(t->cells[i].text);
    for (size_t j = 0; t->cols && j < t->ncols; j++)
      free(t->cols[j]);
    free(t->cells), free(t->cols), free(t->name), free(t);
  }
  for (size_t i = 0; i < r->ncharts; i++) {
    chart *c = &r->charts[i];
    for (size_t s = 0; c->ys && s < c->ny; s++)
      free(c->ys[s]);
    free(c->ys), free(c->table), free(c->title), free(c->x), free(c->x_label), free(c->y_label);
  }
  for (size_t i = 0; i < r->nnotes; i++)
    free(r->notes[i]);
  free(r->notes), free(r->charts), free(r->tables);
  free(r->dir), free(r->mode), free(r->cmdline), free(r);
}

pulse_status pulse_report_close(pulse_report *r, char *detail, size_t detail_size) {
  char scratch[512];
  if (detail == NULL || detail_size == 0)
    detail = scratch, detail_size = sizeof scratch;
  detail[0] = '\0';
  if (r == NULL)
    return PULSE_OK;
  pulse_status st = r->err;
  if (st == PULSE_ERR_NOMEM)
    snprintf(detail, detail_size, "out of memory while collecting the report");
  else if (st != PULSE_OK)
    snprintf(detail, detail_size, "a table has a bad name or no columns");
  for (size_t k = 0; k < r->ntables; k++) {
    if (r->tables[k]->name == NULL || r->tables[k]->cols == NULL)
      continue;
    if (write_csv(r, r->tables[k]) != 0 && st == PULSE_OK) {
      st = PULSE_ERR_IO;
      snprintf(detail, detail_size, "cannot write %s/%s.csv", r->dir, r->tables[k]->name);
    }
  }
  if (st != PULSE_ERR_NOMEM) {
    char d[512] = "";
    if (write_html(r, d, sizeof d) != 0 && st == PULSE_OK) {
      st = strncmp(d, "cannot", 6) == 0 ? PULSE_ERR_IO : PULSE_ERR_ARG;
      snprintf(detail, detail_size, "%s", d);
    }
  }
  report_free(r);
  return st;
}
