/* Fuzz target "request": the bytes a client sends to `lupin serve`.
 *
 * They go over loopback to the real gateway (examples/configs/default.json,
 * three model servers played by the harness, which answer well): parsed by
 * http_parser as the server does it, the body checked, the request scheduled
 * through the config's plugins and proxied.  After each input: every byte
 * the client read is a well-formed HTTP/1.1 response, the gateway's own
 * answers are OpenAI error JSON, and no request or connection is left. */
#include "fuzz.h"

static lupin_gateway *gw;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  gw = fz_gateway("examples/configs/default.json", 3);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_reply r;
  fz_exchange(gw, gw->server, (const char *)data, size, &r);
  fz_check(gw, &r);
  return 0;
}
