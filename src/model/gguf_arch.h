/* llama.cpp's `gemma4` GGUF architecture as g4 sees it: tensor names, ggml types and the
 * metadata that stands in for config.json. Shared by the GGUF weight source (source_gguf.c, where
 * the mapping and every converter transformation are documented) and the GGUF writer. */
#ifndef G4_MODEL_GGUF_ARCH_H
#define G4_MODEL_GGUF_ARCH_H
#include <stddef.h>
#include <stdint.h>

#include "cpu/kernels.h"
#include "formats/gguf.h"
#include "g4.h"

/* ggml type ids (ggml.h's enum ggml_type) of the types g4's kernels know. */
enum {
    G4_GGML_F32 = 0, G4_GGML_F16 = 1, G4_GGML_Q4_0 = 2, G4_GGML_Q4_1 = 3, G4_GGML_Q5_0 = 6,
    G4_GGML_Q5_1 = 7, G4_GGML_Q8_0 = 8, G4_GGML_Q4_K = 12, G4_GGML_Q5_K = 13, G4_GGML_Q6_K = 14,
    G4_GGML_BF16 = 30,
};

/* The wtype of a ggml type, or G4_W_COUNT when g4 has no kernel for it. */
g4_wtype g4_wtype_of_ggml(uint32_t ggml_type);
/* The ggml type of a wtype, or -1 for AFFINE/SYMM (no ggml equivalent). */
int g4_ggml_of_wtype(g4_wtype t);

/* The GGUF tensor name for a Hugging Face text-model name ("layers.3.self_attn.q_proj.weight" →
 * "blk.3.attn_q.weight"). Returns 0 and writes out, or -1 when the name has no GGUF counterpart
 * (lm_head.weight, the tied LM head, also returns -1: GGUF files of Gemma 4 omit it). */
int g4_gguf_name_of_hf(const char *hf, char *out, size_t n);

/* The config.json text (a heap string the caller frees) equivalent to a `gemma4` GGUF's metadata
 * and tensor shapes. Fails naming the file and key for anything missing, inconsistent or not
 * expressible in g4's config (errors are G4_ERR_FORMAT, G4_ERR_TENSOR or G4_ERR_UNSUPPORTED). */
g4_status g4_gguf_config_json(const g4_gguf *g, char **json, g4_error *err);
#endif
