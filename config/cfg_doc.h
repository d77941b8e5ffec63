/* cfg_doc: a gpuswapd config built option by option, each value checked against the option schema as the loader checks it, written through libyaml's emitter (what `gpuswap fleet` writes for each host). */
#ifndef CFG_DOC_H
#define CFG_DOC_H

#include <stddef.h>
#include <stdio.h>

typedef struct cfg_doc cfg_doc_t;

/* An empty document (no option set: the daemon's defaults apply); NULL when out of memory. */
cfg_doc_t *cfg_doc_new(void);
void cfg_doc_free(cfg_doc_t *d); /* accepts NULL */

/* Whether dotted names a top-level scalar option ("device.page_size", "scheduler.max_stall"). */
int cfg_doc_known(const char *dotted);

/* Sets the top-level scalar option dotted from its config text: parsed, bounded and
 * checked as the loader does (a relative path stays as written); setting it again
 * replaces the value. 0, or CFG_ERR_INVALID with why: an unknown option (with the
 * nearest known name), a section, a list, auth.keys or models, or a bad value. */
int cfg_doc_set(cfg_doc_t *d, const char *dotted, const char *text, char *why, size_t n);

/* Appends a model entry; returns its index, or -1 when out of memory. */
int cfg_doc_add_model(cfg_doc_t *d);
/* Sets option key ("path", "gpu_quota", "defaults.temperature") of model m, as cfg_doc_set. */
int cfg_doc_model_set(cfg_doc_t *d, size_t m, const char *key, const char *text, char *why,
                      size_t n);

/* Writes the document: the options set, in the schema's order under their sections, then
 * the models; nothing else (a caller writes its comment lines first). 0, or CFG_ERR_IO
 * (or CFG_ERR_NOMEM). */
int cfg_doc_write(const cfg_doc_t *d, FILE *fp);

#endif
