#include "engine/context.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace ul {

// Guards' contexts, oldest first; g_ctx caches the back (ctx() is called by every op).
static thread_local std::vector<Context*> g_stack;
static thread_local Context* g_ctx = nullptr;

Context* ctx_or_null() { return g_ctx; }

void push_ctx(Context* c) {
  g_stack.push_back(c);
  g_ctx = c;
}

void pop_ctx(Context* c) {
  const auto it = std::find(g_stack.rbegin(), g_stack.rend(), c);
  if (it != g_stack.rend()) g_stack.erase(std::next(it).base());
  g_ctx = g_stack.empty() ? nullptr : g_stack.back();
}

Context& ctx() {
  if (!g_ctx) throw std::runtime_error("no ulysses context on this thread (make a Context and a ContextGuard)");
  return *g_ctx;
}

}  // namespace ul
