#include "data/packing.h"

namespace ul {

void document_layout(const int32_t* tokens, int T, int32_t eot, int32_t* doc, int32_t* pos) {
  int32_t d = 0, start = 0;
  for (int t = 0; t < T; t++) {
    // An EOT at t = 0 opens the window's first document: there is nothing before it to separate.
    if (eot >= 0 && t > 0 && tokens[t] == eot) d++, start = t;
    doc[t] = d;
    pos[t] = t - start;
  }
}

}  // namespace ul
