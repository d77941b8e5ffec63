/* hugemem: big host buffers on transparent huge pages where the kernel gives them. A weight
 * stream on 4 KiB pages crosses a page every 4 KiB, where the hardware prefetchers stop: F16
 * decode of the 134M shape on two threads read 22 GB/s there, 28 GB/s from huge pages. */
#include "base/hugemem.h"

#include <stdint.h>
#include <sys/mman.h>

/* the span mapped for bytes: whole huge pages from a huge page or more, else whole 4 KiB pages */
static size_t span_of(size_t bytes)
{
    size_t page = bytes >= HUGEMEM_PAGE ? HUGEMEM_PAGE : 4096;
    return ((bytes ? bytes : 1) + page - 1) / page * page;
}

/* bytes (> 0) mapped with prot and flags, starting on a huge page: a huge page more mapped, then
 * both ends trimmed */
static char *map_aligned(size_t bytes, int prot, int flags)
{
    size_t over = bytes + HUGEMEM_PAGE;
    char *p = mmap(NULL, over, prot, flags | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    size_t head = (HUGEMEM_PAGE - (uintptr_t)p % HUGEMEM_PAGE) % HUGEMEM_PAGE;
    if (head)
        munmap(p, head);
    if (over - head > bytes)
        munmap(p + head + bytes, over - head - bytes);
    return p + head;
}

void *hugemem_alloc(size_t bytes)
{
    size_t span = span_of(bytes);
    if (span < HUGEMEM_PAGE) {
        void *p = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    char *p = map_aligned(span, PROT_READ | PROT_WRITE, 0);
    if (p)
        madvise(p, span, MADV_HUGEPAGE); /* a hint */
    return p;
}

void *hugemem_reserve(size_t bytes)
{
    return map_aligned(bytes ? bytes : 1, PROT_NONE, MAP_NORESERVE);
}

void hugemem_free(void *p, size_t bytes)
{
    if (p)
        munmap(p, span_of(bytes));
}
