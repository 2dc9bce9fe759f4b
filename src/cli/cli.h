/* The g4 command: one function per subcommand, each taking the arguments after its name.
 * Only the CLI prints; it turns library errors into messages on stderr and exit codes. */
#ifndef G4_CLI_H
#define G4_CLI_H

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
} cli_command;

int cmd_bench(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_synth(int argc, char **argv);

/* Parses a non-negative int option value; prints an error naming opt and returns -1 if bad. */
int cli_parse_int(const char *opt, const char *val, int min, int max, int *out);
/* --kv-type f32|bf16 into G4_KV_F32 / G4_KV_BF16; prints an error and returns -1 if bad. */
int cli_parse_kv_type(const char *opt, const char *val, int *out);

/* Shared by g4 synth and g4 convert (cmd_synth.c). */
struct g4_writer_options;
/* --bits, --group, --threads, --tokenizer-from, --multimodal, --text-only: 1 when argv[*i] was one
 * (its value consumed), -1 on a bad value (message printed), 0 otherwise. */
int cli_writer_option(int argc, char **argv, int *i, struct g4_writer_options *wo, int *threads,
                      const char **tok_from);
/* Copies the tokenizer files found in `from` to `to` (and writes a generation_config.json when none
 * was there); returns the number copied, -1 on a write error. */
int cli_copy_tokenizer(const char *from, const char *to, int quiet);
/* Loads DIR, runs a 4-token forward and prints logit statistics; 0 when finite and not flat. */
int cli_quick_check(const char *dir, int threads);
/* Size of DIR/model.safetensors in bytes (0 when absent). */
double cli_dir_bytes(const char *dir);
#endif
