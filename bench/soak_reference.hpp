// Inputs and reference results for plait-soak, exact bit for bit and cheap to check.
//
// Reductions use the patterns of tests/support/reference.hpp: small values whose sum,
// product, min, max, average and bitwise ops are exact in any order for up to 8 ranks.
// Those patterns repeat in the element index (period 11, 2 or 128), so the inputs and
// the reduced result over one period are tabulated once per (type, op, ranks) and a
// check is one table lookup per element. A per-call offset into the period makes
// consecutive calls differ, so a stale slot from an earlier call shows.
//
// Data movement (all_gather, broadcast, all_to_all, send/recv) uses a hash of
// (call seed, source rank, element index) that varies every bit, so a block that lands
// one block, rank or call off is caught. Hashed floats are normal numbers (never NaN,
// infinity or subnormal), so a copy that goes through float arithmetic keeps them.
//
// Single-threaded; the tables are built on first use and kept for the process.
#pragma once

#include <array>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include <plait/ops.hpp>
#include <plait/types.hpp>

namespace plait::soak {

// ---- reductions -----------------------------------------------------------------

template <class Op>
constexpr std::size_t period_of() {
  if constexpr (std::is_same_v<Op, prod>)
    return 2;
  else if constexpr (std::is_same_v<Op, band> || std::is_same_v<Op, bor> || std::is_same_v<Op, bxor>)
    return 128;
  else
    return 11;
}

// Rank `rank`'s element i (the same values as plait::testing::exact_value).
template <class T, class Op>
T reduce_input(int rank, std::size_t i) {
  const auto r = static_cast<std::size_t>(rank);
  long v;
  if constexpr (std::is_same_v<Op, prod>) {
    v = 1 + static_cast<long>((i + r) % 2);
  } else if constexpr (std::is_same_v<Op, band> || std::is_same_v<Op, bor> || std::is_same_v<Op, bxor>) {
    v = static_cast<long>((i * 37 + r * 11 + 5) & 0x7f);
  } else if constexpr (std::is_same_v<Op, min> || std::is_same_v<Op, max>) {
    v = static_cast<long>((i * 7 + r * 3) % 11);
    if constexpr (std::is_signed_v<compute_t<T>>) v -= 5;
  } else {
    v = static_cast<long>((i * 7 + r * 3) % 11);
  }
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

// One period of every rank's input and of the reduction over `ranks` ranks.
template <class T, class Op>
struct reduce_table {
  static constexpr std::size_t period = period_of<Op>();
  std::vector<std::array<T, period>> input;  // [rank][i % period]
  std::array<T, period> result{};

  explicit reduce_table(int ranks) : input(static_cast<std::size_t>(ranks)) {
    for (int r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < period; ++i) input[static_cast<std::size_t>(r)][i] = reduce_input<T, Op>(r, i);
    const Op op{};
    for (std::size_t i = 0; i < period; ++i) {
      compute_t<T> acc = to_compute(input[0][i]);
      for (int r = 1; r < ranks; ++r) acc = op(acc, to_compute(input[static_cast<std::size_t>(r)][i]));
      if constexpr (has_finalize<Op, T>) acc = op.finalize(acc, ranks);
      result[i] = from_compute<T>(acc);
    }
  }

  T in(int rank, std::size_t i) const { return input[static_cast<std::size_t>(rank)][i % period]; }
  T out(std::size_t i) const { return result[i % period]; }
};

// The table for this process's rank count (fixed for the process's lifetime).
template <class T, class Op>
const reduce_table<T, Op>& table_for(int ranks) {
  static const reduce_table<T, Op> t(ranks);
  return t;
}

// ---- data movement --------------------------------------------------------------

constexpr std::uint64_t mix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <class T>
T move_value(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t h = mix(seed ^ mix((static_cast<std::uint64_t>(rank) << 48) ^ i));
  if constexpr (std::is_same_v<T, float>) {
    // Sign and mantissa from the hash, exponent in [1, 254]: a normal float.
    const auto bits = static_cast<std::uint32_t>((h & 0x807fffffu) | (((h >> 32) % 254 + 1) << 23));
    return std::bit_cast<float>(bits);
  } else if constexpr (std::is_same_v<T, double>) {
    const std::uint64_t bits = (h & 0x800fffffffffffffull) | (((mix(h) % 2046) + 1) << 52);
    return std::bit_cast<double>(bits);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    return bfloat16::from_bits(static_cast<std::uint16_t>((h & 0x807fu) | (((h >> 16) % 254 + 1) << 7)));
  } else {
    return static_cast<T>(h);  // integers: every bit pattern is a value
  }
}

// ---- comparison and reports -------------------------------------------------------

template <class T>
bool same_bits(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

template <class T>
std::string show(T v) {
  char buf[96];
  if constexpr (std::is_same_v<T, bfloat16>)
    std::snprintf(buf, sizeof buf, "%g (bits 0x%04x)", static_cast<double>(static_cast<float>(v)), v.bits);
  else if constexpr (std::is_same_v<T, float>)
    std::snprintf(buf, sizeof buf, "%.9g (bits 0x%08x)", static_cast<double>(v), std::bit_cast<std::uint32_t>(v));
  else if constexpr (std::is_same_v<T, double>)
    std::snprintf(buf, sizeof buf, "%.17g (bits 0x%016llx)", v,
                  static_cast<unsigned long long>(std::bit_cast<std::uint64_t>(v)));
  else if constexpr (std::is_signed_v<T>)
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
  else
    std::snprintf(buf, sizeof buf, "%llu", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace plait::soak
