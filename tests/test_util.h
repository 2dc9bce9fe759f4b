/* Shared helpers for the cmocka test programs. */
#ifndef G4_TEST_UTIL_H
#define G4_TEST_UTIL_H
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

/* The shared fixtures directory (G4_FIXTURES, else ../shared/fixtures from the project root). */
static inline const char *test_fixtures_dir(void) {
    const char *d = getenv("G4_FIXTURES");
    return d && *d ? d : "../shared/fixtures";
}

/* Joins the fixtures dir and a relative path into buf. */
static inline const char *test_fixture_path(char *buf, size_t n, const char *rel) {
    snprintf(buf, n, "%s/%s", test_fixtures_dir(), rel);
    return buf;
}

/* Reads a whole file; the caller frees. Fails the test when the file is missing. */
static inline void *test_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return buf;
}

/* A scratch directory under the build tree, created fresh for one test. */
static inline const char *test_tmpdir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/g4test-%s-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", name,
             (int)getpid());
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%.1000s' && mkdir -p '%.1000s'", buf, buf);
    if (system(cmd) != 0) fail_msg("cannot create %s", buf);
    return buf;
}

/* Removes a directory made by test_tmpdir once its test is done with it. */
static inline void test_rmdir(const char *dir) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%.1000s'", dir);
    if (system(cmd) != 0) fail_msg("cannot remove %s", dir);
}
#endif
