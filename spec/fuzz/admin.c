/* Fuzz target "admin": the bytes a client sends to the admin listener.
 *
 * The same gateway as the request target (examples/configs/default.json,
 * three model servers played by the harness), with the bytes written to its
 * admin port: routes, methods, POST /admin/reload and /admin/leaks included.
 * After each input the answers must be well-formed HTTP/1.1, the JSON ones
 * valid JSON, and nothing may be left in flight. */
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
  fz_exchange(gw, gw->admin, (const char *)data, size, &r);
  fz_check(gw, &r);
  return 0;
}
