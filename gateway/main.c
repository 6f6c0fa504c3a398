/* The `lupin` command: `lupin serve` runs the gateway, `lupin check`
 * validates a config and its plugins without serving. */
#include "gateway.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage:\n"
    "  lupin serve --config FILE [--listen 127.0.0.1:8080] [--admin 127.0.0.1:9090]\n"
    "              [--admin-token TOKEN] [--endpoints FILE] [--log-level error|warn|info|debug]\n"
    "              [--no-watch] [--max-lua-memory BYTES[k|m|g]] [--admin-insecure]\n"
    "              [--resolve NAME=ADDR[,ADDR...]]...\n"
    "  lupin check --config FILE [--endpoints FILE]\n"
    "  lupin version\n"
    "\n"
    "The config is an EndpointPickerConfig (JSON) with two lupin extensions: \"endpoints\"\n"
    "(a list of {name, address, port, labels}) and \"gateway\" (limits, timeouts, the\n"
    "metrics refresh interval; see README.md).  --endpoints names a file holding the\n"
    "same list, watched and re-read on change; it replaces the config's endpoints.\n"
    "The config file and the plugin directories are watched too: a change reloads\n"
    "(debounced; --no-watch turns it off).  SIGHUP and POST /admin/reload reload.\n"
    "An endpoint's host name stands for all its addresses, tried in order;\n"
    "--resolve pins a name's addresses instead of asking DNS (as curl's does).\n"

    "Port 0 picks a free port; the first line on stdout says which.\n"
    "--max-lua-memory caps the Lua state (0: no cap; overrides gateway.maxLuaMemoryBytes).\n"
    "An admin address off loopback needs --admin-token, or --admin-insecure to serve it\n"
    "open anyway.\n";

static int level_of(const char *s) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

/* Without $LUPIN_HOME, a binary run from a source tree (build/lupin) uses
 * that tree's lua/ and plugins/. */
static void guess_home(void) {
  if (getenv("LUPIN_HOME")) return;
  char exe[PATH_MAX], probe[PATH_MAX + 32];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = 0;
  for (int up = 0; up < 2; up++) {
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = 0;
  }
  snprintf(probe, sizeof probe, "%s/lua/lupin/runtime.lua", exe);
  if (access(probe, R_OK) == 0) setenv("LUPIN_HOME", exe, 0);
}

static int parse_args(int argc, char **argv, gw_options *o) {
  *o = (gw_options){
      .listen = "127.0.0.1:8080", .admin = "127.0.0.1:9090", .log_level = LUPIN_LOG_INFO};
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    const char **dst = !strcmp(a, "--config")           ? &o->config
                       : !strcmp(a, "--listen")         ? &o->listen
                       : !strcmp(a, "--admin")          ? &o->admin
                       : !strcmp(a, "--admin-token")    ? &o->admin_token
                       : !strcmp(a, "--endpoints")      ? &o->endpoints_file
                       : !strcmp(a, "--max-lua-memory") ? &o->max_lua_memory
                                                        : NULL;
    if (!strcmp(a, "--no-watch")) {
      o->no_watch = 1;
      continue;
    }
    if (!strcmp(a, "--admin-insecure")) {
      o->admin_insecure = 1;
      continue;
    }
    if (!strcmp(a, "--resolve") && v && strchr(v, '=') && o->n_resolve < 16) {
      o->resolve[o->n_resolve++] = v;
    } else if (!strcmp(a, "--log-level") && v && level_of(v) >= 0) {
      o->log_level = level_of(v);
    } else if (!dst || !v) {
      fprintf(stderr, "lupin: bad argument %s\n\n%s", a, usage);
      return -1;
    } else {
      *dst = v;
    }
    i++;
  }
  if (!o->config) {
    fprintf(stderr, "lupin: --config FILE is required\n\n%s", usage);
    return -1;
  }
  return 0;
}

static void count_endpoint(void *ud, const lupin_endpoint_desc *d) {
  (void)d;
  (*(size_t *)ud)++;
}

static int check(const gw_options *o) {
  char err[2048];
  lupin_options ro = {.log_level = LUPIN_LOG_WARN};
  lupin_runtime *rt = lupin_runtime_new(&ro, err, sizeof err);
  size_t n = 0;
  int rc = !rt || lupin_runtime_load(rt, o->config, err, sizeof err) ||
           gw_lua_endpoints(rt, o->endpoints_file, count_endpoint, &n, err, sizeof err);
  if (rc)
    fprintf(stderr, "lupin check: %s\n", err);
  else
    printf("%s: ok (%zu endpoints)\n", o->config, n);
  lupin_runtime_free(rt);
  return rc ? 1 : 0;
}

static int serve(const gw_options *o) {
  lupin_gateway gw;
  char err[2048];
  if (gw_open(&gw, o, err, sizeof err)) {
    fprintf(stderr, "lupin serve: %s\n", err);
    gw.exit_code = 1;
  }
  return gw_run(&gw);
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (!strcmp(argv[1], "version")) {
    printf("lupin %s\n", LUPIN_VERSION);
    return 0;
  }
  gw_options o;
  if (strcmp(argv[1], "serve") && strcmp(argv[1], "check")) {
    fprintf(stderr, "lupin: unknown command %s\n\n%s", argv[1], usage);
    return 2;
  }
  if (parse_args(argc, argv, &o)) return 2;
  guess_home();
  return !strcmp(argv[1], "check") ? check(&o) : serve(&o);
}
