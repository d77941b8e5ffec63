/* test_hugemem: big host buffers on huge pages: aligned, zeroed, writable, freed by size. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "base/hugemem.h"

Test(hugemem, buffers_of_every_size_are_zeroed_writable_and_huge_page_aligned_from_one_page_on)
{
    const size_t sizes[] = {0,
                            1,
                            4095,
                            4096,
                            65537,
                            HUGEMEM_PAGE - 1,
                            HUGEMEM_PAGE,
                            HUGEMEM_PAGE + 1,
                            5 * HUGEMEM_PAGE + 12345};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        size_t n = sizes[i];
        unsigned char *p = hugemem_alloc(n);
        cr_assert_not_null(p, "%zu bytes", n);
        cr_assert_eq((uintptr_t)p % 4096, 0, "%zu bytes: page aligned", n);
        if (n >= HUGEMEM_PAGE)
            cr_assert_eq((uintptr_t)p % HUGEMEM_PAGE, 0, "%zu bytes: huge page aligned", n);
        for (size_t j = 0; j < n; j += 4093)
            cr_assert_eq(p[j], 0, "%zu bytes: byte %zu zeroed", n, j);
        if (n) {
            memset(p, 0xa5, n);
            cr_assert_eq(p[n - 1], 0xa5);
        }
        hugemem_free(p, n);
    }
    hugemem_free(NULL, 123); /* accepted */
}

Test(hugemem, many_buffers_come_and_go_without_overlap)
{
    enum {
        N = 8
    };
    unsigned char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = hugemem_alloc(HUGEMEM_PAGE + (size_t)i * 1000);
        cr_assert_not_null(p[i]);
        memset(p[i], i + 1, HUGEMEM_PAGE + (size_t)i * 1000);
    }
    for (int i = 0; i < N; i++) {
        cr_assert_eq(p[i][0], i + 1, "buffer %d untouched by the others", i);
        cr_assert_eq(p[i][HUGEMEM_PAGE + (size_t)i * 1000 - 1], i + 1);
        hugemem_free(p[i], HUGEMEM_PAGE + (size_t)i * 1000);
    }
}

Test(hugemem, a_reserved_range_starts_on_a_huge_page_and_maps_over)
{
    size_t n = 3 * HUGEMEM_PAGE + 4096;
    char *p = hugemem_reserve(n);
    cr_assert_not_null(p);
    cr_assert_eq((uintptr_t)p % HUGEMEM_PAGE, 0);
    void *m = mmap(p + HUGEMEM_PAGE, HUGEMEM_PAGE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    cr_assert_eq(m, (void *)(p + HUGEMEM_PAGE));
    p[HUGEMEM_PAGE] = 1;
    cr_assert_eq(p[HUGEMEM_PAGE], 1);
    cr_assert_eq(munmap(p, n), 0);
}
