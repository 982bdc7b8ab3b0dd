// Whether a sequence of `length` tokens runs with a model on a group of `ranks` ranks: the one
// statement of the rule, which every command checks before any work and generation's prefill
// lengths obey (model/generate.h prefill_length). The zigzag layout must admit the length
// (parallel/layout.h SequenceLayout::check_length: 2P equal segments for P > 1), and a model with GDN
// heads (ModelConfig::has_gdn_heads) needs every segment to hold the conv halo, K − 1 tokens
// (parallel/gdn_scan.h conv_halo_fits). A rank's layout of the sequence: parallel/layout.h group_layout.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"

namespace hydra {

bool sequence_length_fits(const ModelConfig& config, int64_t length, int ranks);
// The same as a check: a UserError naming the length, the ranks and lengths that would run; `where`
// prefixes the message ("calibration prompt 3: ").
void check_sequence_length(const ModelConfig& config, int64_t length, int ranks, const std::string& where = "");

}  // namespace hydra
