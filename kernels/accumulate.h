// Whether an op's output is overwritten or added to. Backward passes accumulate gradients: a
// weight's gradient sums over tokens, micro-batches and ring steps, a residual-stream gradient over
// the branches that read it.
#pragma once

namespace hydra::ops {

enum class Accumulate { no, yes };

}  // namespace hydra::ops
