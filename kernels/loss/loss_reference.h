// The CPU reference of the loss ops (loss_reference.cpp), called by their entry points (loss.cpp) for
// host tensors once shapes are checked: same arguments and results as the ops of loss.h. Internal to
// kernels/loss/.
#pragma once

#include "kernels/loss/loss.h"

namespace hydra::ops::reference {

void cross_entropy_with_grad(const TensorView& logits, const TensorView& row_loss, const TensorView& targets,
                             float grad_scale, const TensorView& grad);
void kl_divergence_with_grad(const TensorView& student_logits, const TensorView& row_loss,
                             const TensorView& teacher_logits, float grad_scale, const TensorView& grad,
                             const TensorView& targets);
void squared_error_with_grad(const TensorView& d_a, const TensorView& row_loss, const TensorView& a,
                             const TensorView& b, float grad_scale);

}  // namespace hydra::ops::reference
