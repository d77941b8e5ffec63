/* quant_fmt: quant's weight formats: F16/BF16 scalars, the block types' unpack/pack pairs and their table, the quantizers, and the portable reference kernels the SIMD ones are tested against. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/quant.h"
#include "kernels/quant_int.h"
#include "kernels/wtype.h"

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

struct qfmt {
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
};

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

const qfmt_t *quant_fmt_of(uint32_t type)
{
    for (size_t i = 0; i < N_QFMTS; i++)
        if (qfmts[i].type == type)
            return &qfmts[i];
    return NULL;
}

void quant_fmt_traits(uint32_t type, size_t *blck, size_t *bytes)
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

void quant_fmt_act_q8(const float *x, quant_act_q8_t *a, size_t nb)
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

void quant_fmt_act_q8k(const float *x, quant_act_q8k_t *a, size_t nb)
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

static quant_path_t path_cur = QUANT_PATH_FAST;

void quant_path_set(quant_path_t p)
{
    path_cur = p;
}

quant_act_t quant_act_of(uint32_t type)
{
    const qfmt_t *f = quant_fmt_of(type);
    return f ? (quant_act_t)f->act : QUANT_ACT_F32;
}

quant_act_t quant_act_for(uint32_t type)
{
    const qfmt_t *f = quant_fmt_of(type);
    return f && f->fast && path_cur == QUANT_PATH_FAST ? (quant_act_t)f->act : QUANT_ACT_F32;
}

/* ------------------------------------------------------------------ portable integer dots
 * The reference the SIMD dots are tested against: per block the integer
 * sums of quant_int.h's comment, then its float term (q8_term, k_term). */

float quant_fmt_vdot_row(const qfmt_t *f, const uint8_t *w, size_t bb, const void *xq, size_t nblk)
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
    const qfmt_t *f = quant_fmt_of(type);
    if (!f)
        return 0.0f;
    size_t blck, bytes;
    quant_fmt_traits(type, &blck, &bytes);
    return quant_fmt_vdot_row(f, w, bytes, xq, n / blck);
}

/* ------------------------------------------------------------------ exact dots of block types
 * F32 activations against each block dequantized exactly; per pair 8 lanes
 * over the row, reduced as pair_plain does, so results never depend on
 * the tile shape. */

void quant_fmt_tile_exact(const qfmt_t *f, const void *w, size_t rb, int nr, const float *const *x,
                          int nx, size_t n, float *out)
{
    size_t blck, bytes;
    quant_fmt_traits(f->type, &blck, &bytes);
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
    return type == GGUF_T_F32 || type == GGUF_T_F16 || type == GGUF_T_BF16 || quant_fmt_of(type);
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
    quant_fmt_traits(type, &blck, &bytes);
    if (n % blck)
        return 0;
    return n / blck * bytes;
}

void quant_fmt_row_from_f32(uint32_t type, const float *x, void *dst, size_t n)
{
    switch (type) {
    case GGUF_T_F32: memcpy(dst, x, n * 4); break;
    case GGUF_T_F16: {
        uint16_t *d = dst;
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
        const qfmt_t *f = quant_fmt_of(type);
        if (!f)
            break;
        size_t blck, bytes;
        quant_fmt_traits(type, &blck, &bytes);
        for (size_t k = 0; k < n / blck; k++)
            quantize_block(f, x + k * blck, blck, (uint8_t *)dst + k * bytes);
        break;
    }
    }
}

void quant_fmt_row_to_f32(uint32_t type, const void *src, float *dst, size_t n)
{
    switch (type) {
    case GGUF_T_F32: memcpy(dst, src, n * 4); break;
    case GGUF_T_F16: {
        const uint16_t *s = src;
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
        const qfmt_t *f = quant_fmt_of(type);
        if (!f)
            break;
        size_t blck, bytes;
        quant_fmt_traits(type, &blck, &bytes);
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

void quant_fmt_tile(uint32_t type, const void *w, size_t rb, int nr, const float *const *x, int nx,
                    size_t n, float *out)
{
    for (int r = 0; r < nr; r++) {
        const void *row = (const uint8_t *)w + (size_t)r * rb;
        for (int t = 0; t < nx; t++)
            out[r * nx + t] = type == GGUF_T_Q8_0 ? pair_q8_0_plain(row, x[t], n)
                                                  : pair_plain(type, row, x[t], n);
    }
}

float quant_fmt_dot_f32(const float *a, const float *b, size_t n)
{
    return pair_plain(GGUF_T_F32, a, b, n);
}

void quant_fmt_axpy(float *y, float a, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] += a * x[i];
}
