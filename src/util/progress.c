/* progress: see progress.h. Owns one small heap struct per bar; writes only
 * to the FILE it was given, only when that FILE is a terminal. */
#include "util/progress.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "util/err.h"
#include "util/timer.h"

#define BAR_WIDTH 30
#define MIN_REDRAW_MS 100.0   /* ~10 redraws per second */

struct progress {
    FILE    *out;            /* borrowed */
    int      tty;            /* draw at all? */
    int      units;
    int      drawn;          /* something is on the line (close adds '\n') */
    int      last_width;     /* characters of the previous line, to blank leftovers */
    int      final_drawn;    /* the done == total state is on screen */
    uint64_t total, done;
    double   t_start, t_last;
    char     label[48];
};

static void set_label(progress *p, const char *label)
{
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
}

int progress_open(progress **out, const char *label, uint64_t total, FILE *out_file)
{
    *out = NULL;
    progress *p = calloc(1, sizeof *p);
    if (!p) return ERR_NOMEM;
    p->out = out_file;
    p->tty = out_file && isatty(fileno(out_file));
    p->total = total;
    p->t_start = timer_ms();
    p->t_last = -1e30;
    set_label(p, label);
    *out = p;
    return 0;
}

void progress_set_units(progress *p, int units) { if (p) p->units = units; }
void progress_set_label(progress *p, const char *label) { if (p) set_label(p, label); }
int progress_active(const progress *p) { return p && p->tty; }

static void fmt_amount(char *buf, size_t n, const progress *p, uint64_t v, int with_unit)
{
    if (p->units == PROGRESS_COUNT) {
        snprintf(buf, n, "%llu", (unsigned long long)v);
    } else if (p->total >= (1ull << 30)) {
        snprintf(buf, n, "%.2f%s", v / 1073741824.0, with_unit ? " GiB" : "");
    } else {
        snprintf(buf, n, "%.1f%s", v / 1048576.0, with_unit ? " MiB" : "");
    }
}

static void draw(progress *p, double now)
{
    const double frac = p->total ? (double)p->done / (double)p->total : 1.0;
    const int fill = (int)(frac * BAR_WIDTH + 0.5);
    char bar[BAR_WIDTH + 1];
    for (int i = 0; i < BAR_WIDTH; i++) bar[i] = i < fill ? '#' : '.';
    bar[BAR_WIDTH] = '\0';
    char a[32], b[32];
    fmt_amount(a, sizeof a, p, p->done, 0);
    fmt_amount(b, sizeof b, p, p->total, 1);
    char line[256];
    int w = snprintf(line, sizeof line, "%s [%s] %3d%%  %s/%s  %.1f s", p->label, bar,
                     (int)(frac * 100.0), a, b, (now - p->t_start) / 1000.0);
    if (w < 0) return;
    if (w >= (int)sizeof line) w = (int)sizeof line - 1;
    /* Blank what a longer previous line left behind. */
    const int pad = p->last_width > w ? p->last_width - w : 0;
    fprintf(p->out, "\r%s%*s", line, pad, "");
    fflush(p->out);
    p->last_width = w;
    p->drawn = 1;
    p->final_drawn = p->done == p->total;
    p->t_last = now;
}

void progress_update(progress *p, uint64_t done)
{
    if (!p || !p->tty) return;
    p->done = done > p->total ? p->total : done;
    const double now = timer_ms();
    if (now - p->t_last >= MIN_REDRAW_MS || (p->done == p->total && !p->final_drawn))
        draw(p, now);
}

void progress_close(progress *p)
{
    if (!p) return;
    if (p->tty) {
        if (!p->final_drawn) draw(p, timer_ms());
        fputc('\n', p->out);
        fflush(p->out);
    }
    free(p);
}
