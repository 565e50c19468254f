// What the backward pass tells whoever reduces gradients: which of them are
// final. Backward visits the parameters in decreasing buffer offset (the
// last layer first; shared embeddings, stored first, last), so one number
// says it all.
#pragma once

#include <cstddef>

namespace mpiformer {

class GradientListener {
 public:
  virtual ~GradientListener() = default;
  // grads[offset, count) will not change again in this pass. Offsets only
  // decrease within a pass; the last call of a pass is offset 0.
  virtual void gradients_final(size_t offset) = 0;
};

}  // namespace mpiformer
