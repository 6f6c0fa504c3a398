/* Where the Kubernetes API server is and who lupin is to it: in-cluster
 * (the service account's token, CA and namespace files, the
 * KUBERNETES_SERVICE_* environment) or a kubeconfig (YAML, read with
 * libyaml) as kubectl reads it: --kubeconfig, else $KUBECONFIG, else
 * in-cluster when its environment is set, else ~/.kube/config. */
#include "endpoints/endpoints.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <yaml.h>

#define SA_DIR   "/var/run/secrets/kubernetes.io/serviceaccount"
#define MAX_FILE (4 << 20) /* no credential file is larger */

/* A whole small file, NUL-terminated; NULL with err. */
static char *slurp(const char *path, size_t *len, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    lh_errf(err, errlen, "cannot read %s: %s", path, strerror(errno));
    return NULL;
  }
  lh_buf b = {0};
  char chunk[8192];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0 && b.len < MAX_FILE)
    lh_buf_append(&b, chunk, n);
  fclose(f);
  lh_buf_append(&b, "", 1);
  if (!b.data) {
    lh_errf(err, errlen, "cannot read %s: out of memory", path);
    return NULL;
  }
  if (len) *len = b.len - 1;
  return b.data;
}

/* Trailing whitespace off (token and namespace files end with a newline). */
static char *trimmed(char *s) {
  if (!s) return NULL;
  size_t n = strlen(s);
  while (n && strchr(" \t\r\n", s[n - 1]))
    s[--n] = 0;
  return s;
}

/* "https://host[:port][/]" or "https://[v6]:port". */
static int parse_server(gw_k8s_config *c, const char *url, char *err, size_t errlen) {
  if (strncmp(url, "https://", 8)) {
    lh_errf(err, errlen, "server %s: lupin speaks to the API server over https:// only", url);
    return -1;
  }
  const char *h = url + 8, *end;
  if (*h == '[') {
    end = strchr(h, ']');
    if (!end) goto bad;
    snprintf(c->host, sizeof c->host, "%.*s", (int)(end - h - 1), h + 1);
    end++;
  } else {
    end = h + strcspn(h, ":/");
    snprintf(c->host, sizeof c->host, "%.*s", (int)(end - h), h);
  }
  c->port = 443;
  if (*end == ':') {
    char *stop;
    long p = strtol(end + 1, &stop, 10);
    if (p < 1 || p > 65535 || (*stop && strcmp(stop, "/"))) goto bad;
    c->port = (int)p;
  } else if (*end && strcmp(end, "/")) {
    goto bad;
  }
  if (*c->host) return 0;
bad:
  lh_errf(err, errlen, "server %s: not https://HOST[:PORT]", url);
  return -1;
}

static int in_cluster(gw_k8s_config *c, char *err, size_t errlen) {
  const char *host = getenv("KUBERNETES_SERVICE_HOST"), *port = getenv("KUBERNETES_SERVICE_PORT");
  char url[300];
  snprintf(c->from, sizeof c->from, "in-cluster (%s)", SA_DIR);
  snprintf(url, sizeof url, strchr(host, ':') ? "https://[%s]:%s" : "https://%s:%s", host,
           port && *port ? port : "443");
  if (parse_server(c, url, err, errlen)) return -1;
  c->token_file = strdup(SA_DIR "/token");
  c->ca = slurp(SA_DIR "/ca.crt", &c->ca_len, err, errlen);
  if (!c->ca) return -1;
  c->ns = trimmed(slurp(SA_DIR "/namespace", NULL, NULL, 0)); /* optional */
  return 0;
}

/* --- kubeconfig ------------------------------------------------------------ */

typedef struct kube_file {
  yaml_document_t doc;
  char dir[4096]; /* relative paths are relative to the file's folder */
} kube_file;

static yaml_node_t *get(kube_file *k, yaml_node_t *map, const char *key) {
  if (!map || map->type != YAML_MAPPING_NODE) return NULL;
  for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
    yaml_node_t *kn = yaml_document_get_node(&k->doc, p->key);
    if (kn && kn->type == YAML_SCALAR_NODE && !strcmp((char *)kn->data.scalar.value, key))
      return yaml_document_get_node(&k->doc, p->value);
  }
  return NULL;
}

static const char *scalar(kube_file *k, yaml_node_t *map, const char *key) {
  yaml_node_t *n = get(k, map, key);
  return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* The entry of a named list (clusters, users, contexts) called name: its
 * inner map (entry[field]). */
static yaml_node_t *named(kube_file *k, const char *list, const char *field, const char *name) {
  yaml_node_t *l = get(k, yaml_document_get_root_node(&k->doc), list);
  if (!l || l->type != YAML_SEQUENCE_NODE || !name) return NULL;
  for (yaml_node_item_t *i = l->data.sequence.items.start; i < l->data.sequence.items.top; i++) {
    yaml_node_t *e = yaml_document_get_node(&k->doc, *i);
    const char *n = scalar(k, e, "name");
    if (n && !strcmp(n, name)) return get(k, e, field);
  }
  return NULL;
}

static char *base64(const char *s, size_t *len, char *err, size_t errlen, const char *what) {
  size_t n = strlen(s);
  unsigned char *out = malloc(n / 4 * 3 + 4);
  int got = out ? EVP_DecodeBlock(out, (const unsigned char *)s, (int)n) : -1;
  if (got < 0) {
    free(out);
    lh_errf(err, errlen, "%s: not base64", what);
    return NULL;
  }
  while (n && s[n - 1] == '=') { /* EVP_DecodeBlock counts the padding's bytes */
    n--;
    got--;
  }
  out[got] = 0;
  *len = (size_t)got;
  return (char *)out;
}

/* A credential given inline (FIELD-data, base64) or as a file (FIELD). */
static int pem(kube_file *k, yaml_node_t *m, const char *field, char **out, size_t *len, char *err,
               size_t errlen) {
  char data[96], path[8192];
  snprintf(data, sizeof data, "%s-data", field);
  const char *inline_ = scalar(k, m, data), *file = scalar(k, m, field);
  if (inline_) return (*out = base64(inline_, len, err, errlen, data)) ? 0 : -1;
  if (!file) return 0;
  snprintf(path, sizeof path, "%s%s", file[0] == '/' ? "" : k->dir, file);
  return (*out = slurp(path, len, err, errlen)) ? 0 : -1;
}

static int load_yaml(kube_file *k, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    lh_errf(err, errlen, "kubeconfig %s: %s", path, strerror(errno));
    return -1;
  }
  yaml_parser_t p;
  yaml_parser_initialize(&p);
  yaml_parser_set_input_file(&p, f);
  int ok = yaml_parser_load(&p, &k->doc);
  if (!ok)
    lh_errf(err, errlen, "kubeconfig %s:%zu: %s", path, p.problem_mark.line + 1,
            p.problem ? p.problem : "not YAML");
  yaml_parser_delete(&p);
  fclose(f);
  if (ok && !yaml_document_get_root_node(&k->doc)) {
    yaml_document_delete(&k->doc);
    lh_errf(err, errlen, "kubeconfig %s: empty", path);
    return -1;
  }
  return ok ? 0 : -1;
}

static int from_kubeconfig(gw_k8s_config *c, kube_file *k, const char *path, char *err,
                           size_t errlen) {
  yaml_node_t *root = yaml_document_get_root_node(&k->doc);
  const char *ctx_name = scalar(k, root, "current-context");
  yaml_node_t *ctx = named(k, "contexts", "context", ctx_name);
  if (!ctx) {
    lh_errf(err, errlen, "kubeconfig %s: no context %s", path, ctx_name ? ctx_name : "(none set)");
    return -1;
  }
  const char *cluster_name = scalar(k, ctx, "cluster"), *user_name = scalar(k, ctx, "user");
  yaml_node_t *cluster = named(k, "clusters", "cluster", cluster_name);
  yaml_node_t *user = named(k, "users", "user", user_name); /* may be absent */
  const char *server = scalar(k, cluster, "server");
  if (!server) {
    lh_errf(err, errlen, "kubeconfig %s: context %s: cluster %s has no server", path, ctx_name,
            cluster_name ? cluster_name : "(none)");
    return -1;
  }
  if (parse_server(c, server, err, errlen)) return -1;
  const char *insecure = scalar(k, cluster, "insecure-skip-tls-verify");
  c->insecure = insecure && !strcmp(insecure, "true");
  const char *ns = scalar(k, ctx, "namespace"), *token = scalar(k, user, "token");
  const char *token_file = scalar(k, user, "tokenFile");
  if (ns) c->ns = strdup(ns);
  if (token) c->token = strdup(token);
  if (token_file) {
    char p[8192];
    snprintf(p, sizeof p, "%s%s", token_file[0] == '/' ? "" : k->dir, token_file);
    c->token_file = strdup(p);
  }
  return pem(k, cluster, "certificate-authority", &c->ca, &c->ca_len, err, errlen) ||
                 pem(k, user, "client-certificate", &c->cert, &c->cert_len, err, errlen) ||
                 pem(k, user, "client-key", &c->key, &c->key_len, err, errlen)
             ? -1
             : 0;
}

static int kubeconfig_file(gw_k8s_config *c, const char *path, char *err, size_t errlen) {
  kube_file k;
  snprintf(c->from, sizeof c->from, "kubeconfig %s", path);
  snprintf(k.dir, sizeof k.dir, "%s", path);
  char *slash = strrchr(k.dir, '/');
  if (slash)
    slash[1] = 0;
  else
    k.dir[0] = 0;
  if (load_yaml(&k, path, err, errlen)) return -1;
  int rc = from_kubeconfig(c, &k, path, err, errlen);
  yaml_document_delete(&k.doc);
  return rc;
}

int gw_k8s_config_load(const char *kubeconfig, gw_k8s_config *c, char *err, size_t errlen) {
  memset(c, 0, sizeof *c);
  const char *env = getenv("KUBECONFIG"), *home = getenv("HOME");
  int rc;
  if (kubeconfig && *kubeconfig) {
    rc = kubeconfig_file(c, kubeconfig, err, errlen);
  } else if (env && *env) { /* a list of files: the first one, as kubectl merges them */
    char first[4096];
    snprintf(first, sizeof first, "%.*s", (int)strcspn(env, ":"), env);
    rc = kubeconfig_file(c, first, err, errlen);
  } else if (getenv("KUBERNETES_SERVICE_HOST") && *getenv("KUBERNETES_SERVICE_HOST")) {
    rc = in_cluster(c, err, errlen);
  } else {
    char path[4096];
    snprintf(path, sizeof path, "%s/.kube/config", home ? home : "");
    rc = kubeconfig_file(c, path, err, errlen);
  }
  if (rc) gw_k8s_config_free(c);
  return rc;
}

void gw_k8s_config_free(gw_k8s_config *c) {
  free(c->ca);
  free(c->token);
  free(c->token_file);
  free(c->cert);
  free(c->key);
  free(c->ns);
  c->ca = c->token = c->token_file = c->cert = c->key = c->ns = NULL;
}

char *gw_k8s_config_token(const gw_k8s_config *c, char *err, size_t errlen) {
  if (c->token_file) return trimmed(slurp(c->token_file, NULL, err, errlen));
  return c->token ? strdup(c->token) : NULL;
}
