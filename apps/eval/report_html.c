/* report_html: HTML + inline SVG writer (see report_html.h).
 *
 * Geometry: a fixed 760 x 300 viewBox scaled by the browser; the y range
 * covers the data and the reference lines with 8% headroom, with ticks at
 * 1, 2 or 5 times a power of ten. */
#include "report_html.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { W = 760, H = 300, ML = 70, MR = 110, MT = 16, MB = 44 };

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default:  fputc(*s, f);
        }
    }
}

void report_html_begin(FILE *f, const char *title)
{
    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>", f);
    esc(f, title);
    fputs("</title>\n<style>body{font-family:sans-serif;max-width:64em;margin:1em auto;padding:0 1em;color:#222}"
          "pre{background:#f6f6f6;padding:.6em;overflow-x:auto;font-size:12px}"
          "svg{width:100%;height:auto;background:#fff;border:1px solid #ddd}"
          "svg text{font-family:sans-serif;font-size:11px;fill:#333}</style></head><body>\n<h1>", f);
    esc(f, title);
    fputs("</h1>\n", f);
}

void report_html_para(FILE *f, const char *text)
{
    fputs("<p>", f);
    esc(f, text);
    fputs("</p>\n", f);
}

void report_html_pre(FILE *f, const char *text)
{
    fputs("<pre>", f);
    esc(f, text);
    fputs("</pre>\n", f);
}

/* The tick step for a span: 1, 2 or 5 times a power of ten, about 5 ticks. */
static double nice_step(double span)
{
    double raw = span / 5, p = pow(10, floor(log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

void report_html_chart(FILE *f, const report_chart *c)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < c->n; i++)
        if (isfinite(c->y[i])) { lo = fmin(lo, c->y[i]); hi = fmax(hi, c->y[i]); }
    if (c->title) { fputs("<h2>", f); esc(f, c->title); fputs("</h2>\n", f); }
    if (!isfinite(lo)) { report_html_para(f, "(no values to draw)"); return; }
    for (int i = 0; i < c->n_lines; i++)
        if (isfinite(c->lines[i].y)) { lo = fmin(lo, c->lines[i].y); hi = fmax(hi, c->lines[i].y); }
    if (c->bars) lo = fmin(lo, 0);
    double span = hi - lo;
    if (span <= 0) span = fabs(hi) > 0 ? fabs(hi) * 0.1 : 1;
    lo -= span * 0.08;
    hi += span * 0.08;
    if (c->bars && lo < 0 && lo > -span * 0.09) lo = 0;
    const double step = nice_step(hi - lo);
    const double pw = W - ML - MR, ph = H - MT - MB;
#define X(i) (ML + pw * ((i) + 0.5) / c->n)
#define Y(v) (MT + ph * (1 - ((v) - lo) / (hi - lo)))
    fprintf(f, "<svg viewBox=\"0 0 %d %d\" xmlns=\"http://www.w3.org/2000/svg\" role=\"img\">\n", W, H);
    fprintf(f, "<rect x=\"%d\" y=\"%d\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" stroke=\"#999\"/>\n", ML, MT, pw, ph);
    for (double t = ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) {
        double y = Y(t);
        fprintf(f, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.6g</text>\n",
                ML, ML + pw, y, y, ML - 6, y + 4, fabs(t) < step * 1e-9 ? 0.0 : t);
    }
    const int every = c->n > 40 ? (c->n + 39) / 40 : 1;
    for (int i = 0; i < c->n; i += every) {
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", X(i), H - MB + 16);
        if (c->x_names) esc(f, c->x_names[i]); else fprintf(f, "%d", i + 1);
        fputs("</text>\n", f);
    }
    if (c->x_label) {
        fprintf(f, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">", ML + pw / 2, H - 8);
        esc(f, c->x_label);
        fputs("</text>\n", f);
    }
    if (c->y_label) {
        fprintf(f, "<text transform=\"translate(14 %.1f) rotate(-90)\" text-anchor=\"middle\">", MT + ph / 2);
        esc(f, c->y_label);
        fputs("</text>\n", f);
    }
    double label_y[8];
    int n_label = 0;
    for (int i = 0; i < c->n_lines; i++) {
        const report_line *l = &c->lines[i];
        if (!isfinite(l->y)) continue;
        /* keep labels of nearby lines apart */
        double ly = Y(l->y) + 4;
        for (int again = 1; again;) {
            again = 0;
            for (int j = 0; j < n_label; j++)
                if (fabs(label_y[j] - ly) < 12) { ly = label_y[j] + 12; again = 1; }
        }
        if (n_label < 8) label_y[n_label++] = ly;
        fprintf(f, "<line x1=\"%d\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.5\"%s/>",
                ML, ML + pw, Y(l->y), Y(l->y), l->dashed ? "#888" : "#2a7", l->dashed ? " stroke-dasharray=\"5 4\"" : "");
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">", ML + pw + 4, ly);
        esc(f, l->label ? l->label : "");
        fputs("</text>\n", f);
    }
    if (!c->bars) {
        fputs("<polyline fill=\"none\" stroke=\"#36c\" stroke-width=\"1\" points=\"", f);
        for (int i = 0; i < c->n; i++)
            if (isfinite(c->y[i])) fprintf(f, "%.1f,%.1f ", X(i), Y(c->y[i]));
        fputs("\"/>\n", f);
    }
    const double bw = fmax(1.0, pw / c->n * 0.7);
    for (int i = 0; i < c->n; i++) {
        if (!isfinite(c->y[i])) continue;
        const char *col = c->flag && c->flag[i] ? "#d33" : "#36c";
        if (c->bars) {
            double y0 = Y(fmax(lo, 0)), y1 = Y(c->y[i]);
            fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\">", X(i) - bw / 2,
                    fmin(y0, y1), bw, fabs(y0 - y1), col);
        } else {
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\">", X(i), Y(c->y[i]), col);
        }
        fprintf(f, "<title>");
        if (c->x_names) esc(f, c->x_names[i]); else fprintf(f, "%d", i + 1);
        fprintf(f, ": %.6f</title></%s>\n", c->y[i], c->bars ? "rect" : "circle");
    }
    if (c->flag && c->flag_label) {
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%d\" r=\"4\" fill=\"#d33\"/><text x=\"%.1f\" y=\"%d\">", ML + pw + 8.0,
                MT + 8, ML + pw + 16.0, MT + 12);
        esc(f, c->flag_label);
        fputs("</text>\n", f);
    }
    fputs("</svg>\n", f);
#undef X
#undef Y
}

int report_html_end(FILE *f)
{
    fputs("</body></html>\n", f);
    return ferror(f) ? -1 : 0;
}
