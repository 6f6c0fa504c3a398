/* The `lupin` command: `lupin serve` runs the gateway, `lupin check`
 * validates a config and its plugins without serving, `lupin test` runs
 * plugin specs (cli/test.c). */
#include "cli.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: lupin [-h | --help] [-V | --version] COMMAND [OPTIONS]\n"
    "\n"
    "commands:\n"
    "  serve    run the gateway (lupin serve --help)\n"
    "  epp      run as an InferencePool's endpoint picker, over ext_proc (lupin epp --help)\n"
    "  check    load a config as a reload would, without serving (lupin check --help)\n"
    "  explain  schedule one request offline and show why (lupin explain --help)\n"
    "  test     run plugin specs with busted and lupin.testing (lupin test --help)\n"
    "  version  print the version\n"
    "  help     print this text (help serve, epp, check, explain, test: theirs)\n"
    "\n"
    "exit status: 0 ok, 1 config, plugin or endpoints rejected (test: a spec failed),\n"
    "2 usage error (explain: or a bad request file), 3 serve could not start\n"
    "(address in use, ...; test: no busted), 4 requests cut at drainTimeoutMs.\n"
    "See lupin(1).\n";

static const char serve_usage[] =
    "usage: lupin serve --config FILE [--listen 127.0.0.1:8080] [--admin 127.0.0.1:9090]\n"
    "                   [--admin-token TOKEN] [--endpoints FILE] [--no-watch]\n"
    "                   [--log-level error|warn|info|debug] [--log-format text|json]\n"
    "                   [--resolve NAME=ADDR[,ADDR...]]... [--max-lua-memory BYTES[k|m|g]]\n"
    "                   [--admin-insecure] [--workers N|auto] [--redis HOST:PORT]\n"
    "                   [--k8s-pool NAME [--pool-namespace NS] [--pool-group GROUP]\n"
    "                    [--kubeconfig FILE]]\n"
    "\n"
    "The config is an EndpointPickerConfig (JSON or YAML) with two lupin extensions:\n"
    "\"endpoints\" (a list of {name, address, port, labels}) and \"gateway\" (limits,\n"
    "timeouts, the metrics refresh interval; see README.md).  --endpoints names a file\n"
    "holding the same list, watched and re-read on change; it replaces the config's\n"
    "endpoints.  The config is checked as `lupin check` does (a dry scheduling cycle\n"
    "over the endpoints included): serve refuses to start when that fails (exit 1).\n"
    "The config file and the plugin directories are watched: a change reloads\n"
    "(debounced; --no-watch turns it off).  SIGHUP and POST /admin/reload reload.\n"
    "An endpoint's host name stands for all its addresses, tried in order;\n"
    "--resolve pins a name's addresses instead of asking DNS (as curl's does).\n"
    "Port 0 picks a free port; the first line on stdout says which.  The access log\n"
    "goes to stdout (JSON lines), diagnostics to stderr (--log-format).\n"
    "--max-lua-memory caps the Lua state (0: no cap; overrides gateway.maxLuaMemoryBytes).\n"
    "--workers runs N event loops, each a thread with its own runtime, sharing the\n"
    "endpoints, their in-flight counts and the prefix indexes (auto: one per core;\n"
    "overrides gateway.workers; docs/workers.md).\n"
    "--redis shares the prefix indexes with other replicas through Redis at HOST:PORT\n"
    "(turns the replicas section on and overrides its address; docs/replicas.md).\n"
    "An admin address off loopback needs --admin-token, or --admin-insecure to serve it\n"
    "open anyway.\n"
    "--k8s-pool reads the endpoints from the Kubernetes InferencePool NAME instead: one\n"
    "per Ready pod it selects and target port (named as the pod, POD-PORT with several\n"
    "ports; the pod's labels), kept in step with a watch.  --pool-namespace (default:\n"
    "the in-cluster namespace, else the kubeconfig context's, else default),\n"
    "--pool-group (inference.networking.k8s.io, v1; inference.networking.x-k8s.io:\n"
    "v1alpha2), --kubeconfig (default: $KUBECONFIG, else in-cluster, else\n"
    "~/.kube/config).  /readyz says why while the pool is not read (docs/gateway.md).\n";

static const char check_usage[] =
    "usage: lupin check --config FILE [--endpoints FILE] [--format text|json]\n"
    "                   [--log-format text|json]\n"
    "\n"
    "Does what a reload does, without serving: reads and checks the config (JSON or\n"
    "YAML), loads and instantiates every plugin, runs init, then one dry scheduling\n"
    "cycle over the config's endpoints (or those of --endpoints; one placeholder\n"
    "endpoint when there are none).  Exit 0 when all of it passed, 1 with the error\n"
    "(file:line: path: message) when not.  --format json prints one JSON object:\n"
    "{\"ok\", \"config\", \"endpoints\", \"digest\"} or {\"ok\": false, \"error\", \"file\",\n"
    "\"line\", \"path\", \"message\"}.\n";

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
  snprintf(probe, sizeof probe, "%s/lua/lupin/runtime/init.lua", exe);
  if (access(probe, R_OK) == 0) setenv("LUPIN_HOME", exe, 0);
}

static int is_help(const char *a) { return !strcmp(a, "-h") || !strcmp(a, "--help"); }

static int is_version(const char *a) { return !strcmp(a, "-V") || !strcmp(a, "--version"); }

/* 0: parsed; 1: help printed; -1: a usage error (printed). */
static int parse_args(int argc, char **argv, gw_options *o, const char **format) {
  const char *cmd = argv[1], *help = !strcmp(cmd, "check") ? check_usage : serve_usage;
  *o = (gw_options){
      .listen = "127.0.0.1:8080", .admin = "127.0.0.1:9090", .log_level = LUPIN_LOG_INFO};
  for (int i = 2; i < argc; i++)
    if (is_help(argv[i])) {
      fputs(help, stdout);
      return 1;
    }
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    const char **dst = !strcmp(a, "--config")           ? &o->config
                       : !strcmp(a, "--listen")         ? &o->listen
                       : !strcmp(a, "--admin")          ? &o->admin
                       : !strcmp(a, "--admin-token")    ? &o->admin_token
                       : !strcmp(a, "--endpoints")      ? &o->endpoints_file
                       : !strcmp(a, "--max-lua-memory") ? &o->max_lua_memory
                       : !strcmp(a, "--workers")        ? &o->workers
                       : !strcmp(a, "--redis")          ? &o->redis
                       : !strcmp(a, "--k8s-pool")       ? &o->k8s_pool
                       : !strcmp(a, "--pool-namespace") ? &o->k8s_namespace
                       : !strcmp(a, "--pool-group")     ? &o->k8s_group
                       : !strcmp(a, "--kubeconfig")     ? &o->kubeconfig
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
    } else if (!strcmp(a, "--log-format") && v && (!strcmp(v, "text") || !strcmp(v, "json"))) {
      o->log_json = !strcmp(v, "json");
    } else if (!strcmp(a, "--format") && !strcmp(cmd, "check") && v &&
               (!strcmp(v, "text") || !strcmp(v, "json"))) {
      *format = v;
    } else if (!strcmp(a, "--workers") && v && strcmp(v, "auto") &&
               (atoi(v) < 1 || atoi(v) > 256 || strspn(v, "0123456789") != strlen(v))) {
      fprintf(stderr, "lupin %s: --workers %s: give a number of workers from 1 to 256, or auto\n",
              cmd, v);
      return -1;
    } else if (!dst || !v) {
      fprintf(stderr, "lupin %s: bad argument %s\n\n%s", cmd, a, help);
      return -1;
    } else {
      *dst = v;
    }
    i++;
  }
  if (!o->config) {
    fprintf(stderr, "lupin %s: --config FILE is required\n\n%s", cmd, help);
    return -1;
  }
  if (o->k8s_pool && (o->endpoints_file || !strcmp(cmd, "check"))) {
    fprintf(stderr, "lupin %s: --k8s-pool %s\n\n%s", cmd,
            o->endpoints_file ? "and --endpoints: give one source of endpoints"
                              : "is for lupin serve",
            help);
    return -1;
  }
  if (!o->k8s_pool && (o->k8s_namespace || o->k8s_group || o->kubeconfig)) {
    fprintf(stderr, "lupin %s: --pool-namespace, --pool-group and --kubeconfig need --k8s-pool\n",
            cmd);
    return -1;
  }
  return 0;
}

/* --- lupin check ---------------------------------------------------------- */

typedef struct check_run {
  const gw_options *o;
  lupin_runtime *rt;
  size_t n;
  int failed;
  char digest[32];
  char err[2048];
} check_run;

static void check_log(void *ud, int level, const char *msg) {
  lh_log_line(((const check_run *)ud)->o->log_json, level, msg);
}

static void check_upsert(void *ud, const lupin_endpoint_desc *d) {
  check_run *c = ud;
  c->n++;
  if (!c->failed && lupin_endpoint_upsert(c->rt, d, c->err, sizeof c->err)) c->failed = 1;
}

static void check_digest(void *ud, const lupin_generation_info *g) {
  if (g->current)
    snprintf(((check_run *)ud)->digest, sizeof((check_run *)ud)->digest, "%s", g->digest);
}

/* The reload path, step by step, over the endpoints the config names. */
static int check_run_all(check_run *c) {
  const gw_options *o = c->o;
  lupin_options ro = {.log = check_log, .log_ud = c, .log_level = LUPIN_LOG_WARN};
  c->rt = lupin_runtime_new(&ro, c->err, sizeof c->err);
  if (!c->rt || gw_settings_declare(c->rt, c->err, sizeof c->err) ||
      lupin_runtime_load(c->rt, o->config, c->err, sizeof c->err) ||
      lupin_runtime_read_endpoints(c->rt, o->endpoints_file, check_upsert, c, c->err,
                                   sizeof c->err) ||
      c->failed)
    return -1;
  if (!c->n) { /* nothing to schedule over would make the cycle vacuous */
    lupin_endpoint_desc none = {"check-placeholder", "127.0.0.1", 1, NULL, 0};
    check_upsert(c, &none);
    c->n = 0;
  }
  if (c->failed || lupin_runtime_dry_run(c->rt, c->err, sizeof c->err)) return -1;
  lupin_runtime_generations(c->rt, check_digest, c);
  return 0;
}

/* Splits "file:line: path: message" (lua/lupin/config/init.lua) for --format json. */
static void check_json_error(lh_buf *b, const char *err) {
  const char *p = err, *colon;
  while ((colon = strchr(p, ':')) && !(colon[1] >= '0' && colon[1] <= '9'))
    p = colon + 1;
  char *end;
  long line = colon ? strtol(colon + 1, &end, 10) : 0;
  if (!colon || strncmp(end, ": ", 2)) {
    lh_buf_append(b, ",\"message\":", 11);
    lh_buf_json(b, err);
    return;
  }
  char file[1024], path[512] = "";
  snprintf(file, sizeof file, "%.*s", (int)(colon - err), err);
  const char *msg = end + 2;
  size_t n = strspn(msg, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.[]-");
  if (n && !strncmp(msg + n, ": ", 2) && n < sizeof path) {
    snprintf(path, sizeof path, "%.*s", (int)n, msg);
    msg += n + 2;
  }
  lh_buf_printf(b, ",\"file\":");
  lh_buf_json(b, file);
  lh_buf_printf(b, ",\"line\":%ld,\"path\":", line);
  lh_buf_json(b, path);
  lh_buf_printf(b, ",\"message\":");
  lh_buf_json(b, msg);
}

static int check(const gw_options *o, const char *format) {
  check_run c = {.o = o};
  int rc = check_run_all(&c);
  lupin_pool pool = {0}; /* the file's InferencePool: where the endpoints come from */
  int has_pool = !rc && lupin_runtime_config_pool(c.rt, NULL, NULL, &pool, NULL, 0) == 1;
  if (format && !strcmp(format, "json")) {
    lh_buf b = {0};
    lh_buf_printf(&b, "{\"ok\":%s,\"config\":", rc ? "false" : "true");
    lh_buf_json(&b, o->config);
    if (rc) {
      lh_buf_printf(&b, ",\"error\":");
      lh_buf_json(&b, c.err);
      check_json_error(&b, c.err);
    } else {
      lh_buf_printf(&b, ",\"endpoints\":%zu,\"digest\":\"%s\"", c.n, c.digest);
      if (has_pool) {
        lh_buf_printf(&b, ",\"pool\":{\"name\":");
        lh_buf_json(&b, pool.name);
        lh_buf_printf(&b, ",\"selector\":");
        lh_buf_json(&b, pool.selector);
        lh_buf_printf(&b, ",\"ports\":[");
        for (int i = 0; i < pool.n_ports; i++)
          lh_buf_printf(&b, "%s%d", i ? "," : "", pool.ports[i]);
        lh_buf_printf(&b, "],\"at\":");
        lh_buf_json(&b, pool.where);
        lh_buf_printf(&b, "}");
      } else if (!c.n) {
        lh_buf_printf(&b, ",\"warnings\":[\"no endpoints: every request would get 503\"]");
      }
    }
    lh_buf_append(&b, "}\n", 2);
    if (b.data) fputs(b.data, stdout);
    lh_buf_free(&b);
  } else if (rc) {
    fprintf(stderr, "lupin check: %s\n", c.err);
  } else {
    printf("%s: ok (%zu endpoints)\n", o->config, c.n);
    if (has_pool)
      printf("%s: InferencePool %s selects %s, port %d%s (%s): with --k8s-pool, its pods are "
             "the endpoints\n",
             o->config, *pool.name ? pool.name : "(the chart's)", pool.selector, pool.ports[0],
             pool.n_ports > 1 ? " and more" : "", pool.where);
  }
  if (!rc && !c.n && !has_pool) /* serving it would answer every request 503 */
    fprintf(stderr,
            "lupin check: warning: %s lists no endpoints: every request would get 503"
            " (no endpoint)\n",
            o->endpoints_file ? o->endpoints_file : o->config);
  lupin_runtime_free(c.rt);
  return rc ? GW_EXIT_CONFIG : GW_EXIT_OK;
}

static int serve(const gw_options *o) {
  lupin_gateway gw;
  char err[2048];
  int rc = gw_open(&gw, o, err, sizeof err);
  if (rc) {
    char msg[2200];
    snprintf(msg, sizeof msg, "lupin serve: %s%s", rc == -1 ? "not starting: " : "", err);
    lh_log_line(o->log_json, LUPIN_LOG_ERROR, msg);
    gw.exit_code = rc == -1 ? GW_EXIT_CONFIG : GW_EXIT_START;
  }
  return gw_run(&gw);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fputs(usage, stderr);
    return GW_EXIT_USAGE;
  }
  if (is_help(argv[1]) || !strcmp(argv[1], "help")) {
    const char *topic = argc > 2 ? argv[2] : "";
    fputs(!strcmp(topic, "serve")     ? serve_usage
          : !strcmp(topic, "check")   ? check_usage
          : !strcmp(topic, "test")    ? gw_test_usage
          : !strcmp(topic, "epp")     ? gw_epp_usage
          : !strcmp(topic, "explain") ? gw_explain_usage
                                      : usage,
          stdout);
    return GW_EXIT_OK;
  }
  if (is_version(argv[1]) || !strcmp(argv[1], "version")) {
    printf("lupin %s\n", LUPIN_VERSION);
    return GW_EXIT_OK;
  }
  if (!strcmp(argv[1], "explain")) { /* explain_cli.c */
    guess_home();
    return gw_explain_main(argc, argv);
  }
  if (!strcmp(argv[1], "epp")) { /* epp_cli.c */
    guess_home();
    return gw_epp_main(argc, argv);
  }
  if (!strcmp(argv[1], "test")) {
    guess_home();
    return gw_test_main(argc, argv);
  }
  gw_options o;
  if (strcmp(argv[1], "serve") && strcmp(argv[1], "check")) {
    fprintf(stderr, "lupin: unknown command %s\n\n%s", argv[1], usage);
    return GW_EXIT_USAGE;
  }
  const char *format = NULL;
  int parsed = parse_args(argc, argv, &o, &format);
  if (parsed) return parsed > 0 ? GW_EXIT_OK : GW_EXIT_USAGE;
  guess_home();
  return !strcmp(argv[1], "check") ? check(&o, format) : serve(&o);
}
