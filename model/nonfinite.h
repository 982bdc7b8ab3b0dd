// NaN and Inf: refused in the weights once at load, located in the forward when they appear.
//
// A checkpoint with a NaN weight used to run to the end and print `null` (forward's NLL), accuracy 0
// (eval-niah) or write γ = NaN into a student (convert --calib). Now:
//  - check_finite_parameters() runs on every checkpoint read (read_model_checkpoint), a UserError
//    naming the first tensor and element; `--allow-nonfinite` lets such a checkpoint load (a NaN
//    in an embedding row no input uses is harmless);
//  - a command that gets a non-finite result (a loss, a log-probability, a logit, a γ) calls
//    fail_nonfinite(), which runs the forward once more checking every stage (embedding, each
//    layer's output, the final norm, the logits) on every rank and reports the first stage where a
//    non-finite value appears, with the rank and global position. The extra forward happens only on
//    this error path, so a healthy run pays nothing.
#pragma once

#include <span>
#include <string>

#include "model/model.h"

namespace hydra {

// UserError "SOURCE: tensor 'NAME' holds NaN/Inf (first at element I of N)" for the first such tensor.
void check_finite_parameters(const NamedTensors& params, const std::string& source);

// Collective over `comm` (the model's communicator; `ids` the whole sequence, identical on every
// rank). "the output of layer 3 (first on rank 1, position 37)", "the embedding (...)", ..., or
// "" when every stage is finite.
std::string locate_nonfinite(const Model& model, Communicator& comm, std::span<const int32_t> ids);
// Throws, on every rank, a UserError "WHAT not finite (NaN or Inf): the first non-finite value
// appears in <locate_nonfinite>; ...". Collective.
[[noreturn]] void fail_nonfinite(const Model& model, Communicator& comm, std::span<const int32_t> ids,
                                 const std::string& what);

}  // namespace hydra
