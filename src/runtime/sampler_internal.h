/* Sampler internals exposed only so tests can check them against a reference. */
#ifndef G4_RUNTIME_SAMPLER_INTERNAL_H
#define G4_RUNTIME_SAMPLER_INTERNAL_H

#include "g4_sample.h"

/* y[i] = e^x[i] for x[i] <= 0, computed by the same vector code the sampler's softmax uses
 * (about 1-2 ulp; 0 for x < -87, -inf or NaN). Bitwise independent of n and of i's position. */
void g4_sampler_exp_neg(const float *x, float *y, int n);

/* g4_sampler_create with the vocabulary-wide loops built for `width` lanes (4: generic, 8: AVX2,
 * 16: AVX-512; 0: the widest this CPU runs). G4_ERR_UNSUPPORTED when the CPU lacks it. Every
 * width must give bitwise identical results; the tests hold them to it. */
g4_status g4_sampler_create_width(const g4_sampler_options *opts, int n_vocab, int width,
                                  g4_sampler **out, g4_error *err);

#endif
