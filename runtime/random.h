// Counter-based random numbers: value i of stream (seed, key) is a pure function of its inputs.
//
// Weight initialisation draws element i of a parameter from (seed, hash(parameter name), i), so a
// tensor's values do not depend on the order tensors are created in, on the number of threads,
// or on whether the host or the GPU draws them. The mixer is SplitMix64's finaliser (Steele,
// Lea, Flood 2014); normals come from Box-Muller on two uniforms.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

#if defined(__CUDACC__)
#define HYDRA_HOST_DEVICE __host__ __device__
#else
#define HYDRA_HOST_DEVICE
#endif

namespace hydra {

// The same streams on host and device (weights initialised on the GPU equal the CPU's).
HYDRA_HOST_DEVICE constexpr uint64_t mix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// FNV-1a of a name, to key a stream by parameter path.
constexpr uint64_t hash_name(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : name) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  return h;
}

struct RandomStream {
  uint64_t seed = 0;
  uint64_t key = 0;

  HYDRA_HOST_DEVICE uint64_t bits(uint64_t index) const { return mix64(mix64(seed ^ mix64(key)) + index); }
  // Uniform in (0, 1): never exactly 0 or 1.
  HYDRA_HOST_DEVICE double uniform(uint64_t index) const {
    return (static_cast<double>(bits(index) >> 11) + 0.5) * 0x1.0p-53;
  }
  // Standard normal.
  HYDRA_HOST_DEVICE double normal(uint64_t index) const {
    const double u1 = uniform(2 * index), u2 = uniform(2 * index + 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
};

}  // namespace hydra
