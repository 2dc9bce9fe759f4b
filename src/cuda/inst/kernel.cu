/* One instantiation of the persistent kernel: compiled once per entry of G4C_INST_MASKS
 * (internal.h) with -DG4C_INST=i (Makefile), so the instantiations build in parallel. */
#include "cuda/forward.cuh"

#ifndef G4C_INST
#error "compile with -DG4C_INST=<index into G4C_INST_MASKS>"
#endif
static constexpr unsigned g4c_inst_masks[G4C_N_INST] = G4C_INST_MASKS;
static_assert(G4C_INST >= 0 && G4C_INST < G4C_N_INST, "G4C_INST out of range");
template const void *g4c_kernel_fn<g4c_inst_masks[G4C_INST]>();
