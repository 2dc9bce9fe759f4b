/* Which writer a format name selects. To add a format family, add one line to `formats` below
 * (its open function declared in your own header): the prefix it owns, the function, and a
 * help line. The function receives the full format name ("gguf-q4_0") and parses the rest. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/writer.h"
#include "model/writer_st.h"
#include "formats/gguf_write.h"
#include "util/error.h"

typedef g4_status (*writer_open_fn)(const char *format, const char *out_dir, const g4_writer_options *opts,
                                    g4_model_writer *out, g4_error *err);

static const struct {
    const char *prefix; /* a format matches when it equals the prefix or starts with prefix + "-" */
    writer_open_fn open;
    const char *help;   /* NULL: covered by another line */
} formats[] = {
    {"bf16", g4_writer_open_safetensors,
     "bf16, f16, f32       Hugging Face safetensors (text-only layout; multimodal prefix on request)"},
    {"f16", g4_writer_open_safetensors, NULL},
    {"f32", g4_writer_open_safetensors, NULL},
    {"safetensors", g4_writer_open_safetensors, NULL},
    {"mlx", g4_writer_open_mlx,
     "mlx, mlx-2 .. mlx-8  MLX affine, mlx-community layout (bits, group 32/64/128; MoE router 8-bit)"},
    {"gguf", g4_writer_open_gguf,
     "gguf, gguf-TYPE      llama.cpp GGUF, architecture gemma4 (TYPE f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1\n"
     "                       q4_k q5_k q6_k; plain gguf = the checkpoint's float type)"},
    {"qat", g4_writer_open_qat,
     "qat, qat-int2/4/8    Google QAT (quant_method \"gemma\"); plain qat = the E2B mixed recipe"},
};

void g4_writer_formats_help(char *buf, size_t n) {
    size_t used = 0;
    if (n) buf[0] = 0;
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        if (!formats[i].help || used >= n) continue;
        int k = snprintf(buf + used, n - used, "  %s\n", formats[i].help);
        if (k > 0) used += (size_t)k;
    }
}

g4_status g4_writer_open(const char *format, const char *out_dir, const g4_writer_options *opts,
                         g4_model_writer *out, g4_error *err) {
    memset(out, 0, sizeof *out);
    if (!format || !*format) return g4_fail(err, G4_ERR_ARG, "no output format given");
    if (!out_dir || !*out_dir) return g4_fail(err, G4_ERR_ARG, "no output directory given");
    for (size_t i = 0; i < sizeof formats / sizeof *formats; i++) {
        size_t n = strlen(formats[i].prefix);
        if (!strncmp(format, formats[i].prefix, n) && (format[n] == 0 || format[n] == '-'))
            return formats[i].open(format, out_dir, opts, out, err);
    }
    char help[1024];
    g4_writer_formats_help(help, sizeof help);
    return g4_fail(err, G4_ERR_ARG, "unknown output format '%s'; known formats:\n%s", format, help);
}

void g4_writer_rows_reset(g4_writer_rows *p) {
    free(p->buf);
    memset(p, 0, sizeof *p);
}

g4_status g4_writer_put_rows(const g4_model_writer *w, g4_writer_rows *p, const char *name, int ndim,
                             const int64_t *shape, int64_t row0, int64_t n_rows, const float *data, g4_error *err) {
    if (w->write_rows) return w->write_rows(w->ctx, name, row0, n_rows, data, err);
    int64_t rows = 1, cols = ndim > 0 ? shape[ndim - 1] : 1;
    for (int i = 0; i < ndim - 1; i++) rows *= shape[i];
    if (row0 == 0 && n_rows == rows) return w->write(w->ctx, name, data, err);
    if (row0 == 0) {
        g4_writer_rows_reset(p);
        if (!(p->buf = malloc(sizeof(float) * (size_t)rows * (size_t)cols)))
            return g4_fail(err, G4_ERR_NOMEM, "out of memory gathering tensor '%s' (%lld x %lld) for a writer "
                           "without row streaming", name, (long long)rows, (long long)cols);
        p->rows = rows;
        p->cols = cols;
    }
    if (!p->buf || row0 != p->filled || row0 + n_rows > p->rows)
        return g4_fail(err, G4_ERR_ARG, "tensor '%s': rows [%lld, %lld) out of order", name, (long long)row0,
                       (long long)(row0 + n_rows));
    memcpy(p->buf + (size_t)row0 * (size_t)cols, data, sizeof(float) * (size_t)n_rows * (size_t)cols);
    p->filled += n_rows;
    if (p->filled < p->rows) return G4_OK;
    g4_status st = w->write(w->ctx, name, p->buf, err);
    g4_writer_rows_reset(p);
    return st;
}
