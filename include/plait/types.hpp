// Element types: what a collective can carry, and how the kernel computes on it.
//
// plait::half (IEEE binary16) and plait::bfloat16 are 16-bit storage types: they hold
// bits and convert explicitly to and from float. To float is exact. From float rounds to
// nearest, ties to even: NaN stays NaN with its sign (and is quieted), overflow goes to
// infinity, subnormals are kept in both directions. Arithmetic on them happens in float
// (compute_t), so a reduction converts on load and rounds once on store. The half
// conversions use one float addition each for subnormals: they assume the default
// rounding mode (round to nearest) and give the same results with flush-to-zero and
// denormals-are-zero on, since neither that addition's operands nor its result is
// subnormal where it matters.
//
// dtype names the 12 element types on the wire and in reports (nccl-tests spelling);
// element_type<T> is true for exactly those 12 types. Everything here is constexpr,
// allocation-free, thread-safe and usable in CUDA device code (no host-only std calls:
// bit casts go through __builtin_bit_cast, which both g++ and nvcc accept).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <plait/detail/config.hpp>

namespace plait {

namespace detail {

// std::bit_cast is not marked __device__; the builtin behind it works on both sides.
template <class To, class From>
PLAIT_HOST_DEVICE constexpr To bit_cast(const From& from) noexcept {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  return __builtin_bit_cast(To, from);
}

// c ? a : b through a mask. The half conversions compute every case and pick one with
// this: written as ?:, g++ turns the pick into a branch, and with -ftrapping-math (its
// default) it may not execute the float operation of the subnormal case unconditionally
// again, so loops converting arrays would not vectorise.
PLAIT_HOST_DEVICE constexpr std::uint32_t select_bits(bool c, std::uint32_t a, std::uint32_t b) noexcept {
  const std::uint32_t mask = 0u - static_cast<std::uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// float -> binary16 bits, round to nearest even, without branches or loops.
PLAIT_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t ax = x & 0x7fffffffu;
  // >= 65536 or inf: inf; NaN: keep the top payload bits and set the quiet bit.
  const std::uint32_t big = select_bits(ax > 0x7f800000u, 0x7e00u | ((ax >> 13) & 0x3ffu), 0x7c00u);
  // Normal half (2^-14 <= |f| < 65536): rebias the exponent and round on the 13 dropped
  // bits; a carry out of the mantissa bumps the exponent, up to inf from 65520 on.
  const std::uint32_t normal = (ax - 0x38000000u + 0xfffu + ((ax >> 13) & 1u)) >> 13;
  // Subnormal half (|f| < 2^-14): adding 0.5f, whose ulp is 2^-24 (the half subnormal
  // step), makes the FPU round |f| to that step, nearest even; the low bits are the result.
  const std::uint32_t subnormal = bit_cast<std::uint32_t>(bit_cast<float>(ax) + 0.5f) - 0x3f000000u;
  const std::uint32_t r = select_bits(ax >= 0x47800000u, big, select_bits(ax >= 0x38800000u, normal, subnormal));
  return static_cast<std::uint16_t>(sign | r);
}

// binary16 bits -> float (exact).
PLAIT_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t shifted = static_cast<std::uint32_t>(h & 0x7fffu) << 13;
  const std::uint32_t exponent = shifted & 0x0f800000u;
  const std::uint32_t normal = shifted + 0x38000000u;   // rebias 15 -> 127
  const std::uint32_t inf_nan = shifted + 0x70000000u;  // exponent 31 -> 255, payload kept
  // Zero and subnormal: build 2^-14 * (1 + m/1024) and subtract 2^-14, leaving m * 2^-24
  // exactly (and +0 for m = 0).
  const std::uint32_t subnormal = bit_cast<std::uint32_t>(bit_cast<float>(normal + 0x00800000u) - 0x1p-14f);
  const std::uint32_t r = select_bits(exponent == 0x0f800000u, inf_nan, select_bits(exponent == 0, subnormal, normal));
  return bit_cast<float>(sign | r);
}

// float -> bfloat16 bits, round to nearest even. Written as a select rather than an
// early return so that loops converting arrays of them can vectorise.
PLAIT_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = bit_cast<std::uint32_t>(f);
  const std::uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (x >> 16) | 0x40u;
  return static_cast<std::uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

PLAIT_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

// IEEE 754 binary16: 1 sign, 5 exponent, 10 mantissa bits. Largest finite 65504.
struct half {
  std::uint16_t bits;

  half() = default;
  PLAIT_HOST_DEVICE constexpr explicit half(float f) noexcept : bits(detail::float_to_half_bits(f)) {}
  PLAIT_HOST_DEVICE constexpr explicit operator float() const noexcept { return detail::half_bits_to_float(bits); }
  PLAIT_HOST_DEVICE static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
};

// bfloat16: the top 16 bits of a float (8 exponent bits, 7 mantissa bits).
struct bfloat16 {
  std::uint16_t bits;

  bfloat16() = default;
  PLAIT_HOST_DEVICE constexpr explicit bfloat16(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}
  PLAIT_HOST_DEVICE constexpr explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  PLAIT_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 v;
    v.bits = b;
    return v;
  }
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half> && std::is_standard_layout_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16> && std::is_standard_layout_v<bfloat16>);

// The wire value is part of the slot header's fingerprint: append, never renumber.
enum class dtype : std::uint8_t { f32 = 1, f64, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16 };

namespace detail {
template <class T>
struct dtype_traits {};  // not an element type
template <dtype D>
struct dtype_value {
  static constexpr dtype value = D;
};
template <>
struct dtype_traits<float> : dtype_value<dtype::f32> {};
template <>
struct dtype_traits<double> : dtype_value<dtype::f64> {};
template <>
struct dtype_traits<std::int8_t> : dtype_value<dtype::i8> {};
template <>
struct dtype_traits<std::int16_t> : dtype_value<dtype::i16> {};
template <>
struct dtype_traits<std::int32_t> : dtype_value<dtype::i32> {};
template <>
struct dtype_traits<std::int64_t> : dtype_value<dtype::i64> {};
template <>
struct dtype_traits<std::uint8_t> : dtype_value<dtype::u8> {};
template <>
struct dtype_traits<std::uint16_t> : dtype_value<dtype::u16> {};
template <>
struct dtype_traits<std::uint32_t> : dtype_value<dtype::u32> {};
template <>
struct dtype_traits<std::uint64_t> : dtype_value<dtype::u64> {};
template <>
struct dtype_traits<half> : dtype_value<dtype::f16> {};
template <>
struct dtype_traits<bfloat16> : dtype_value<dtype::bf16> {};
}  // namespace detail

// True for exactly the 12 element types (cv-qualified types are not element types).
template <class T>
concept element_type = requires {
  detail::dtype_traits<T>::value;
};

template <element_type T>
inline constexpr dtype dtype_of = detail::dtype_traits<T>::value;

// The type the kernel computes in: float for the 16-bit float types, T otherwise.
template <element_type T>
using compute_t = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat16>, float, T>;

// Size in bytes of one element; 0 for a value that names no dtype.
constexpr std::size_t dtype_size(dtype d) noexcept {
  switch (d) {
    case dtype::i8:
    case dtype::u8:
      return 1;
    case dtype::i16:
    case dtype::u16:
    case dtype::f16:
    case dtype::bf16:
      return 2;
    case dtype::f32:
    case dtype::i32:
    case dtype::u32:
      return 4;
    case dtype::f64:
    case dtype::i64:
    case dtype::u64:
      return 8;
  }
  return 0;
}

// The name nccl-tests prints; "unknown" for a value that names no dtype (bytes off the wire).
constexpr const char* dtype_name(dtype d) noexcept {
  switch (d) {
    case dtype::f32:
      return "float";
    case dtype::f64:
      return "double";
    case dtype::i8:
      return "int8";
    case dtype::i16:
      return "int16";
    case dtype::i32:
      return "int32";
    case dtype::i64:
      return "int64";
    case dtype::u8:
      return "uint8";
    case dtype::u16:
      return "uint16";
    case dtype::u32:
      return "uint32";
    case dtype::u64:
      return "uint64";
    case dtype::f16:
      return "half";
    case dtype::bf16:
      return "bfloat16";
  }
  return "unknown";
}

// Load and store between an element and its compute type (the identity except for
// half and bfloat16, which convert with the rounding described above).
template <element_type T>
PLAIT_HOST_DEVICE constexpr compute_t<T> to_compute(T v) noexcept {
  return static_cast<compute_t<T>>(v);
}

template <element_type T>
PLAIT_HOST_DEVICE constexpr T from_compute(compute_t<T> v) noexcept {
  return static_cast<T>(v);
}

}  // namespace plait
