/* log: leveled lines on stderr, "<N>"-prefixed for the journal when systemd's JOURNAL_STREAM matches stderr. */
#include "base/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/stat.h>

const char *const log_level_names[] = {"error", "warning", "notice", "info", "debug", NULL};

static _Atomic int log_level = LOG_LEVEL_INFO;
static FILE *log_out;                /* NULL: stderr */
static _Atomic int log_journal = -1; /* -1: not decided yet */

const char *log_level_name(log_level_t l)
{
    return l >= LOG_LEVEL_ERROR && l <= LOG_LEVEL_DEBUG ? log_level_names[l - LOG_LEVEL_ERROR]
                                                        : NULL;
}

void log_set_level(log_level_t l)
{
    atomic_store(&log_level, (int)l);
}

/* 1 when JOURNAL_STREAM ("device:inode") is stderr's: systemd connected it to the journal. */
static int log_detect_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(2, &st) != 0)
        return 0;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void log_set_output(FILE *f, int journal)
{
    log_out = f;
    atomic_store(&log_journal, journal);
}

void log_msg(log_level_t level, const char *fmt, ...)
{
    if ((int)level > atomic_load(&log_level))
        return;
    int j = atomic_load(&log_journal);
    if (j < 0) {
        j = log_detect_journal();
        atomic_store(&log_journal, j);
    }
    char line[2048];
    int n = j ? snprintf(line, sizeof line, "<%d>gpuswapd: ", (int)level)
              : snprintf(line, sizeof line, "gpuswapd: ");
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
    if (len > sizeof line - 2)
        len = sizeof line - 2; /* truncated */
    line[len++] = '\n';
    line[len] = 0;
    FILE *f = log_out ? log_out : stderr;
    fputs(line, f);
    fflush(f);
}
