// Sequence groups: the world cut into world/sp groups of sp consecutive ranks. Each group runs
// one sequence at a time over its ranks (zigzag layout, ring attention); the groups run different
// sequences side by side: data-parallel replicas in training (model/train/trainer.h), whole
// evaluation samples, windows or prompts in eval-niah, eval-lm, generate and select-heads
// (`--sp N` on every one of them). Group g holds world ranks [g·sp, (g+1)·sp), ranked in world
// order, so world rank 0 is rank 0 of group 0.
//
// gather() gives every rank each group's result (a vector of doubles that the group's rank 0
// passes): the way rank 0 of the world collects what the other groups computed, in a fixed order.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "parallel/communicator.h"

namespace hydra {

class SequenceGroups {
 public:
  // sp = 0: one group of every rank. UserError (naming --sp) unless sp divides world.size().
  // Collective over `world` (the split) when there are several groups.
  SequenceGroups(Communicator& world, int sp);
  // The ranks per group --sp N asks for on `ranks` ranks (0: all), checked before any work.
  static int resolve_sp(int sp, int ranks);

  Communicator& world() { return world_; }
  Communicator& sequence() { return *sequence_; }
  int replica() const { return replica_; }     // this rank's group
  int replicas() const { return replicas_; }   // the number of groups
  int sp() const { return sequence_->size(); }
  bool group_lead() const { return sequence_->rank() == 0; }

  // Every group's `mine` (the value passed by the group's rank 0; other ranks' values are ignored),
  // in group order, on every rank. Exact: each element is summed with zeros only. Two small
  // all-reduces over the world. Collective over world().
  std::vector<std::vector<double>> gather(std::span<const double> mine);

 private:
  Communicator& world_;
  std::unique_ptr<Communicator> owned_;
  Communicator* sequence_ = nullptr;
  int replica_ = 0, replicas_ = 1;
};

}  // namespace hydra
