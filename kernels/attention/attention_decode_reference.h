// The CPU reference of the decode-step attention ops (attention_decode_reference.cpp), called by their
// entry points (attention_decode.cpp) for host tensors once shapes are checked: same arguments and
// results as the ops of attention_decode.h. Internal to kernels/attention/.
#pragma once

#include "kernels/attention/attention_decode.h"

namespace hydra::ops::reference {

void attention_decode(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k_cache,
                      const TensorView& v_cache, const TensorView& slots, const TensorView& lengths,
                      int64_t max_length, const TensorView& q_positions, const AttentionParams& params);
void kv_cache_append(const TensorView& k_cache, const TensorView& v_cache, const TensorView& k_new,
                     const TensorView& v_new, const TensorView& slots, const TensorView& rows);

}  // namespace hydra::ops::reference
