/* Random-weight drafters for benchmarks (see synth_drafter.c for the assumed geometry). */
#ifndef G4_MODEL_SYNTH_DRAFTER_H
#define G4_MODEL_SYNTH_DRAFTER_H
#include <stdint.h>

#include "g4.h"
#include "model/config.h"

/* Writes DIR/config.json and DIR/model.safetensors (bf16) of a drafter for target. */
g4_status g4_synth_drafter_write(const g4_model *target, const char *dir, uint64_t seed, g4_error *err);
#endif
