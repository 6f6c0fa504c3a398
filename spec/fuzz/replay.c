/* Runs a fuzz harness over files without libFuzzer: `make fuzz-replay`
 * builds each harness with this main() under ASan/UBSan (gcc will do) and
 * feeds it the committed corpus and the crashes `make fuzz` saved.
 *
 *   replay-<target> FILE|DIR...
 *
 * Prints "ok <file>" per input and "N passed, N failed" at the end (the
 * line spec/run and .ci/run count).  A crash ends the process with the
 * sanitizer's report; the last "running" line names the input.  The
 * access log goes to /dev/null and the gateway logs errors only
 * (LUPIN_FUZZ_VERBOSE=1 keeps both and shows each answer). */
#include "fuzz.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static FILE *out;

static int cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(out, "not ok %s: %s\n", path, strerror(errno));
    return -1;
  }
  lh_buf b = {0};
  char chunk[65536];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
    lh_buf_append(&b, chunk, n);
  fclose(f);
  fprintf(out, "running %s\n", path);
  fflush(out);
  /* a copy of exactly the input's size, so ASan sees reads past its end */
  uint8_t *copy = malloc(b.len ? b.len : 1);
  if (b.len) memcpy(copy, b.data, b.len);
  double t0 = lupin_now();
  LLVMFuzzerTestOneInput(copy, b.len);
  double ms = (lupin_now() - t0) * 1e3;
  free(copy);
  lh_buf_free(&b);
  fprintf(out, "ok %s (%.1f ms)\n", path, ms);
  fflush(out);
  return 0;
}

static void run_path(const char *path, int *passed, int *failed) {
  struct stat st;
  if (stat(path, &st)) return; /* a crash folder not made yet */
  if (!S_ISDIR(st.st_mode)) {
    if (run_file(path))
      (*failed)++;
    else
      (*passed)++;
    return;
  }
  DIR *d = opendir(path);
  if (!d) return;
  char **names = NULL;
  size_t n = 0, cap = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    if (n == cap) names = realloc(names, (cap = cap ? cap * 2 : 64) * sizeof *names);
    size_t len = strlen(path) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    snprintf(names[n++], len, "%s/%s", path, e->d_name);
  }
  closedir(d);
  if (n) qsort(names, n, sizeof *names, cmp);
  for (size_t i = 0; i < n; i++) {
    run_path(names[i], passed, failed);
    free(names[i]);
  }
  free(names);
}

int main(int argc, char **argv) {
  const char *verbose = getenv("LUPIN_FUZZ_VERBOSE");
  /* stderr stays, for the sanitizers' reports: the gateway logs errors only */
  if (!(verbose && *verbose == '1')) setenv("LUPIN_FUZZ_LOG", "0", 0);
  out = verbose && *verbose == '1' ? stdout : fz_quiet();
  LLVMFuzzerInitialize(&argc, &argv);
  int passed = 0, failed = 0;
  for (int i = 1; i < argc; i++)
    run_path(argv[i], &passed, &failed);
  fprintf(out, "%d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
