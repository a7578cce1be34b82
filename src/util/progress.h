/* progress: a one-line progress bar for long jobs (quantize, repack, warm
 * fill, profile).
 *
 *   progress *p;
 *   progress_open(&p, "quantize", total_bytes, stderr);
 *   for (...) progress_update(p, done_bytes);
 *   progress_close(p);
 *
 * It draws only when `out` is a terminal (isatty), so logs and pipes stay
 * clean; otherwise every call is a cheap no-op. Redraws are throttled to
 * about 10 per second, plus one final draw when done reaches total or on
 * close. The line is "\r<label> [#####.....]  42%  1.23/2.91 GiB  3.4 s"
 * (a count instead of GiB when `total` is not a byte count; see
 * progress_set_units). progress_close ends the line with '\n' if anything was
 * drawn.
 *
 * Thread-safety: none. One thread updates a bar; callers that work in
 * parallel report from the thread that coordinates them. */
#ifndef STRATA_PROGRESS_H
#define STRATA_PROGRESS_H

#include <stdint.h>
#include <stdio.h>

typedef struct progress progress;

enum progress_units {
    PROGRESS_BYTES = 0,   /* show done/total as GiB / MiB (the default) */
    PROGRESS_COUNT = 1,   /* show done/total as plain numbers */
};

/* *out owned by the caller; free with progress_close(). `label` is copied
 * (truncated to 47 bytes). `out` is borrowed and must outlive the bar.
 * Returns 0, or ERR_NOMEM (util/err.h) with *out = NULL. */
int  progress_open(progress **out, const char *label, uint64_t total, FILE *out_file);
void progress_set_units(progress *p, int units);
/* Replace the label shown (e.g. the current tensor); copied. */
void progress_set_label(progress *p, const char *label);
/* Report absolute progress (clamped to total). Draws if due. */
void progress_update(progress *p, uint64_t done);
/* Final draw and newline if drawing; NULL is a no-op. */
void progress_close(progress *p);
/* 1 when the bar draws (out is a TTY), else 0. */
int  progress_active(const progress *p);

#endif
