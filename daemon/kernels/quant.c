/* quant: weight formats (F32, F16, BF16, the legacy, K and IQ4 block quants), their conversions and the dot kernels. */
#include "kernels/quant.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/wtype.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define QUANT_HAVE_X86 1
#else
#define QUANT_HAVE_X86 0
#endif

/* ------------------------------------------------------------------ scalars */

float quant_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t f;
    if (exp == 0) {
        if (man == 0) {
            f = sign;
        } else {
            /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            f = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        f = sign | 0x7f800000u | (man << 13);
    } else {
        f = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float r;
    memcpy(&r, &f, 4);
    return r;
}

uint16_t quant_f32_to_f16(float fv)
{
    uint32_t x;
    memcpy(&x, &fv, 4);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: half subnormal or zero */
        uint32_t exp = a >> 23;
        if (exp < 102)
            return sign;
        uint32_t man = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - exp;
        uint32_t m = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (m & 1)))
            m++;
        return (uint16_t)(sign | m);
    }
    uint32_t h = (a >> 13) - ((127u - 15u) << 10);
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
        h++;
    return (uint16_t)(sign | h);
}

float quant_bf16_to_f32(uint16_t h)
{
    uint32_t f = (uint32_t)h << 16;
    float r;
    memcpy(&r, &f, 4);
    return r;
}

uint16_t quant_f32_to_bf16(float fv)
{
    uint32_t x;
    memcpy(&x, &fv, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* F16 rows by F16C when the kernels are SIMD ones (the same values: the
 * conversions are exact one way and round to nearest even the other; only
 * a NaN's payload may differ). Defined with the dispatch. */
static int f16_rows_simd(void);
static void f16_to_f32_row_simd(const uint16_t *s, float *d, size_t n);
static void f32_to_f16_row_simd(const float *s, uint16_t *d, size_t n);
/* The activation quantizers by AVX2 (the same values: products, round to
 * nearest even and maxima as the portable ones take them). */
static void act_q8_simd(const float *x, quant_act_q8_t *a, size_t nb);
static void act_q8k_simd(const float *x, quant_act_q8k_t *a, size_t nb);

/* ------------------------------------------------------------------ block formats
 * Every block type decodes ("unpacks") into one common form, qblk_t: small
 * integer values, integer scales and mins per sub-block and two float
 * factors, so that value[i] = (d * sc[s]) * q[i] - dm * mn[s], s = i / sub.
 * The exact dequantizer, the integer dot and the quantizer (which "packs"
 * the same form) all go through it, so each format's bit layout is written
 * once, in its unpack/pack pair. Layouts follow the GGUF / ggml block
 * definitions (little-endian, F16 scales). */

typedef struct qblk {
    int8_t q[QUANT_K_BLOCK]; /* values, in element order */
    int16_t sc[16];          /* integer scale per sub-block (1 for one-scale blocks) */
    int16_t mn[16];          /* integer min per sub-block (0 for symmetric types) */
    float d, dm;             /* factors of sc and mn */
} qblk_t;

/* the 16 levels of IQ4_NL and IQ4_XS (a non-uniform 4-bit grid) */
static const int8_t iq4_grid[16] = QUANT_IQ4_GRID;

static inline float rd_f16(const uint8_t *p)
{
    return quant_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static inline void wr_f16(uint8_t *p, float v)
{
    uint16_t h = quant_f32_to_f16(v);
    p[0] = (uint8_t)h;
    p[1] = (uint8_t)(h >> 8);
}

static inline uint32_t rd_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline int grid_index(int8_t v)
{
    for (int i = 0; i < 16; i++)
        if (iq4_grid[i] == v)
            return i;
    return 8; /* unreachable for values the quantizer made */
}

static void one_scale(qblk_t *o, float d, float m)
{
    o->sc[0] = 1;
    o->mn[0] = m != 0.0f;
    o->d = d;
    o->dm = -m; /* value = d * q + m */
}

/* Q4_0, 18 bytes: d (f16), qs[16]: element j is the low nibble of qs[j],
 * element j + 16 its high nibble, both offset by 8. */
static void unpack_q4_0(const uint8_t *b, qblk_t *o)
{
    one_scale(o, rd_f16(b), 0.0f);
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)((b[2 + j] & 15) - 8);
        o->q[j + 16] = (int8_t)((b[2 + j] >> 4) - 8);
    }
}

static void pack_q4_0(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)((o->q[j] + 8) | (o->q[j + 16] + 8) << 4);
}

/* Q4_1, 20 bytes: d, m (f16), qs[16] as Q4_0 without offset; value d*q + m. */
static void unpack_q4_1(const uint8_t *b, qblk_t *o)
{
    one_scale(o, rd_f16(b), rd_f16(b + 2));
    o->mn[0] = 1;
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(b[4 + j] & 15);
        o->q[j + 16] = (int8_t)(b[4 + j] >> 4);
    }
}

static void pack_q4_1(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    wr_f16(b + 2, -o->dm);
    for (int j = 0; j < 16; j++)
        b[4 + j] = (uint8_t)(o->q[j] | o->q[j + 16] << 4);
}

/* Q5_0, 22 bytes: d, qh (32 bits: bit j is bit 4 of element j), qs[16] as
 * Q4_0's low four bits; offset 16. */
static void unpack_q5_0(const uint8_t *b, qblk_t *o)
{
    one_scale(o, rd_f16(b), 0.0f);
    uint32_t qh = rd_u32(b + 2);
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)(((b[6 + j] & 15) | ((qh >> j) & 1) << 4) - 16);
        o->q[j + 16] = (int8_t)(((b[6 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16);
    }
}

static void pack_q5_bits(const qblk_t *o, int off, uint8_t *qhp, uint8_t *qs)
{
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        unsigned a = (unsigned)(o->q[j] + off), c = (unsigned)(o->q[j + 16] + off);
        qs[j] = (uint8_t)((a & 15) | (c & 15) << 4);
        qh |= (a >> 4) << j | (c >> 4) << (j + 16);
    }
    for (int i = 0; i < 4; i++)
        qhp[i] = (uint8_t)(qh >> 8 * i);
}

static void pack_q5_0(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    pack_q5_bits(o, 16, b + 2, b + 6);
}

/* Q5_1, 24 bytes: d, m, qh, qs; no offset, value d*q + m. */
static void unpack_q5_1(const uint8_t *b, qblk_t *o)
{
    one_scale(o, rd_f16(b), rd_f16(b + 2));
    o->mn[0] = 1;
    uint32_t qh = rd_u32(b + 4);
    for (int j = 0; j < 16; j++) {
        o->q[j] = (int8_t)((b[8 + j] & 15) | ((qh >> j) & 1) << 4);
        o->q[j + 16] = (int8_t)((b[8 + j] >> 4) | ((qh >> (j + 16)) & 1) << 4);
    }
}

static void pack_q5_1(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    wr_f16(b + 2, -o->dm);
    pack_q5_bits(o, 0, b + 4, b + 8);
}

/* Q8_0, 34 bytes: d, qs[32] signed. */
static void unpack_q8_0(const uint8_t *b, qblk_t *o)
{
    one_scale(o, rd_f16(b), 0.0f);
    memcpy(o->q, b + 2, 32);
}

static void pack_q8_0(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    memcpy(b + 2, o->q, 32);
}

/* IQ4_NL, 18 bytes: d, qs[16] as Q4_0, each nibble an index into iq4_grid. */
static void unpack_iq4_nl(const uint8_t *b, qblk_t *o)
{
    one_scale(o, rd_f16(b), 0.0f);
    for (int j = 0; j < 16; j++) {
        o->q[j] = iq4_grid[b[2 + j] & 15];
        o->q[j + 16] = iq4_grid[b[2 + j] >> 4];
    }
}

static void pack_iq4_nl(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    for (int j = 0; j < 16; j++)
        b[2 + j] = (uint8_t)(grid_index(o->q[j]) | grid_index(o->q[j + 16]) << 4);
}

/* Q2_K, 84 bytes: scales[16] (low nibble scale, high nibble min, one pair
 * per 16 elements), qs[64] (2 bits each), d, dmin. Element 128n + 32k +
 * 16h + l sits in bits 2k..2k+1 of qs[32n + 16h + l]. */
static void unpack_q2_k(const uint8_t *b, qblk_t *o)
{
    for (int i = 0; i < 16; i++) {
        o->sc[i] = b[i] & 15;
        o->mn[i] = b[i] >> 4;
    }
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++)
                o->q[128 * n + 32 * k + l] = (int8_t)((b[16 + 32 * n + l] >> 2 * k) & 3);
    o->d = rd_f16(b + 80);
    o->dm = rd_f16(b + 82);
}

static void pack_q2_k(const qblk_t *o, uint8_t *b)
{
    memset(b, 0, 84);
    for (int i = 0; i < 16; i++)
        b[i] = (uint8_t)(o->sc[i] | o->mn[i] << 4);
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++)
                b[16 + 32 * n + l] |= (uint8_t)(o->q[128 * n + 32 * k + l] << 2 * k);
    wr_f16(b + 80, o->d);
    wr_f16(b + 82, o->dm);
}

/* Q3_K, 110 bytes: hmask[32], qs[64] (low 2 bits as Q2_K), scales[12]
 * (16 six-bit scales, offset 32: low nibbles in bytes 0..7, top two bits
 * in bytes 8..11), d. Bit 4n + k of hmask[16h + l] set means the element
 * is low2, clear means low2 - 4. */
static inline int q3_scale(const uint8_t *s, int i)
{
    int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4;
    int hi = (s[8 + i % 4] >> 2 * (i / 4)) & 3;
    return (lo | hi << 4) - 32;
}

static void unpack_q3_k(const uint8_t *b, qblk_t *o)
{
    const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
    for (int i = 0; i < 16; i++) {
        o->sc[i] = (int16_t)q3_scale(s, i);
        o->mn[i] = 0;
    }
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                int lo = (qs[32 * n + l] >> 2 * k) & 3;
                int hb = (hm[l] >> (4 * n + k)) & 1;
                o->q[128 * n + 32 * k + l] = (int8_t)(lo - (hb ? 0 : 4));
            }
    o->d = rd_f16(b + 108);
    o->dm = 0.0f;
}

static void pack_q3_k(const qblk_t *o, uint8_t *b)
{
    memset(b, 0, 110);
    uint8_t *hm = b, *qs = b + 32, *s = b + 96;
    for (int i = 0; i < 16; i++) {
        unsigned u = (unsigned)(o->sc[i] + 32);
        if (i < 8)
            s[i] |= (uint8_t)(u & 15);
        else
            s[i - 8] |= (uint8_t)((u & 15) << 4);
        s[8 + i % 4] |= (uint8_t)((u >> 4) << 2 * (i / 4));
    }
    for (int n = 0; n < 2; n++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                unsigned u = (unsigned)(o->q[128 * n + 32 * k + l] + 4);
                qs[32 * n + l] |= (uint8_t)((u & 3) << 2 * k);
                hm[l] |= (uint8_t)((u >> 2) << (4 * n + k));
            }
    wr_f16(b + 108, o->d);
}

/* The 12-byte scale field of Q4_K and Q5_K: 8 six-bit scales and 8 six-bit
 * mins. Pairs 0..3 are the low 6 bits of bytes 0..3 (scales) and 4..7
 * (mins); pairs 4..7 keep their low nibbles in bytes 8..11 (scale low,
 * min high) and their top two bits in bits 6..7 of bytes 0..3 (scales)
 * and 4..7 (mins). */
static void k4_scales_get(const uint8_t *s, qblk_t *o)
{
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            o->sc[j] = s[j] & 63;
            o->mn[j] = s[j + 4] & 63;
        } else {
            o->sc[j] = (int16_t)((s[j + 4] & 15) | (s[j - 4] >> 6) << 4);
            o->mn[j] = (int16_t)((s[j + 4] >> 4) | (s[j] >> 6) << 4);
        }
    }
}

static void k4_scales_put(const qblk_t *o, uint8_t *s)
{
    memset(s, 0, 12);
    for (int j = 0; j < 8; j++) {
        unsigned sc = (unsigned)o->sc[j], mn = (unsigned)o->mn[j];
        if (j < 4) {
            s[j] |= (uint8_t)sc;
            s[j + 4] |= (uint8_t)mn;
        } else {
            s[j + 4] = (uint8_t)((sc & 15) | (mn & 15) << 4);
            s[j - 4] |= (uint8_t)((sc >> 4) << 6);
            s[j] |= (uint8_t)((mn >> 4) << 6);
        }
    }
}

/* Q4_K, 144 bytes: d, dmin, scales[12], qs[128]: chunk c of 64 elements
 * takes the low nibbles of qs[32c..32c+31] then their high nibbles
 * (sub-blocks 2c and 2c+1 of 32). */
static void unpack_q4_k(const uint8_t *b, qblk_t *o)
{
    o->d = rd_f16(b);
    o->dm = rd_f16(b + 2);
    k4_scales_get(b + 4, o);
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->q[64 * c + l] = (int8_t)(qs[32 * c + l] & 15);
            o->q[64 * c + 32 + l] = (int8_t)(qs[32 * c + l] >> 4);
        }
}

static void pack_q4_k(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    wr_f16(b + 2, o->dm);
    k4_scales_put(o, b + 4);
    uint8_t *qs = b + 16;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)(o->q[64 * c + l] | o->q[64 * c + 32 + l] << 4);
}

/* Q5_K, 176 bytes: d, dmin, scales[12], qh[32], qs[128]: as Q4_K, and bit
 * 2c (2c + 1) of qh[l] is bit 4 of element 64c + l (64c + 32 + l). */
static void unpack_q5_k(const uint8_t *b, qblk_t *o)
{
    o->d = rd_f16(b);
    o->dm = rd_f16(b + 2);
    k4_scales_get(b + 4, o);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            o->q[64 * c + l] = (int8_t)((qs[32 * c + l] & 15) | ((qh[l] >> 2 * c) & 1) << 4);
            o->q[64 * c + 32 + l] =
                (int8_t)((qs[32 * c + l] >> 4) | ((qh[l] >> (2 * c + 1)) & 1) << 4);
        }
}

static void pack_q5_k(const qblk_t *o, uint8_t *b)
{
    wr_f16(b, o->d);
    wr_f16(b + 2, o->dm);
    k4_scales_put(o, b + 4);
    uint8_t *qh = b + 16, *qs = b + 48;
    memset(qh, 0, 32);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            unsigned a = (unsigned)o->q[64 * c + l], e = (unsigned)o->q[64 * c + 32 + l];
            qs[32 * c + l] = (uint8_t)((a & 15) | (e & 15) << 4);
            qh[l] |= (uint8_t)((a >> 4) << 2 * c | (e >> 4) << (2 * c + 1));
        }
}

/* Q6_K, 210 bytes: ql[128] (low nibbles), qh[64] (top two bits), scales[16]
 * (int8, one per 16 elements), d; offset 32. In half n (128 elements),
 * element 32g + l takes nibble g / 2 of ql[64n + 32(g % 2) + l] and bits
 * 2g..2g+1 of qh[32n + l]. */
static void unpack_q6_k(const uint8_t *b, qblk_t *o)
{
    for (int i = 0; i < 16; i++) {
        o->sc[i] = (int8_t)b[192 + i];
        o->mn[i] = 0;
    }
    for (int n = 0; n < 2; n++) {
        const uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                int lo = (ql[32 * (g % 2) + l] >> 4 * (g / 2)) & 15;
                int hi = (qh[l] >> 2 * g) & 3;
                o->q[128 * n + 32 * g + l] = (int8_t)((lo | hi << 4) - 32);
            }
    }
    o->d = rd_f16(b + 208);
    o->dm = 0.0f;
}

static void pack_q6_k(const qblk_t *o, uint8_t *b)
{
    memset(b, 0, 210);
    for (int i = 0; i < 16; i++)
        b[192 + i] = (uint8_t)o->sc[i];
    for (int n = 0; n < 2; n++) {
        uint8_t *ql = b + 64 * n, *qh = b + 128 + 32 * n;
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                unsigned u = (unsigned)(o->q[128 * n + 32 * g + l] + 32);
                ql[32 * (g % 2) + l] |= (uint8_t)((u & 15) << 4 * (g / 2));
                qh[l] |= (uint8_t)((u >> 4) << 2 * g);
            }
    }
    wr_f16(b + 208, o->d);
}

/* IQ4_XS, 136 bytes: d, scales_h (16 bits: top two bits of each of 8
 * six-bit scales, offset 32), scales_l[4] (their low nibbles, two a byte),
 * qs[128]: sub-block s of 32 as one IQ4_NL block's nibbles, qs[16s..]. */
static void unpack_iq4_xs(const uint8_t *b, qblk_t *o)
{
    o->d = rd_f16(b);
    o->dm = 0.0f;
    unsigned sh = (unsigned)(b[2] | b[3] << 8);
    const uint8_t *sl = b + 4, *qs = b + 8;
    for (int s = 0; s < 8; s++) {
        int ls = ((sl[s / 2] >> 4 * (s % 2)) & 15) | ((sh >> 2 * s) & 3) << 4;
        o->sc[s] = (int16_t)(ls - 32);
        o->mn[s] = 0;
        for (int j = 0; j < 16; j++) {
            o->q[32 * s + j] = iq4_grid[qs[16 * s + j] & 15];
            o->q[32 * s + 16 + j] = iq4_grid[qs[16 * s + j] >> 4];
        }
    }
}

static void pack_iq4_xs(const qblk_t *o, uint8_t *b)
{
    memset(b, 0, 136);
    wr_f16(b, o->d);
    unsigned sh = 0;
    uint8_t *sl = b + 4, *qs = b + 8;
    for (int s = 0; s < 8; s++) {
        unsigned ls = (unsigned)(o->sc[s] + 32);
        sl[s / 2] |= (uint8_t)((ls & 15) << 4 * (s % 2));
        sh |= (ls >> 4) << 2 * s;
        for (int j = 0; j < 16; j++)
            qs[16 * s + j] =
                (uint8_t)(grid_index(o->q[32 * s + j]) | grid_index(o->q[32 * s + 16 + j]) << 4);
    }
    b[2] = (uint8_t)sh;
    b[3] = (uint8_t)(sh >> 8);
}

/* ------------------------------------------------------------------ the type table
 * One row per block type: how it unpacks and packs, the activations its
 * integer dot takes, and what its quantizer aims for. Block size and bytes
 * come from gguf's type table. */

typedef struct qfmt {
    uint32_t type;
    uint16_t sub;         /* elements per sub-block (the block size for one-scale types) */
    uint8_t act;          /* quant_act_t its integer dot takes */
    uint8_t fast;         /* the FAST path uses the integer dot for it */
    int8_t qmin, qmax;    /* range of the integer values (grid types: the grid's) */
    int16_t scmin, scmax; /* range of the integer scales; 0, 0 for one F16 scale a block */
    uint8_t asym;         /* has mins: value = d*sc*q - dm*mn */
    uint8_t grid;         /* values are iq4_grid levels */
    void (*unpack)(const uint8_t *b, qblk_t *o);
    void (*pack)(const qblk_t *o, uint8_t *b);
} qfmt_t;

/* FAST takes the integer dot for every block type (Q8_0 too: its AVX2
 * integer kernel beats the F32 one, 441 vs 287 tok/s prefill and 170 vs
 * 145 decode on the 134M shape, one thread). */
static const qfmt_t qfmts[] = {
    {GGUF_T_Q4_0, 32, QUANT_ACT_Q8, 1, -8, 7, 0, 0, 0, 0, unpack_q4_0, pack_q4_0},
    {GGUF_T_Q4_1, 32, QUANT_ACT_Q8, 1, 0, 15, 0, 0, 1, 0, unpack_q4_1, pack_q4_1},
    {GGUF_T_Q5_0, 32, QUANT_ACT_Q8, 1, -16, 15, 0, 0, 0, 0, unpack_q5_0, pack_q5_0},
    {GGUF_T_Q5_1, 32, QUANT_ACT_Q8, 1, 0, 31, 0, 0, 1, 0, unpack_q5_1, pack_q5_1},
    {GGUF_T_Q8_0, 32, QUANT_ACT_Q8, 1, -127, 127, 0, 0, 0, 0, unpack_q8_0, pack_q8_0},
    {GGUF_T_IQ4_NL, 32, QUANT_ACT_Q8, 1, -127, 113, 0, 0, 0, 1, unpack_iq4_nl, pack_iq4_nl},
    {GGUF_T_Q2_K, 16, QUANT_ACT_Q8K, 1, 0, 3, 0, 15, 1, 0, unpack_q2_k, pack_q2_k},
    {GGUF_T_Q3_K, 16, QUANT_ACT_Q8K, 1, -4, 3, -32, 31, 0, 0, unpack_q3_k, pack_q3_k},
    {GGUF_T_Q4_K, 32, QUANT_ACT_Q8K, 1, 0, 15, 0, 63, 1, 0, unpack_q4_k, pack_q4_k},
    {GGUF_T_Q5_K, 32, QUANT_ACT_Q8K, 1, 0, 31, 0, 63, 1, 0, unpack_q5_k, pack_q5_k},
    {GGUF_T_Q6_K, 16, QUANT_ACT_Q8K, 1, -32, 31, -128, 127, 0, 0, unpack_q6_k, pack_q6_k},
    {GGUF_T_IQ4_XS, 32, QUANT_ACT_Q8K, 1, -127, 113, -32, 31, 0, 1, unpack_iq4_xs, pack_iq4_xs},
};
#define N_QFMTS (sizeof qfmts / sizeof qfmts[0])

static const qfmt_t *qfmt_of(uint32_t type)
{
    for (size_t i = 0; i < N_QFMTS; i++)
        if (qfmts[i].type == type)
            return &qfmts[i];
    return NULL;
}

/* block size and bytes of a type (gguf's table) */
static void blk_traits(uint32_t type, size_t *blck, size_t *bytes)
{
    uint32_t b = 1, s = 0;
    gguf_ttype_traits(type, &b, &s);
    *blck = b;
    *bytes = s;
}

/* Exact dequantization of one block into y[blck]: (d * sc) * q - dm * mn. */
static void qblk_to_f32(const qfmt_t *f, const qblk_t *u, float *y, size_t blck)
{
    for (size_t s = 0; s < blck / f->sub; s++) {
        float ds = u->d * (float)u->sc[s], ms = u->dm * (float)u->mn[s];
        for (size_t i = s * f->sub; i < (s + 1) * f->sub; i++)
            y[i] = ds * (float)u->q[i] - ms;
    }
}

static int8_t grid_nearest(float t)
{
    int best = 0;
    float bd = INFINITY;
    for (int i = 0; i < 16; i++) {
        float e = fabsf(t - (float)iq4_grid[i]);
        if (e < bd) {
            bd = e;
            best = i;
        }
    }
    return iq4_grid[best];
}

/* the value of largest magnitude (keeping its sign) */
static float signed_extreme(const float *x, size_t n)
{
    float v = 0.0f;
    for (size_t i = 0; i < n; i++)
        if (fabsf(x[i]) > fabsf(v))
            v = x[i];
    return v;
}

static inline float f16_round(float v)
{
    return quant_f16_to_f32(quant_f32_to_f16(v));
}

/* Round-to-nearest quantizer of one block: per sub-block a scale (and
 * min) that spans its values, the scales themselves quantized to the
 * format's integer range under an F16 factor, then every value rounded on
 * the decoded scale. */
static void quantize_block(const qfmt_t *f, const float *x, size_t blck, uint8_t *dst)
{
    qblk_t u;
    memset(&u, 0, sizeof u);
    size_t ns = blck / f->sub;
    float scale[16], lo[16];
    int qneg = f->grid ? iq4_grid[0] : f->qmin; /* the most negative level */
    for (size_t s = 0; s < ns; s++) {
        const float *xs = x + s * f->sub;
        if (f->asym) {
            float mn = xs[0], mx = xs[0];
            for (size_t i = 1; i < f->sub; i++) {
                mn = fminf(mn, xs[i]);
                mx = fmaxf(mx, xs[i]);
            }
            if (f->scmax) /* K mins are subtracted: keep them <= 0 */
                mn = fminf(mn, 0.0f);
            lo[s] = mn;
            scale[s] = (mx - mn) / (float)f->qmax;
        } else {
            lo[s] = 0.0f;
            scale[s] = signed_extreme(xs, f->sub) / (float)qneg;
        }
    }
    if (!f->scmax) { /* one F16 scale (and min) per block */
        u.sc[0] = 1;
        u.d = f16_round(scale[0]);
        if (f->asym) {
            u.mn[0] = 1;
            u.dm = f16_round(-lo[0]);
        }
    } else if (f->asym) { /* unsigned scales and mins */
        float smax = 0.0f, mmax = 0.0f;
        for (size_t s = 0; s < ns; s++) {
            smax = fmaxf(smax, scale[s]);
            mmax = fmaxf(mmax, -lo[s]);
        }
        u.d = f16_round(smax / (float)f->scmax);
        u.dm = f16_round(mmax / (float)f->scmax);
        for (size_t s = 0; s < ns; s++) {
            long sc = u.d > 0.0f ? lrintf(scale[s] / u.d) : 0;
            long mn = u.dm > 0.0f ? lrintf(-lo[s] / u.dm) : 0;
            u.sc[s] = (int16_t)(sc < 0 ? 0 : sc > f->scmax ? f->scmax : sc);
            u.mn[s] = (int16_t)(mn < 0 ? 0 : mn > f->scmax ? f->scmax : mn);
        }
    } else { /* signed scales */
        u.d = f16_round(signed_extreme(scale, ns) / (float)f->scmin);
        for (size_t s = 0; s < ns; s++) {
            long sc = u.d != 0.0f ? lrintf(scale[s] / u.d) : 0;
            u.sc[s] = (int16_t)(sc < f->scmin ? f->scmin : sc > f->scmax ? f->scmax : sc);
        }
    }
    for (size_t s = 0; s < ns; s++) {
        float ds = u.d * (float)u.sc[s], ms = u.dm * (float)u.mn[s];
        for (size_t i = s * f->sub; i < (s + 1) * f->sub; i++) {
            float t = ds != 0.0f ? (x[i] + ms) / ds : 0.0f;
            if (f->grid) {
                u.q[i] = grid_nearest(t);
            } else {
                long q = lrintf(t);
                u.q[i] = (int8_t)(q < f->qmin ? f->qmin : q > f->qmax ? f->qmax : q);
            }
        }
    }
    f->pack(&u, dst);
}

/* ------------------------------------------------------------------ activation quantization */

static void act_q8(const float *x, quant_act_q8_t *a, size_t nb)
{
    for (size_t k = 0; k < nb; k++, x += QUANT_Q8_0_BLOCK) {
        float amax = 0.0f;
        for (int j = 0; j < QUANT_Q8_0_BLOCK; j++) /* fmaxf, without the call */
            amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        /* the scale is kept as F16 (rounded after the values are) */
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < QUANT_Q8_0_BLOCK; j++) {
            a[k].qs[j] = (int8_t)lrintf(x[j] * id);
            sum += a[k].qs[j];
        }
        a[k].d = f16_round(d);
        a[k].s = f16_round(d * (float)sum);
    }
}

static void act_q8k(const float *x, quant_act_q8k_t *a, size_t nb)
{
    for (size_t k = 0; k < nb; k++, x += QUANT_K_BLOCK) {
        /* the value of largest magnitude maps to -127 (as llama.cpp's Q8_K
         * does, so d may be negative) */
        float v = signed_extreme(x, QUANT_K_BLOCK);
        float id = v != 0.0f ? -127.0f / v : 0.0f, d = v != 0.0f ? 1.0f / id : 0.0f;
        for (int j = 0; j < QUANT_K_BLOCK; j++) {
            long q = lrintf(x[j] * id);
            a[k].qs[j] = (int8_t)(q > 127 ? 127 : q);
        }
        for (int g = 0; g < QUANT_K_BLOCK / 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++)
                sum += a[k].qs[16 * g + j];
            a[k].bsums[g] = (int16_t)sum;
        }
        a[k].d = d;
    }
}

size_t quant_act_bytes(quant_act_t act, size_t n)
{
    switch (act) {
    case QUANT_ACT_Q8:
        return n % QUANT_Q8_0_BLOCK ? 0 : n / QUANT_Q8_0_BLOCK * sizeof(quant_act_q8_t);
    case QUANT_ACT_Q8K: return n % QUANT_K_BLOCK ? 0 : n / QUANT_K_BLOCK * sizeof(quant_act_q8k_t);
    default: return n * sizeof(float);
    }
}

void quant_act_from_f32(quant_act_t act, const float *x, void *dst, size_t n)
{
    switch (act) {
    case QUANT_ACT_Q8:
        (f16_rows_simd() ? act_q8_simd : act_q8)(x, dst, n / QUANT_Q8_0_BLOCK);
        break;
    case QUANT_ACT_Q8K:
        (f16_rows_simd() ? act_q8k_simd : act_q8k)(x, dst, n / QUANT_K_BLOCK);
        break;
    default: memcpy(dst, x, n * sizeof(float)); break;
    }
}

static quant_path_t path_cur = QUANT_PATH_FAST;

void quant_path_set(quant_path_t p)
{
    path_cur = p;
}

quant_act_t quant_act_of(uint32_t type)
{
    const qfmt_t *f = qfmt_of(type);
    return f ? (quant_act_t)f->act : QUANT_ACT_F32;
}

quant_act_t quant_act_for(uint32_t type)
{
    const qfmt_t *f = qfmt_of(type);
    return f && f->fast && path_cur == QUANT_PATH_FAST ? (quant_act_t)f->act : QUANT_ACT_F32;
}

/* ------------------------------------------------------------------ portable integer dots
 * Per block: integer sums per sub-block (|sum| < 2^31: at most 256 products
 * of |q| <= 127 by |a| <= 127, times |sc| <= 128), one float expression. */

/* The float side of one block's dot, shared by every kernel so that the
 * SIMD ones equal the portable one bit for bit: 32-blocks with d, min
 * factor dm and integer min mn; 256-blocks with integer sums sq (values x
 * scales) and sm (activation sums x mins). */
static inline float q8_term(float d, float dm, int mn, int32_t s, const quant_act_q8_t *a)
{
    return (d * a->d) * (float)s - (dm * (float)mn) * a->s;
}

static inline float k_term(float d, float dm, int32_t sq, int32_t sm, const quant_act_q8k_t *a)
{
    return a->d * (d * (float)sq - dm * (float)sm);
}

/* a row of nblk weight blocks against nx (<= QUANT_DOTN_MAX) activation
 * rows of the type's format, out[t]; each result independent of nx */
typedef void (*vdot_row_fn)(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                            float *out);

/* nr weight rows (rb bytes apart) against nx activation rows, out[r * nx +
 * t]: a prefill register tile, each result identical to the type's
 * vdot_row_fn on that row and token alone */
typedef void (*vtile_fn)(const uint8_t *w, size_t rb, int nr, const void *const *xq, int nx,
                         size_t nblk, float *out);

static float vdot_row_portable(const qfmt_t *f, const uint8_t *w, size_t bb, const void *xq,
                               size_t nblk)
{
    float acc = 0.0f;
    qblk_t u;
    for (size_t k = 0; k < nblk; k++) {
        f->unpack(w + k * bb, &u);
        if (f->act == QUANT_ACT_Q8) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq + k;
            int32_t s = 0;
            for (int i = 0; i < QUANT_Q8_0_BLOCK; i++)
                s += u.q[i] * a->qs[i];
            acc += q8_term(u.d, u.dm, u.mn[0], s * u.sc[0], a);
        } else {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq + k;
            int32_t sq = 0, sm = 0;
            int g = f->sub / 16; /* bsums per sub-block */
            for (int s = 0; s < QUANT_K_BLOCK / f->sub; s++) {
                int32_t is = 0, bs = 0;
                for (int i = s * f->sub; i < (s + 1) * f->sub; i++)
                    is += u.q[i] * a->qs[i];
                for (int j = 0; j < g; j++)
                    bs += a->bsums[s * g + j];
                sq += is * u.sc[s];
                sm += bs * u.mn[s];
            }
            acc += k_term(u.d, u.dm, sq, sm, a);
        }
    }
    return acc;
}

float quant_vdot_portable(uint32_t type, const void *w, const void *xq, size_t n)
{
    const qfmt_t *f = qfmt_of(type);
    if (!f)
        return 0.0f;
    size_t blck, bytes;
    blk_traits(type, &blck, &bytes);
    return vdot_row_portable(f, w, bytes, xq, n / blck);
}

/* ------------------------------------------------------------------ exact dots of block types
 * F32 activations against each block dequantized exactly; per pair 8 lanes
 * over the row, reduced as pair_plain does, so results never depend on
 * the tile shape. */

static void tile_blocks_exact(const qfmt_t *f, const void *w, size_t rb, int nr,
                              const float *const *x, int nx, size_t n, float *out)
{
    size_t blck, bytes;
    blk_traits(f->type, &blck, &bytes);
    float y[QUANT_K_BLOCK];
    qblk_t u;
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * rb;
        for (int t0 = 0; t0 < nx; t0 += QUANT_DOTN_MAX) {
            int nt = nx - t0 < QUANT_DOTN_MAX ? nx - t0 : QUANT_DOTN_MAX;
            float acc[QUANT_DOTN_MAX][8] = {{0}};
            for (size_t k = 0; k < n / blck; k++) {
                f->unpack(row + k * bytes, &u);
                qblk_to_f32(f, &u, y, blck);
                for (int t = 0; t < nt; t++) {
                    const float *xb = x[t0 + t] + k * blck;
                    for (size_t i = 0; i < blck; i += 8)
                        for (int l = 0; l < 8; l++)
                            acc[t][l] += y[i + l] * xb[i + l];
                }
            }
            for (int t = 0; t < nt; t++) {
                const float *a = acc[t];
                out[r * nx + t0 + t] =
                    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
            }
        }
    }
}

int quant_type_supported(uint32_t type)
{
    return type == GGUF_T_F32 || type == GGUF_T_F16 || type == GGUF_T_BF16 || qfmt_of(type);
}

void quant_type_list(char *buf, size_t cap)
{
    size_t used = 0;
    static const uint32_t plain[] = {GGUF_T_F32, GGUF_T_F16, GGUF_T_BF16};
    if (!cap)
        return;
    buf[0] = 0;
    for (size_t i = 0; i < 3 + N_QFMTS; i++) {
        uint32_t t = i < 3 ? plain[i] : qfmts[i - 3].type;
        int w = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", gguf_ttype_name(t));
        if (w < 0 || (size_t)w >= cap - used)
            return;
        used += (size_t)w;
    }
}

size_t quant_row_bytes(uint32_t type, size_t n)
{
    if (!quant_type_supported(type))
        return 0;
    size_t blck, bytes;
    blk_traits(type, &blck, &bytes);
    if (n % blck)
        return 0;
    return n / blck * bytes;
}

void quant_row_from_f32(uint32_t type, const float *x, void *dst, size_t n)
{
    switch (type) {
    case GGUF_T_F32: memcpy(dst, x, n * 4); break;
    case GGUF_T_F16: {
        uint16_t *d = dst;
        if (f16_rows_simd()) {
            f32_to_f16_row_simd(x, d, n);
            break;
        }
        for (size_t i = 0; i < n; i++)
            d[i] = quant_f32_to_f16(x[i]);
        break;
    }
    case GGUF_T_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++)
            d[i] = quant_f32_to_bf16(x[i]);
        break;
    }
    case GGUF_T_Q8_0: {
        quant_block_q8_0_t *b = dst;
        for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
            const float *xb = x + k * QUANT_Q8_0_BLOCK;
            float amax = 0.0f;
            for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
                amax = fmaxf(amax, fabsf(xb[j]));
            float d = amax / 127.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            b[k].d = quant_f32_to_f16(d);
            for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
                b[k].qs[j] = (int8_t)roundf(xb[j] * id);
        }
        break;
    }
    default: {
        const qfmt_t *f = qfmt_of(type);
        if (!f)
            break;
        size_t blck, bytes;
        blk_traits(type, &blck, &bytes);
        for (size_t k = 0; k < n / blck; k++)
            quantize_block(f, x + k * blck, blck, (uint8_t *)dst + k * bytes);
        break;
    }
    }
}

void quant_row_to_f32(uint32_t type, const void *src, float *dst, size_t n)
{
    switch (type) {
    case GGUF_T_F32: memcpy(dst, src, n * 4); break;
    case GGUF_T_F16: {
        const uint16_t *s = src;
        if (f16_rows_simd()) {
            f16_to_f32_row_simd(s, dst, n);
            break;
        }
        for (size_t i = 0; i < n; i++)
            dst[i] = quant_f16_to_f32(s[i]);
        break;
    }
    case GGUF_T_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++)
            dst[i] = quant_bf16_to_f32(s[i]);
        break;
    }
    case GGUF_T_Q8_0: {
        const quant_block_q8_0_t *b = src;
        for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
            float d = quant_f16_to_f32(b[k].d);
            for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
                dst[k * QUANT_Q8_0_BLOCK + j] = d * (float)b[k].qs[j];
        }
        break;
    }
    default: {
        const qfmt_t *f = qfmt_of(type);
        if (!f)
            break;
        size_t blck, bytes;
        blk_traits(type, &blck, &bytes);
        qblk_t u;
        for (size_t k = 0; k < n / blck; k++) {
            f->unpack((const uint8_t *)src + k * bytes, &u);
            qblk_to_f32(f, &u, dst + k * blck, blck);
        }
        break;
    }
    }
}

/* ------------------------------------------------------------------ portable kernels
 * Every kernel computes each (row, vector) pair with its own accumulator
 * chain in the same order, whatever the tile size, so out[r][t] does not
 * depend on how many rows or vectors share the call. */

static inline float w_at(uint32_t type, const void *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16: return quant_f16_to_f32(((const uint16_t *)w)[i]);
    case GGUF_T_BF16: return quant_bf16_to_f32(((const uint16_t *)w)[i]);
    default: return ((const float *)w)[i];
    }
}

/* one pair: 8 lanes over 8-element chunks, reduced pairwise, then the tail */
static float pair_plain(uint32_t type, const void *w, const float *x, size_t n)
{
    float acc[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += w_at(type, w, i + l) * x[i + l];
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < n; i++)
        s += w_at(type, w, i) * x[i];
    return s;
}

static float pair_q8_0_plain(const void *w, const float *x, size_t n)
{
    const quant_block_q8_0_t *b = w;
    float acc = 0.0f;
    for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
        const float *xb = x + k * QUANT_Q8_0_BLOCK;
        float s = 0.0f;
        for (int j = 0; j < QUANT_Q8_0_BLOCK; j++)
            s += (float)b[k].qs[j] * xb[j];
        acc += s * quant_f16_to_f32(b[k].d);
    }
    return acc;
}

static void tile_portable(uint32_t type, const void *w, size_t rb, int nr, const float *const *x,
                          int nx, size_t n, float *out)
{
    for (int r = 0; r < nr; r++) {
        const void *row = (const uint8_t *)w + (size_t)r * rb;
        for (int t = 0; t < nx; t++)
            out[r * nx + t] = type == GGUF_T_Q8_0 ? pair_q8_0_plain(row, x[t], n)
                                                  : pair_plain(type, row, x[t], n);
    }
}

static float dot_f32_portable(const float *a, const float *b, size_t n)
{
    return pair_plain(GGUF_T_F32, a, b, n);
}

static void axpy_portable(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

/* ------------------------------------------------------------------ AVX2 kernels */
#if QUANT_HAVE_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

AVX2_INLINE float hsum256(__m256 v)
{
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}

AVX2_INLINE __m256 load8(uint32_t type, const void *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    case GGUF_T_BF16: {
        __m256i v =
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    default: return _mm256_loadu_ps((const float *)w + i);
    }
}

/* nr rows x nx vectors (nr * nx <= QUANT_TILE_MAX), one accumulator per
 * pair: each weight chunk is loaded once for nx vectors, each vector chunk
 * once for nr rows. */
AVX2_INLINE void tile_avx2_body(uint32_t type, const uint8_t *w, size_t rb, int nr,
                                const float *const *x, int nx, size_t n, float *out)
{
    __m256 acc[QUANT_TILE_MAX];
#pragma GCC unroll 8
    for (int p = 0; p < nr * nx; p++)
        acc[p] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 xv[QUANT_DOTN_MAX];
#pragma GCC unroll 8
        for (int t = 0; t < nx; t++)
            xv[t] = _mm256_loadu_ps(x[t] + i);
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            __m256 wv = load8(type, w + (size_t)r * rb, i);
#pragma GCC unroll 8
            for (int t = 0; t < nx; t++)
                acc[r * nx + t] = _mm256_fmadd_ps(wv, xv[t], acc[r * nx + t]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < nr; r++) {
#pragma GCC unroll 8
        for (int t = 0; t < nx; t++) {
            float s = hsum256(acc[r * nx + t]);
            for (size_t j = i; j < n; j++)
                s += w_at(type, w + (size_t)r * rb, j) * x[t][j];
            out[r * nx + t] = s;
        }
    }
}

AVX2_INLINE __m256 q8_load8(const int8_t *q)
{
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
}

AVX2_INLINE void tile_q8_0_avx2_body(const uint8_t *w, size_t rb, int nr, const float *const *x,
                                     int nx, size_t n, float *out)
{
    __m256 acc[QUANT_TILE_MAX];
#pragma GCC unroll 8
    for (int p = 0; p < nr * nx; p++)
        acc[p] = _mm256_setzero_ps();
    for (size_t k = 0; k < n / QUANT_Q8_0_BLOCK; k++) {
#pragma GCC unroll 8
        for (int r = 0; r < nr; r++) {
            const quant_block_q8_0_t *b = (const quant_block_q8_0_t *)(w + (size_t)r * rb) + k;
            __m256 d = _mm256_set1_ps(_cvtsh_ss(b->d));
            __m256 q0 = q8_load8(b->qs), q1 = q8_load8(b->qs + 8);
            __m256 q2 = q8_load8(b->qs + 16), q3 = q8_load8(b->qs + 24);
#pragma GCC unroll 8
            for (int t = 0; t < nx; t++) {
                const float *xb = x[t] + k * QUANT_Q8_0_BLOCK;
                __m256 sv = _mm256_mul_ps(q0, _mm256_loadu_ps(xb));
                sv = _mm256_fmadd_ps(q1, _mm256_loadu_ps(xb + 8), sv);
                sv = _mm256_fmadd_ps(q2, _mm256_loadu_ps(xb + 16), sv);
                sv = _mm256_fmadd_ps(q3, _mm256_loadu_ps(xb + 24), sv);
                acc[r * nx + t] = _mm256_fmadd_ps(sv, d, acc[r * nx + t]);
            }
        }
    }
#pragma GCC unroll 8
    for (int p = 0; p < nr * nx; p++)
        out[p] = hsum256(acc[p]);
}

/* Specialise on (nr, nx) so the loops unroll into registers. */
#define TILE_SHAPES(call)                                                                          \
    switch (nr * 8 + nx) {                                                                         \
    case 1 * 8 + 1: call(1, 1); break;                                                             \
    case 1 * 8 + 2: call(1, 2); break;                                                             \
    case 1 * 8 + 3: call(1, 3); break;                                                             \
    case 1 * 8 + 4: call(1, 4); break;                                                             \
    case 2 * 8 + 1: call(2, 1); break;                                                             \
    case 2 * 8 + 2: call(2, 2); break;                                                             \
    case 2 * 8 + 3: call(2, 3); break;                                                             \
    case 2 * 8 + 4: call(2, 4); break;                                                             \
    case 3 * 8 + 1: call(3, 1); break;                                                             \
    case 3 * 8 + 2: call(3, 2); break;                                                             \
    case 4 * 8 + 1: call(4, 1); break;                                                             \
    case 4 * 8 + 2: call(4, 2); break;                                                             \
    default:                                                                                       \
        for (int r_ = 0; r_ < nr; r_++)                                                            \
            for (int t_ = 0; t_ < nx; t_++) {                                                      \
                const float *xs_[1] = {x[t_]};                                                     \
                call##_ONE(r_, t_, xs_);                                                           \
            }                                                                                      \
        break;                                                                                     \
    }

AVX2 static void tile_avx2(uint32_t type, const void *wv, size_t rb, int nr, const float *const *x,
                           int nx, size_t n, float *out)
{
    const uint8_t *w = wv;
    if (type == GGUF_T_Q8_0) {
#define Q8T(R, X) tile_q8_0_avx2_body(w, rb, R, x, X, n, out)
#define Q8T_ONE(r, t, xs)                                                                          \
    tile_q8_0_avx2_body(w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(Q8T)
#undef Q8T
#undef Q8T_ONE
        return;
    }
    switch (type) {
    case GGUF_T_F16: {
#define F16T(R, X) tile_avx2_body(GGUF_T_F16, w, rb, R, x, X, n, out)
#define F16T_ONE(r, t, xs)                                                                         \
    tile_avx2_body(GGUF_T_F16, w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(F16T)
#undef F16T
#undef F16T_ONE
        break;
    }
    case GGUF_T_BF16: {
#define BF16T(R, X) tile_avx2_body(GGUF_T_BF16, w, rb, R, x, X, n, out)
#define BF16T_ONE(r, t, xs)                                                                        \
    tile_avx2_body(GGUF_T_BF16, w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(BF16T)
#undef BF16T
#undef BF16T_ONE
        break;
    }
    default: {
#define F32T(R, X) tile_avx2_body(GGUF_T_F32, w, rb, R, x, X, n, out)
#define F32T_ONE(r, t, xs)                                                                         \
    tile_avx2_body(GGUF_T_F32, w + (size_t)(r)*rb, rb, 1, xs, 1, n, &out[(r)*nx + (t)])
        TILE_SHAPES(F32T)
#undef F32T
#undef F32T_ONE
        break;
    }
    }
}

AVX2 static float dot_f32_avx2(const float *a, const float *b, size_t n)
{
    /* attention's q.k: two chains for latency, its own order (not a matmul) */
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), a1);
    }
    for (; i + 8 <= n; i += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), a0);
    float s = hsum256(_mm256_add_ps(a0, a1));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

AVX2 static void axpy_avx2(float *y, float a, const float *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i,
                         _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * x[i];
}

/* ------------------------------------------------------------------ AVX2 integer dots
 * maddubs (u8 x s8 -> pairs summed in int16) then madd by the sub-block
 * scale (-> int32): every product and sum is exact (pairs stay below
 * 2 * 63 * 127; totals below 2^31), so the integer sums equal the portable
 * ones and the shared float terms make results bit-identical. */

/* an F16 factor of a block, by F16C (the same value as rd_f16) */
AVX2_INLINE float rd_f16c(const uint8_t *p)
{
    return _cvtsh_ss((unsigned short)(p[0] | p[1] << 8));
}

AVX2_INLINE int32_t hsum_i32(__m256i v)
{
    __m128i x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0x4e));
    x = _mm_add_epi32(x, _mm_shuffle_epi32(x, 0xb1));
    return _mm_cvtsi128_si32(x);
}

/* The 32-value types (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL): float lanes, not the portable
 * order (one hsum per block costs more than the dot): lane j of each
 * block's int32 vector (values 4j..4j+3) is scaled by d_w * d_a and
 * accumulated with FMA, the lanes summed at the end. They differ from the
 * portable dot by float rounding only (tested within 1e-5 of the sum of
 * |products|). */
/* 32 bits -> 32 bytes, 16 where the bit is set */
AVX2_INLINE __m256i q5_high_bits(uint32_t qh)
{
    const __m256i pick = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                          2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), pick), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, bit), _mm256_set1_epi8(16));
}

/* the 32 values of a block, signed (Q4_1 and Q5_1: unsigned, the min apart) */
AVX2_INLINE __m256i q32_values(const uint8_t *w, uint32_t type)
{
    if (type == GGUF_T_Q8_0)
        return _mm256_loadu_si256((const __m256i *)(w + 2));
    const size_t qs = type == GGUF_T_Q4_1   ? 4
                      : type == GGUF_T_Q5_0 ? 6
                      : type == GGUF_T_Q5_1 ? 8
                                            : 2;
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i b = _mm_loadu_si128((const __m128i *)(w + qs));
    __m256i v = _mm256_setr_m128i(_mm_and_si128(b, m4), _mm_and_si128(_mm_srli_epi16(b, 4), m4));
    switch (type) {
    case GGUF_T_Q4_0: return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
    case GGUF_T_Q4_1: return v;
    case GGUF_T_Q5_0:
        return _mm256_sub_epi8(_mm256_or_si256(v, q5_high_bits(rd_u32(w + 2))),
                               _mm256_set1_epi8(16));
    case GGUF_T_Q5_1: return _mm256_or_si256(v, q5_high_bits(rd_u32(w + 4)));
    default:
        return _mm256_shuffle_epi8(
            _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid)), v);
    }
}

AVX2_INLINE void vdot_q32_avx2(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                               float *out, uint32_t type)
{
    const __m256i ones = _mm256_set1_epi16(1);
    const int mins = type == GGUF_T_Q4_1 || type == GGUF_T_Q5_1;
    size_t bb; /* block bytes, as in gguf's table */
    switch (type) {
    case GGUF_T_Q8_0: bb = 34; break;
    case GGUF_T_Q4_1: bb = 20; break;
    case GGUF_T_Q5_0: bb = 22; break;
    case GGUF_T_Q5_1: bb = 24; break;
    default: bb = 18; break;
    }
    __m256 acc[QUANT_DOTN_MAX];
    float macc[QUANT_DOTN_MAX] = {0}; /* the mins' part: m x d_a x activation sum */
    for (int t = 0; t < nx; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++, w += bb) {
        __m256i q = q32_values(w, type);
        __m256i aq = mins ? q : _mm256_abs_epi8(q);
        float d = rd_f16c(w), m = mins ? rd_f16c(w + 2) : 0.0f;
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            /* |q| x (x with q's sign): |q| <= 128 and |x| <= 127 keep pairs exact */
            __m256i p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(aq, mins ? x : _mm256_sign_epi8(x, q)), ones);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[t]);
            if (mins)
                macc[t] += m * a->s;
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = hsum256(acc[t]) + macc[t];
}

/* The 32-value types' entry points: vdot_q32_avx2 specialised per type. */
#define VDOT_Q32_AVX2(name, T)                                                                     \
    AVX2_INLINE void vdot_##name##_avx2_body(const uint8_t *w, const void *const *xq, int nx,      \
                                             size_t nblk, float *out)                              \
    {                                                                                              \
        vdot_q32_avx2(w, xq, nx, nblk, out, T);                                                    \
    }
VDOT_Q32_AVX2(q8_0, GGUF_T_Q8_0)
VDOT_Q32_AVX2(q4_0, GGUF_T_Q4_0)
VDOT_Q32_AVX2(q4_1, GGUF_T_Q4_1)
VDOT_Q32_AVX2(q5_0, GGUF_T_Q5_0)
VDOT_Q32_AVX2(q5_1, GGUF_T_Q5_1)
VDOT_Q32_AVX2(iq4_nl, GGUF_T_IQ4_NL)
#undef VDOT_Q32_AVX2

/* IQ4_XS: grid values (|q| <= 127) by sign trick, each 32-value sub-block's
 * pair sums scaled by its int16 scale; bit-identical to the portable dot. */
AVX2_INLINE void vdot_iq4_xs_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                       float *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i grid = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)iq4_grid));
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += 136) {
        unsigned sh = (unsigned)(w[2] | w[3] << 8);
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {
            /* sub-blocks 2p and 2p + 1: A holds values 0..15 of each, B 16..31 */
            __m256i v = _mm256_loadu_si256((const __m256i *)(w + 8 + 32 * p));
            __m256i qa = _mm256_shuffle_epi8(grid, _mm256_and_si256(v, m4));
            __m256i qb = _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            __m256i aa = _mm256_abs_epi8(qa), ab = _mm256_abs_epi8(qb);
            int l0 = ((w[4 + p] & 15) | ((sh >> 4 * p) & 3) << 4) - 32;
            int l1 = ((w[4 + p] >> 4) | ((sh >> (4 * p + 2)) & 3) << 4) - 32;
            __m256i scv = _mm256_setr_m128i(_mm_set1_epi16((short)l0), _mm_set1_epi16((short)l1));
#pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const int8_t *x = ((const quant_act_q8k_t *)xq[t] + k)->qs + 64 * p;
                __m256i xa = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)x),
                                               _mm_loadu_si128((const __m128i *)(x + 32)));
                __m256i xb = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(x + 16)),
                                               _mm_loadu_si128((const __m128i *)(x + 48)));
                __m256i pa = _mm256_maddubs_epi16(aa, _mm256_sign_epi8(xa, qa));
                __m256i pb = _mm256_maddubs_epi16(ab, _mm256_sign_epi8(xb, qb));
                /* (pa + pb would overflow int16: each pair reaches 2 * 127 * 127) */
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(pa, scv));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(pb, scv));
            }
        }
        float d = rd_f16c(w);
        for (int t = 0; t < nx; t++)
            acc[t] += k_term(d, 0.0f, hsum_i32(sum[t]), 0, (const quant_act_q8k_t *)xq[t] + k);
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

/* Q4_K's 12-byte scale field (see k4_scales_get) as 8 scale and 8 min
 * bytes, four at a time */
static inline void k4_scales_bytes(const uint8_t *s, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t a = rd_u32(s), b = rd_u32(s + 4), c = rd_u32(s + 8);
    uint32_t v[4] = {a & 0x3f3f3f3fu, b & 0x3f3f3f3fu,
                     (c & 0x0f0f0f0fu) | ((a >> 6) & 0x03030303u) << 4,
                     ((c >> 4) & 0x0f0f0f0fu) | ((b >> 6) & 0x03030303u) << 4};
    memcpy(sc, &v[0], 4);
    memcpy(mn, &v[1], 4);
    memcpy(sc + 4, &v[2], 4);
    memcpy(mn + 4, &v[3], 4);
}

/* Q4_K, and Q5_K (five = 1: qh[32] before qs, bit 2c / 2c + 1 of qh[l] is
 * bit 4 of element 64c + l / 64c + 32 + l) */
AVX2_INLINE void vdot_q45_k_avx2(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                 float *out, int five)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
    const size_t bb = five ? 176 : 144;
    const uint8_t *qs0 = w + (five ? 48 : 16);
    /* byte pairs (2j, 2j+1) of a 128-bit lane: broadcast int16 j */
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += bb, qs0 += bb) {
        uint8_t sc[8], mn[8];
        k4_scales_bytes(w + 4, sc, mn);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        uint64_t sc64, mn64;
        memcpy(&sc64, sc, 8);
        memcpy(&mn64, mn, 8);
        /* scales as int16 in both halves; mins as int16 pairs (one per 16 bsums) */
        __m256i scv =
            _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc64)));
        __m256i mnv =
            _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128((long long)mn64), dup));
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i q = _mm256_loadu_si256((const __m256i *)(qs0 + 32 * c));
            __m256i lo = _mm256_and_si256(q, m4),
                    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if (five) { /* qh was shifted right by 2c: its bits 0 and 1 are this chunk's */
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(qh, one), 4));
                hi = _mm256_or_si256(
                    hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 1), one), 4));
                qh = _mm256_srli_epi16(qh, 2);
            }
            __m256i s0 =
                _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c))));
            __m256i s1 =
                _mm256_shuffle_epi8(scv, _mm256_set1_epi16((short)(0x0100 + 0x0202 * (2 * c + 1))));
#pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 64 * c;
                __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)aq));
                __m256i p1 =
                    _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(aq + 32)));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p0, s0));
                sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p1, s1));
            }
        }
        float d = rd_f16c(w), dm = rd_f16c(w + 2);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            int32_t sm = hsum_i32(_mm256_madd_epi16(bs, mnv));
            acc[t] += k_term(d, dm, hsum_i32(sum[t]), sm, a);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

AVX2_INLINE __m256i q6_values(__m256i ql, __m256i qh, int g)
{
    /* values + 32 (0..63): nibble g / 2 of ql, bits 2g..2g+1 of qh */
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    __m256i lo = _mm256_and_si256(g / 2 ? _mm256_srli_epi16(ql, 4) : ql, m4);
    __m256i hi;
    switch (g) {
    case 0: hi = qh; break;
    case 1: hi = _mm256_srli_epi16(qh, 2); break;
    case 2: hi = _mm256_srli_epi16(qh, 4); break;
    default: hi = _mm256_srli_epi16(qh, 6); break;
    }
    return _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(hi, m2), 4));
}

AVX2_INLINE void vdot_q6_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += 210) {
        /* the 16 scales as int16; per half, its 8 in both 128-bit lanes */
        __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
        __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                          _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            __m256i ql0 = _mm256_loadu_si256((const __m256i *)(w + 64 * n));
            __m256i ql1 = _mm256_loadu_si256((const __m256i *)(w + 64 * n + 32));
            __m256i qh = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * n));
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m256i q = q6_values(g % 2 ? ql1 : ql0, qh, g);
                /* the two 16-value sub-blocks of these 32: scales 2g, 2g + 1 of the half */
                __m256i scv = _mm256_shuffle_epi8(
                    sch[n],
                    _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g))),
                                      _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * g + 1)))));
#pragma GCC unroll 4
                for (int t = 0; t < nx; t++) {
                    const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 128 * n + 32 * g;
                    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)aq));
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, scv));
                }
            }
        }
        float d = rd_f16c(w + 208);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            /* the values' offset: 32 x activation sums x scales */
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            int32_t off = hsum_i32(_mm256_madd_epi16(bs, sc16));
            acc[t] += k_term(d, 0.0f, hsum_i32(sum[t]) - 32 * off, 0, a);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

/* Q2_K and Q3_K: 2-bit fields (Q3_K: plus its hmask bit, as value + 4 in
 * 0..7, the offset taken back with the activation sums); 16-value
 * sub-blocks, two per 32 values as in Q6_K. Bit-identical to the portable
 * dot. */
AVX2_INLINE void vdot_q23_k_avx2(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                 float *out, int three)
{
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    const size_t bb = three ? 110 : 84;
    float acc[QUANT_DOTN_MAX] = {0};
    for (size_t k = 0; k < nblk; k++, w += bb) {
        const uint8_t *qs = three ? w + 32 : w + 16;
        __m256i sc16, mn16 = _mm256_setzero_si256();
        if (three) { /* q3_scale four at a time */
            uint32_t a = rd_u32(w + 96), b = rd_u32(w + 100), c = rd_u32(w + 104);
            uint32_t v[4] = {(a & 0x0f0f0f0fu) | (c & 0x03030303u) << 4,
                             (b & 0x0f0f0f0fu) | ((c >> 2) & 0x03030303u) << 4,
                             ((a >> 4) & 0x0f0f0f0fu) | ((c >> 4) & 0x03030303u) << 4,
                             ((b >> 4) & 0x0f0f0f0fu) | ((c >> 6) & 0x03030303u) << 4};
            __m128i u = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)v), _mm_set1_epi8(32));
            sc16 = _mm256_cvtepi8_epi16(u);
        } else {
            __m128i s8 = _mm_loadu_si128((const __m128i *)w);
            sc16 = _mm256_cvtepu8_epi16(_mm_and_si128(s8, _mm_set1_epi8(15)));
            mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), _mm_set1_epi8(15)));
        }
        __m256i sch[2] = {_mm256_permute2x128_si256(sc16, sc16, 0x00),
                          _mm256_permute2x128_si256(sc16, sc16, 0x11)};
        __m256i hm = three ? _mm256_loadu_si256((const __m256i *)w) : _mm256_setzero_si256();
        __m256i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm256_setzero_si256();
        for (int n = 0; n < 2; n++) {
            __m256i qv = _mm256_loadu_si256((const __m256i *)(qs + 32 * n));
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m256i q = _mm256_and_si256(qv, m2); /* qv shifted right by 2j */
                qv = _mm256_srli_epi16(qv, 2);
                if (three) { /* hm shifted right by 4n + j: bit 0 is this group's */
                    q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(hm, one), 2));
                    hm = _mm256_srli_epi16(hm, 1);
                }
                __m256i scv = _mm256_shuffle_epi8(
                    sch[n],
                    _mm256_setr_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * j))),
                                      _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * j + 1)))));
#pragma GCC unroll 4
                for (int t = 0; t < nx; t++) {
                    const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 128 * n + 32 * j;
                    __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)aq));
                    sum[t] = _mm256_add_epi32(sum[t], _mm256_madd_epi16(p, scv));
                }
            }
        }
        float d = rd_f16c(w + (three ? 108 : 80));
        float dm = three ? 0.0f : rd_f16c(w + 82);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            int32_t sq = hsum_i32(sum[t]), sm = 0;
            if (three)
                sq -= 4 * hsum_i32(_mm256_madd_epi16(bs, sc16));
            else
                sm = hsum_i32(_mm256_madd_epi16(bs, mn16));
            acc[t] += k_term(d, dm, sq, sm, a);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = acc[t];
}

AVX2_INLINE void vdot_q2_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q23_k_avx2(w, xq, nx, nblk, out, 0);
}

AVX2_INLINE void vdot_q3_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q23_k_avx2(w, xq, nx, nblk, out, 1);
}

/* Specialise on nx so the token loops unroll into registers. */
#define VDOT_SHAPES(body)                                                                          \
    AVX2 static void body##_nx(const uint8_t *w, const void *const *xq, int nx, size_t nblk,       \
                               float *out)                                                         \
    {                                                                                              \
        switch (nx) {                                                                              \
        case 1: body##_body(w, xq, 1, nblk, out); break;                                           \
        case 2: body##_body(w, xq, 2, nblk, out); break;                                           \
        case 3: body##_body(w, xq, 3, nblk, out); break;                                           \
        default: body##_body(w, xq, 4, nblk, out); break;                                          \
        }                                                                                          \
    }
AVX2_INLINE void vdot_q4_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q45_k_avx2(w, xq, nx, nblk, out, 0);
}

AVX2_INLINE void vdot_q5_k_avx2_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    vdot_q45_k_avx2(w, xq, nx, nblk, out, 1);
}

VDOT_SHAPES(vdot_q8_0_avx2)
VDOT_SHAPES(vdot_q4_0_avx2)
VDOT_SHAPES(vdot_q4_1_avx2)
VDOT_SHAPES(vdot_q5_0_avx2)
VDOT_SHAPES(vdot_q5_1_avx2)
VDOT_SHAPES(vdot_iq4_nl_avx2)
VDOT_SHAPES(vdot_iq4_xs_avx2)
VDOT_SHAPES(vdot_q2_k_avx2)
VDOT_SHAPES(vdot_q3_k_avx2)
VDOT_SHAPES(vdot_q4_k_avx2)
VDOT_SHAPES(vdot_q5_k_avx2)
VDOT_SHAPES(vdot_q6_k_avx2)

/* ------------------------------------------------------------------ AVX-VNNI integer dots
 * vpdpbusd sums four u8 x s8 products into each int32 lane: the lanes of
 * the AVX2 Q8_0 kernel's maddubs + madd in one exact instruction, so its
 * results equal the AVX2 ones bit for bit. (Q4_K and Q6_K scale each
 * 16-bit pair sum as they go: vpdpbusd would save them nothing.) */
#define VNNI __attribute__((target("avx2,fma,f16c,avxvnni")))
#define VNNI_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c,avxvnni")))

VNNI_INLINE void vdot_q8_0_vnni_body(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                     float *out)
{
    __m256 acc[QUANT_DOTN_MAX];
    for (int t = 0; t < nx; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++, w += 34) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i aq = _mm256_abs_epi8(q);
        float d = rd_f16c(w);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            __m256i p = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), aq, _mm256_sign_epi8(x, q));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[t]);
        }
    }
    for (int t = 0; t < nx; t++) {
        __m128 lo = _mm256_castps256_ps128(acc[t]), hi = _mm256_extractf128_ps(acc[t], 1);
        lo = _mm_add_ps(lo, hi);
        __m128 sh = _mm_movehdup_ps(lo), sm = _mm_add_ps(lo, sh);
        sh = _mm_movehl_ps(sh, sm);
        out[t] = _mm_cvtss_f32(_mm_add_ss(sm, sh)); /* as hsum256 */
    }
}

VNNI static void vdot_q8_0_vnni_nx(const uint8_t *w, const void *const *xq, int nx, size_t nblk,
                                   float *out)
{
    switch (nx) {
    case 1: vdot_q8_0_vnni_body(w, xq, 1, nblk, out); break;
    case 2: vdot_q8_0_vnni_body(w, xq, 2, nblk, out); break;
    case 3: vdot_q8_0_vnni_body(w, xq, 3, nblk, out); break;
    default: vdot_q8_0_vnni_body(w, xq, 4, nblk, out); break;
    }
}

/* Q8_0 prefill, as the AVX-512 tile below on 256 bits: up to 2 rows x 4
 * tokens, unsigned weights (q + 128) shared by the tokens, each token's
 * lanes started from -128 x its activation sums; the one-row kernel's lanes
 * and float order, so the same results bit for bit. */
VNNI_INLINE void vtile_q8_0_vnni_body(const uint8_t *w, size_t rb, const void *const *xq,
                                      size_t nblk, float *out, int ostride, int R, int T)
{
    const __m256i c80 = _mm256_set1_epi8((char)0x80), zero = _mm256_setzero_si256();
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < R * T; i++)
        acc[i] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++) {
        __m256i wu[2];
        __m256 dw[2];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + (size_t)r * rb + 34 * k;
            wu[r] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(b + 2)), c80);
            dw[r] = _mm256_set1_ps(rd_f16c(b));
        }
#pragma GCC unroll 4
        for (int t = 0; t < T; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            __m256i corr = _mm256_sub_epi32(zero, _mm256_dpbusd_avx_epi32(zero, c80, x));
            __m256 da = _mm256_set1_ps(a->d);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                __m256i s = _mm256_dpbusd_avx_epi32(corr, wu[r], x);
                acc[r * T + t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], da),
                                                 acc[r * T + t]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int t = 0; t < T; t++)
            out[r * ostride + t] = hsum256(acc[r * T + t]);
}

/* Any nr x nx, in tiles of up to 2 rows x 4 tokens. */
VNNI static void vtile_q8_0_vnni(const uint8_t *w0, size_t rb, int nr, const void *const *xq0,
                                 int nx, size_t nblk, float *out0)
{
    for (int r0 = 0; r0 < nr; r0 += 2) {
        int R = nr - r0 < 2 ? nr - r0 : 2;
        const uint8_t *w = w0 + (size_t)r0 * rb;
        for (int t0 = 0; t0 < nx; t0 += 4) {
            int T = nx - t0 < 4 ? nx - t0 : 4;
            const void *const *xq = xq0 + t0;
            float *out = out0 + (size_t)r0 * nx + t0;
            int ostride = nx;
            switch (R * 8 + T) {
            case 9: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 1); break;
            case 10: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 2); break;
            case 11: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 3); break;
            case 12: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 1, 4); break;
            case 17: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 1); break;
            case 18: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 2); break;
            case 19: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 3); break;
            default: vtile_q8_0_vnni_body(w, rb, xq, nblk, out, ostride, 2, 4); break;
            }
        }
    }
}

static vdot_row_fn vdot_for_avx2(uint32_t type);

static vdot_row_fn vdot_for_vnni(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vdot_q8_0_vnni_nx : vdot_for_avx2(type);
}

static vtile_fn vtile_for_vnni(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vtile_q8_0_vnni : NULL;
}

static vdot_row_fn vdot_for_avx2(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q8_0: return vdot_q8_0_avx2_nx;
    case GGUF_T_Q4_0: return vdot_q4_0_avx2_nx;
    case GGUF_T_Q4_1: return vdot_q4_1_avx2_nx;
    case GGUF_T_Q5_0: return vdot_q5_0_avx2_nx;
    case GGUF_T_Q5_1: return vdot_q5_1_avx2_nx;
    case GGUF_T_IQ4_NL: return vdot_iq4_nl_avx2_nx;
    case GGUF_T_IQ4_XS: return vdot_iq4_xs_avx2_nx;
    case GGUF_T_Q2_K: return vdot_q2_k_avx2_nx;
    case GGUF_T_Q3_K: return vdot_q3_k_avx2_nx;
    case GGUF_T_Q4_K: return vdot_q4_k_avx2_nx;
    case GGUF_T_Q5_K: return vdot_q5_k_avx2_nx;
    case GGUF_T_Q6_K: return vdot_q6_k_avx2_nx;
    default: return NULL;
    }
}

/* ------------------------------------------------------------------ AVX-512 kernels
 * 64 bytes an instruction (AVX-512 F, BW, VL and VNNI): the F32/F16/BF16
 * tile with 16-lane accumulators in register tiles of up to 4 rows x 6
 * vectors (prefill uses 4 x 4), and the integer dots of Q8_0, Q4_K and Q6_K (the other block
 * types keep their AVX2 kernels). Within a block every product and sum is
 * exact (maddubs, then vpdpwssd by the sub-block scales); across blocks
 * they sum in float lanes, as llama.cpp does (one horizontal sum a row,
 * not one a block): they differ from the portable dot by float rounding
 * only (tested within 1e-5 of the sum of |products|). Every kernel keeps
 * one chain per (row, vector) in one order whatever the tile shape, so
 * batched, prefilled and token-by-token results stay identical. */
#define AVX512_TARGET "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
#define AVX512 __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE static inline __attribute__((always_inline, target(AVX512_TARGET)))

AVX512_INLINE __m512 load16(uint32_t type, const uint8_t *w, size_t i)
{
    switch (type) {
    case GGUF_T_F16:
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
    case GGUF_T_BF16: {
        __m512i v =
            _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)((const uint16_t *)w + i)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    }
    default: return _mm512_loadu_ps((const float *)w + i);
    }
}

AVX512_INLINE void tile_avx512_body(uint32_t type, const uint8_t *w, size_t rb, int nr,
                                    const float *const *x, int nx, size_t n, float *out)
{
    __m512 acc[24];
#pragma GCC unroll 24
    for (int p = 0; p < nr * nx; p++)
        acc[p] = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        /* the rows' weights held, one activation vector at a time (at 4 x 6,
         * 24 accumulators + 4 + 1 of the 32 registers: GCC spills some) */
        __m512 wv[4];
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++)
            wv[r] = load16(type, w + (size_t)r * rb, i);
#pragma GCC unroll 6
        for (int t = 0; t < nx; t++) {
            __m512 xv = _mm512_loadu_ps(x[t] + i);
#pragma GCC unroll 4
            for (int r = 0; r < nr; r++)
                acc[r * nx + t] = _mm512_fmadd_ps(wv[r], xv, acc[r * nx + t]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++) {
#pragma GCC unroll 6
        for (int t = 0; t < nx; t++) {
            float s = _mm512_reduce_add_ps(acc[r * nx + t]);
            for (size_t j = i; j < n; j++)
                s += w_at(type, w + (size_t)r * rb, j) * x[t][j];
            out[r * nx + t] = s;
        }
    }
}

/* (kept by hand: one row of cases per tile height) */
// clang-format off
/* Specialise on (nr, nx), up to 4 x 6, so the loops unroll into registers. */
#define TILE16_CASE(R, X, type)                                                                    \
    case R * 8 + X: tile_avx512_body(type, w, rb, R, x, X, n, out); break;
#define TILE16_SHAPES(type)                                                                        \
    switch (nr * 8 + nx) {                                                                         \
    TILE16_CASE(1, 1, type) TILE16_CASE(1, 2, type) TILE16_CASE(1, 3, type) TILE16_CASE(1, 4, type) \
    TILE16_CASE(2, 1, type) TILE16_CASE(2, 2, type) TILE16_CASE(2, 3, type) TILE16_CASE(2, 4, type) \
    TILE16_CASE(3, 1, type) TILE16_CASE(3, 2, type) TILE16_CASE(3, 3, type) TILE16_CASE(3, 4, type) \
    TILE16_CASE(4, 1, type) TILE16_CASE(4, 2, type) TILE16_CASE(4, 3, type) TILE16_CASE(4, 4, type) \
    TILE16_CASE(1, 5, type) TILE16_CASE(2, 5, type) TILE16_CASE(3, 5, type) TILE16_CASE(4, 5, type) \
    TILE16_CASE(1, 6, type) TILE16_CASE(2, 6, type) TILE16_CASE(3, 6, type) TILE16_CASE(4, 6, type) \
    default:                                                                                       \
        for (int r_ = 0; r_ < nr; r_++)                                                            \
            for (int t_ = 0; t_ < nx; t_++)                                                        \
                tile_avx512_body(type, w + (size_t)r_ * rb, rb, 1, &x[t_], 1, n,                  \
                                 &out[r_ * nx + t_]);                                              \
        break;                                                                                     \
    }
// clang-format on

AVX512 static void tile_avx512(uint32_t type, const void *wv, size_t rb, int nr,
                               const float *const *x, int nx, size_t n, float *out)
{
    const uint8_t *w = wv;
    switch (type) {
    case GGUF_T_Q8_0: tile_avx2(type, wv, rb, nr, x, nx, n, out); break; /* the exact path */
    case GGUF_T_F16: TILE16_SHAPES(GGUF_T_F16) break;
    case GGUF_T_BF16: TILE16_SHAPES(GGUF_T_BF16) break;
    default: TILE16_SHAPES(GGUF_T_F32) break;
    }
}

/* Q8_0: one block a 256-bit vector, |q| x (x with q's sign) by the EVEX
 * vpdpbusd (AVX-512 VL + VNNI: CPUs with AVX-512 VNNI but no AVX-VNNI have
 * it too), the AVX-VNNI kernel's very lanes, so the same results. Two
 * blocks a 512-bit vector measured slower here (decode 147-174 vs
 * 178-196 tok/s on the 134M shape, one thread, side by side). */
AVX512_INLINE void vdot_q8_0_avx512_body(const uint8_t *w, const void *const *xq, int nx,
                                         size_t nblk, float *out)
{
    __m256 acc[QUANT_DOTN_MAX];
    for (int t = 0; t < nx; t++)
        acc[t] = _mm256_setzero_ps();
    for (size_t k = 0; k < nblk; k++, w += 34) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(w + 2));
        __m256i aq = _mm256_abs_epi8(q);
        float d = rd_f16c(w);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8_t *a = (const quant_act_q8_t *)xq[t] + k;
            __m256i x = _mm256_loadu_si256((const __m256i *)a->qs);
            __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), aq, _mm256_sign_epi8(x, q));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(d * a->d), acc[t]);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = hsum256(acc[t]);
}

/* Q4_K: per 64 values, the low nibbles of 32 bytes (sub-block 2c) then
 * their high nibbles (2c + 1) in one vector, against 64 activations. */
AVX512_INLINE void vdot_q4_k_avx512_body(const uint8_t *w, const void *const *xq, int nx,
                                         size_t nblk, float *out)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f);
    const __m512i shv = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    const __m128i dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    __m512 acc[QUANT_DOTN_MAX];
    __m256 accm[QUANT_DOTN_MAX];
    for (int t = 0; t < nx; t++) {
        acc[t] = _mm512_setzero_ps();
        accm[t] = _mm256_setzero_ps();
    }
    for (size_t k = 0; k < nblk; k++, w += 144) {
        uint8_t sc[8], mn[8];
        k4_scales_bytes(w + 4, sc, mn);
        uint64_t sc64, mn64;
        memcpy(&sc64, sc, 8);
        memcpy(&mn64, mn, 8);
        __m512i sc16 =
            _mm512_zextsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)sc64)));
        __m256i mnv =
            _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128((long long)mn64), dup));
        __m512i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            __m512i b =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 16 + 32 * c)));
            __m512i q = _mm512_and_si512(_mm512_srlv_epi16(b, shv), m4);
            /* int16 lanes 0..15: scale 2c, 16..31: scale 2c + 1 */
            __m512i s = _mm512_permutexvar_epi16(
                _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * c)),
                                   _mm256_set1_epi16((short)(2 * c + 1)), 1),
                sc16);
#pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 64 * c;
                __m512i p = _mm512_maddubs_epi16(q, _mm512_loadu_si512((const void *)aq));
                sum[t] = _mm512_dpwssd_epi32(sum[t], p, s);
            }
        }
        float d = rd_f16c(w), dm = rd_f16c(w + 2);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), _mm512_set1_ps(a->d * d), acc[t]);
            accm[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(bs, mnv)),
                                      _mm256_set1_ps(a->d * dm), accm[t]);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = _mm512_reduce_add_ps(acc[t]) - hsum256(accm[t]);
}

/* Q6_K: per half (128 values), the low nibbles of its 64 ql bytes with qh
 * bits 0-1 / 2-3 (values 0..63), then the high nibbles with bits 4-5 / 6-7
 * (64..127), each as value + 32; the offset comes back with the
 * activation sums, as in the AVX2 kernel. */
AVX512_INLINE void vdot_q6_k_avx512_body(const uint8_t *w, const void *const *xq, int nx,
                                         size_t nblk, float *out)
{
    const __m512i m4 = _mm512_set1_epi8(0x0f), m2 = _mm512_set1_epi8(3);
    const __m512i sh01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i sh23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    /* int16 lane i of the 64 values [h]alf-quarter pair: scale 8n + 4h + i / 8 */
    __m512i idx[2][2];
    for (int n = 0; n < 2; n++)
        for (int h = 0; h < 2; h++) {
            int16_t v[32];
            for (int i = 0; i < 32; i++)
                v[i] = (int16_t)(8 * n + 4 * h + i / 8);
            idx[n][h] = _mm512_loadu_si512((const void *)v);
        }
    __m512 acc[QUANT_DOTN_MAX];
    for (int t = 0; t < nx; t++)
        acc[t] = _mm512_setzero_ps();
    for (size_t k = 0; k < nblk; k++, w += 210) {
        __m256i sc16y = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(w + 192)));
        __m512i sc16 = _mm512_zextsi256_si512(sc16y);
        __m512i sum[QUANT_DOTN_MAX];
        for (int t = 0; t < nx; t++)
            sum[t] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int n = 0; n < 2; n++) {
            __m512i ql = _mm512_loadu_si512((const void *)(w + 64 * n));
            __m512i qh =
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 128 + 32 * n)));
            __m512i q01 = _mm512_or_si512(
                _mm512_and_si512(ql, m4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh01), m2), 4));
            __m512i q23 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(qh, sh23), m2), 4));
            __m512i s01 = _mm512_permutexvar_epi16(idx[n][0], sc16);
            __m512i s23 = _mm512_permutexvar_epi16(idx[n][1], sc16);
#pragma GCC unroll 4
            for (int t = 0; t < nx; t++) {
                const int8_t *aq = ((const quant_act_q8k_t *)xq[t] + k)->qs + 128 * n;
                __m512i p01 = _mm512_maddubs_epi16(q01, _mm512_loadu_si512((const void *)aq));
                __m512i p23 =
                    _mm512_maddubs_epi16(q23, _mm512_loadu_si512((const void *)(aq + 64)));
                sum[t] = _mm512_dpwssd_epi32(sum[t], p01, s01);
                sum[t] = _mm512_dpwssd_epi32(sum[t], p23, s23);
            }
        }
        float d = rd_f16c(w + 208);
#pragma GCC unroll 4
        for (int t = 0; t < nx; t++) {
            const quant_act_q8k_t *a = (const quant_act_q8k_t *)xq[t] + k;
            __m256i bs = _mm256_loadu_si256((const __m256i *)a->bsums);
            /* the offset: 32 x activation sums x scales, off the first 8 lanes */
            __m512i off =
                _mm512_zextsi256_si512(_mm256_slli_epi32(_mm256_madd_epi16(bs, sc16y), 5));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(sum[t], off)),
                                     _mm512_set1_ps(a->d * d), acc[t]);
        }
    }
    for (int t = 0; t < nx; t++)
        out[t] = _mm512_reduce_add_ps(acc[t]);
}

#define VDOT512_SHAPES(body)                                                                       \
    AVX512 static void body##_nx(const uint8_t *w, const void *const *xq, int nx, size_t nblk,     \
                                 float *out)                                                       \
    {                                                                                              \
        switch (nx) {                                                                              \
        case 1: body##_body(w, xq, 1, nblk, out); break;                                           \
        case 2: body##_body(w, xq, 2, nblk, out); break;                                           \
        case 3: body##_body(w, xq, 3, nblk, out); break;                                           \
        default: body##_body(w, xq, 4, nblk, out); break;                                          \
        }                                                                                          \
    }
VDOT512_SHAPES(vdot_q8_0_avx512)
VDOT512_SHAPES(vdot_q4_k_avx512)
VDOT512_SHAPES(vdot_q6_k_avx512)

/* Q8_0 prefill: a register tile of up to 4 rows x 4 token pairs, each
 * weight block loaded once for every token and each activation block once
 * for every row. The weights go unsigned (q + 128, by xor), so rows share
 * the activations as they are; each lane starts from -128 x the sum of its
 * four activations and vpdpbusd adds the four (q + 128) x a products: the
 * exact q x a lane sums of the one-row kernel above. A 512-bit vector holds
 * one block of two tokens (lanes 0-7, 8-15), scaled and summed in the very
 * float order of the one-row kernel, so every result is bit-identical to
 * it. */
AVX512_INLINE void vtile_q8_0_avx512_body(const uint8_t *w, size_t rb, const void *const *xq,
                                          size_t nblk, float *out, int ostride, int R, int P)
{
    const __m512i c80 = _mm512_set1_epi8((char)0x80), zero = _mm512_setzero_si512();
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < R * P; i++)
        acc[i] = _mm512_setzero_ps();
    for (size_t k = 0; k < nblk; k++) {
        __m512i wu[4];
        __m512 dw[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8_t *b = w + (size_t)r * rb + 34 * k;
            wu[r] = _mm512_xor_si512(
                _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b + 2))), c80);
            dw[r] = _mm512_set1_ps(rd_f16c(b));
        }
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            const quant_act_q8_t *a0 = (const quant_act_q8_t *)xq[2 * p] + k;
            const quant_act_q8_t *a1 = (const quant_act_q8_t *)xq[2 * p + 1] + k;
            __m512i x = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a0->qs)),
                _mm256_loadu_si256((const __m256i *)a1->qs), 1);
            __m512i corr = _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, c80, x));
            __m512 da = _mm512_mask_mov_ps(_mm512_set1_ps(a0->d), 0xff00, _mm512_set1_ps(a1->d));
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                __m512i s = _mm512_dpbusd_epi32(corr, wu[r], x);
                acc[r * P + p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw[r], da),
                                                 acc[r * P + p]);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int p = 0; p < P; p++) {
            __m512i v = _mm512_castps_si512(acc[r * P + p]);
            out[r * ostride + 2 * p] = hsum256(_mm512_castps512_ps256(acc[r * P + p]));
            out[r * ostride + 2 * p + 1] =
                hsum256(_mm256_castsi256_ps(_mm512_extracti64x4_epi64(v, 1)));
        }
}

/* (kept by hand: one row of cases per tile height) */
// clang-format off
#define VTILE8_CASE(R, P)                                                                          \
    case R * 8 + P: vtile_q8_0_avx512_body(w, rb, xq, nblk, out, ostride, R, P); break;
// clang-format on

/* Any nr x nx: tiles of up to 4 rows x 4 token pairs; an odd last token
 * takes the one-row kernel (the same results). */
AVX512 static void vtile_q8_0_avx512(const uint8_t *w0, size_t rb, int nr, const void *const *xq0,
                                     int nx, size_t nblk, float *out0)
{
    int np = nx / 2, ostride = nx;
    for (int r0 = 0; r0 < nr; r0 += 4) {
        int R = nr - r0 < 4 ? nr - r0 : 4;
        const uint8_t *w = w0 + (size_t)r0 * rb;
        for (int p0 = 0; p0 < np; p0 += 4) {
            int P = np - p0 < 4 ? np - p0 : 4;
            const void *const *xq = xq0 + 2 * p0;
            float *out = out0 + (size_t)r0 * nx + 2 * p0;
            // clang-format off
            switch (R * 8 + P) {
            VTILE8_CASE(1, 1) VTILE8_CASE(1, 2) VTILE8_CASE(1, 3) VTILE8_CASE(1, 4)
            VTILE8_CASE(2, 1) VTILE8_CASE(2, 2) VTILE8_CASE(2, 3) VTILE8_CASE(2, 4)
            VTILE8_CASE(3, 1) VTILE8_CASE(3, 2) VTILE8_CASE(3, 3) VTILE8_CASE(3, 4)
            VTILE8_CASE(4, 1) VTILE8_CASE(4, 2) VTILE8_CASE(4, 3) default: VTILE8_CASE(4, 4)
            }
            // clang-format on
        }
        if (nx & 1)
            for (int r = 0; r < R; r++)
                vdot_q8_0_avx512_body(w + (size_t)r * rb, xq0 + nx - 1, 1, nblk,
                                      out0 + (size_t)(r0 + r) * nx + nx - 1);
    }
}
#undef VTILE8_CASE

static int vnni_ok; /* the CPU has AVX-VNNI too (set by quant_isa_set) */

static vdot_row_fn vdot_for_avx512(uint32_t type)
{
    switch (type) {
    case GGUF_T_Q8_0: return vdot_q8_0_avx512_nx;
    case GGUF_T_Q4_K: return vdot_q4_k_avx512_nx;
    case GGUF_T_Q6_K: return vdot_q6_k_avx512_nx;
    default: return vnni_ok ? vdot_for_vnni(type) : vdot_for_avx2(type);
    }
}

static vtile_fn vtile_for_avx512(uint32_t type)
{
    return type == GGUF_T_Q8_0 ? vtile_q8_0_avx512 : vnni_ok ? vtile_for_vnni(type) : NULL;
}
#endif

/* ------------------------------------------------------------------ dispatch */

typedef struct kernels {
    void (*tile)(uint32_t, const void *, size_t, int, const float *const *, int, size_t, float *);
    float (*dot_f32)(const float *, const float *, size_t);
    void (*axpy)(float *, float, const float *, size_t);
    vdot_row_fn (*vdot_for)(uint32_t type); /* NULL result: the portable integer dot */
    vtile_fn (*vtile_for)(uint32_t type);   /* NULL result: vdot_for's kernel row by row */
} kernels_t;

static vdot_row_fn vdot_for_portable(uint32_t type)
{
    (void)type;
    return NULL;
}

static vtile_fn vtile_for_none(uint32_t type)
{
    (void)type;
    return NULL;
}

static const kernels_t k_portable = {tile_portable, dot_f32_portable, axpy_portable,
                                     vdot_for_portable, vtile_for_none};
#if QUANT_HAVE_X86
static const kernels_t k_avx2 = {tile_avx2, dot_f32_avx2, axpy_avx2, vdot_for_avx2, vtile_for_none};
static const kernels_t k_vnni = {tile_avx2, dot_f32_avx2, axpy_avx2, vdot_for_vnni, vtile_for_vnni};
static const kernels_t k_avx512 = {tile_avx512, dot_f32_avx2, axpy_avx2, vdot_for_avx512,
                                   vtile_for_avx512};
#endif

static const kernels_t *k_cur;
static quant_isa_t isa_cur = QUANT_ISA_PORTABLE;

static int cpu_has_avx2(void)
{
#if QUANT_HAVE_X86
    /* f16c through cpuid: clang's __builtin_cpu_supports does not know it */
    unsigned a, b, c, d;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#else
    return 0;
#endif
}

static int cpu_has_avxvnni(void)
{
#if QUANT_HAVE_X86
    unsigned a, b, c, d; /* CPUID.(7,1):EAX bit 4 */
    return cpu_has_avx2() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
#else
    return 0;
#endif
}

static int cpu_has_avx512(void)
{
#if QUANT_HAVE_X86
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

quant_isa_t quant_isa_set(quant_isa_t want)
{
#if QUANT_HAVE_X86
    vnni_ok = cpu_has_avxvnni();
    if ((want == QUANT_ISA_AUTO || want == QUANT_ISA_AVX512) && cpu_has_avx512()) {
        k_cur = &k_avx512;
        isa_cur = QUANT_ISA_AVX512;
        return isa_cur;
    }
    if ((want == QUANT_ISA_AUTO || want == QUANT_ISA_AVX512 || want == QUANT_ISA_AVX2_VNNI) &&
        vnni_ok) {
        k_cur = &k_vnni;
        isa_cur = QUANT_ISA_AVX2_VNNI;
        return isa_cur;
    }
#endif
    if (want != QUANT_ISA_PORTABLE && cpu_has_avx2()) {
#if QUANT_HAVE_X86
        k_cur = &k_avx2;
        isa_cur = QUANT_ISA_AVX2;
        return isa_cur;
#endif
    }
    k_cur = &k_portable;
    isa_cur = QUANT_ISA_PORTABLE;
    return isa_cur;
}

static inline const kernels_t *kern(void)
{
    if (!k_cur)
        quant_isa_set(QUANT_ISA_AUTO);
    return k_cur;
}

void quant_tile_shape(uint32_t type, int *rows, int *cols)
{
    *rows = 2;
    *cols = QUANT_DOTN_MAX;
#if QUANT_HAVE_X86
    const kernels_t *k = kern();
    if (k == &k_avx512 && quant_act_for(type) == QUANT_ACT_F32) {
        *rows = 4;
        *cols = 4;
    } else if (k == &k_avx512 && quant_act_for(type) == QUANT_ACT_Q8 && type == GGUF_T_Q8_0) {
        *rows = 4; /* 4 x 6: 1.3-1.5x the one-row kernel's prefill; 4 x 4 and 4 x 8 within noise */
        *cols = 6;
    }
#endif
}

static int f16_rows_simd(void)
{
    return kern() != &k_portable;
}

#if QUANT_HAVE_X86
AVX2 static void f16_to_f32_row_simd(const uint16_t *s, float *d, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
    for (; i < n; i++)
        d[i] = quant_f16_to_f32(s[i]);
}

AVX2 static void f32_to_f16_row_simd(const float *s, uint16_t *d, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = quant_f32_to_f16(s[i]);
}
/* 8 products x * id rounded to nearest even (lrintf's default mode) */
AVX2_INLINE __m256i round8(const float *x, __m256 id)
{
    return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
}

/* 32 int32 (four vectors) to int8, in order */
AVX2_INLINE __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    __m256i v = _mm256_packs_epi16(ab, cd);
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2_INLINE float hmax256(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

AVX2 static void act_q8_simd(const float *x, quant_act_q8_t *a, size_t nb)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (size_t k = 0; k < nb; k++, x += QUANT_Q8_0_BLOCK) {
        __m256 m = _mm256_and_ps(_mm256_loadu_ps(x), abs);
        for (int j = 8; j < QUANT_Q8_0_BLOCK; j += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs));
        float amax = hmax256(m);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        __m256i q0 = round8(x, idv), q1 = round8(x + 8, idv);
        __m256i q2 = round8(x + 16, idv), q3 = round8(x + 24, idv);
        _mm256_storeu_si256((__m256i *)a[k].qs, pack32(q0, q1, q2, q3));
        int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
        a[k].d = f16_round(d);
        a[k].s = f16_round(d * (float)sum);
    }
}

AVX2 static void act_q8k_simd(const float *x, quant_act_q8k_t *a, size_t nb)
{
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i lim = _mm256_set1_epi32(127);
    for (size_t k = 0; k < nb; k++, x += QUANT_K_BLOCK) {
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QUANT_K_BLOCK; j += 8)
            m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x + j), abs));
        float amax = hmax256(m), v = 0.0f;
        for (int j = 0; j < QUANT_K_BLOCK && amax != 0.0f; j++) /* the first of largest magnitude */
            if (fabsf(x[j]) == amax) {
                v = x[j];
                break;
            }
        float id = v != 0.0f ? -127.0f / v : 0.0f, d = v != 0.0f ? 1.0f / id : 0.0f;
        __m256 idv = _mm256_set1_ps(id);
        for (int j = 0; j < QUANT_K_BLOCK; j += 32) {
            __m256i q0 = _mm256_min_epi32(round8(x + j, idv), lim);
            __m256i q1 = _mm256_min_epi32(round8(x + j + 8, idv), lim);
            __m256i q2 = _mm256_min_epi32(round8(x + j + 16, idv), lim);
            __m256i q3 = _mm256_min_epi32(round8(x + j + 24, idv), lim);
            _mm256_storeu_si256((__m256i *)(a[k].qs + j), pack32(q0, q1, q2, q3));
            a[k].bsums[j / 16] = (int16_t)hsum_i32(_mm256_add_epi32(q0, q1));
            a[k].bsums[j / 16 + 1] = (int16_t)hsum_i32(_mm256_add_epi32(q2, q3));
        }
        a[k].d = d;
    }
}
#else
static void act_q8_simd(const float *x, quant_act_q8_t *a, size_t nb)
{
    act_q8(x, a, nb);
}

static void act_q8k_simd(const float *x, quant_act_q8k_t *a, size_t nb)
{
    act_q8k(x, a, nb);
}

static void f16_to_f32_row_simd(const uint16_t *s, float *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = quant_f16_to_f32(s[i]);
}

static void f32_to_f16_row_simd(const float *s, uint16_t *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        d[i] = quant_f32_to_f16(s[i]);
}
#endif

quant_isa_t quant_isa_get(void)
{
    kern();
    return isa_cur;
}

const char *quant_isa_name(quant_isa_t isa)
{
    switch (isa) {
    case QUANT_ISA_AVX2: return "avx2";
    case QUANT_ISA_AVX2_VNNI: return "avx2-vnni";
    case QUANT_ISA_AVX512: return "avx512";
    case QUANT_ISA_PORTABLE: return "portable";
    default: return "auto";
    }
}

/* F32, F16, BF16 and Q8_0 go to the ISA's kernels; the other block types
 * take the portable exact kernel. */
static void tile_any(uint32_t type, const void *w, size_t rb, int nr, const float *const *x, int nx,
                     size_t n, float *out)
{
    if (type != GGUF_T_Q8_0 && type != GGUF_T_F16 && type != GGUF_T_F32 && type != GGUF_T_BF16) {
        const qfmt_t *f = qfmt_of(type);
        if (f) {
            tile_blocks_exact(f, w, rb, nr, x, nx, n, out);
            return;
        }
    }
    kern()->tile(type, w, rb, nr, x, nx, n, out);
}

void quant_dot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const float *const *x,
                    int nx, size_t n, float *out)
{
    tile_any(type, w, row_bytes, nr, x, nx, n, out);
}

void quant_dotn(uint32_t type, const void *w, const float *const *x, int nx, size_t n, float *out)
{
    tile_any(type, w, 0, 1, x, nx, n, out);
}

float quant_dot(uint32_t type, const void *w, const float *x, size_t n)
{
    float r;
    tile_any(type, w, 0, 1, &x, 1, n, &r);
    return r;
}

float quant_dot_f32(const float *a, const float *b, size_t n)
{
    return kern()->dot_f32(a, b, n);
}

void quant_axpy_f32(float *y, float a, const float *x, size_t n)
{
    kern()->axpy(y, a, x, n);
}

#if QUANT_HAVE_X86
/* as f16_to_f32_row_simd then axpy_avx2, without the row in between */
AVX2 static void axpy_f16_avx2(float *y, float a, const uint16_t *x, size_t n)
{
    __m256 av = _mm256_set1_ps(a);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(
            y + i, _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i))),
                                   _mm256_loadu_ps(y + i)));
    for (; i < n; i++)
        y[i] += a * quant_f16_to_f32(x[i]);
}
#endif

#if QUANT_HAVE_X86
/* axpy_f16_avx2 over rows in order, y held in registers across them: per
 * element the same FMAs in the same order */
AVX2 static void axpy_f16_rows_avx2(float *y, const float *a, const uint16_t *x, size_t x_stride,
                                    size_t nrows, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256 y0 = _mm256_loadu_ps(y + i), y1 = _mm256_loadu_ps(y + i + 8);
        __m256 y2 = _mm256_loadu_ps(y + i + 16), y3 = _mm256_loadu_ps(y + i + 24);
        const uint16_t *xr = x + i;
        for (size_t p = 0; p < nrows; p++, xr += x_stride) {
            __m256 av = _mm256_set1_ps(a[p]);
            y0 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)xr)), y0);
            y1 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 8))),
                                 y1);
            y2 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 16))),
                                 y2);
            y3 = _mm256_fmadd_ps(av, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xr + 24))),
                                 y3);
        }
        _mm256_storeu_ps(y + i, y0);
        _mm256_storeu_ps(y + i + 8, y1);
        _mm256_storeu_ps(y + i + 16, y2);
        _mm256_storeu_ps(y + i + 24, y3);
    }
    if (i < n)
        for (size_t p = 0; p < nrows; p++)
            axpy_f16_avx2(y + i, a[p], x + p * x_stride + i, n - i);
}
#endif

void quant_axpy_f16_rows(float *y, const float *a, const uint16_t *x, size_t x_stride, size_t nrows,
                         size_t n)
{
#if QUANT_HAVE_X86
    if (kern() != &k_portable) {
        axpy_f16_rows_avx2(y, a, x, x_stride, nrows, n);
        return;
    }
#endif
    for (size_t p = 0; p < nrows; p++)
        quant_axpy_f16(y, a[p], x + p * x_stride, n);
}

void quant_axpy_f16(float *y, float a, const uint16_t *x, size_t n)
{
#if QUANT_HAVE_X86
    if (kern() != &k_portable) {
        axpy_f16_avx2(y, a, x, n);
        return;
    }
#endif
    float v[64];
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        quant_row_to_f32(GGUF_T_F16, x + i, v, m);
        kern()->axpy(y + i, a, v, m);
    }
}

void quant_vdot_tile(uint32_t type, const void *w, size_t row_bytes, int nr, const void *const *xq,
                     int nx, size_t n, float *out)
{
    const qfmt_t *f = qfmt_of(type);
    size_t blck, bytes;
    blk_traits(type, &blck, &bytes);
    vdot_row_fn fn = f ? kern()->vdot_for(type) : NULL;
    vtile_fn tile = f && nx > 1 ? kern()->vtile_for(type) : NULL;
    if (tile) {
        tile(w, row_bytes, nr, xq, nx, n / blck, out);
        return;
    }
    for (int r = 0; r < nr; r++) {
        const uint8_t *row = (const uint8_t *)w + (size_t)r * row_bytes;
        if (fn) {
            for (int t0 = 0; t0 < nx; t0 += QUANT_DOTN_MAX)
                fn(row, xq + t0, nx - t0 < QUANT_DOTN_MAX ? nx - t0 : QUANT_DOTN_MAX, n / blck,
                   out + r * nx + t0);
            continue;
        }
        for (int t = 0; t < nx; t++)
            out[r * nx + t] = f ? vdot_row_portable(f, row, bytes, xq[t], n / blck) : 0.0f;
    }
}
