/* Writing native packs (formats/pack.h) from any model or drafter g4 loads. */
#ifndef G4_MODEL_PACK_H
#define G4_MODEL_PACK_H
#include <stddef.h>

#include "g4.h"

typedef struct g4_pack_options {
    const char *tokenizer; /* tokenizer.json to carry (NULL: IN's own — IN/tokenizer.json, or the
                              one a pack carries — when there is one) */
    int keep_layout;       /* 1: matrices in the input's layout; 0 (default): 4/8-bit matrices in the
                              CPU kernels' split layout (cpu/quant.h), so an AVX-512 CPU maps them
                              with no repacking (a GPU session needs keep_layout packs) */
} g4_pack_options;

typedef struct g4_pack_stats {
    int n_tensors;         /* float tensors (matrices and vectors) */
    int n_int_tensors;
    int is_drafter;
    int has_tokenizer;
    size_t bytes;          /* the file's size */
    char path[4096];       /* the file written */
} g4_pack_stats;

/* Loads IN (a checkpoint folder or file in any format g4 reads, a drafter folder, or a pack),
 * binds it through a recording source, and writes every tensor the binder read, byte for byte as
 * the kernels consume it, into OUT: a file when OUT ends in ".g4p", else OUT/model.g4p (the folder
 * is created). A model loaded from the result computes bitwise the same logits as IN loaded the
 * default way (repacked where the CPU repacks). opts and stats may be NULL. */
g4_status g4_pack_write(const char *in, const char *out, const g4_pack_options *opts, g4_pack_stats *stats,
                        g4_error *err);
#endif
