// The CPU reference of the embedding ops (embedding_reference.cpp), called by their entry points
// (embedding.cpp) for host tensors once shapes are checked: same arguments and results as the ops of
// embedding.h. Internal to kernels/embedding/.
#pragma once

#include "kernels/embedding/embedding.h"

namespace hydra::ops::reference {

void embedding(const TensorView& out, const TensorView& table, const TensorView& ids);
void embedding_backward(const TensorView& d_table, const TensorView& d_out, const TensorView& ids);

}  // namespace hydra::ops::reference
