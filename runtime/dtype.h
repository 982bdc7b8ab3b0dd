// Element types and devices a tensor can have, and the host-side bf16 conversions.
//
// float64 exists for the host only: the CPU ops run in float32 (the reference) or float64 (gradient
// checks by finite differences, whole-model gradient tests); device tensors are bf16/fp32.
//
// bf16 is stored as its 16 raw bits (the upper half of an IEEE float32); float -> bf16 rounds to
// nearest even, the rounding every GPU library uses, so CPU references can round their inputs
// exactly as the device sees them.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace hydra {

enum class DType : uint8_t { f32, bf16, i32, i64, f64 };
enum class Device : uint8_t { host, cuda };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::bf16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::f64: return 8;
  }
  return 0;
}

constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::bf16: return "bfloat16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::f64: return "float64";
  }
  return "?";
}

// The type a model's weights and activations are stored in on a device, the one rule every command
// and the memory plan follow: bf16 on the GPU (DESIGN.md §2), f32 on the host (the reference; the
// gradient checks that run in f64 choose it themselves).
constexpr DType storage_dtype(Device device) { return device == Device::cuda ? DType::bf16 : DType::f32; }

// The type partial results accumulate in: fp32 on the GPU (DESIGN.md §2), the storage type on the
// host (f32, or f64 in gradient checks).
constexpr DType accumulator_dtype(DType storage, Device device) { return device == Device::cuda ? DType::f32 : storage; }

constexpr std::string_view device_name(Device d) { return d == Device::host ? "host" : "cuda"; }

struct bf16 {
  uint16_t bits = 0;
};

inline bf16 float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return bf16{static_cast<uint16_t>((u >> 16) | 0x40u)};  // keep NaN a quiet NaN
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<uint16_t>(u >> 16)};
}

inline float bf16_to_float(bf16 b) { return std::bit_cast<float>(static_cast<uint32_t>(b.bits) << 16); }

// Rounds a float to the nearest bf16 value and back: what a bf16 device tensor would hold.
inline float round_to_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

template <class T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::f32; }
template <> constexpr DType dtype_of<bf16>() { return DType::bf16; }
template <> constexpr DType dtype_of<int32_t>() { return DType::i32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::i64; }
template <> constexpr DType dtype_of<double>() { return DType::f64; }

}  // namespace hydra
