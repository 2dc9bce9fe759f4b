/* The sampler's vocabulary-wide loops, written once and included by sampler.c for each vector
 * width: KW lanes per native vector (4: SSE2 / NEON / generic, 8: AVX2, 16: AVX-512), KSUFFIX
 * naming the copy, KTARGET its target attribute (possibly empty).
 *
 * Why copies rather than one wide vector type: GCC lowers a vector wider than the target's
 * registers badly (comparisons become one scalar compare per lane), so each copy uses exactly
 * the native width. All copies give the same bits: every lane operation is a plain IEEE single
 * precision operation (no FMA: -ffp-contract=off), and sums follow one fixed layout whatever KW
 * is: 16 accumulators, element i of a block going to accumulator i % 16, added in index order,
 * then the 16 added in accumulator order. A "step" below is 16 logits, KN16 vectors of KW.
 */
#define KCAT2(a, b) a##b
#define KCAT(a, b) KCAT2(a, b)
#define KN(name) KCAT(name, KSUFFIX)
#define KN16 (16 / KW)

typedef float KN(vf) __attribute__((vector_size(KW * 4), aligned(4), may_alias));
typedef int32_t KN(vi) __attribute__((vector_size(KW * 4), aligned(4), may_alias));
#define VF KN(vf)
#define VI KN(vi)

KTARGET static inline __attribute__((always_inline)) VF KN(splat)(float x) {
    VF v;
    for (int i = 0; i < KW; i++) v[i] = x;
    return v;
}

/* Lane l of a comparison mask (all ones or zero per lane) as bit l. */
KTARGET static inline __attribute__((always_inline)) unsigned KN(mask_bits)(const VI *m) {
#if KW == 16 && defined(__x86_64__)
    return (unsigned)_mm512_test_epi32_mask((__m512i)*m, (__m512i)*m);
#elif KW == 8 && defined(__x86_64__)
    return (unsigned)_mm256_movemask_ps((__m256)*m);
#elif KW == 4 && defined(__SSE2__)
    return (unsigned)_mm_movemask_ps((__m128)*m);
#else
    unsigned b = 0;
    for (int l = 0; l < KW; l++) b |= ((unsigned)(*m)[l] & 1u) << l;
    return b;
#endif
}

KTARGET static inline __attribute__((always_inline)) int KN(any)(const VI *m) {
    return KN(mask_bits)(m) != 0;
}

/* e^x for x <= 0: x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2, so n*LN2_HI is
 * exact), e^r by its degree-7 Taylor polynomial (truncation error under 6e-9 there), and 2^n
 * built in the exponent bits. Below -87, 2^n would be subnormal; such a weight is under 1.7e-38
 * of the top token's, so it (and -inf, and NaN) becomes exactly 0. */
KTARGET static inline __attribute__((always_inline)) VF KN(exp_neg)(const VF *px) {
    const VF x = *px;
    const VF round_magic = KN(splat)(12582912.0f); /* 1.5 * 2^23: adding it rounds to integer */
    const VF t = x * KN(splat)(1.44269504088896341f) + round_magic;
    const VF n = t - round_magic;
    VF r = x - n * KN(splat)(0.693359375f);
    r = r - n * KN(splat)(-2.12194440e-4f);
    VF p = KN(splat)(1.0f / 5040.0f);
    p = p * r + KN(splat)(1.0f / 720.0f);
    p = p * r + KN(splat)(1.0f / 120.0f);
    p = p * r + KN(splat)(1.0f / 24.0f);
    p = p * r + KN(splat)(1.0f / 6.0f);
    p = p * r + KN(splat)(0.5f);
    p = p * r + KN(splat)(1.0f);
    p = p * r + KN(splat)(1.0f);
    /* t's low mantissa bits hold n + 0x400000; rebuild 2^n from them. */
    const VI ni = (VI)t - (VI)round_magic;
    const VI scale = (ni + 127) << 23;
    const VF y = p * (VF)scale;
    const VI in_range = x >= KN(splat)(-87.0f);
    return (VF)((VI)y & in_range);
}

/* e^((x[i] - m) * inv_t) for one step of 16, into y (mv, tv: m and inv_t in every lane). */
KTARGET static inline __attribute__((always_inline)) void
KN(weights16)(const float *x, const VF *mv, const VF *tv, float *y) {
#pragma GCC unroll 16
    for (int v = 0; v < KN16; v++) {
        const VF xs = (*(const VF *)(x + v * KW) - *mv) * *tv;
        *(VF *)(y + v * KW) = KN(exp_neg)(&xs);
    }
}

/* Max of x[0..n); *bad when any element is NaN or +inf (tested on the bits: exponent all ones
 * and not -inf). */
KTARGET static float KN(max_pass)(const float *x, int n, int *bad) {
    VF mv[KN16];
    VI badv = {0};
#pragma GCC unroll 16
    for (int v = 0; v < KN16; v++) mv[v] = KN(splat)(-INFINITY);
    int i = 0;
    for (; i + 16 <= n; i += 16)
#pragma GCC unroll 16
        for (int v = 0; v < KN16; v++) {
            const VF a = *(const VF *)(x + i + v * KW);
            const VI gt = a > mv[v], bits = (VI)a;
            mv[v] = (VF)(((VI)a & gt) | ((VI)mv[v] & ~gt));
            badv |= ((bits & 0x7fffffff) > 0x7f800000) | (bits == 0x7f800000);
        }
    float m = -INFINITY;
#pragma GCC unroll 16
    for (int v = 0; v < KN16; v++)
#pragma GCC unroll 16
        for (int l = 0; l < KW; l++) m = mv[v][l] > m ? mv[v][l] : m;
    int b = KN(any)(&badv);
    for (; i < n; i++) {
        if (x[i] > m) m = x[i];
        if (x[i] != x[i] || x[i] == INFINITY) b = 1;
    }
    *bad = b;
    return m;
}

/* Lowest index holding the value m (which x contains). */
KTARGET static int KN(first_equal)(const float *x, int n, float m) {
    const VF mv = KN(splat)(m);
    int i = 0;
    for (; i + KW <= n; i += KW) {
        const VI eq = *(const VF *)(x + i) == mv;
        if (KN(any)(&eq)) break;
    }
    for (; i < n; i++)
        if (x[i] == m) return i;
    return n - 1;
}

/* w[i] = e^((x[i] - m) * inv_t) over the vocabulary, with a sum per BLOCK of weights. The last
 * partial step goes through the same code, padded with -inf (weight 0); w has room for it.
 * When c is given, also gathers (in index order) the tokens with (x - m) * inv_t >= lo, up to
 * cap of them; returns how many, or -1 when there were more than cap. */
KTARGET static int KN(exp_pass)(const float *x, int n, float m, float inv_t, float *w,
                                float *block_sum, float lo, cand *c, int cap) {
    const VF mv = KN(splat)(m), tv = KN(splat)(inv_t), lov = KN(splat)(lo);
    int b = 0, k = 0;
    for (int start = 0; start < n; start += BLOCK, b++) {
        const int end = start + BLOCK < n ? start + BLOCK : n;
        VF acc[KN16];
#pragma GCC unroll 16
        for (int v = 0; v < KN16; v++) acc[v] = KN(splat)(0.0f);
        for (int i = start; i < end; i += 16) {
            float tmp[16];
            const float *xi = x + i;
            if (end - i < 16) { /* the very last, partial step */
                for (int j = 0; j < 16; j++) tmp[j] = i + j < end ? x[i + j] : -INFINITY;
                xi = tmp;
            }
            unsigned bits = 0;
#pragma GCC unroll 16
            for (int v = 0; v < KN16; v++) {
                const VF xs = (*(const VF *)(xi + v * KW) - mv) * tv;
                const VF e = KN(exp_neg)(&xs);
                *(VF *)(w + i + v * KW) = e;
                acc[v] += e;
                if (c) {
                    const VI ge = xs >= lov;
                    bits |= KN(mask_bits)(&ge) << (v * KW);
                }
            }
            for (; bits && k >= 0; bits &= bits - 1) {
                const int j = i + __builtin_ctz(bits);
                if (k == cap)
                    k = -1;
                else
                    c[k++] = (cand){x[j], j, w[j]};
            }
        }
        float sum = 0.0f;
#pragma GCC unroll 16
        for (int v = 0; v < KN16; v++)
#pragma GCC unroll 16
            for (int l = 0; l < KW; l++) sum += acc[v][l];
        block_sum[b] = sum;
    }
    return k;
}

/* Bit j set when x[j] > thr, for one step of 16. */
KTARGET static inline __attribute__((always_inline)) unsigned KN(above16)(const float *x,
                                                                          const VF *thr) {
    unsigned bits = 0;
#pragma GCC unroll 16
    for (int v = 0; v < KN16; v++) {
        const VI gt = *(const VF *)(x + v * KW) > *thr;
        bits |= KN(mask_bits)(&gt) << (v * KW);
    }
    return bits;
}

/* The k best-ranked logits of x[0..n), 0 < k < n, into c[0..k) (unordered), through a heap
 * with the worst at the root. A later index with an equal value ranks after the root, so only
 * strictly greater values get in. The root only rises, so a group of 64 with nothing above it
 * is dismissed by vector compares, and inside a step only the flagged lanes are looked at. */
KTARGET static void KN(top_k_select)(const float *x, int n, int k, cand *c) {
    for (int i = 0; i < k; i++) c[i] = (cand){x[i], i, 0.0f};
    for (int i = k / 2 - 1; i >= 0; i--) heap_sift_down(c, k, i);
    int i = k;
    for (; i + GROUP <= n; i += GROUP) {
        VF thr = KN(splat)(c[0].v);
        VI hit = {0};
#pragma GCC unroll 16
        for (int j = 0; j < GROUP; j += KW) hit |= *(const VF *)(x + i + j) > thr;
        if (!KN(any)(&hit)) continue;
        for (int s = i; s < i + GROUP; s += 16) {
            thr = KN(splat)(c[0].v);
            for (unsigned bits = KN(above16)(x + s, &thr); bits; bits &= bits - 1) {
                const int j = s + __builtin_ctz(bits);
                if (x[j] > c[0].v) {
                    c[0] = (cand){x[j], j, 0.0f};
                    heap_sift_down(c, k, 0);
                }
            }
        }
    }
    for (; i < n; i++)
        if (x[i] > c[0].v) {
            c[0] = (cand){x[i], i, 0.0f};
            heap_sift_down(c, k, 0);
        }
}

/* Gathers, in index order, every token with (x - m) * inv_t >= lo: a best-ranked prefix, since
 * that expression never decreases as x grows. Weights come from w when given (else 0); returns
 * how many, and their summed weight in *mass. */
KTARGET static int KN(collect_by_logit)(const float *x, int n, float m, float inv_t, float lo,
                                        const float *w, cand *c, double *mass) {
    const VF mv = KN(splat)(m), tv = KN(splat)(inv_t), lov = KN(splat)(lo);
    int k = 0, i = 0;
    double sum = 0.0;
    for (; i + 16 <= n; i += 16) {
        unsigned bits = 0;
#pragma GCC unroll 16
        for (int v = 0; v < KN16; v++) {
            const VI ge = (*(const VF *)(x + i + v * KW) - mv) * tv >= lov;
            bits |= KN(mask_bits)(&ge) << (v * KW);
        }
        for (; bits; bits &= bits - 1) {
            const int j = i + __builtin_ctz(bits);
            const float wj = w ? w[j] : 0.0f;
            c[k++] = (cand){x[j], j, wj};
            sum += wj;
        }
    }
    for (; i < n; i++)
        if ((x[i] - m) * inv_t >= lo) {
            const float wj = w ? w[i] : 0.0f;
            c[k++] = (cand){x[i], i, wj};
            sum += wj;
        }
    *mass = sum;
    return k;
}

/* For LADDER thresholds lows[0] > lows[1] > ...: how many tokens have (x - m) * inv_t >=
 * lows[j], and their weight in units of 1 / LADDER_SCALE of the top token's (each truncated).
 * Integer sums are exact in any order, so every vector width reaches the same numbers; they
 * only steer the top-p search, whose answer is then computed exactly. Lanes are emptied into
 * 64-bit totals every LADDER_CHUNK logits so that they cannot overflow (LADDER_CHUNK / 4 lanes
 * times LADDER_SCALE stays below 2^31). */
KTARGET static void KN(ladder)(const float *x, const float *w, int n, float m, float inv_t,
                               const float *lows, int64_t *mass_q, int64_t *count) {
    const VF mv = KN(splat)(m), tv = KN(splat)(inv_t), scale = KN(splat)(LADDER_SCALE);
    VF lv[LADDER];
#pragma GCC unroll 16
    for (int j = 0; j < LADDER; j++) {
        lv[j] = KN(splat)(lows[j]);
        mass_q[j] = count[j] = 0;
    }
    const int n16 = n / 16 * 16;
    for (int start = 0; start < n16; start += LADDER_CHUNK) {
        const int end = n16 - start > LADDER_CHUNK ? start + LADDER_CHUNK : n16;
        VI macc[LADDER], cacc[LADDER];
#pragma GCC unroll 16
        for (int j = 0; j < LADDER; j++) macc[j] = cacc[j] = (VI){0};
        for (int i = start; i < end; i += KW) {
            const VF xs = (*(const VF *)(x + i) - mv) * tv;
            const VI wq = __builtin_convertvector(*(const VF *)(w + i) * scale, VI);
#pragma GCC unroll 16
            for (int j = 0; j < LADDER; j++) {
                const VI ge = xs >= lv[j];
                macc[j] += wq & ge;
                cacc[j] -= ge;
            }
        }
#pragma GCC unroll 16
        for (int j = 0; j < LADDER; j++)
#pragma GCC unroll 16
            for (int l = 0; l < KW; l++) {
                mass_q[j] += macc[j][l];
                count[j] += cacc[j][l];
            }
    }
    for (int i = n16; i < n; i++) {
        const float xs = (x[i] - m) * inv_t;
        const int32_t wq = (int32_t)(w[i] * LADDER_SCALE);
#pragma GCC unroll 16
        for (int j = 0; j < LADDER; j++)
            if (xs >= lows[j]) {
                mass_q[j] += wq;
                count[j]++;
            }
    }
}

static const sampler_kernels KN(kernels) = {
    KW,         KN(max_pass), KN(first_equal), KN(exp_pass), KN(top_k_select), KN(collect_by_logit),
    KN(ladder),
};

#undef VF
#undef VI
#undef KN16
#undef KN
#undef KCAT
#undef KCAT2
