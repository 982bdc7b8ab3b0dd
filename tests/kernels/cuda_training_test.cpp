// The GPU training kernels (chunked losses, AdamW, the gradient's sum of squares) against their CPU
// references on the same fp32 inputs (bf16-rounded where the device reads bf16). NaN/Inf are
// checked first (expect_close). Tolerances, max |err| / max |ref|:
//  - cross-entropy and KL: row losses 1e-5 (CE; fp32 statistics, the reference's may be fp64) and
//    1e-4 (KL, a sum of 151936 signed terms); gradients 1e-5 (p in fp32 via expf, a few ulp);
//  - squared error: loss 1e-5 (fp32 sum over D), fp32 gradient 1e-6 (one product per element),
//    bf16 gradient 1e-2 (output rounding);
//  - AdamW: master, m, v 1e-6 (fp32 arithmetic in the same order; FMA contraction moves the last
//    bit); the bf16 weight copy 1e-2 (a master value at a rounding boundary may round either way);
//  - sum of squares: 1e-10 relative — fp64 sums of exact fp64 squares in another order (an fp32
//    accumulation would be off by ~1e-7).
//  - the loss head's device sums (row_sum): 1e-12 relative to the host's sequential fp64 sum (a fixed
//    tree of fp64 sums of fp32 values), and the same bits twice;
//  - the gradient scaled at run time (the loss kernel reading the scale from a device scalar, both
//    cross-entropy kernels): the same bits as the scale passed by value, bf16 and fp32 (what makes the
//    training step's CUDA graph equal to the eager step).
// Losses, AdamW and the sum of squares must also give the same bits in two runs.
// Without a GPU every test here reports SKIPPED.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/adamw/adamw.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/loss/loss.h"
#include "kernels/row_sum/row_sum.h"
#include "kernels/small_rows.h"
#include "tests/common/test_util.h"
#include "tests/kernels/device_update_check.h"

namespace hydra::test {
namespace {


void expect_same_bits(const TensorView& a, const TensorView& b, const std::string& what) {
  const Tensor ha = host(a), hb = host(b);
  ASSERT_EQ(ha.numel(), hb.numel()) << what;
  EXPECT_EQ(std::memcmp(ha.data(), hb.data(), ha.nbytes()), 0) << what << ": two runs differ";
}

// Adds `offset` to every entry of row `row` of a host fp32 matrix.
void shift_row(Tensor& m, int64_t row, float offset) {
  float* r = m.data_as<float>() + row * m.size(1);
  for (int64_t i = 0; i < m.size(1); ++i) r[i] += offset;
}

struct LossCase {
  int64_t rows, vocab, pad;  // pad > 0: the logits are columns [1, 1 + V) of a [rows, V + pad] buffer
};
const LossCase kLossCases[] = {{5, 151936, 0}, {37, 1001, 0}, {6, 4099, 5}};

std::string describe(const LossCase& c) {
  return "rows=" + std::to_string(c.rows) + " V=" + std::to_string(c.vocab) + (c.pad > 0 ? " (unaligned view)" : "");
}
TensorView logits_of(const TensorView& buffer, const LossCase& c) {
  return buffer.narrow(1, c.pad > 0 ? 1 : 0, c.vocab);
}

// The gradient in the logits' columns, and the buffer's other columns untouched (bit for bit).
void expect_gradient(const TensorView& device_buffer, const TensorView& ref, const TensorView& original,
                     const LossCase& c, const std::string& what) {
  const Tensor h = host(device_buffer);
  expect_close(logits_of(h, c), logits_of(ref, c), 1e-5, what + " gradient");
  if (c.pad == 0) return;
  expect_close(h.view().narrow(1, 0, 1), original.narrow(1, 0, 1), 0.0, what + " column before the view");
  expect_close(h.view().narrow(1, c.vocab + 1, c.pad - 1), original.narrow(1, c.vocab + 1, c.pad - 1), 0.0,
               what + " columns after the view");
}

// What both cross-entropy kernels owe beyond the values (given `loss1`, `g1`: a first run in place
// over the fp32 logits of `buffer`'s copy): a second run gives the same bits, and the gradient
// written into a separate bf16 operand (the training loss head's path) leaves the same row losses,
// the fp32 gradient rounded, and the logits as they were.
void expect_repeatable_and_operand_form(const TensorView& buffer, const LossCase& c, const TensorView& targets,
                                        float scale, const Tensor& loss1, const Tensor& g1, const std::string& what) {
  Tensor g2 = gpu(buffer, DType::f32), loss2 = Tensor::empty({c.rows}, DType::f32, Device::cuda);
  ops::cross_entropy_with_grad(logits_of(g2, c), loss2, targets, scale);
  expect_same_bits(loss1, loss2, what + " row loss");
  expect_same_bits(g1, g2, what + " gradient");
  Tensor g3 = gpu(buffer, DType::f32), loss3 = Tensor::empty({c.rows}, DType::f32, Device::cuda);
  Tensor op = Tensor::empty({c.rows, c.vocab}, DType::bf16, Device::cuda);
  ops::cross_entropy_with_grad(logits_of(g3, c), loss3, targets, scale, op);
  expect_same_bits(loss3, loss1, what + " row loss with a bf16 gradient");
  expect_close(host(op), logits_of(host(g1), c), 1e-2, what + " bf16 gradient");
  expect_close(host(g3), buffer, 0.0, what + " logits untouched");
}

TEST(CudaTraining, CrossEntropy) {
  HYDRA_REQUIRE_GPU();
  for (const LossCase& c : kLossCases) {
    const std::string what = "cross-entropy " + describe(c);
    Tensor buffer = random_tensor({c.rows, c.vocab + c.pad}, 100, 3.0f);
    shift_row(buffer, 1, 1000.0f);  // large logits: the max must be subtracted
    Tensor targets = Tensor::empty({c.rows}, DType::i32);
    for (int64_t i = 0; i < c.rows; ++i) targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7919) % c.vocab);
    targets.data_as<int32_t>()[2] = -1;  // ignored: loss 0, gradient 0
    const float scale = 0.25f;
    Tensor ref = clone(buffer), loss_ref = Tensor::empty({c.rows}, DType::f32);
    ops::cross_entropy_with_grad(logits_of(ref, c), loss_ref, targets, scale);
    const Tensor gtargets = to_device(targets, Device::cuda);
    Tensor g1 = gpu(buffer, DType::f32), loss1 = Tensor::empty({c.rows}, DType::f32, Device::cuda);
    ops::cross_entropy_with_grad(logits_of(g1, c), loss1, gtargets, scale);
    expect_close(host(loss1), loss_ref, 1e-5, what + " row loss");
    expect_gradient(g1, ref, buffer, c, what);
    EXPECT_EQ(host(loss1).data_as<float>()[2], 0.0f) << what << ": ignored row";
    expect_repeatable_and_operand_form(buffer, c, gtargets, scale, loss1, g1, what);
  }
}

// The small-vocabulary cross-entropy (HYDRA_SMALL_ROWS=1, kernels/small_rows.h: a warp a row for
// V ≤ 2048) against the CPU reference with CrossEntropy's bounds, and against the default block
// kernel (row losses and gradients within 1e-5: the same formulas, sums in another order). Shapes:
// qwen3-synth's step (16384 rows of 512 logits), row counts that leave the last CTA's 8 warps
// part-empty, V not a multiple of 4 or 32 (the scalar tail of a lane's chunk), V < 32, V = 2048
// (16 chunks a lane) on an unaligned view (scalar loads, the same chunks), and V = 2049 (the block
// kernel: the small path declines). Masked rows (target −1), targets at 0 and V − 1, a row of
// large logits.
TEST(CudaTraining, CrossEntropySmallVocab) {
  HYDRA_REQUIRE_GPU();
  const LossCase cases[] = {{16384, 512, 0}, {37, 1001, 0}, {6, 2048, 5}, {19, 31, 0}, {9, 130, 3}, {13, 2047, 0},
                            {8, 2049, 0}};
  for (const LossCase& c : cases) {
    const std::string what = "small-vocab cross-entropy " + describe(c);
    Tensor buffer = random_tensor({c.rows, c.vocab + c.pad}, 130, 3.0f);
    shift_row(buffer, 1, 1000.0f);
    Tensor targets = Tensor::empty({c.rows}, DType::i32);
    for (int64_t i = 0; i < c.rows; ++i) targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7919) % c.vocab);
    targets.data_as<int32_t>()[2] = -1;
    targets.data_as<int32_t>()[3] = 0;
    targets.data_as<int32_t>()[4] = static_cast<int32_t>(c.vocab - 1);
    for (int64_t i = 40; i < c.rows; i += 97) targets.data_as<int32_t>()[i] = -1;
    const float scale = 0.25f;
    Tensor ref = clone(buffer), loss_ref = Tensor::empty({c.rows}, DType::f32);
    ops::cross_entropy_with_grad(logits_of(ref, c), loss_ref, targets, scale);
    const Tensor gtargets = to_device(targets, Device::cuda);
    // The default kernel, for the comparison.
    Tensor g0 = gpu(buffer, DType::f32), loss0 = Tensor::empty({c.rows}, DType::f32, Device::cuda);
    ops::cross_entropy_with_grad(logits_of(g0, c), loss0, gtargets, scale);

    const ops::SmallRowKernelsScope small(true);
    Tensor g1 = gpu(buffer, DType::f32), loss1 = Tensor::empty({c.rows}, DType::f32, Device::cuda);
    ops::cross_entropy_with_grad(logits_of(g1, c), loss1, gtargets, scale);
    expect_close(host(loss1), loss_ref, 1e-5, what + " row loss");
    expect_gradient(g1, ref, buffer, c, what);
    expect_close(host(loss1), host(loss0), 1e-5, what + " row loss vs the block kernel");
    expect_close(logits_of(host(g1), c), logits_of(host(g0), c), 1e-5, what + " gradient vs the block kernel");
    const Tensor l1 = host(loss1);
    for (int64_t i = 2; i < c.rows; i += (i == 2 ? 38 : 97)) {
      EXPECT_EQ(l1.data_as<float>()[i], 0.0f) << what << ": ignored row " << i;
    }
    expect_repeatable_and_operand_form(buffer, c, gtargets, scale, loss1, g1, what);
  }
}

TEST(CudaTraining, KlDivergence) {
  HYDRA_REQUIRE_GPU();
  for (const LossCase& c : kLossCases) {
    const std::string what = "KL " + describe(c);
    Tensor student = random_tensor({c.rows, c.vocab + c.pad}, 110, 3.0f);
    Tensor teacher = clone(student);
    const Tensor noise = random_tensor({c.rows, c.vocab + c.pad}, 111);
    for (int64_t i = 0; i < teacher.numel(); ++i) teacher.data_as<float>()[i] += noise.data_as<float>()[i];
    shift_row(student, 1, 500.0f);  // softmax is shift-invariant: only the max subtraction sees this
    shift_row(teacher, 1, 1000.0f);
    const float scale = 0.5f;
    Tensor ref = clone(student), loss_ref = Tensor::empty({c.rows}, DType::f32);
    ops::kl_divergence_with_grad(logits_of(ref, c), loss_ref, logits_of(teacher, c), scale);
    const Tensor gteacher = gpu(teacher, DType::f32);
    Tensor g1 = gpu(student, DType::f32), g2 = gpu(student, DType::f32);
    Tensor loss1 = Tensor::empty({c.rows}, DType::f32, Device::cuda),
           loss2 = Tensor::empty({c.rows}, DType::f32, Device::cuda);
    ops::kl_divergence_with_grad(logits_of(g1, c), loss1, logits_of(gteacher, c), scale);
    ops::kl_divergence_with_grad(logits_of(g2, c), loss2, logits_of(gteacher, c), scale);
    expect_close(host(loss1), loss_ref, 1e-4, what + " row loss");
    expect_gradient(g1, ref, student, c, what);
    expect_same_bits(loss1, loss2, what + " row loss");
    expect_same_bits(g1, g2, what + " gradient");
    Tensor g3 = gpu(student, DType::f32), loss3 = Tensor::empty({c.rows}, DType::f32, Device::cuda);
    Tensor op = Tensor::empty({c.rows, c.vocab}, DType::bf16, Device::cuda);
    ops::kl_divergence_with_grad(logits_of(g3, c), loss3, logits_of(gteacher, c), scale, op);
    expect_same_bits(loss3, loss1, what + " row loss with a bf16 gradient");
    expect_close(host(op), logits_of(host(g1), c), 1e-2, what + " bf16 gradient");
    expect_close(host(g3), student, 0.0, what + " logits untouched");
  }
}

TEST(CudaTraining, SquaredError) {
  HYDRA_REQUIRE_GPU();
  for (const int64_t dim : {int64_t{2048}, int64_t{130}}) {
    const std::string what = "squared error D=" + std::to_string(dim);
    const int64_t n = 37;
    const float scale = 0.1f;
    const Tensor a = rounded_to_bf16(random_tensor({n, dim}, 120)), b = rounded_to_bf16(random_tensor({n, dim}, 121));
    Tensor da_ref = Tensor::empty({n, dim}, DType::f32), loss_ref = Tensor::empty({n}, DType::f32);
    ops::squared_error_with_grad(da_ref, loss_ref, a, b, scale);
    const Tensor gb = gpu(b);
    // bf16 a and b, fp32 gradient.
    Tensor gda = Tensor::empty({n, dim}, DType::f32, Device::cuda),
           gloss = Tensor::empty({n}, DType::f32, Device::cuda);
    ops::squared_error_with_grad(gda, gloss, gpu(a), gb, scale);
    expect_close(host(gloss), loss_ref, 1e-5, what + " row loss");
    expect_close(host(gda), da_ref, 1e-6, what + " gradient fp32");
    // bf16 gradient written over a.
    Tensor ga = gpu(a);
    ops::squared_error_with_grad(ga, gloss, ga, gb, scale);
    expect_close(host(gloss), loss_ref, 1e-5, what + " row loss (gradient over a)");
    expect_close(host(ga), da_ref, 1e-2, what + " gradient bf16 over a");
  }
}

TEST(CudaTraining, AdamW) {
  HYDRA_REQUIRE_GPU();
  const int64_t n = 100003;
  const Tensor master0 = random_tensor({n}, 130);
  Tensor master = clone(master0), m = Tensor::zeros({n}, DType::f32), v = Tensor::zeros({n}, DType::f32);
  Tensor gmaster = gpu(master0, DType::f32), gm = Tensor::zeros({n}, DType::f32, Device::cuda),
         gv = Tensor::zeros({n}, DType::f32, Device::cuda);
  Tensor gweight = Tensor::empty({n}, DType::bf16, Device::cuda);
  ops::AdamWParams p{.lr = 1e-3f, .weight_decay = 0.1f, .grad_scale = 0.5f};
  // Steps 1–3 with a bf16 weight copy, step 4 with the fp32 weight aliasing master, step 5 with a
  // separate fp32 weight copy, which must equal master bit for bit.
  for (int64_t step = 1; step <= 5; ++step) {
    const std::string what = "AdamW step " + std::to_string(step);
    p.step = step;
    const Tensor grad = random_tensor({n}, 130 + static_cast<uint64_t>(step), 0.1f);
    ops::adamw_update(master, m, v, grad, TensorView(), p);
    const Tensor ggrad = gpu(grad, DType::f32);
    Tensor gweight32 = Tensor::empty({n}, DType::f32, Device::cuda);
    const TensorView weight = step <= 3 ? gweight.view() : step == 4 ? gmaster.view() : gweight32.view();
    ops::adamw_update(gmaster, gm, gv, ggrad, weight, p);
    expect_close(host(gmaster), master, 1e-6, what + " master");
    expect_close(host(gm), m, 1e-6, what + " m");
    expect_close(host(gv), v, 1e-6, what + " v");
    if (step <= 3) expect_close(host(gweight), rounded_to_bf16(master), 1e-2, what + " bf16 weight");
    if (step == 5) expect_same_bits(gweight32, gmaster, what + " fp32 weight = master");
  }
  // No weight copy; the same inputs give the same bits.
  Tensor a = gpu(master0, DType::f32), b = gpu(master0, DType::f32);
  Tensor am = Tensor::zeros({n}, DType::f32, Device::cuda), av = Tensor::zeros({n}, DType::f32, Device::cuda);
  Tensor bm = Tensor::zeros({n}, DType::f32, Device::cuda), bv = Tensor::zeros({n}, DType::f32, Device::cuda);
  const Tensor ggrad = gpu(random_tensor({n}, 140), DType::f32);
  p.step = 1;
  ops::adamw_update(a, am, av, ggrad, TensorView(), p);
  ops::adamw_update(b, bm, bv, ggrad, TensorView(), p);
  expect_same_bits(a, b, "AdamW master");
}

// The list form (the optimizer's one launch over its segments): bit for bit the single form on each
// block, with blocks of different sizes, weight dtypes (bf16, none, fp32) and decay on and off; and
// zero_tensors zeroes every tensor of a list.
TEST(CudaTraining, AdamWListIsTheSingleFormOnEachBlock) {
  HYDRA_REQUIRE_GPU();
  const std::vector<int64_t> sizes = {100003, 1, 4097, 300};
  struct Block {
    Tensor master, m, v, grad, weight;
  };
  std::vector<Block> a, b;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t n = sizes[i];
    for (std::vector<Block>* set : {&a, &b}) {
      Block blk{gpu(random_tensor({n}, 160 + i), DType::f32), gpu(random_tensor({n}, 170 + i, 0.01f), DType::f32),
                gpu(random_tensor({n}, 180 + i, 0.001f), DType::f32), gpu(random_tensor({n}, 190 + i, 0.1f), DType::f32),
                Tensor()};
      fill(blk.v, 0.001);  // v ≥ 0
      if (i == 0) blk.weight = Tensor::empty({n}, DType::bf16, Device::cuda);
      if (i == 2) blk.weight = Tensor::empty({n}, DType::f32, Device::cuda);
      set->push_back(std::move(blk));
    }
  }
  const ops::AdamWParams p{.lr = 1e-3f, .weight_decay = 0.1f, .step = 3, .grad_scale = 0.7f};
  std::vector<ops::AdamWSlice> slices;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const bool decay = i % 2 == 0;
    slices.push_back({a[i].master, a[i].m, a[i].v, a[i].grad, a[i].weight, decay});
    ops::AdamWParams single = p;
    if (!decay) single.weight_decay = 0.0f;
    ops::adamw_update(b[i].master, b[i].m, b[i].v, b[i].grad, b[i].weight, single);
  }
  ops::adamw_update(slices, p);
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::string what = "block " + std::to_string(i);
    expect_same_bits(a[i].master, b[i].master, what + " master");
    expect_same_bits(a[i].m, b[i].m, what + " m");
    expect_same_bits(a[i].v, b[i].v, what + " v");
    if (a[i].weight.defined()) expect_same_bits(a[i].weight, b[i].weight, what + " weight");
  }
  std::vector<TensorView> grads;
  for (const Block& blk : a) grads.push_back(blk.grad);
  grads.push_back(Tensor::empty({0}, DType::f32, Device::cuda));
  ops::zero_tensors(grads);
  for (size_t i = 0; i < sizes.size(); ++i) EXPECT_EQ(ops::sum_of_squares(a[i].grad), 0.0) << "block " << i << " not zeroed";
}

TEST(CudaTraining, SumOfSquares) {
  HYDRA_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{1000003}}) {
    const Tensor x = random_tensor({n}, 150);
    const double ref = ops::sum_of_squares(x);
    const Tensor gx = gpu(x, DType::f32);
    const double a = ops::sum_of_squares(gx), b = ops::sum_of_squares(gx);
    EXPECT_NEAR(a, ref, 1e-10 * ref) << "sum of squares n=" << n;
    EXPECT_EQ(std::memcmp(&a, &b, sizeof a), 0) << "sum of squares n=" << n << ": two runs differ";
  }
  // A matrix (contiguous, any rank): the same as its flat view.
  const Tensor mat = random_tensor({37, 29}, 151);
  EXPECT_NEAR(ops::sum_of_squares(gpu(mat, DType::f32)), ops::sum_of_squares(mat), 1e-10 * ops::sum_of_squares(mat));
}

// The list form (the optimizer's global norm): bit-identical to adding the single-tensor sums in order,
// an empty tensor in the list included.
TEST(CudaTraining, SumOfSquaresOfAList) {
  HYDRA_REQUIRE_GPU();
  const std::vector<Tensor> parts = {gpu(random_tensor({1000003}, 152), DType::f32), Tensor::empty({0}, DType::f32, Device::cuda),
                                     gpu(random_tensor({17}, 153), DType::f32), gpu(random_tensor({64, 33}, 154), DType::f32)};
  double loop = 0;
  std::vector<TensorView> views;
  for (const Tensor& t : parts) {
    loop += ops::sum_of_squares(t);
    views.push_back(t);
  }
  const double list = ops::sum_of_squares(views);
  EXPECT_EQ(std::memcmp(&list, &loop, sizeof list), 0) << "list " << list << " vs loop " << loop;
  EXPECT_GT(list, 1e5);
}

// The optimizer's tail as device work (ops::DeviceUpdate) on the GPU, launched directly and replayed
// from a CUDA graph captured once: the eager tail (sum_of_squares read back, the host's clip scale,
// adamw_update, zero_tensors) bit for bit, skipped steps included (tests/kernels/device_update_check.h).
TEST(CudaTraining, DeviceUpdateIsTheEagerTail) {
  HYDRA_REQUIRE_GPU();
  check_device_update(Device::cuda, false);
}

TEST(CudaTraining, DeviceUpdateReplayedFromAGraphIsTheEagerTail) {
  HYDRA_REQUIRE_GPU();
  check_device_update(Device::cuda, true);
}

TEST(CudaTraining, RowSumsMatchTheHostSum) {
  HYDRA_REQUIRE_GPU();
  for (const int64_t n : {int64_t{1}, int64_t{37}, int64_t{4099}, int64_t{65536}}) {
    const Tensor values = random_tensor({n}, 40, 5.0f);
    Tensor marks = Tensor::zeros({n}, DType::i32);
    for (int64_t i = 0; i < n; i += 7) marks.data_as<int32_t>()[i] = 1;
    Tensor ref = Tensor::zeros({2}, DType::f64);
    ops::add_row_sums(ref, values, marks);
    const Tensor dv = to_device(values, Device::cuda), dm = to_device(marks, Device::cuda);
    Tensor s1 = Tensor::zeros({2}, DType::f64, Device::cuda), s2 = Tensor::zeros({2}, DType::f64, Device::cuda);
    ops::add_row_sums(s1, dv, dm);
    ops::add_row_sums(s2, dv, dm);
    // Read back in f64 (the tests' host() reads f32, which the first GPU run found here).
    const Tensor h1 = to(s1, Device::host, DType::f64), h2 = to(s2, Device::host, DType::f64);
    for (int k = 0; k < 2; ++k) {
      const double r = ref.data_as<double>()[k], g = h1.data_as<double>()[k];
      EXPECT_LE(std::abs(g - r), 1e-12 * std::max(1.0, std::abs(r))) << "n=" << n << " sum " << k;
    }
    EXPECT_EQ(std::memcmp(h1.data(), h2.data(), h1.nbytes()), 0) << "row sums n=" << n << ": two runs differ";
  }
}

TEST(CudaTraining, GradientScaledAtRunTimeIsTheLossKernelsScaling) {
  HYDRA_REQUIRE_GPU();
  for (const bool small_rows : {false, true}) {
    const ops::SmallRowKernelsScope scope(small_rows);  // V ≤ 2048: the warp-a-row kernel when on
    for (const LossCase& c : {LossCase{37, 512, 0}, LossCase{6, 4099, 0}, LossCase{5, 151936, 0}}) {
      const std::string what = "cross-entropy scaled at run time " + describe(c) + (small_rows ? " small rows" : "");
      const Tensor logits = random_tensor({c.rows, c.vocab}, 77, 3.0f);
      Tensor targets = Tensor::empty({c.rows}, DType::i32);
      for (int64_t i = 0; i < c.rows; ++i) targets.data_as<int32_t>()[i] = static_cast<int32_t>((i * 7919) % c.vocab);
      targets.data_as<int32_t>()[c.rows / 2] = -1;
      const Tensor gtargets = to_device(targets, Device::cuda);
      const float scale = 1.0f / 1237.0f;  // 1 / counted: not a power of two
      Tensor dscale = Tensor::empty({1}, DType::f32);
      dscale.data_as<float>()[0] = scale;
      dscale = to_device(dscale, Device::cuda);
      for (const DType out : {DType::bf16, DType::f32}) {
        // The eager step: the scale passed by value; the operand (bf16), or over the logits (fp32).
        Tensor a = gpu(logits, DType::f32), la = Tensor::empty({c.rows}, DType::f32, Device::cuda);
        Tensor ga = out == DType::bf16 ? Tensor::empty({c.rows, c.vocab}, DType::bf16, Device::cuda) : a;
        ops::cross_entropy_with_grad(a, la, gtargets, scale, ga);
        // The captured step: the kernel reads the device scalar (the value argument is ignored).
        Tensor b = gpu(logits, DType::f32), lb = Tensor::empty({c.rows}, DType::f32, Device::cuda);
        Tensor gb = out == DType::bf16 ? Tensor::empty({c.rows, c.vocab}, DType::bf16, Device::cuda) : b;
        ops::cross_entropy_with_grad(b, lb, gtargets, 0.0f, gb, dscale);
        expect_same_bits(ga, gb, what + (out == DType::bf16 ? " bf16 operand" : " fp32 in place"));
        expect_same_bits(la, lb, what + " row loss");
      }
    }
  }
}

}  // namespace
}  // namespace hydra::test
