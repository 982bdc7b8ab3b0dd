#include "model/nonfinite.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/log.h"

namespace hydra {
namespace {

// Index of the first non-finite element of `v` (copied to the host as f32 if needed), or −1.
int64_t first_nonfinite(const TensorView& v) {
  const Tensor host =
      v.on_host() && v.dtype() == DType::f32 && v.is_contiguous() ? Tensor() : to(v, Device::host, DType::f32);
  const float* p = host.defined() ? host.data_as<float>() : v.data_as<float>();
  const int64_t n = v.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) return i;
  }
  return -1;
}

}  // namespace

void check_finite_parameters(const NamedTensors& params, const std::string& source) {
  for (const auto& [name, tensor] : params) {
    if (tensor.dtype() != DType::f32 && tensor.dtype() != DType::bf16 && tensor.dtype() != DType::f64) continue;
    const int64_t i = first_nonfinite(tensor);
    HYDRA_USER_CHECK(i < 0,
                     "{}: tensor '{}' holds NaN or Inf (first at element {} of {}); the checkpoint is damaged "
                     "or came from a diverged run (--allow-nonfinite loads it anyway)",
                     source, name, i, tensor.numel());
  }
}

std::string locate_nonfinite(const Model& model, Communicator& comm, std::span<const int32_t> ids) {
  const ModelConfig& c = model.config();
  const SequenceLayout layout = group_layout(comm, static_cast<int64_t>(ids.size()));
  Tensor local = Tensor::empty({layout.local_length()}, DType::i32);
  for (const Segment& s : layout.local_segments()) {
    std::copy_n(ids.begin() + s.start, s.length, local.data_as<int32_t>() + s.local_offset);
  }
  // Stages: 0 the embedding, 1 + l layer l's output, L + 1 the final norm, L + 2 the logits.
  const int64_t none = c.num_layers + 3;
  int64_t stage = none, row = -1;
  const auto check = [&](int64_t s, const TensorView& v, int64_t row_width) {
    if (stage != none) return;
    const int64_t i = first_nonfinite(v);
    if (i >= 0) {
      stage = s;
      row = i / row_width;
    }
  };
  ForwardContext context{.comm = comm, .layout = layout};
  const Tensor positions = model.positions(layout);
  Tensor x = model.embed(local);
  check(0, x, c.hidden_size);
  for (int64_t l = 0; l < c.num_layers; ++l) {  // every rank runs every layer: the collectives match
    model.layer_forward(context, l, positions, x);
    check(1 + l, x, c.hidden_size);
  }
  const Tensor hidden = model.final_norm(x);
  check(c.num_layers + 1, hidden, c.hidden_size);
  const int64_t tile =
      std::max<int64_t>(1, std::min<int64_t>(layout.local_length(), (int64_t{1} << 26) / c.vocab_size));
  Tensor logits = Tensor::empty({tile, c.vocab_size}, DType::f32, model.device());
  for (int64_t r0 = 0; r0 < layout.local_length() && stage == none; r0 += tile) {
    const int64_t n = std::min(tile, layout.local_length() - r0);
    const TensorView out = logits.view().narrow(0, 0, n);
    model.lm_head(out, hidden.view().narrow(0, r0, n));
    check(c.num_layers + 2, out, c.vocab_size);
    if (stage != none) row += r0;
  }
  // The earliest stage over the ranks (ties: the lowest rank), and its global position.
  const std::vector<int64_t> positions_of_rows = layout.local_positions();
  Tensor mine = Tensor::empty({2}, DType::i64);
  mine.data_as<int64_t>()[0] = stage;
  mine.data_as<int64_t>()[1] = stage == none ? -1 : positions_of_rows[static_cast<size_t>(row)];
  Tensor all = Tensor::empty({comm.size(), 2}, DType::i64);
  if (comm.device() == Device::host) {
    comm.all_gather(mine, all);
  } else {
    Tensor d_all = Tensor::empty({comm.size(), 2}, DType::i64, comm.device());
    comm.all_gather(to_device(mine, comm.device()), d_all);
    all = to(d_all, Device::host, DType::i64);
  }
  int best = 0;
  for (int r = 1; r < comm.size(); ++r) {
    if (all.data_as<int64_t>()[2 * r] < all.data_as<int64_t>()[2 * best]) best = r;
  }
  const int64_t s = all.data_as<int64_t>()[2 * best], position = all.data_as<int64_t>()[2 * best + 1];
  if (s == none) return "";
  const std::string where = s == 0                  ? "the embedding"
                            : s <= c.num_layers     ? fmt::format("the output of layer {}", s - 1)
                            : s == c.num_layers + 1 ? std::string("the final norm")
                                                    : std::string("the logits (lm_head)");
  return fmt::format("{} (first on rank {}, position {})", where, best, position);
}

void fail_nonfinite(const Model& model, Communicator& comm, std::span<const int32_t> ids, const std::string& what) {
  const std::string where = locate_nonfinite(model, comm, ids);
  HYDRA_USER_CHECK(!where.empty(),
                   "{} not finite (NaN or Inf), although every stage of the forward is finite on this "
                   "input (an overflow after the logits?)",
                   what);
  HYDRA_USER_FAIL(
      "{} not finite (NaN or Inf): the first non-finite value appears in {}; check that stage's weights "
      "(hydra info --tensors) or the input",
      what, where);
}

}  // namespace hydra
