#include "util/mapped_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/error.h"

void *g4_map_anon_huge(size_t bytes) {
    const size_t huge = (size_t)2 << 20;
    if (!bytes || bytes > SIZE_MAX - huge) return NULL;
    uint8_t *base = mmap(NULL, bytes + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    /* keep the 2 MB-aligned `bytes` of the slightly larger mapping, unmap the rest */
    uint8_t *at = (uint8_t *)(((uintptr_t)base + huge - 1) & ~(uintptr_t)(huge - 1));
    if (at > base) munmap(base, (size_t)(at - base));
    if (base + huge > at) munmap(at + bytes, (size_t)(base + huge - at));
#ifdef MADV_HUGEPAGE
    madvise(at, bytes, MADV_HUGEPAGE);
#endif
    return at;
}

void g4_unmap_anon(void *p, size_t bytes) {
    if (p) munmap(p, bytes);
}

g4_status g4_mapped_file_open(g4_mapped_file *f, const char *path, g4_error *err) {
    f->data = NULL;
    f->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return g4_fail(err, G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return g4_fail(err, G4_ERR_IO, "%s: not a regular file", path);
    }
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return g4_fail(err, G4_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        f->data = p;
        f->size = (size_t)st.st_size;
    }
    close(fd);
    return G4_OK;
}

void g4_mapped_file_close(g4_mapped_file *f) {
    if (f->data) munmap((void *)f->data, f->size);
    f->data = NULL;
    f->size = 0;
}

g4_status g4_read_file(const char *path, char **out, size_t *len, g4_error *err) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return g4_fail(err, G4_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (!buf) {
            fclose(fp);
            return g4_fail(err, G4_ERR_NOMEM, "%s: out of memory reading file", path);
        }
        n += fread(buf + n, 1, cap - n - 1, fp);
        if (n < cap - 1) break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb) free(buf);
        buf = nb;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) {
        free(buf);
        return g4_fail(err, G4_ERR_IO, "%s: read error", path);
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return G4_OK;
}
