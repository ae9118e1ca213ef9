// Inputs whose reductions are exact in any order, their reference results, and a
// comparison that names the rank, the first bad element, the expected and the got.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include <plait/ops.hpp>
#include <plait/types.hpp>

namespace plait::testing {

// Small values: sums of up to 8 ranks stay exact in bfloat16 and int8; products of
// up to 8 ranks use {1, 2} only; bitwise ops get varied bit patterns.
template <class T, class Op = sum>
T exact_value(int rank, std::size_t i) {
  long v;
  if constexpr (std::is_same_v<Op, prod>) {
    v = 1 + static_cast<long>((i + static_cast<std::size_t>(rank)) % 2);
  } else if constexpr (std::is_same_v<Op, band> || std::is_same_v<Op, bor> || std::is_same_v<Op, bxor>) {
    v = static_cast<long>((i * 37 + static_cast<std::size_t>(rank) * 11 + 5) & 0x7f);
  } else if constexpr (std::is_same_v<Op, min> || std::is_same_v<Op, max>) {
    v = static_cast<long>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11);
    if constexpr (std::is_signed_v<compute_t<T>>) v -= 5;
  } else {
    v = static_cast<long>((i * 7 + static_cast<std::size_t>(rank) * 3) % 11);
  }
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return T(static_cast<float>(v));
  else
    return static_cast<T>(v);
}

template <class T, class Op = sum>
std::vector<T> exact_pattern(int rank, std::size_t count, std::size_t first = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = exact_value<T, Op>(rank, first + i);
  return v;
}

// Element i of the reduction over `ranks` ranks of exact_value (with finalize).
template <class T, class Op>
T reduced_value(int ranks, std::size_t i, Op op = {}) {
  compute_t<T> acc = to_compute(exact_value<T, Op>(0, i));
  for (int r = 1; r < ranks; ++r) acc = op(acc, to_compute(exact_value<T, Op>(r, i)));
  if constexpr (has_finalize<Op, T>) acc = op.finalize(acc, ranks);
  return from_compute<T>(acc);
}

template <class T, class Op>
std::vector<T> reference_all_reduce(int ranks, std::size_t count, Op op = {}, std::size_t first = 0) {
  std::vector<T> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = reduced_value<T, Op>(ranks, first + i, op);
  return v;
}

template <class T>
std::string show(T v) {
  std::ostringstream s;
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    s << static_cast<float>(v) << " (bits 0x" << std::hex << v.bits << ")";
  else if constexpr (sizeof(T) == 1)
    s << static_cast<int>(v);
  else
    s << v;
  return s.str();
}

// "" when equal bit for bit; otherwise where and how they differ.
template <class T>
std::string compare(const std::vector<T>& want, const std::vector<T>& got, int rank, const std::string& what) {
  std::ostringstream s;
  if (want.size() != got.size()) {
    s << what << ": rank " << rank << " returned " << got.size() << " elements, expected " << want.size();
    return s.str();
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &got[i], sizeof(T)) != 0) {
      s << what << ": rank " << rank << ", element " << i << ": expected " << show(want[i]) << ", got " << show(got[i]);
      return s.str();
    }
  }
  return {};
}

}  // namespace plait::testing
