/* report_html: self-contained HTML reports with inline SVG charts, for the
 * measurement tools (bench-ab's per-pair ratios; usable for KL per position).
 *
 * No scripts, no external fonts or styles: one file that any browser shows
 * offline and that can be attached to a report. A chart is one series of
 * values at x = 1..n (points joined by a line, or bars), optional flagged
 * points in an alert colour, and optional horizontal reference lines (a
 * median, 1.0). Every point carries a <title> tooltip with its exact value.
 *
 * Usage: report_html_begin, then any number of report_html_para/pre/chart,
 * then report_html_end. Text is HTML-escaped here. Stateless; no globals. */
#ifndef STRATA_REPORT_HTML_H
#define STRATA_REPORT_HTML_H

#include <stdio.h>

typedef struct report_line {
    double      y;
    const char *label;      /* drawn at the right end of the line */
    int         dashed;
} report_line;

typedef struct report_chart {
    const char        *title;      /* heading above the chart */
    const char        *x_label;    /* e.g. "pair" */
    const char        *y_label;    /* e.g. "candidate/baseline ratio" */
    const double      *y;          /* n values (NaN: missing, not drawn) */
    int                n;
    const int         *flag;       /* NULL, or n flags: flagged points/bars in the alert colour */
    const char        *flag_label; /* legend text for flagged values (NULL: no legend) */
    int                bars;       /* 1: bars from the axis minimum; 0: points and a line */
    const report_line *lines;      /* n_lines horizontal reference lines */
    int                n_lines;
    const char *const *x_names;    /* NULL, or n tick names (default "1".."n") */
} report_chart;

/* Write the document head and an <h1> title. */
void report_html_begin(FILE *f, const char *title);
/* A paragraph of plain text. */
void report_html_para(FILE *f, const char *text);
/* A preformatted block (tables, provenance). */
void report_html_pre(FILE *f, const char *text);
/* One chart; nothing drawn (a note instead) when no value is finite. */
void report_html_chart(FILE *f, const report_chart *c);
/* Close the document. Returns 0, or -1 when a write to f failed. */
int  report_html_end(FILE *f);

#endif
