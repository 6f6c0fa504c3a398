/* fuzz.h -- what the fuzz harnesses share (spec/fuzz/README.md).
 *
 * The request and upstream harnesses run the real gateway (gw_open, as
 * `lupin serve` does) on a libuv loop in the harness's own process, with
 * model servers played by the harness on 127.0.0.1 and a client that writes
 * the bytes to the gateway's port: bytes reach the parser exactly as they do
 * in production, and no gateway source had to change for it.
 *
 * Every harness is a libFuzzer target (LLVMFuzzerTestOneInput); replay.c is
 * a main() that runs one over files, so a corpus replays without libFuzzer. */
#ifndef LUPIN_FUZZ_H
#define LUPIN_FUZZ_H

#include "gateway.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reports a broken invariant on the real stderr (libFuzzer may have closed
 * fd 2) and aborts, so the fuzzer saves the input. */
void fz_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* Whether LUPIN_FUZZ_KNOWN (a comma-separated list) names cls: a class of
 * finding already reported, which a long run may step over to find others
 * (the committed reproducers still fail `make fuzz-replay`). */
int fz_known(const char *cls);
/* Sets LUPIN_HOME to the source tree and keeps a copy of stderr for fz_fail. */
void fz_setup(void);
/* Sends stdout (the access log) to /dev/null; returns a stream on the old
 * stdout.  libFuzzer's -close_fd_mask=3 silences both for `make fuzz`. */
FILE *fz_quiet(void);

/* With LUPIN_FUZZ_LUA_COVERAGE=1, Lua lines count as coverage (support.c). */
void fz_lua_coverage(lupin_runtime *rt);

/* --- the gateway under test ----------------------------------------------- */

/* Opens the gateway once: config (a path from the source tree) with
 * n_endpoints model servers played by the harness, listening on port 0. */
lupin_gateway *fz_gateway(const char *config, int n_endpoints);

/* What the model servers answer to POST and GET /v1/models: NULL for a
 * canned good answer, else these bytes, written in two pieces split at
 * split (the gateway reads in between), then the connection closed (reset
 * when reset is set).  /metrics always gets a canned vLLM text. */
void fz_set_answer(const char *bytes, size_t len, size_t split, int reset);

/* What the model servers answer to GET /metrics: this text in a 200, or
 * the canned vLLM text (NULL). */
void fz_set_metrics(const char *text, size_t len);

typedef struct fz_reply {
  char *data; /* what the client read, until it closed */
  size_t len;
} fz_reply;

/* Connects a client to `to` (gw->server or gw->admin), writes bytes, runs the loop until the
 * gateway has nothing in flight and nothing moves, closes the client and waits for the gateway to
 * close its side.  out->data is valid until the next call. */
void fz_exchange(lupin_gateway *gw, gw_server *to, const char *bytes, size_t len, fz_reply *out);

/* The invariants after an exchange: the client's bytes are well-formed
 * HTTP/1.1 responses (the last may be cut short), the gateway's own answers
 * are JSON in the OpenAI error shape, no request or connection is left. */
void fz_check(lupin_gateway *gw, const fz_reply *r);

#endif
