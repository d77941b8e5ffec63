/* log: the daemon's one log: leveled lines on stderr, with <N> syslog priority prefixes when stderr goes to the journal. */
#ifndef LOG_H
#define LOG_H

#include <stdio.h>

/* Levels are syslog priorities: a line is written when its level <= the set level. */
typedef enum log_level {
    LOG_LEVEL_ERROR = 3,   /* something failed: a request, a model, the daemon */
    LOG_LEVEL_WARNING = 4, /* something is off and was worked around */
    LOG_LEVEL_NOTICE = 5,  /* lifecycle: serving, reloaded, draining */
    LOG_LEVEL_INFO = 6,    /* what the daemon is doing (default) */
    LOG_LEVEL_DEBUG = 7,   /* detail for developers */
} log_level_t;

/* Names in config syntax ("error", "warning", "notice", "info", "debug"),
 * indexed by level - LOG_LEVEL_ERROR; NULL-terminated. */
extern const char *const log_level_names[];
#define LOG_LEVEL_OF_INDEX(i) ((log_level_t)((i) + LOG_LEVEL_ERROR))

/* "error" ... "debug"; NULL outside the enum. */
const char *log_level_name(log_level_t l);
/* Sets the level (any thread; default LOG_LEVEL_INFO). */
void log_set_level(log_level_t l);
/* Where lines go (default stderr) and whether they carry <N> prefixes:
 * journal 1 yes, 0 no, -1 as the environment says (JOURNAL_STREAM names
 * stderr's device and inode, as systemd sets it). For tests. */
void log_set_output(FILE *f, int journal);

/* Writes "gpuswapd: <message>\n" (prefixed "<N>" under the journal) when
 * level is enabled; one fputs per line, so lines of threads do not mix. */
void log_msg(log_level_t level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_msg(LOG_LEVEL_ERROR, __VA_ARGS__)
#define log_warning(...) log_msg(LOG_LEVEL_WARNING, __VA_ARGS__)
#define log_notice(...) log_msg(LOG_LEVEL_NOTICE, __VA_ARGS__)
#define log_info(...) log_msg(LOG_LEVEL_INFO, __VA_ARGS__)
#define log_debug(...) log_msg(LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
