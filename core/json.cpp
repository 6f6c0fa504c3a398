/* Request bodies decoded by simdjson (Debian's libsimdjson-dev) into Lua
 * values, for lua/lupin/runtime/json.lua.  lua-cjson reads a string a byte at a time
 * and was most of a lifecycle's time on long prompts (docs/performance.md);
 * simdjson validates and unescapes with SIMD instructions.
 *
 * It is a fast path, not a second parser with its own rules: a text
 * simdjson refuses, nests deeper than lua-cjson's limit or may hold -0 (which
 * simdjson reads as 0) returns nothing, and the caller hands it to lua-cjson,
 * whose verdict and message stand.
 * What simdjson accepts decodes to what lua-cjson makes of it: objects and
 * arrays as plain tables, null as cjson.null (a NULL light userdata), every
 * number a Lua number.
 *
 * C++ behind one C entry point, lupin__json_open (internal.h).  The parser, with the buffers it
 * grows, belongs to the Lua state that opened the module (a userdata freed
 * with it): one per runtime, nothing shared between workers. */
#include <lua.hpp>
#include <simdjson.h>
#include <utf8proc.h>

#include <cstring>
#include <new>

namespace {

/* lua-cjson's default decode_max_depth: deeper texts go to it to be refused */
constexpr int MAX_DEPTH = 1000;
/* Bodies past this parse with a parser of their own, freed after: the kept
 * parser's buffers stay the size of an ordinary request. */
constexpr size_t KEPT_CAPACITY = 64 * 1024;

const char *const PARSER_MT = "lupin.json.parser";

struct kept_parser {
  simdjson::dom::parser *p;
};

/* What a walk over the document saw that the values alone do not tell. */
struct walk {
  bool zero; /* an integer 0: simdjson reads -0 as 0, lua-cjson as -0.0 */
};

bool push(lua_State *L, simdjson::dom::element e, int depth, walk *w);

bool push_object(lua_State *L, simdjson::dom::object o, int depth, walk *w) {
  lua_createtable(L, 0, (int)o.size());
  for (simdjson::dom::key_value_pair f : o) {
    lua_pushlstring(L, f.key.data(), f.key.size());
    if (!push(L, f.value, depth + 1, w)) return false;
    lua_rawset(L, -3);
  }
  return true;
}

bool push_array(lua_State *L, simdjson::dom::array a, int depth, walk *w) {
  lua_createtable(L, (int)a.size(), 0);
  int i = 1;
  for (simdjson::dom::element v : a) {
    if (!push(L, v, depth + 1, w)) return false;
    lua_rawseti(L, -2, i++);
  }
  return true;
}

/* Pushes e (and what it holds); false, with the stack left to the caller to
 * reset, when the text nests deeper than lua-cjson allows. */
bool push(lua_State *L, simdjson::dom::element e, int depth, walk *w) {
  if (depth > MAX_DEPTH) return false;
  luaL_checkstack(L, 3, "JSON nesting");
  switch (e.type()) {
  case simdjson::dom::element_type::OBJECT:
    return push_object(L, e.get_object().value_unsafe(), depth, w);
  case simdjson::dom::element_type::ARRAY:
    return push_array(L, e.get_array().value_unsafe(), depth, w);
  case simdjson::dom::element_type::STRING: {
    std::string_view s = e.get_string().value_unsafe();
    lua_pushlstring(L, s.data(), s.size());
    return true;
  }
  case simdjson::dom::element_type::INT64: {
    int64_t v = e.get_int64().value_unsafe();
    w->zero = w->zero || v == 0;
    lua_pushnumber(L, (lua_Number)v);
    return true;
  }
  case simdjson::dom::element_type::UINT64:
    lua_pushnumber(L, (lua_Number)e.get_uint64().value_unsafe());
    return true;
  case simdjson::dom::element_type::DOUBLE:
    lua_pushnumber(L, e.get_double().value_unsafe());
    return true;
  case simdjson::dom::element_type::BOOL:
    lua_pushboolean(L, e.get_bool().value_unsafe());
    return true;
  case simdjson::dom::element_type::NULL_VALUE:
    lua_pushlightuserdata(L, nullptr); /* cjson.null */
    return true;
  }
  return false;
}

/* Whether the text may hold the number -0: a "-0" not followed by more of a
 * number.  Inside a string it only sends the text to lua-cjson. */
bool negative_zero(const char *text, size_t len) {
  const char *end = text + len, *p = text;
  while ((p = static_cast<const char *>(memmem(p, (size_t)(end - p), "-0", 2)))) {
    p += 2;
    if (p == end || !strchr("0123456789.eE", *p)) return true;
  }
  return false;
}

/* The offset of the first byte of s that is not UTF-8 (utf8proc decides:
 * no overlong forms, no surrogates, nothing past U+10FFFF), -1 if none. */
long long utf8_invalid_at(const char *s, size_t len) {
  const unsigned char *p = reinterpret_cast<const unsigned char *>(s);
  for (size_t i = 0; i < len;) {
    uint64_t w; /* ASCII is most of a body: eight bytes at a time, no call */
    if (len - i >= 8 && (memcpy(&w, p + i, 8), !(w & 0x8080808080808080ull))) {
      i += 8;
      continue;
    }
    if (p[i] < 0x80) {
      i++;
      continue;
    }
    utf8proc_int32_t cp;
    size_t left = len - i;
    utf8proc_ssize_t n = utf8proc_iterate(p + i, (utf8proc_ssize_t)(left < 4 ? left : 4), &cp);
    if (n <= 0) return (long long)i;
    i += (size_t)n;
  }
  return -1;
}

/* Nothing, or where the text stops being UTF-8: for a text simdjson
 * refused.  simdjson validates UTF-8 as it parses, so a text it takes is
 * UTF-8 and only a refused one is scanned, in the same terms. */
int refused(lua_State *L, const char *text, size_t len) {
  long long bad = utf8_invalid_at(text, len);
  if (bad < 0) return 0;
  lua_pushnil(L);
  lua_pushnumber(L, (lua_Number)bad);
  return 2;
}

/* Decodes with p; pushes the value and returns 1, or returns what refused
 * pushes. */
int decode_with(lua_State *L, simdjson::dom::parser &p, const char *text, size_t len) {
  simdjson::dom::element root;
  if (p.parse(text, len, true).get(root)) return refused(L, text, len);
  int top = lua_gettop(L);
  walk w = {false};
  if (push(L, root, 1, &w) && !(w.zero && negative_zero(text, len))) return 1;
  lua_settop(L, top);
  return 0;
}

/* decode(text) or decode(pointer, length) (a body in the host's memory,
 * core/request.c): the value; or nothing when simdjson refuses the text,
 * and nil and the offset of its first byte that is not UTF-8 when it is
 * not. */
int decode(lua_State *L) {
  size_t len;
  const char *text;
  if (lua_islightuserdata(L, 1)) {
    text = static_cast<const char *>(lua_touserdata(L, 1));
    len = static_cast<size_t>(luaL_checkinteger(L, 2));
  } else {
    text = luaL_checklstring(L, 1, &len);
  }
  if (len > KEPT_CAPACITY) {
    simdjson::dom::parser once;
    return decode_with(L, once, text, len);
  }
  auto *kept = static_cast<kept_parser *>(lua_touserdata(L, lua_upvalueindex(1)));
  return decode_with(L, *kept->p, text, len);
}

int free_parser(lua_State *L) {
  auto *kept = static_cast<kept_parser *>(luaL_checkudata(L, 1, PARSER_MT));
  delete kept->p;
  kept->p = nullptr;
  return 0;
}

} // namespace

extern "C" int lupin__json_open(lua_State *L) {
  auto *kept = static_cast<kept_parser *>(lua_newuserdata(L, sizeof(kept_parser)));
  kept->p = new (std::nothrow) simdjson::dom::parser();
  if (!kept->p) return luaL_error(L, "lupin.json: out of memory");
  if (luaL_newmetatable(L, PARSER_MT)) {
    lua_pushcfunction(L, free_parser);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  lua_createtable(L, 0, 1);
  lua_insert(L, -2);
  lua_pushcclosure(L, decode, 1);
  lua_setfield(L, -2, "decode");
  return 1;
}
