#include "model/train/objective.h"

#include <algorithm>

#include "kernels/elementwise/elementwise.h"
#include "kernels/loss/loss.h"
#include "kernels/matmul/matmul.h"
#include "kernels/row_sum/row_sum.h"
#include "runtime/memory_timeline.h"

namespace hydra::train {
namespace {

double sum_on_host(const TensorView& values) {
  const Tensor host = to(values, Device::host, DType::f64, {MemoryPart::workspaces, "row losses read back"});
  if (host.is_meta()) return 0;  // a memory plan's shape-only run: nothing to add
  double s = 0;
  for (int64_t i = 0; i < host.numel(); ++i) s += host.data_as<double>()[i];
  return s;
}

// The chunk walk shared by the logit heads: logits of rows [r0, r0 + n) into `logits`, `to_grad`
// writes their gradient into `grad` (the GEMM operand: bf16 on the GPU, the logits themselves on the
// CPU) and the rows' losses, which are added into `sums` [2] f64 on the device (Σ all rows, Σ the rows
// `answer` marks; ops::add_row_sums), then the gradient flows into d_hidden and lm_head. No host read.
template <class ToGrad>
void walk_logit_chunks(const Model& model, const TensorView& hidden, const TensorView& d_hidden, ModelTensors& grads,
                       const TensorView& sums, const TensorView& answer, ToGrad&& to_grad) {
  const int64_t t = hidden.size(0);
  // The chunk's shapes (model/layer_buffers.h); each allocation names its buffer for the memory plans.
  const LossBuffers b = loss_buffers(model.config(), t, model.dtype(), model.acc_dtype());
  const int64_t chunk = b.logits.shape[0];
  Tensor logits = b.logits.empty(model.device(), {MemoryPart::workspaces, "logits"});
  Tensor row_loss = b.row_loss.empty(model.device(), {MemoryPart::workspaces, "row losses"});
  // The gradient as a GEMM operand in the weights' dtype (bf16 on the GPU); on the CPU it is the same buffer.
  const bool backward = d_hidden.defined() || grads.lm_head.defined();
  Tensor operand = !backward || model.dtype() == model.acc_dtype()
                       ? logits
                       : b.operand.empty(model.device(), {MemoryPart::workspaces, "logit gradient operand"});
  for (int64_t r0 = 0; r0 < t; r0 += chunk) {
    const int64_t n = std::min(chunk, t - r0);
    const TensorView lg = logits.view().narrow(0, 0, n), rl = row_loss.view().narrow(0, 0, n);
    const TensorView h = hidden.narrow(0, r0, n);
    model.lm_head(lg, h);
    const TensorView op = operand.view().narrow(0, 0, n);
    to_grad(lg, rl, r0, n, op);
    ops::add_row_sums(sums, rl, answer.defined() ? answer.narrow(0, r0, n) : TensorView());
    if (backward) {
      ops::linear_backward(d_hidden.defined() ? d_hidden.narrow(0, r0, n) : TensorView(), grads.lm_head.view(), op, h,
                           model.lm_head_weight());
    }
  }
}

// A head's loss sums on the device, read back once: its accumulator [2] f64 and the answer marks
// [T_loc] i32 on the model's device (undefined when none are marked).
struct HostHeadSums {
  Tensor sums, answer;
  HostHeadSums(const Model& model, std::span<const uint8_t> flags) {
    sums = Tensor::zeros({2}, DType::f64, model.device(), {MemoryPart::workspaces, "loss sums"});
    if (flags.empty()) return;
    Tensor marks = Tensor::empty({static_cast<int64_t>(flags.size())}, DType::i32, Device::host);
    for (size_t i = 0; i < flags.size() && !marks.is_meta(); ++i) marks.data_as<int32_t>()[i] = flags[i] ? 1 : 0;
    answer = to_device(marks, model.device(), {MemoryPart::workspaces, "answer marks"});
  }
  void read_into(LossSums& out) const {
    const Tensor host = to(sums, Device::host, DType::f64, {MemoryPart::workspaces, "loss sums read back"});
    if (host.is_meta()) return;  // a memory plan's shape-only run: nothing to add
    out.loss = host.data_as<double>()[0];
    out.answer_loss = host.data_as<double>()[1];
  }
};

// The cross-entropy chunk walk into `sums` (see walk_logit_chunks) with the gradient scale a host
// value or, `device_scale` defined, a device scalar the loss kernel reads when it runs (on the host:
// when the op runs, i.e. now).
void cross_entropy_chunks(const Model& model, const TensorView& hidden, const TensorView& device_targets,
                          float grad_scale, const TensorView& device_scale, const TensorView& d_hidden,
                          ModelTensors& grads, const TensorView& sums, const TensorView& answer) {
  walk_logit_chunks(model, hidden, d_hidden, grads, sums, answer,
                    [&](const TensorView& lg, const TensorView& rl, int64_t r0, int64_t n, const TensorView& g) {
    ops::cross_entropy_with_grad(lg, rl, device_targets.narrow(0, r0, n), grad_scale, g, device_scale);
  });
}

}  // namespace

LossSums count_targets(const TensorView& host_targets, std::span<const uint8_t> answer) {
  LossSums sums;
  if (host_targets.is_meta()) return sums;  // a memory plan's shape-only run: nothing to count
  HYDRA_ASSERT(host_targets.on_host() && host_targets.dtype() == DType::i32 && host_targets.is_contiguous(),
               "count_targets of {} {} targets", device_name(host_targets.device()), dtype_name(host_targets.dtype()));
  for (int64_t i = 0; i < host_targets.numel(); ++i) {
    if (host_targets.data_as<const int32_t>()[i] < 0) continue;
    ++sums.tokens;
    if (!answer.empty() && answer[static_cast<size_t>(i)]) ++sums.answer_tokens;
  }
  return sums;
}

LossSums cross_entropy_head(const Model& model, const TensorView& hidden, const TensorView& targets,
                            double grad_scale, const TensorView& d_hidden, ModelTensors& grads,
                            std::span<const uint8_t> answer) {
  expect_shape(targets, "targets", {{"T_loc", hidden.size(0)}});
  HYDRA_ASSERT(answer.empty() || static_cast<int64_t>(answer.size()) == hidden.size(0), "answer flags of {} rows for {}",
               answer.size(), hidden.size(0));
  const Tensor host_targets = to(targets, Device::host, DType::i32, "targets on the host");
  LossSums sums = count_targets(host_targets, answer);
  const Tensor device_targets = to_device(host_targets, model.device(), "targets");
  const HostHeadSums acc(model, answer);
  cross_entropy_chunks(model, hidden, device_targets, static_cast<float>(grad_scale), TensorView(), d_hidden, grads,
                       acc.sums, acc.answer);
  acc.read_into(sums);
  return sums;
}

LossSums distillation_head(const Model& student, const Model& teacher, const TensorView& hidden,
                           const TensorView& teacher_hidden, const TensorView& targets, double grad_scale,
                           const TensorView& d_hidden, ModelTensors& grads, std::span<const uint8_t> answer) {
  HYDRA_ASSERT(teacher.config().vocab_size == student.config().vocab_size, "teacher vocabulary {} vs student {}",
               teacher.config().vocab_size, student.config().vocab_size);
  expect_shape(targets, "targets", {{"T_loc", hidden.size(0)}});
  Tensor teacher_logits = loss_buffers(student.config(), hidden.size(0), student.dtype(), student.acc_dtype())
                              .logits.empty(student.device(), {MemoryPart::workspaces, "teacher logits"});
  const Tensor host_targets = to(targets, Device::host, DType::i32, "targets on the host");
  LossSums sums = count_targets(host_targets, answer);
  const Tensor device_targets = to_device(host_targets, student.device(), "targets");
  const HostHeadSums acc(student, answer);
  walk_logit_chunks(student, hidden, d_hidden, grads, acc.sums, acc.answer,
                    [&](const TensorView& lg, const TensorView& rl, int64_t r0, int64_t n, const TensorView& g) {
    const TensorView tl = teacher_logits.view().narrow(0, 0, n);
    teacher.lm_head(tl, teacher_hidden.narrow(0, r0, n));
    ops::kl_divergence_with_grad(lg, rl, tl, static_cast<float>(grad_scale), g, device_targets.view().narrow(0, r0, n));
  });
  acc.read_into(sums);
  return sums;
}

LossSums sequence_gradients(ForwardContext& context, const Model& model, const TokenRows& rows, Objective objective,
                            double grad_scale, ModelTensors* grads, const Model* teacher,
                            const DeviceLossHead* device_head) {
  HYDRA_ASSERT(objective != Objective::distillation || teacher, "distillation without a teacher");
  HYDRA_ASSERT(!device_head || (objective == Objective::cross_entropy && grads), "a device loss head is cross-entropy with gradients");
  const TensorView ids = rows.ids, targets = rows.targets;
  const std::span<const uint8_t> answer = rows.answer;
  const int64_t t = context.sequence().local_length(), D = model.config().hidden_size;
  const int64_t layers = model.config().num_layers;
  Tensor teacher_hidden;
  if (objective == Objective::distillation) {
    memory_stage("teacher forward");
    teacher_hidden = teacher->forward(context, ids);
  }
  if (!grads) {  // evaluation: the loss of a plain forward
    ModelTensors none;
    const Tensor hidden = model.forward(context, ids);
    return objective == Objective::cross_entropy
               ? cross_entropy_head(model, hidden, targets, grad_scale, TensorView(), none, answer)
               : distillation_head(model, *teacher, hidden, teacher_hidden, targets, grad_scale, TensorView(), none,
                                   answer);
  }
  const Tensor positions = model.positions(context.sequence());
  Tensor x = model.embed(ids);
  std::vector<LayerSaved> saved(static_cast<size_t>(layers));
  model.run_layers(context, LayerMode::save, positions, x, saved);
  memory_stage("loss");
  Tensor d_hidden = Tensor::zeros({t, D}, model.acc_dtype(), model.device(), "d_hidden");
  LossSums sums;
  {
    const Tensor hidden = model.final_norm(x);
    if (device_head) {
      expect_shape(targets, "targets", {{"T_loc", t}});
      HYDRA_ASSERT(targets.device() == model.device() && targets.dtype() == DType::i32, "a device loss head's targets are "
                   "i32 on the model's device");
      cross_entropy_chunks(model, hidden, targets, 0.0f, device_head->grad_scale, d_hidden, *grads, device_head->sums,
                           device_head->answer);
    } else if (objective == Objective::cross_entropy) {
      sums = cross_entropy_head(model, hidden, targets, grad_scale, d_hidden, *grads, answer);
    } else {
      sums = distillation_head(model, *teacher, hidden, teacher_hidden, targets, grad_scale, d_hidden, *grads, answer);
    }
  }
  teacher_hidden = Tensor();
  Tensor dx = Tensor::empty({t, D}, model.acc_dtype(), model.device(), "dx");
  model.final_norm_backward(dx, d_hidden, x, *grads);
  d_hidden = Tensor();
  for (int64_t l = layers - 1; l >= 0; --l) {
    model.layer_backward(context, l, positions, saved[static_cast<size_t>(l)], dx, grads->layers[static_cast<size_t>(l)]);
    saved[static_cast<size_t>(l)] = LayerSaved{};  // free as we go: the backward's memory falls layer by layer
  }
  memory_stage("embedding backward");
  model.embed_backward(dx, ids, *grads);
  return sums;
}

LossSums alignment_gradients(ForwardContext& context, const Model& student, const Model& teacher,
                             const TensorView& ids, double grad_scale, ModelTensors* grads,
                             std::vector<double>* layer_loss) {
  const int64_t t = context.sequence().local_length(), D = student.config().hidden_size;
  const int64_t layers = student.config().num_layers;
  HYDRA_ASSERT(teacher.config().num_layers == layers && teacher.config().hidden_size == D,
               "alignment of a {}-layer student with a {}-layer teacher", layers, teacher.config().num_layers);
  const Tensor positions = teacher.positions(context.sequence());
  // The teacher's residual stream at every layer boundary: boundary[l] enters layer l.
  std::vector<Tensor> boundary;
  memory_stage("teacher forward");
  Tensor x = teacher.embed(ids);
  boundary.push_back(clone(x, "teacher boundary"));
  teacher.run_layers(context, LayerMode::forward, positions, x, {},
                     [&](int64_t) { boundary.push_back(clone(x, "teacher boundary")); });
  if (layer_loss) layer_loss->assign(static_cast<size_t>(layers), 0.0);
  LossSums sums;
  sums.tokens = t;
  Tensor d = Tensor::empty({t, D}, student.acc_dtype(), student.device(), "alignment gradient");
  Tensor row_loss = Tensor::empty({t}, student.acc_dtype(), student.device(), {MemoryPart::workspaces, "row losses"});
  for (int64_t l = 0; l < layers; ++l) {
    Tensor y = to(boundary[static_cast<size_t>(l)], student.device(), student.dtype(), "layer input");
    LayerSaved saved;
    student.layer_forward(context, l, positions, y, grads ? &saved : nullptr);
    ops::squared_error_with_grad(d, row_loss, y,
                                 to(boundary[static_cast<size_t>(l) + 1], student.device(), student.dtype(), "layer target"),
                                 static_cast<float>(grad_scale / static_cast<double>(D)));
    const double loss = sum_on_host(row_loss) / static_cast<double>(D);
    sums.loss += loss;
    if (layer_loss) (*layer_loss)[static_cast<size_t>(l)] = loss;
    if (grads) {
      student.layer_backward(context, l, positions, saved, d, grads->layers[static_cast<size_t>(l)],
                             Model::InputGradient::skip);
    }
  }
  return sums;
}

void all_reduce_gradients(Communicator& comm, ModelTensors& grads) {
  if (comm.size() == 1) return;
  grads.for_each([&](const std::string&, Tensor& t) {
    if (t.device() == comm.device()) {
      comm.all_reduce_sum(t);
    } else {
      Tensor staged = to_device(t, comm.device());
      comm.all_reduce_sum(staged);
      copy_into(t, staged);
    }
  });
}

NamedGradients next_token_gradients(Communicator& comm, const Model& model, std::span<const int32_t> ids,
                                    std::span<const uint8_t> counted, std::span<const int64_t> document_starts) {
  const int64_t total = static_cast<int64_t>(ids.size());
  HYDRA_USER_CHECK(total >= 2, "next-token gradients need at least 2 tokens (got {})", total);
  HYDRA_ASSERT(counted.empty() || counted.size() == ids.size(), "loss mask of {} for {} tokens", counted.size(), ids.size());
  const SequenceLayout layout = group_layout(comm, total, {document_starts.begin(), document_starts.end()});
  const std::vector<uint8_t> mask = counted_within_documents(counted, total, document_starts);
  const TokenRows rows = layout.token_rows(ids, {.counted = mask, .answer = {}});  // the last token has no target
  // Every rank knows the whole mask: the global count of counted targets (positions 1..T−1).
  const int64_t count = std::count(mask.begin() + 1, mask.end(), 1);
  ModelTensors grads = model.zeros_like_weights(model.acc_dtype());
  ForwardContext context{comm, layout};
  NamedGradients out;
  out.sums = sequence_gradients(context, model, rows, Objective::cross_entropy,
                                count > 0 ? 1.0 / static_cast<double>(count) : 0.0, &grads);
  all_reduce_gradients(comm, grads);
  Tensor sums = Tensor::empty({2}, DType::f64);
  sums.data_as<double>()[0] = out.sums.loss;
  sums.data_as<double>()[1] = static_cast<double>(out.sums.tokens);
  all_reduce_sum_host(comm, sums);
  out.sums.loss = sums.data_as<double>()[0];
  out.sums.tokens = static_cast<int64_t>(sums.data_as<double>()[1]);
  out.grads = model.unpack(grads);
  return out;
}

}  // namespace hydra::train
