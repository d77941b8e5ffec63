/* hugemem: big host buffers on transparent huge pages where the kernel gives them. */
#ifndef HUGEMEM_H
#define HUGEMEM_H

#include <stddef.h>

/* The huge page size the buffers are aligned to (2 MiB on x86-64). */
#define HUGEMEM_PAGE ((size_t)2 << 20)

/* bytes of zeroed anonymous memory (any size; a buffer of a huge page or more is aligned to one
 * and advised MADV_HUGEPAGE: without transparent huge pages, 4 KiB ones), NULL when out of
 * memory. Free with hugemem_free and the same size. */
void *hugemem_alloc(size_t bytes);
void hugemem_free(void *p, size_t bytes); /* accepts NULL */
/* bytes of address space starting on a huge page, inaccessible and not backed (PROT_NONE,
 * MAP_NORESERVE) until parts are mapped over it; NULL when none. Free with munmap(p, bytes). */
void *hugemem_reserve(size_t bytes);

#endif
