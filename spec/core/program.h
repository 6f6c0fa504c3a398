/* What the C test programs run by the specs of spec/core share.  Define
 * PROGRAM (the program's name, for its messages) before including it. */
#ifndef LUPIN_SPEC_PROGRAM_H
#define LUPIN_SPEC_PROGRAM_H

#include <lupin.h>

#include <stdio.h>

/* A failed check is reported on stderr and counted; main returns 1 when
 * any failed. */
static int failures;
#define CHECK(cond, ...)                                                                           \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, PROGRAM ": " __VA_ARGS__);                                                   \
      fputc('\n', stderr);                                                                         \
      failures++;                                                                                  \
    }                                                                                              \
  } while (0)

/* Endpoints ep1..epN at 10.0.0.1..N, port 8000. */
static void add_endpoints(lupin_runtime *rt, int n) {
  char name[16], address[32], err[256];
  for (int i = 1; i <= n; i++) {
    snprintf(name, sizeof name, "ep%d", i);
    snprintf(address, sizeof address, "10.0.0.%d", i);
    CHECK(!lupin_endpoint_upsert(rt, &(lupin_endpoint_desc){name, address, 8000, NULL, 0}, err,
                                 sizeof err),
          "adding %s: %s", name, err);
  }
}

#endif
