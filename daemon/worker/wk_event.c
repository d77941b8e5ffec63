/* wk_event: the typed events the worker hands to the front ends; releasing one, field by field from WK_EVENT_FIELDS. */
#include "wk_event.h"

#include <stdlib.h>
#include <string.h>

#define WK_EVENT_RELEASE_VAL(f) (void)(f)
#define WK_EVENT_RELEASE_STR(f) free(f)
#define WK_EVENT_RELEASE_JSON(f) json_decref(f)
#define WK_EVENT_RELEASE(own, type, name) WK_EVENT_RELEASE_##own(ev->name);

void wk_event_clear(wk_event_t *ev)
{
    if (!ev)
        return;
    WK_EVENT_FIELDS(WK_EVENT_RELEASE)
    memset(ev, 0, sizeof *ev);
}
