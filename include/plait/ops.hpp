// Reduce ops: empty, trivially copyable functors compiled into the fused kernel.
//
// Each built-in op combines two values of the compute type C (compute_t<T>: float for
// half and bfloat16, T otherwise) and carries a wire id and a name. A user op is any
// trivially copyable functor with `C operator()(C, C) const` (reduce_op<Op, T>), plus
// optionally `C finalize(C, int n) const`, applied once to each result (avg divides by
// the number of ranks). Ops are called from the kernels' inner loops, on the host and,
// where CUDA is on, in device code, so they are constexpr, noexcept and host-device.
//
// Defined behaviour at the edges (so that every rank and every reduction order agree):
// - integer sum and prod wrap modulo 2^bits (computed in an unsigned type, no UB);
// - min and max propagate NaN: if either operand is NaN the result is NaN (the first
//   NaN operand). min(-0, +0) is -0 and max(-0, +0) is +0 in either order;
// - integer avg is the wrapped sum divided by n, truncated toward zero.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include <plait/detail/config.hpp>
#include <plait/types.hpp>

namespace plait {

namespace detail {

// Integer arithmetic that wraps: small types are widened to unsigned int (not int, which
// the usual promotions would pick and where uint16 * uint16 can overflow).
template <class C>
using wrap_unsigned_t = std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, std::make_unsigned_t<C>>;

template <class C>
PLAIT_HOST_DEVICE constexpr bool sign_bit(C v) noexcept {
  if constexpr (sizeof(C) == 4)
    return (bit_cast<std::uint32_t>(v) >> 31) != 0;
  else
    return (bit_cast<std::uint64_t>(v) >> 63) != 0;
}

}  // namespace detail

struct sum {
  static constexpr std::uint8_t id = 1;
  static constexpr const char* name = "sum";
  template <class C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      using U = detail::wrap_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};

struct prod {
  static constexpr std::uint8_t id = 2;
  static constexpr const char* name = "prod";
  template <class C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      using U = detail::wrap_unsigned_t<C>;
      return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};

// min and max on floats pick among computed values instead of returning early, so
// that g++ if-converts them and the kernel loop vectorises.
struct min {
  static constexpr std::uint8_t id = 3;
  static constexpr const char* name = "min";
  template <class C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    if constexpr (std::is_floating_point_v<C>) {
      const C equal = detail::sign_bit(a) ? a : b;  // -0 below +0
      const C r = a == b ? equal : (b < a ? b : a);
      return a != a ? a : (b != b ? b : r);
    } else {
      return b < a ? b : a;
    }
  }
};

struct max {
  static constexpr std::uint8_t id = 4;
  static constexpr const char* name = "max";
  template <class C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    if constexpr (std::is_floating_point_v<C>) {
      const C equal = detail::sign_bit(a) ? b : a;  // +0 above -0
      const C r = a == b ? equal : (a < b ? b : a);
      return a != a ? a : (b != b ? b : r);
    } else {
      return a < b ? b : a;
    }
  }
};

// Sum, then finalize divides each result by n (the number of contributions).
struct avg {
  static constexpr std::uint8_t id = 5;
  static constexpr const char* name = "avg";
  template <class C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    return sum{}(a, b);
  }
  // n > 0. Integer division truncates toward zero (C++ semantics). It is done in a type
  // at least as wide as int, so that n = 200 ranks does not wrap for int8 and uint8.
  template <class C>
  PLAIT_HOST_DEVICE constexpr C finalize(C v, int n) const noexcept {
    if constexpr (std::is_integral_v<C>) {
      using W =
          std::conditional_t<std::is_signed_v<C>, std::conditional_t<(sizeof(C) <= 4), std::int32_t, std::int64_t>,
                             std::conditional_t<(sizeof(C) <= 4), std::uint32_t, std::uint64_t>>;
      return static_cast<C>(static_cast<W>(v) / static_cast<W>(n));
    } else {
      return v / static_cast<C>(n);
    }
  }
};

struct band {
  static constexpr std::uint8_t id = 6;
  static constexpr const char* name = "band";
  template <std::integral C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    return static_cast<C>(a & b);
  }
};

struct bor {
  static constexpr std::uint8_t id = 7;
  static constexpr const char* name = "bor";
  template <std::integral C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    return static_cast<C>(a | b);
  }
};

struct bxor {
  static constexpr std::uint8_t id = 8;
  static constexpr const char* name = "bxor";
  template <std::integral C>
  PLAIT_HOST_DEVICE constexpr C operator()(C a, C b) const noexcept {
    return static_cast<C>(a ^ b);
  }
};

// Op reduces elements of type T: it combines two compute values into one.
template <class Op, class T>
concept reduce_op = element_type<T> && std::is_trivially_copyable_v<Op> && requires(const Op& op, compute_t<T> c) {
  { op(c, c) } -> std::convertible_to<compute_t<T>>;
};

// Op has a finalize step for T, applied once to each reduced value.
template <class Op, class T>
concept has_finalize = reduce_op<Op, T> && requires(const Op& op, compute_t<T> c, int n) {
  { op.finalize(c, n) } -> std::convertible_to<compute_t<T>>;
};

namespace detail {
template <class Op>
concept has_op_id = requires {
  { Op::id } -> std::convertible_to<std::uint8_t>;
};
template <class Op>
concept has_op_name = requires {
  { Op::name } -> std::convertible_to<const char*>;
};
}  // namespace detail

// The op's id in the call fingerprint (255: a user functor) and its name in reports.
template <class Op>
inline constexpr std::uint8_t op_id_v = [] {
  if constexpr (detail::has_op_id<Op>)
    return static_cast<std::uint8_t>(Op::id);
  else
    return std::uint8_t{255};
}();

template <class Op>
inline constexpr const char* op_name_v = [] {
  if constexpr (detail::has_op_name<Op>)
    return static_cast<const char*>(Op::name);
  else
    return "user";
}();

}  // namespace plait
