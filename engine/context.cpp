#include "engine/context.h"

#include <stdexcept>

namespace ul {

static thread_local Context* g_ctx = nullptr;

Context* ctx_or_null() { return g_ctx; }
void set_ctx(Context* c) { g_ctx = c; }
Context& ctx() {
  if (!g_ctx) throw std::runtime_error("no ulysses context on this thread (make a Context and a ContextGuard)");
  return *g_ctx;
}

}  // namespace ul
