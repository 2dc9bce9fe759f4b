/* The g4 command: one function per subcommand, each taking the arguments after its name.
 * Only the CLI prints; it turns library errors into messages on stderr and exit codes. */
#ifndef G4_CLI_H
#define G4_CLI_H

typedef struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name */
} cli_command;

int cmd_check(int argc, char **argv);

/* Parses a non-negative int option value; prints an error naming opt and returns -1 if bad. */
int cli_parse_int(const char *opt, const char *val, int min, int max, int *out);
#endif
