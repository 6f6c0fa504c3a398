/* Lua patterns with a step limit: string.find, match, gmatch and gsub as the
 * Lua 5.1 manual defines them (and as LuaJIT behaves: a pattern ends at its
 * first "\0", `%g` is a class, `%x` in a replacement is a plain `x`), but
 * checked against the running plugin call's budget as they go.
 *
 * Why our own matcher: the built-in one is a single C call that the budget
 * cannot interrupt, and a backtracking pattern over client text runs for
 * minutes (docs/plugins.md, "Budgets").  Here every LUPIN_STEPS steps of
 * matching read the watchdog's `cut` flag and, when it is set, call
 * budget.lua's trip (guard.c), which grants the grace or throws the cut from
 * this frame exactly as a poll in plugin code would.  Nothing is allocated
 * outside the Lua state while matching, so the throw leaks nothing.
 *
 * The matcher backtracks like the original: each item is tried at a
 * position, a quantifier tries its longest (or shortest) run first, and a
 * failed rest of the pattern makes it give one character back. */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

#include <ctype.h>
#include <string.h>

#include <lauxlib.h>

#define MAX_CAPTURES   32
#define CAP_UNFINISHED (-1)
#define CAP_POSITION   (-2)
#define MAX_DEPTH      200  /* nested items that recurse: `?`, `*`, captures */
#define LUPIN_STEPS    1024 /* matching steps between two reads of the flag */
#define SPECIALS       "^$*+?.([%-"

typedef struct matcher {
  const char *src, *src_end; /* the subject */
  const char *pat_end;       /* the pattern, up to its first "\0" */
  lua_State *L;
  lupin_guard *g;
  int level; /* captures open or closed so far */
  int depth; /* recursion, bounded: a pattern of 100k `a?` would overflow the C stack */
  int left;  /* steps until the flag is read again */
  struct {
    const char *at;
    ptrdiff_t len; /* or CAP_UNFINISHED, CAP_POSITION */
  } cap[MAX_CAPTURES];
} matcher;

/* One step of work: every LUPIN_STEPS of them, the budget is looked at. */
static inline void step(matcher *m) {
  if (--m->left > 0) return;
  m->left = LUPIN_STEPS;
  lupin__guard_poll(m->L, m->g, 0);
}

/* Bytes a replacement appended count too: 256 of them are a step, so a
 * gsub writing a large replacement at every match still looks at the
 * budget every 256 KB it writes. */
static inline void charge(matcher *m, size_t bytes) {
  if (bytes < 256) return;
  m->left -= bytes > ((size_t)LUPIN_STEPS << 8) ? LUPIN_STEPS : (int)(bytes >> 8);
  if (m->left <= 0) step(m);
}

static int class_matches(int c, int cl) {
  int r;
  switch (tolower(cl)) {
  case 'a':
    r = isalpha(c);
    break;
  case 'c':
    r = iscntrl(c);
    break;
  case 'd':
    r = isdigit(c);
    break;
  case 'g':
    r = isgraph(c);
    break;
  case 'l':
    r = islower(c);
    break;
  case 'p':
    r = ispunct(c);
    break;
  case 's':
    r = isspace(c);
    break;
  case 'u':
    r = isupper(c);
    break;
  case 'w':
    r = isalnum(c);
    break;
  case 'x':
    r = isxdigit(c);
    break;
  case 'z':
    r = (c == 0);
    break; /* 5.1's class for "\0" */
  default:
    return cl == c; /* an escaped character stands for itself */
  }
  if (isupper(cl)) return !r; /* %A is the complement of %a */
  return r != 0;
}

/* Whether c is in the set [p .. end], p at '[' and end at its ']'. */
static int set_matches(int c, const char *p, const char *end) {
  int in = 1;
  if (p[1] == '^') {
    in = 0;
    p++;
  }
  while (++p < end) {
    if (*p == '%') {
      p++;
      if (class_matches(c, (unsigned char)*p)) return in;
    } else if (p[1] == '-' && p + 2 < end) {
      p += 2;
      if ((unsigned char)p[-2] <= c && c <= (unsigned char)*p) return in;
    } else if ((unsigned char)*p == c) {
      return in;
    }
  }
  return !in;
}

/* Past the single-character class at p; errors name what is wrong. */
static const char *class_end(matcher *m, const char *p) {
  char c = *p++;
  if (c == '%') {
    if (p >= m->pat_end) luaL_error(m->L, "malformed pattern (ends with '%%')");
    return p + 1;
  }
  if (c == '[') {
    if (*p == '^') p++;
    do { /* the first character may be a ']' of the set */
      if (p >= m->pat_end) luaL_error(m->L, "malformed pattern (missing ']')");
      if (*p++ == '%' && p < m->pat_end) p++;
    } while (*p != ']'); /* *pat_end is the "\0" that ends the pattern */
    return p + 1;
  }
  return p;
}

/* Whether the character at s matches the class [p, ep). */
static int one_matches(matcher *m, const char *s, const char *p, const char *ep) {
  if (s >= m->src_end) return 0;
  int c = (unsigned char)*s;
  switch (*p) {
  case '.':
    return 1;
  case '%':
    return class_matches(c, (unsigned char)p[1]);
  case '[':
    return set_matches(c, p, ep - 1);
  default:
    return (unsigned char)*p == c;
  }
}

static const char *match(matcher *m, const char *s, const char *p);

static const char *balance(matcher *m, const char *s, const char *p) {
  if (p + 1 >= m->pat_end) luaL_error(m->L, "unbalanced pattern (%%b needs two characters)");
  if (s >= m->src_end || *s != *p) return NULL;
  char open = p[0], close = p[1];
  int depth = 1;
  while (++s < m->src_end) {
    step(m);
    if (*s == close) {
      if (--depth == 0) return s + 1;
    } else if (*s == open) {
      depth++;
    }
  }
  return NULL;
}

static const char *max_expand(matcher *m, const char *s, const char *p, const char *ep) {
  ptrdiff_t i = 0;
  while (one_matches(m, s + i, p, ep)) {
    i++;
    step(m);
  }
  for (; i >= 0; i--) { /* the longest run first, then one character less */
    const char *r = match(m, s + i, ep + 1);
    if (r) return r;
  }
  return NULL;
}

static const char *min_expand(matcher *m, const char *s, const char *p, const char *ep) {
  for (;;) {
    const char *r = match(m, s, ep + 1);
    if (r) return r;
    if (!one_matches(m, s, p, ep)) return NULL;
    s++;
  }
}

static const char *open_capture(matcher *m, const char *s, const char *p, ptrdiff_t what) {
  if (m->level >= MAX_CAPTURES) luaL_error(m->L, "too many captures (at most %d)", MAX_CAPTURES);
  m->cap[m->level].at = s;
  m->cap[m->level].len = what;
  m->level++;
  const char *r = match(m, s, p);
  if (!r) m->level--;
  return r;
}

static const char *close_capture(matcher *m, const char *s, const char *p) {
  int l = m->level - 1;
  while (l >= 0 && m->cap[l].len != CAP_UNFINISHED)
    l--;
  if (l < 0) luaL_error(m->L, "invalid pattern capture (a ')' closes no '(')");
  m->cap[l].len = s - m->cap[l].at;
  const char *r = match(m, s, p);
  if (!r) m->cap[l].len = CAP_UNFINISHED;
  return r;
}

static const char *back_reference(matcher *m, const char *s, int digit) {
  int l = digit - '1';
  if (l < 0 || l >= m->level || m->cap[l].len == CAP_UNFINISHED)
    luaL_error(m->L, "invalid capture index %%%d in pattern", l + 1);
  ptrdiff_t len = m->cap[l].len;
  /* a position capture never matches text (as in the original) */
  if (len < 0 || m->src_end - s < len || memcmp(m->cap[l].at, s, (size_t)len)) return NULL;
  return s + len;
}

/* The rest of the pattern after %f[set] at s, or NULL: the set must not
 * hold the character before s and must hold the one at s ("\0" beyond the
 * subject's ends). */
static const char *frontier(matcher *m, const char *s, const char *p) {
  if (p >= m->pat_end || *p != '[') luaL_error(m->L, "missing '[' after '%%f' in pattern");
  const char *ep = class_end(m, p);
  int prev = s == m->src ? 0 : (unsigned char)s[-1];
  int cur = s < m->src_end ? (unsigned char)*s : 0;
  if (set_matches(prev, p, ep - 1) || !set_matches(cur, p, ep - 1)) return NULL;
  return ep;
}

/* One item that is not a capture, an anchor or a %-form: a class with an
 * optional quantifier.  Returns the end of the whole match or NULL; sets
 * *next to continue in the loop of match() without recursing. */
static const char *item(matcher *m, const char *s, const char *p, const char **next_s,
                        const char **next_p) {
  const char *ep = class_end(m, p);
  int ok = one_matches(m, s, p, ep);
  char q = ep < m->pat_end ? *ep : 0;
  switch (q) {
  case '?': {
    const char *r;
    if (ok && (r = match(m, s + 1, ep + 1))) return r;
    *next_s = s, *next_p = ep + 1;
    return NULL;
  }
  case '+':
    return ok ? max_expand(m, s + 1, p, ep) : NULL;
  case '*':
    return max_expand(m, s, p, ep);
  case '-':
    return min_expand(m, s, p, ep);
  default:
    if (!ok) return NULL;
    *next_s = s + 1, *next_p = ep;
    return NULL;
  }
}

static const char *match(matcher *m, const char *s, const char *p) {
  if (++m->depth > MAX_DEPTH)
    luaL_error(m->L, "pattern too complex (nested more than %d deep)", MAX_DEPTH);
  const char *r = NULL;
  for (;;) {
    step(m);
    if (p >= m->pat_end) {
      r = s;
      break;
    }
    if (*p == '(') {
      r = p[1] == ')' ? open_capture(m, s, p + 2, CAP_POSITION)
                      : open_capture(m, s, p + 1, CAP_UNFINISHED);
      break;
    }
    if (*p == ')') {
      r = close_capture(m, s, p + 1);
      break;
    }
    if (*p == '$' && p + 1 == m->pat_end) {
      r = s == m->src_end ? s : NULL;
      break;
    }
    if (*p == '%' && p + 1 < m->pat_end) {
      char c = p[1];
      if (c == 'b') {
        s = balance(m, s, p + 2);
        if (!s) break;
        p += 4;
        continue;
      }
      if (c == 'f') {
        p = frontier(m, s, p + 2);
        if (!p) break;
        continue;
      }
      if (isdigit((unsigned char)c)) {
        s = back_reference(m, s, c);
        if (!s) break;
        p += 2;
        continue;
      }
    }
    const char *ns = NULL, *np = NULL;
    r = item(m, s, p, &ns, &np);
    if (r || !np) break;
    s = ns, p = np;
  }
  m->depth--;
  return r;
}

static void matcher_init(matcher *m, lua_State *L, const char *s, size_t ls, const char *p) {
  m->L = L;
  m->g = lupin__guard_of(L);
  m->src = s;
  m->src_end = s + ls;
  m->pat_end = p + strlen(p); /* as in the original: a pattern ends at "\0" */
  m->level = 0;
  m->depth = 0;
  m->left = LUPIN_STEPS;
}

/* A pattern whose first item is one literal character that must be there
 * (no `*`, `?` or `-` after it): the subject is scanned for it with memchr
 * instead of trying the whole pattern at each position. */
static int first_literal(const matcher *m, const char *p) {
  if (p >= m->pat_end || strchr(SPECIALS, *p) || *p == ')' || *p == '[') return -1;
  char q = p + 1 < m->pat_end ? p[1] : 0;
  if (q == '*' || q == '?' || q == '-') return -1;
  return (unsigned char)*p;
}

/* The next position from s where a match may start. */
static const char *next_start(const matcher *m, const char *s, int lit) {
  if (lit < 0 || s >= m->src_end) return s;
  const char *r = memchr(s, lit, (size_t)(m->src_end - s));
  return r ? r : m->src_end;
}

static void push_capture(matcher *m, int i, const char *s, const char *e) {
  if (i >= m->level) {
    if (i != 0) luaL_error(m->L, "invalid capture index %%%d", i + 1);
    lua_pushlstring(m->L, s, (size_t)(e - s)); /* no captures: the whole match */
    return;
  }
  ptrdiff_t len = m->cap[i].len;
  if (len == CAP_UNFINISHED) luaL_error(m->L, "unfinished capture (a '(' without its ')')");
  if (len == CAP_POSITION)
    lua_pushinteger(m->L, m->cap[i].at - m->src + 1);
  else
    lua_pushlstring(m->L, m->cap[i].at, (size_t)len);
}

/* Pushes the captures (the whole match when there are none, s non-NULL). */
static int push_captures(matcher *m, const char *s, const char *e) {
  int n = m->level == 0 && s ? 1 : m->level;
  luaL_checkstack(m->L, n, "too many captures");
  for (int i = 0; i < n; i++)
    push_capture(m, i, s, e);
  return n;
}

/* 1-based position from a possibly negative one, as the manual says. */
static ptrdiff_t position(lua_Integer pos, size_t len) {
  if (pos < 0) pos += (lua_Integer)len + 1;
  return pos >= 0 ? (ptrdiff_t)pos : 0;
}

/* Plain search, in windows with a look at the budget between them: memmem
 * over hundreds of MB takes longer than a call's budget. */
static const char *plain_find(lua_State *L, const char *s, size_t ls, const char *p, size_t lp) {
  const size_t window = (size_t)1 << 20;
  if (lp == 0) return s;
  if (lp > ls) return NULL;
  lupin_guard *g = lupin__guard_of(L);
  size_t off = 0, last = ls - lp; /* the last start that fits */
  for (;;) {
    size_t starts = last - off + 1 < window ? last - off + 1 : window;
    const char *r = memmem(s + off, starts + lp - 1, p, lp);
    if (r) return r;
    off += starts;
    if (off > last) return NULL;
    lupin__guard_poll(L, g, 0);
  }
}

static int find_aux(lua_State *L, int find) {
  size_t ls, lp;
  const char *s = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checklstring(L, 2, &lp);
  ptrdiff_t init = position(luaL_optinteger(L, 3, 1), ls) - 1;
  if (init < 0) init = 0;
  if ((size_t)init > ls) init = (ptrdiff_t)ls;
  if (find && (lua_toboolean(L, 4) || !strpbrk(p, SPECIALS))) {
    const char *r = plain_find(L, s + init, ls - (size_t)init, p, lp);
    if (!r) {
      lua_pushnil(L);
      return 1;
    }
    lua_pushinteger(L, r - s + 1);
    lua_pushinteger(L, r - s + (ptrdiff_t)lp);
    return 2;
  }
  matcher m;
  matcher_init(&m, L, s, ls, p);
  int anchor = *p == '^';
  if (anchor) p++;
  int lit = anchor ? -1 : first_literal(&m, p);
  const char *at = s + init;
  do {
    at = next_start(&m, at, lit);
    m.level = 0;
    const char *e = match(&m, at, p);
    if (e) {
      if (!find) return push_captures(&m, at, e);
      lua_pushinteger(L, at - s + 1);
      lua_pushinteger(L, e - s);
      return push_captures(&m, NULL, NULL) + 2;
    }
  } while (at++ < m.src_end && !anchor);
  lua_pushnil(L);
  return 1;
}

static int l_find(lua_State *L) { return find_aux(L, 1); }
static int l_match(lua_State *L) { return find_aux(L, 0); }

/* The iterator of gmatch; upvalues: the guard, subject, pattern, next start.
 * As in 5.1, `^` is an ordinary character here. */
static int gmatch_next(lua_State *L) {
  size_t ls;
  const char *s = lua_tolstring(L, lua_upvalueindex(2), &ls);
  const char *p = lua_tostring(L, lua_upvalueindex(3));
  matcher m;
  matcher_init(&m, L, s, ls, p);
  int lit = first_literal(&m, p);
  for (const char *at = s + lua_tointeger(L, lua_upvalueindex(4)); at <= m.src_end; at++) {
    at = next_start(&m, at, lit);
    m.level = 0;
    const char *e = match(&m, at, p);
    if (e) {
      lua_Integer next = e - s;
      if (e == at) next++; /* an empty match: move on at least one character */
      lua_pushinteger(L, next);
      lua_replace(L, lua_upvalueindex(4));
      return push_captures(&m, at, e);
    }
  }
  return 0;
}

static int l_gmatch(lua_State *L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_pushinteger(L, 0);
  lua_pushcclosure(L, gmatch_next, 4);
  return 1;
}

/* A replacement string: %0-%9 name captures, `%` before any other character
 * stands for that character (5.1), a `%` at the end for "\0" (LuaJIT). */
static size_t add_string(matcher *m, luaL_Buffer *b, const char *s, const char *e) {
  size_t l, added = 0;
  const char *r = lua_tolstring(m->L, 3, &l);
  for (size_t i = 0; i < l; i++) {
    if (r[i] != '%') {
      luaL_addchar(b, r[i]);
      added++;
      continue;
    }
    char c = ++i < l ? r[i] : 0;
    if (!isdigit((unsigned char)c)) {
      luaL_addchar(b, c);
      added++;
    } else if (c == '0') {
      luaL_addlstring(b, s, (size_t)(e - s));
      added += (size_t)(e - s);
    } else {
      push_capture(m, c - '1', s, e);
      added += lua_objlen(m->L, -1);
      luaL_addvalue(b);
    }
  }
  return added;
}

/* A replacement by table or function.  The call may recurse into gsub
 * again: the C stack is checked first (guard.c). */
static size_t add_value(matcher *m, luaL_Buffer *b, const char *s, const char *e, int kind) {
  lua_State *L = m->L;
  lupin__guard_stack_check(L, m->g);
  if (kind == LUA_TFUNCTION) {
    lua_pushvalue(L, 3);
    int n = push_captures(m, s, e);
    lua_call(L, n, 1);
  } else {
    push_capture(m, 0, s, e);
    lua_gettable(L, 3);
  }
  if (!lua_toboolean(L, -1)) { /* nil or false: the match stays */
    lua_pop(L, 1);
    lua_pushlstring(L, s, (size_t)(e - s));
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  }
  size_t added = lua_objlen(L, -1);
  luaL_addvalue(b);
  return added;
}

static int l_gsub(lua_State *L) {
  size_t ls;
  const char *src = luaL_checklstring(L, 1, &ls);
  const char *p = luaL_checkstring(L, 2);
  int kind = lua_type(L, 3);
  lua_Integer max_n = luaL_optinteger(L, 4, (lua_Integer)ls + 1);
  luaL_argcheck(
      L, kind == LUA_TNUMBER || kind == LUA_TSTRING || kind == LUA_TFUNCTION || kind == LUA_TTABLE,
      3, "string/function/table expected");
  matcher m;
  matcher_init(&m, L, src, ls, p);
  int anchor = *p == '^';
  if (anchor) p++;
  int lit = anchor ? -1 : first_literal(&m, p);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  const char *s = src;
  lua_Integer n = 0;
  while (n < max_n) {
    const char *at = next_start(&m, s, lit);
    if (at > s) { /* no match can start before `at`: copy that stretch as is */
      luaL_addlstring(&b, s, (size_t)(at - s));
      s = at;
    }
    m.level = 0;
    const char *e = match(&m, s, p);
    if (e) {
      n++;
      int called = kind == LUA_TFUNCTION || kind == LUA_TTABLE;
      charge(&m, called ? add_value(&m, &b, s, e, kind) : add_string(&m, &b, s, e));
    }
    if (e && e > s)
      s = e;
    else if (s < m.src_end)
      luaL_addchar(&b, *s++);
    else
      break;
    if (anchor) break;
  }
  luaL_addlstring(&b, s, (size_t)(m.src_end - s));
  luaL_pushresult(&b);
  lua_pushinteger(L, n);
  return 2;
}

void lupin__pattern_register(lua_State *L, int guard) {
  static const luaL_Reg fns[] = {
      {"find", l_find}, {"match", l_match}, {"gmatch", l_gmatch}, {"gsub", l_gsub}, {NULL, NULL}};
  for (const luaL_Reg *f = fns; f->name; f++) {
    lua_pushvalue(L, guard);
    lua_pushcclosure(L, f->func, 1);
    lua_setfield(L, -2, f->name);
  }
}
