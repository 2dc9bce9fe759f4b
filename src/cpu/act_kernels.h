/* The forward's element-wise loops, written once and included by act.c for each vector width:
 * KW lanes per native vector (4: generic / SSE2, 8: AVX2, 16: AVX-512), KSUFFIX naming the copy,
 * KTARGET its target attribute (possibly empty). Every lane operation is one IEEE single
 * precision operation (no contraction: -ffp-contract=off; where a loop asks for a fused
 * multiply-add it says so, and every copy does it as one: the vector FMA, or fmaf) and sums use
 * one fixed layout (16 partial sums, element i into partial i % 16, then the fixed fold), so every
 * copy gives the scalar bits. */
#define KCAT2(a, b) a##b
#define KCAT(a, b) KCAT2(a, b)
#define KN(name) KCAT(name, KSUFFIX)
#define KN16 (16 / KW)

typedef float KN(af) __attribute__((vector_size(KW * 4), aligned(4), may_alias));
typedef int32_t KN(ai) __attribute__((vector_size(KW * 4), aligned(4), may_alias));
#define VF KN(af)
#define VI KN(ai)
#define KINL KTARGET static inline __attribute__((always_inline))

KINL VF KN(splat)(float x) {
    VF v;
    for (int i = 0; i < KW; i++) v[i] = x;
    return v;
}

/* a·b + c with one rounding, lane by lane */
KINL VF KN(vfma)(VF a, VF b, VF c) {
#if KW == 16
    return (VF)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif KW == 8
    return (VF)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    VF r;
    for (int i = 0; i < KW; i++) r[i] = fmaf(a[i], b[i], c[i]);
    return r;
#endif
}

KINL VF KN(vmin)(VF a, VF b) { return (VF)(((VI)(a < b) & (VI)a) | (~(VI)(a < b) & (VI)b)); }
KINL VF KN(vmax)(VF a, VF b) { return (VF)(((VI)(a > b) & (VI)a) | (~(VI)(a > b) & (VI)b)); }

/* e^x for any float x, the lane version of g4_exp (act.h). */
KINL VF KN(vexp)(VF x) {
    x = KN(vmax)(KN(vmin)(x, KN(splat)(G4_EXP_HI)), KN(splat)(G4_EXP_LO));
    const VF magic = KN(splat)(12582912.0f);
    const VF t = x * KN(splat)(1.44269504088896341f) + magic;
    const VF n = t - magic;
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
    const VI ni = (VI)t - (VI)magic;
    /* 2^n as two factors so that n up to 128 (x near 88.7) stays representable */
    const VI h = ni >> 1;
    return p * (VF)((h + 127) << 23) * (VF)((ni - h + 127) << 23);
}

KINL VF KN(vgelu)(VF x) {
    const VF z = KN(splat)(G4_GELU_K) * (x + KN(splat)(0.044715f) * x * x * x);
    return x / (KN(splat)(1.0f) + KN(vexp)(KN(splat)(-2.0f) * z));
}

KTARGET static void KN(gelu_mul)(float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + KW <= n; i += KW) *(VF *)(g + i) = KN(vgelu)(*(const VF *)(g + i)) * *(const VF *)(u + i);
    for (; i < n; i++) g[i] = g4_gelu_tanh(g[i]) * u[i];
}

KTARGET static void KN(softcap)(float *x, size_t n, float cap) {
    const VF c = KN(splat)(cap), one = KN(splat)(1.0f), two = KN(splat)(2.0f);
    const VI sign = (VI)KN(splat)(-0.0f);
    size_t i = 0;
    for (; i + KW <= n; i += KW) {
        VF y = *(VF *)(x + i) / c;
        VF a = (VF)((VI)y & ~sign);
        VF t = one - two / (one + KN(vexp)(two * a));
        *(VF *)(x + i) = c * (VF)((VI)t | ((VI)y & sign));
    }
    for (; i < n; i++) x[i] = g4_softcap1(x[i], cap);
}

/* y[i] = g4_fake_quant1(x[i], sc). Rounding to an integer, half to even, is exact as a + 1.5·2^23
 * − 1.5·2^23 on a = |v / s| < 2^23 (larger values clamp to ±128 either way), with v's sign put
 * back (nearbyintf keeps it: -0.3 -> -0.0); NaN passes both clamps unchanged as in the scalar. */
KTARGET static void KN(fake_quant)(float *y, const float *x, size_t n, float sc) {
    const VF s = KN(splat)(sc), magic = KN(splat)(12582912.0f), lo = KN(splat)(-128.0f), hi = KN(splat)(127.0f);
    const VI sign = (VI)KN(splat)(-0.0f);
    size_t i = 0;
    for (; i + KW <= n; i += KW) {
        const VF v = *(const VF *)(x + i) / s;
        const VF a = (VF)((VI)v & ~sign);
        VF q = (VF)((VI)((a + magic) - magic) | ((VI)v & sign));
        q = (VF)(((VI)(q < lo) & (VI)lo) | (~(VI)(q < lo) & (VI)q));
        q = (VF)(((VI)(q > hi) & (VI)hi) | (~(VI)(q > hi) & (VI)q));
        *(VF *)(y + i) = q * s;
    }
    for (; i < n; i++) y[i] = g4_fake_quant1(x[i], sc);
}

/* y[i] = e^(x[i] - m); returns the sum of y in the fixed 16-partial layout. */
KTARGET static float KN(exp_sum)(const float *x, float m, float *y, int n) {
    VF acc[KN16];
    for (int v = 0; v < KN16; v++) acc[v] = KN(splat)(0.0f);
    const VF mv = KN(splat)(m);
    int i = 0;
    for (; i + 16 <= n; i += 16)
#pragma GCC unroll 16
        for (int v = 0; v < KN16; v++) {
            VF e = KN(vexp)(*(const VF *)(x + i + v * KW) - mv);
            *(VF *)(y + i + v * KW) = e;
            acc[v] = acc[v] + e;
        }
    float part[16];
    for (int v = 0; v < KN16; v++)
        for (int l = 0; l < KW; l++) part[v * KW + l] = acc[v][l];
    for (; i < n; i++) {
        y[i] = g4_exp(x[i] - m);
        part[i & 15] += y[i];
    }
    return g4_fold16(part);
}

/* The index of the largest x[i], the lowest on ties: the scalar loop `if (x[i] > x[b]) b = i`
 * from b = 0, exactly (NaNs never win; a NaN at x[0] wins; -0.0 ties with 0.0). Lane l keeps the
 * largest of the elements i ≡ l (mod KW) and its first index; the lanes are then merged by value,
 * ties by index, and the tail continues the scalar loop. */
KTARGET static int KN(argmax)(const float *x, int n) {
    if (n < 1 || x[0] != x[0]) return 0;
    VF bv = KN(splat)(x[0]);
    VI bi, idx;
    for (int l = 0; l < KW; l++) bi[l] = 0, idx[l] = l;
    int i = 0;
    for (; i + KW <= n; i += KW) {
        const VF v = *(const VF *)(x + i);
        const VI gt = (VI)(v > bv);
        bv = (VF)((gt & (VI)v) | (~gt & (VI)bv));
        bi = (gt & idx) | (~gt & bi);
        idx = idx + KW;
    }
    int b = 0;
    float m = x[0];
    for (int l = 0; l < KW; l++)
        if (bv[l] > m || (bv[l] == m && bi[l] < b)) m = bv[l], b = bi[l];
    for (; i < n; i++)
        if (x[i] > m) m = x[i], b = i;
    return b;
}

/* y[i] = fma(a, x[i], y[i]) (one rounding). */
KTARGET static void KN(axpy)(float *y, float a, const float *x, int n) {
    const VF av = KN(splat)(a);
    int i = 0;
    for (; i + KW <= n; i += KW) *(VF *)(y + i) = KN(vfma)(av, *(const VF *)(x + i), *(VF *)(y + i));
    for (; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* KW V elements at v[i..]: float rows, or bf16 rows (bf: each value widened exactly) */
KINL VF KN(ldv)(const void *v, size_t i, const int bf) {
    if (!bf) return *(const VF *)((const float *)v + i);
    const uint16_t *h = (const uint16_t *)v + i;
#if KW == 16
    return (VF)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)h)), 16);
#elif KW == 8
    return (VF)_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)h)), 16);
#else
    VF r = KN(splat)(0.0f);
    for (int l = 0; l < KW; l++) r[l] = g4_bf16_to_f32(h[l]);
    return r;
#endif
}
KINL float KN(ldv1)(const void *v, size_t i, const int bf) {
    return bf ? g4_bf16_to_f32(((const uint16_t *)v)[i]) : ((const float *)v)[i];
}

/* y[e] = fma(p[k], v[k·stride + e], y[e]) for k = 0..nk-1 in order (one fused multiply-add per key:
 * half the operations of a multiply and an add, which share this CPU's one 512-bit FMA port):
 * the same operations as nk calls of axpy, with y held in registers across the keys. Blocks of
 * AV_NB vectors (256 floats with AVX-512) first: each key's block is one contiguous run of the
 * row, and the AV_NB accumulators are independent chains. V rows are floats, or bf16 (bf = 1:
 * the same operations on the widened values). */
#define AV_NB (KW == 16 ? 16 : 8)
KINL void KN(avsum_t)(float *y, const float *p, const void *v, size_t stride, int nk, int d, const int bf) {
    int i = 0;
    for (; i + AV_NB * KW <= d; i += AV_NB * KW) {
        VF a[AV_NB];
#pragma GCC unroll 16
        for (int b = 0; b < AV_NB; b++) a[b] = *(VF *)(y + i + b * KW);
        for (int k = 0; k < nk; k++) {
            const size_t vr = (size_t)k * stride + i;
            const VF pk = KN(splat)(p[k]);
#pragma GCC unroll 16
            for (int b = 0; b < AV_NB; b++) a[b] = KN(vfma)(pk, KN(ldv)(v, vr + b * KW, bf), a[b]);
        }
#pragma GCC unroll 16
        for (int b = 0; b < AV_NB; b++) *(VF *)(y + i + b * KW) = a[b];
    }
    for (; i + 4 * KW <= d; i += 4 * KW) {
        VF a0 = *(VF *)(y + i), a1 = *(VF *)(y + i + KW), a2 = *(VF *)(y + i + 2 * KW), a3 = *(VF *)(y + i + 3 * KW);
        for (int k = 0; k < nk; k++) {
            const size_t vr = (size_t)k * stride + i;
            const VF pk = KN(splat)(p[k]);
            a0 = KN(vfma)(pk, KN(ldv)(v, vr, bf), a0);
            a1 = KN(vfma)(pk, KN(ldv)(v, vr + KW, bf), a1);
            a2 = KN(vfma)(pk, KN(ldv)(v, vr + 2 * KW, bf), a2);
            a3 = KN(vfma)(pk, KN(ldv)(v, vr + 3 * KW, bf), a3);
        }
        *(VF *)(y + i) = a0;
        *(VF *)(y + i + KW) = a1;
        *(VF *)(y + i + 2 * KW) = a2;
        *(VF *)(y + i + 3 * KW) = a3;
    }
    for (; i + KW <= d; i += KW) {
        VF a0 = *(VF *)(y + i);
        for (int k = 0; k < nk; k++) a0 = KN(vfma)(KN(splat)(p[k]), KN(ldv)(v, (size_t)k * stride + i, bf), a0);
        *(VF *)(y + i) = a0;
    }
    for (; i < d; i++)
        for (int k = 0; k < nk; k++) y[i] = fmaf(p[k], KN(ldv1)(v, (size_t)k * stride + (size_t)i, bf), y[i]);
}

KTARGET static void KN(avsum)(float *y, const float *p, const float *v, size_t stride, int nk, int d) {
    KN(avsum_t)(y, p, v, stride, nk, d, 0);
}

/* avsum for nh <= 4 heads at once over the same V rows: y_h[e] = fma(p_h[k], v[k·stride + e], y_h[e])
 * for k = 0..nk-1 in order (y_h = y + h·ystride, p_h = p + h·pstride): each element gets exactly
 * the operations of avsum, but every V row is read once for all the heads (blocks of 4 vectors
 * per head: 16 accumulators). */
KINL void KN(avsum_h)(float *y, size_t ystride, const float *p, size_t pstride, const void *v, size_t stride,
                      int nk, int d, const int nh, const int bf) {
    int i = 0;
    for (; i + 4 * KW <= d; i += 4 * KW) {
        VF a[4][4];
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) a[h][b] = *(VF *)(y + h * ystride + i + b * KW);
        for (int k = 0; k < nk; k++) {
            const size_t vr = (size_t)k * stride + i;
            VF w[4];
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) w[b] = KN(ldv)(v, vr + b * KW, bf);
#pragma GCC unroll 4
            for (int h = 0; h < nh; h++) {
                const VF pk = KN(splat)(p[h * pstride + (size_t)k]);
#pragma GCC unroll 4
                for (int b = 0; b < 4; b++) a[h][b] = KN(vfma)(pk, w[b], a[h][b]);
            }
        }
#pragma GCC unroll 4
        for (int h = 0; h < nh; h++)
#pragma GCC unroll 4
            for (int b = 0; b < 4; b++) *(VF *)(y + h * ystride + i + b * KW) = a[h][b];
    }
    const void *vi = bf ? (const void *)((const uint16_t *)v + i) : (const void *)((const float *)v + i);
    for (int h = 0; h < nh; h++) KN(avsum_t)(y + h * ystride + i, p + h * pstride, vi, stride, nk, d - i, bf);
}

/* any number of heads, in runs of 4 over the same rows (the second run's rows come from cache:
 * blocks of 8 heads with 2 vectors each measured slower than two runs of 4 on the Zen 5 machine) */
KINL void KN(avsum_heads_t)(float *y, size_t ystride, const float *p, size_t pstride, int nh, const void *v, size_t stride,
                            int nk, int d, const int bf) {
    for (; nh > 0; nh -= 4, y += 4 * ystride, p += 4 * pstride) {
        switch (nh) {
        case 1: KN(avsum_h)(y, ystride, p, pstride, v, stride, nk, d, 1, bf); break;
        case 2: KN(avsum_h)(y, ystride, p, pstride, v, stride, nk, d, 2, bf); break;
        case 3: KN(avsum_h)(y, ystride, p, pstride, v, stride, nk, d, 3, bf); break;
        default: KN(avsum_h)(y, ystride, p, pstride, v, stride, nk, d, 4, bf); break;
        }
    }
}

KTARGET static void KN(avsum_heads)(float *y, size_t ystride, const float *p, size_t pstride, int nh, const float *v,
                                    size_t stride, int nk, int d) {
    KN(avsum_heads_t)(y, ystride, p, pstride, nh, v, stride, nk, d, 0);
}

KTARGET static void KN(avsum_heads_bf16)(float *y, size_t ystride, const float *p, size_t pstride, int nh,
                                         const uint16_t *v, size_t stride, int nk, int d) {
    KN(avsum_heads_t)(y, ystride, p, pstride, nh, v, stride, nk, d, 1);
}

#undef KCAT2
#undef KCAT
#undef KN
#undef KN16
#undef AV_NB
#undef VF
#undef VI
#undef KINL
