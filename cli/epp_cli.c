/* `lupin epp`: the gateway as an endpoint picker (gateway/epp/, docs/epp.md):
 * Envoy's ext_proc on --grpc-port, gRPC health on --grpc-health-port,
 * /metrics on --metrics-port.  Its flags are the EPP's where they mean the
 * same, in either form (--flag value, --flag=value), so its Deployment
 * swaps in for the EPP's. */
#include "cli.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char gw_epp_usage[] =
    "usage: lupin epp (--config-file FILE | --config-text TEXT)\n"
    "                 [--endpoints FILE | --pool-name NAME [--pool-namespace NS]\n"
    "                  [--pool-group GROUP] [--kubeconfig FILE]]\n"
    "                 [--grpc-port 9002] [--grpc-health-port 9003] [--metrics-port 9090]\n"
    "                 [--bind-address 0.0.0.0] [--admin-token TOKEN] [--admin-insecure]\n"
    "                 [--log-level error|warn|info|debug] [--log-format text|json]\n"
    "                 [--no-watch] [--max-lua-memory BYTES[k|m|g]] [--secure-serving=false]\n"
    "\n"
    "The endpoint picker of an InferencePool, as the Gateway API Inference Extension's\n"
    "EPP is: a gRPC server of envoy.service.ext_proc.v3.ExternalProcessor/Process that\n"
    "answers each request with the picked endpoints (x-gateway-destination-endpoint,\n"
    "header and envoy.lb metadata) or a refusal (ImmediateResponse), and gRPC health\n"
    "(services liveness, readiness, envoy.service.ext_proc.v3.ExternalProcessor).\n"
    "The config is an EndpointPickerConfig (YAML or JSON) as lupin serve reads it;\n"
    "--config-text gives it inline.  Endpoints come from the InferencePool --pool-name\n"
    "(its pods, listed and watched through the Kubernetes API: in-cluster, or\n"
    "--kubeconfig), from --endpoints FILE (watched), or from the config.\n"
    "/metrics, /healthz and /readyz on the metrics port are open; the admin API there\n"
    "needs --admin-token off loopback.  Port 0 picks a free port; the first line on\n"
    "stdout says which.  ext_proc is served in plaintext: --secure-serving=false is\n"
    "accepted, TLS is not yet (docs/epp-compatibility.md).  One event loop.\n";

static int level_of(const char *s) {
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; i < 4; i++)
    if (!strcmp(s, names[i])) return i;
  return -1;
}

typedef struct epp_args {
  gw_options o;
  const char *config_text, *bind, *grpc_port, *health_port, *metrics_port;
  const char *log_level, *log_format, *secure_serving, *workers;
  char grpc[128], health[128], admin[128], config_dir[4096], config_file[4200];
} epp_args;

static int port_ok(const char *flag, const char *v) {
  char *end;
  long p = strtol(v, &end, 10);
  if (*v && !*end && p >= 0 && p <= 65535) return 1;
  fprintf(stderr, "lupin epp: %s %s: give a port number from 0 to 65535\n", flag, v);
  return 0;
}

/* Where a flag's value goes; NULL: no such flag. */
static const char **slot(epp_args *a, const char *flag) {
  static const struct {
    const char *flag;
    size_t at;
  } flags[] = {
      {"--config-file", offsetof(epp_args, o.config)},
      {"--config-text", offsetof(epp_args, config_text)},
      {"--endpoints", offsetof(epp_args, o.endpoints_file)},
      {"--pool-name", offsetof(epp_args, o.k8s_pool)},
      {"--pool-namespace", offsetof(epp_args, o.k8s_namespace)},
      {"--pool-group", offsetof(epp_args, o.k8s_group)},
      {"--kubeconfig", offsetof(epp_args, o.kubeconfig)},
      {"--grpc-port", offsetof(epp_args, grpc_port)},
      {"--grpc-health-port", offsetof(epp_args, health_port)},
      {"--metrics-port", offsetof(epp_args, metrics_port)},
      {"--bind-address", offsetof(epp_args, bind)},
      {"--admin-token", offsetof(epp_args, o.admin_token)},
      {"--max-lua-memory", offsetof(epp_args, o.max_lua_memory)},
      {"--log-level", offsetof(epp_args, log_level)},
      {"--log-format", offsetof(epp_args, log_format)},
      {"--secure-serving", offsetof(epp_args, secure_serving)},
      {"--workers", offsetof(epp_args, workers)},
  };
  for (size_t k = 0; k < sizeof flags / sizeof *flags; k++)
    if (!strcmp(flag, flags[k].flag)) return (const char **)((char *)a + flags[k].at);
  return NULL;
}

static int parse(int argc, char **argv, epp_args *a) {
  for (int i = 2; i < argc; i++) {
    if (!strcmp(argv[i], "--no-watch")) {
      a->o.no_watch = 1;
      continue;
    }
    if (!strcmp(argv[i], "--admin-insecure")) {
      a->o.admin_insecure = 1;
      continue;
    }
    char flag[64];
    const char *eq = strchr(argv[i], '=');
    snprintf(flag, sizeof flag, "%.*s", eq ? (int)(eq - argv[i]) : (int)strlen(argv[i]), argv[i]);
    const char **dst = slot(a, flag);
    const char *v = !dst ? NULL : eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "lupin epp: bad argument %s\n\n%s", argv[i], gw_epp_usage);
      return -1;
    }
    i += !eq;
    *dst = v;
  }
  return 0;
}

/* The values that are words, not strings to pass on. */
static int read_words(epp_args *a) {
  if (a->log_level && (a->o.log_level = level_of(a->log_level)) < 0) {
    fprintf(stderr, "lupin epp: --log-level %s: give error, warn, info or debug\n", a->log_level);
    return -1;
  }
  if (a->log_format && strcmp(a->log_format, "text") && strcmp(a->log_format, "json")) {
    fprintf(stderr, "lupin epp: --log-format %s: give text or json\n", a->log_format);
    return -1;
  }
  a->o.log_json = a->log_format && !strcmp(a->log_format, "json");
  if (a->secure_serving && strcmp(a->secure_serving, "false")) {
    fprintf(stderr,
            "lupin epp: --secure-serving %s: lupin epp serves ext_proc in plaintext for now; "
            "pass --secure-serving=false (docs/epp-compatibility.md)\n",
            a->secure_serving);
    return -1;
  }
  if (a->workers && strcmp(a->workers, "1") && strcmp(a->workers, "auto"))
    fprintf(stderr, "lupin epp: --workers %s: lupin epp runs one event loop\n", a->workers);
  return 0;
}

/* --config-text: written to a file the runtime loads like any other, in
 * a directory of its own ($TMPDIR, else /tmp), removed at exit. */
static int config_from_text(epp_args *a) {
  const char *tmp = getenv("TMPDIR");
  snprintf(a->config_dir, sizeof a->config_dir, "%s/lupin-epp-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  size_t len = strlen(a->config_text);
  FILE *f = NULL;
  if (mkdtemp(a->config_dir)) {
    snprintf(a->config_file, sizeof a->config_file, "%s/config.yaml", a->config_dir);
    f = fopen(a->config_file, "w");
  }
  if (!f || fwrite(a->config_text, 1, len, f) != len || fclose(f)) {
    fprintf(stderr, "lupin epp: --config-text: cannot write it under %s\n", a->config_dir);
    return -1;
  }
  a->o.config = a->config_file;
  a->o.no_watch = 1;
  return 0;
}

static int check_args(epp_args *a) {
  if (!a->o.config == !a->config_text) {
    fprintf(stderr, "lupin epp: give one of --config-file FILE and --config-text TEXT\n\n%s",
            gw_epp_usage);
    return -1;
  }
  if (a->o.k8s_pool && a->o.endpoints_file) {
    fprintf(stderr, "lupin epp: give one of --pool-name and --endpoints: both name the pool\n");
    return -1;
  }
  if (!a->o.k8s_pool && (a->o.k8s_namespace || a->o.k8s_group || a->o.kubeconfig)) {
    fprintf(stderr, "lupin epp: --pool-namespace, --pool-group and --kubeconfig go with "
                    "--pool-name\n");
    return -1;
  }
  if (!port_ok("--grpc-port", a->grpc_port) || !port_ok("--grpc-health-port", a->health_port) ||
      !port_ok("--metrics-port", a->metrics_port))
    return -1;
  const char *fmt = strchr(a->bind, ':') ? "[%s]:%s" : "%s:%s";
  snprintf(a->grpc, sizeof a->grpc, fmt, a->bind, a->grpc_port);
  snprintf(a->health, sizeof a->health, fmt, a->bind, a->health_port);
  snprintf(a->admin, sizeof a->admin, fmt, a->bind, a->metrics_port);
  a->o.grpc = a->grpc;
  a->o.grpc_health = a->health;
  a->o.admin = a->admin;
  return a->config_text ? config_from_text(a) : 0;
}

int gw_epp_main(int argc, char **argv) {
  for (int i = 2; i < argc; i++)
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      fputs(gw_epp_usage, stdout);
      return GW_EXIT_OK;
    }
  epp_args a = {.o = {.log_level = LUPIN_LOG_INFO, .metrics_open = 1},
                .bind = "0.0.0.0",
                .grpc_port = "9002",
                .health_port = "9003",
                .metrics_port = "9090"};
  if (parse(argc, argv, &a) || read_words(&a) || check_args(&a)) return GW_EXIT_USAGE;
  lupin_gateway gw;
  char err[2048];
  int rc = gw_open(&gw, &a.o, err, sizeof err);
  if (rc) {
    char msg[2200];
    snprintf(msg, sizeof msg, "lupin epp: %s%s", rc == -1 ? "not starting: " : "", err);
    lh_log_line(a.o.log_json, LUPIN_LOG_ERROR, msg);
    gw.exit_code = rc == -1 ? GW_EXIT_CONFIG : GW_EXIT_START;
  }
  rc = gw_run(&gw);
  if (*a.config_file) {
    unlink(a.config_file);
    rmdir(a.config_dir);
  }
  return rc;
}
