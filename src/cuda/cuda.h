/* The CUDA backend as the runtime sees it: a device-side session (weights uploaded once, the KV
 * cache with the CPU's staging/commit design, scratch) and the few calls generation needs.
 * Implemented in src/cuda/ (the .cu files); compiled only when nvcc is available (G4_HAVE_CUDA). Every call
 * returns a g4_status; nothing prints.
 *
 * Exactness: one persistent kernel runs the whole forward for any number of tokens M, and each
 * output element is reduced the same way whatever M is (cuda/program.h), so the logits of a
 * position are bitwise identical whether it was decoded alone, verified in a block of k+1 or
 * prefilled in a chunk. Against the CPU backend the results agree to tolerance, not bitwise. */
#ifndef G4_CUDA_CUDA_H
#define G4_CUDA_CUDA_H
#include <stddef.h>
#include <stdint.h>

#include "g4.h"

#ifdef __cplusplus
extern "C" {
#endif

struct g4_model;
struct g4_drafter;
typedef struct g4_cuda g4_cuda;

/* G4_OK when a CUDA device this build can run on is present; otherwise G4_ERR_UNSUPPORTED with
 * a message starting "no CUDA device/driver: ". desc (may be NULL) receives the device's name. */
g4_status g4_cuda_probe(char *desc, size_t desc_len, g4_error *err);

/* Uploads m's weights and allocates the cache for n_ctx positions and blocks of max_batch tokens.
 * m must outlive the session. Quantised matrices (GGUF Q8_0 / Q4_0, MLX affine and QAT at 4 or 8
 * bits) are rearranged into the kernels' layout; other formats fail with G4_ERR_UNSUPPORTED. */
g4_status g4_cuda_create(const struct g4_model *m, int n_ctx, int max_batch, g4_cuda **out, g4_error *err);
void g4_cuda_free(g4_cuda *c);

/* Runs tokens[0..M) at positions pos.. . K/V go to staging (commit them with g4_cuda_commit),
 * except with direct (M == 1 only), which writes them straight into the cache. Logits of tokens
 * [lm_from, M) are computed when want_logits and copied to logits ([M - lm_from][V]) when it is
 * not NULL; the final-normed hidden of those tokens is kept for g4_cuda_save_hidden. */
g4_status g4_cuda_forward(g4_cuda *c, int pos, const int32_t *tokens, int M, int lm_from, int want_logits,
                          float *logits, int direct, g4_error *err);
/* g4_cuda_forward (staged, never direct) with the prefill procedure: bf16 matmul stages on the
 * tensor cores (program.h G4C_FP_*), logits independent of M, within rounding of the decode
 * procedure's. */
g4_status g4_cuda_prefill(g4_cuda *c, int pos, const int32_t *tokens, int M, int lm_from, int want_logits, float *logits,
                          g4_error *err);
/* Copies staged rows [0, n) of the last forward (which started at stage_pos) into the cache. */
g4_status g4_cuda_commit(g4_cuda *c, int stage_pos, int n, g4_error *err);
/* g4_cuda_forward with every row's logits computed but left on the device: ids[m] receives the
 * argmax of row m (softcapped logits, the lowest index on ties), the only bytes copied back. */
g4_status g4_cuda_forward_ids(g4_cuda *c, int pos, const int32_t *tokens, int M, int direct, int32_t *ids,
                              g4_error *err);

/* Named intermediates of the last forward for debugging dumps: "embed", "ple", "layer_out"
 * (needs g4_cuda_set_debug), "final_norm", "logits". Rows m0..m0+n-1 of `layer`. */
g4_status g4_cuda_set_debug(g4_cuda *c, int on, g4_error *err);
g4_status g4_cuda_read(g4_cuda *c, const char *name, int layer, int m0, int n, float *out, int *row_len,
                       g4_error *err);

/* ---- drafting ---------------------------------------------------------------------------------- */
/* Uploads d (once per drafter; a different drafter replaces it). */
g4_status g4_cuda_draft_attach(g4_cuda *c, const struct g4_drafter *d, g4_error *err);
/* The drafter's carried hidden := the final-normed hidden of row `row` of the last forward. */
g4_status g4_cuda_save_hidden(g4_cuda *c, int row, g4_error *err);
/* n_steps drafter steps in one launch at query position qpos, the first fed `tok`, each next one
 * the previous step's argmax. begin: start from the saved hidden (else continue the carry).
 * drafts[n_steps] receives the argmax tokens; logits ([n_steps][V]) and hidden0 ([H], the
 * projected hidden after the first step) may be NULL. */
g4_status g4_cuda_draft(g4_cuda *c, int32_t tok, int qpos, int n_steps, int begin, int32_t *drafts, float *logits,
                        float *hidden0, g4_error *err);

/* ---- benchmarking ------------------------------------------------------------------------------- */
/* n chained greedy decode steps from (pos, tok), one launch per token with the next id kept on
 * the device; writes the tokens to out (may be NULL) and the GPU time to *seconds. */
g4_status g4_cuda_decode_chain(g4_cuda *c, int pos, int32_t tok, int n, int32_t *out, double *seconds,
                               g4_error *err);
/* reps forwards of M tokens at pos (staged, all logits, no commit), GPU time per forward. */
g4_status g4_cuda_time_forward(g4_cuda *c, int pos, const int32_t *tokens, int M, int reps, double *seconds,
                               g4_error *err);
/* Modes, for comparing in benchmarks (both on by default): weight loads marked evict-first in L2,
 * and each stage's description read from a shared-memory copy fetched during the barrier. */
void g4_cuda_set_mode(g4_cuda *c, int evict_first, int op_local);
/* One forward of M tokens at pos (staged, all logits) with per-stage timestamps:
 * stamps[n_ops][grid][4] = start and end (ns, one clock for the device), input-tile cycles and work
 * cycles (the block's SM clock); kinds[n_ops] the stages' G4C_OP_* kinds and wbytes[n_ops] the
 * weight bytes each streams (either may be NULL). */
g4_status g4_cuda_trace(g4_cuda *c, int pos, const int32_t *tokens, int M, unsigned long long *stamps, int *kinds,
                        double *wbytes, g4_error *err);
/* One staged forward of M tokens at pos (all logits; the graph the decode or verify path runs, built
 * with marks): stamps[n_ops][G4C_MAXB][4] = each block's start, the return of its wait for the
 * previous stage, the end of its input tile (0 where the stage builds none) and its end, in ns of
 * the device's global timer; grid[n_ops] the stage's blocks, kern[n_ops] its staged kernel (0 full
 * SM, 1..3 the one-token matmul kernels, 4 half-SM attention), kinds[n_ops] its G4C_OP_* kind or -1
 * for the LM head, wbytes[n_ops] the weight bytes it streams (any of the last four may be NULL).
 * amark > 0: an attention stage's third point is instead where its item got to (g4c_params.amark).
 * A session that does not run this block staged is G4_ERR_UNSUPPORTED. */
g4_status g4_cuda_staged_trace(g4_cuda *c, int pos, const int32_t *tokens, int M, int amark, unsigned long long *stamps,
                               int *grid, int *kern, int *kinds, double *wbytes, g4_error *err);
/* The staged decode for blocks of fewer than G4C_WIDE_M tokens (decode steps, verify blocks; mode
 * from G4_CUDA_STAGED at creation, default 4): 0 the persistent kernel, 1 one launch per stage with
 * one-token matmuls two blocks per SM, 2 one launch per stage, one block per SM, 3 as 1 but one
 * block per SM (the next stage's blocks fit beside), 4 as 2 but one-token matmuls with dense rows
 * through shared-memory weight rings; the values are the same bits in every mode.
 * Returns the mode now in effect (an unknown one keeps the current). */
int g4_cuda_set_staged(g4_cuda *c, int mode);
/* The staged decode's options, for measuring each against its absence on one upload: attention
 * stages copying their earlier K/V rows before the wait, on the half-SM kernel where they fit
 * (attn_early; G4_CUDA_ATTN_EARLY), and quantised rows through mode 4's weight rings (ring_q;
 * G4_CUDA_RING_Q). A negative value keeps the setting; the cached graphs are rebuilt on change. */
void g4_cuda_set_staged_opts(g4_cuda *c, int attn_early, int ring_q);
/* One-token tiles of 4- and 8-bit rows with their loads a group ahead (forward.cuh mm_tile_pipe;
 * from G4_CUDA_PIPE=0/1/2 at creation, default 2): 1 on, 2 on with the staged decode's first group
 * issued before the wait for the stage before (mm_stage_early; verify blocks of 2..4 tokens too,
 * mm_stage_early_v), 0 off, negative keeps it; returns the setting before. All compute the same
 * bits. */
int g4_cuda_set_pipe(g4_cuda *c, int on);
/* the settings now in effect */
void g4_cuda_get_staged_opts(const g4_cuda *c, int *attn_early, int *ring_q);
/* Op classes to skip (G4C_CLS_* of cuda/program.h) for timing breakdowns; 0 for none. */
void g4_cuda_set_skip(g4_cuda *c, int mask);
/* 1: g4_cuda_trace runs the prefill procedure (g4_cuda_prefill's) instead of the decode one. */
void g4_cuda_set_trace_prefill(g4_cuda *c, int on);
/* Benchmark instrumentation: run every stage of a launch rep+1 times back to back (the trace times
 * the last run: its code and small data are warm). Results are meaningless while rep > 0. */
void g4_cuda_set_rep(g4_cuda *c, int rep);
/* Tuning for benchmarks: items per row team prefetched into L2 ahead of the next matmul stage
 * (default 0: none), prefetch of each team's next item within a stage (default 0: off), the most
 * 16-byte chunks a lane streams per row before rows are split over more warps (0: the defaults,
 * 32 for dense rows and 8 for quantised ones; this one changes the reduction order, so compare
 * logits only within one setting), and the shared memory per block in KB (0: keep; less leaves
 * more L1 but tiles fewer tokens). */
g4_status g4_cuda_set_tune(g4_cuda *c, int pf_items, int pf_self, int split_chunks, int smem_kb, g4_error *err);
/* The prefill GEMM on its own (src/cuda/pgemm.cu; a building block of the prefill path, checked and
 * timed by tests/gpu/gpu_gemm): y[m][r] = sum_k w[r][k] · (h + mid + l)[m][k] for m < M, r < N, where
 * terms holds the three bf16 planes [3][M][K] of the inputs (x = h + mid + l, each bf16 of the
 * remainder so far) and w has N rows of row_bytes (a multiple of 16): wtype 2 (bf16 row-major) or
 * 4 (per-channel signed 4-bit codes, LSB-first, w = s·(q − 8), one f32 scale per row at byte
 * sc_off); host arrays, K a multiple of 32. variant: the kernel, 0 mma.sync or 1 wgmma
 * (pgemm_wg.cu), either for both weight types (another variant: G4_ERR_ARG). reps > 0 also times
 * that many launches (*ms: mean per launch). */
g4_status g4_cuda_pgemm(const uint16_t *terms, const void *w, int wtype, long long row_bytes, int sc_off, int M, int N, int K,
                        int variant, float *y, int reps, double *ms, g4_error *err);
/* The fast prefill's attention kernel (pattn.cu) alone, for tests and benchmarks: queries q
 * [M][nH·d] of positions pos0 .. pos0 + M - 1, keys and values k, v [pos0 + M][nkv·d] by
 * position (those before pos0 served from a cache as a session keeps it), att [M][nH·d]; reps > 0
 * also times that many launches (mean ms); kb: the variant (0: the tensor-core kernel - fp16
 * hi/lo split operands, f32 accumulation - or where d is not a multiple of 16, 32, 64
 * for heads up to 128, 256, 512 wide the SIMT kernel; 32: the f32 SIMT kernel in 32-key blocks;
 * 64: the SIMT kernel in 64-key blocks for heads 129..256 wide; 1: the tensor cores over 4 key
 * partitions, merged in order: the session's; others: G4_ERR_ARG). */
g4_status g4_cuda_pattn(const float *q, const float *k, const float *v, int pos0, int M, int nH, int nkv, int d, int is_full,
                        int window, int kb, float *att, int reps, double *ms, g4_error *err);
/* A fast prefill's launches timed (a warm run, then one with events between them; the block's
 * K/V rows are staged as in g4_cuda_prefill), in ms and launches: [0] the persistent kernel's
 * (norms, ropes, PLE, residuals, the matmul stages' input terms, the LM head) and the input
 * phases launched on their own (pprep.cu: a GEMM's input terms, attention's norms and ropes), [1] the prefill
 * GEMM's (a stage's matrices and reductions), [2] the prefill attention's. G4_ERR_UNSUPPORTED when
 * the session runs fast prefill as one launch (G4_CUDA_PGEMM=0, or no stage for those kernels). */
g4_status g4_cuda_prefill_profile(g4_cuda *c, int pos, const int32_t *tokens, int M, double ms[3], int n_launch[3],
                                  g4_error *err);
/* Streaming-read bandwidth of the device over `bytes`, bytes per second. */
g4_status g4_cuda_bandwidth(size_t bytes, double *bytes_per_s, g4_error *err);
/* The persistent kernel's grid (blocks), stages per token and bytes of device memory in use. */
void g4_cuda_describe(const g4_cuda *c, int *grid, int *n_ops, size_t *weight_bytes, size_t *scratch_bytes);

#ifdef __cplusplus
}
#endif
#endif
