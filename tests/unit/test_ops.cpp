// Every built-in op on every element type it applies to, the edge cases the contract
// defines (wrap-around, NaN, signed zeros, avg truncation), and the op concepts.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include <plait/ops.hpp>
#include <plait/types.hpp>

namespace {

using plait::bfloat16;
using plait::half;

// A user op: the largest magnitude. Plain host functor, no finalize.
struct absmax {
  float operator()(float a, float b) const { return std::fabs(a) < std::fabs(b) ? b : a; }
};

// A user op with a finalize step (root mean square of the contributions, for example).
struct sum_of_squares_root {
  template <class C>
  constexpr C operator()(C a, C b) const {
    return a + b;
  }
  template <class C>
  C finalize(C v, int) const {
    return std::sqrt(v);
  }
};

struct not_trivially_copyable {
  not_trivially_copyable() = default;
  not_trivially_copyable(const not_trivially_copyable&) {}
  float operator()(float a, float b) const { return a + b; }
};

struct wrong_signature {
  void operator()(float, float) const {}
};

template <class T>
constexpr T v(int x) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    return T(static_cast<float>(x));
  } else {
    return static_cast<T>(x);
  }
}

// Applies op in compute type, then stores back to T (what the kernel does).
template <class Op, class T>
T apply(Op op, T a, T b) {
  return plait::from_compute<T>(op(plait::to_compute(a), plait::to_compute(b)));
}

template <class T>
double as_double(T x) {
  return static_cast<double>(plait::to_compute(x));
}

}  // namespace

// Wrap-around is computed without undefined behaviour: these are constant expressions, and
// the compiler rejects signed overflow in a constant expression.
static_assert(plait::sum{}(std::int8_t{127}, std::int8_t{1}) == -128);
static_assert(plait::sum{}(std::int8_t{-128}, std::int8_t{-1}) == 127);
static_assert(plait::sum{}(std::int32_t{2147483647}, std::int32_t{1}) == std::numeric_limits<std::int32_t>::min());
static_assert(plait::sum{}(std::int64_t{9223372036854775807}, std::int64_t{1}) ==
              std::numeric_limits<std::int64_t>::min());
static_assert(plait::prod{}(std::uint16_t{65535}, std::uint16_t{65535}) == 1);
static_assert(plait::prod{}(std::int16_t{-32768}, std::int16_t{-1}) == -32768);
static_assert(plait::prod{}(std::int32_t{65536}, std::int32_t{65536}) == 0);
static_assert(plait::prod{}(std::int64_t{1} << 62, std::int64_t{4}) == 0);
static_assert(plait::prod{}(std::uint32_t{0xffffffffu}, std::uint32_t{0xffffffffu}) == 1);
static_assert(plait::avg{}.finalize(std::int32_t{-7}, 2) == -3);

// The concepts.
static_assert(plait::reduce_op<plait::sum, float>);
static_assert(plait::reduce_op<plait::prod, half>);
static_assert(plait::reduce_op<plait::min, bfloat16>);
static_assert(plait::reduce_op<plait::max, std::uint64_t>);
static_assert(plait::reduce_op<plait::avg, std::int8_t>);
static_assert(plait::reduce_op<plait::band, std::int8_t>);
static_assert(plait::reduce_op<plait::bor, std::uint16_t>);
static_assert(plait::reduce_op<plait::bxor, std::int64_t>);
static_assert(!plait::reduce_op<plait::band, float>);
static_assert(!plait::reduce_op<plait::bor, double>);
static_assert(!plait::reduce_op<plait::bxor, half>);
static_assert(!plait::reduce_op<plait::band, bfloat16>);
static_assert(!plait::reduce_op<plait::sum, long double>);  // not an element type
static_assert(!plait::reduce_op<plait::sum, const float>);
static_assert(plait::reduce_op<absmax, float>);
static_assert(plait::reduce_op<absmax, bfloat16>);
static_assert(plait::reduce_op<absmax, half>);
static_assert(!plait::reduce_op<not_trivially_copyable, float>);
static_assert(!plait::reduce_op<wrong_signature, float>);
static_assert(plait::has_finalize<plait::avg, float>);
static_assert(plait::has_finalize<plait::avg, std::uint8_t>);
static_assert(!plait::has_finalize<plait::sum, float>);
static_assert(!plait::has_finalize<absmax, float>);
static_assert(plait::has_finalize<sum_of_squares_root, double>);
static_assert(plait::op_id_v<plait::sum> == 1 && plait::op_id_v<plait::prod> == 2 && plait::op_id_v<plait::min> == 3 &&
              plait::op_id_v<plait::max> == 4 && plait::op_id_v<plait::avg> == 5 && plait::op_id_v<plait::band> == 6 &&
              plait::op_id_v<plait::bor> == 7 && plait::op_id_v<plait::bxor> == 8);
static_assert(plait::op_id_v<absmax> == 255);
static_assert(std::is_empty_v<plait::sum> && std::is_trivially_copyable_v<plait::avg>);

TEST_CASE("op names", "[ops]") {
  CHECK(std::string(plait::op_name_v<plait::sum>) == "sum");
  CHECK(std::string(plait::op_name_v<plait::prod>) == "prod");
  CHECK(std::string(plait::op_name_v<plait::min>) == "min");
  CHECK(std::string(plait::op_name_v<plait::max>) == "max");
  CHECK(std::string(plait::op_name_v<plait::avg>) == "avg");
  CHECK(std::string(plait::op_name_v<plait::band>) == "band");
  CHECK(std::string(plait::op_name_v<plait::bor>) == "bor");
  CHECK(std::string(plait::op_name_v<plait::bxor>) == "bxor");
  CHECK(std::string(plait::op_name_v<absmax>) == "user");
}

TEMPLATE_TEST_CASE("sum, prod, min, max and avg on every element type", "[ops]", float, double, std::int8_t,
                   std::int16_t, std::int32_t, std::int64_t, std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t,
                   half, bfloat16) {
  using T = TestType;
  CHECK(as_double(apply(plait::sum{}, v<T>(3), v<T>(4))) == 7.0);
  CHECK(as_double(apply(plait::prod{}, v<T>(3), v<T>(4))) == 12.0);
  CHECK(as_double(apply(plait::min{}, v<T>(3), v<T>(4))) == 3.0);
  CHECK(as_double(apply(plait::min{}, v<T>(4), v<T>(3))) == 3.0);
  CHECK(as_double(apply(plait::max{}, v<T>(3), v<T>(4))) == 4.0);
  CHECK(as_double(apply(plait::max{}, v<T>(4), v<T>(3))) == 4.0);
  CHECK(as_double(apply(plait::avg{}, v<T>(3), v<T>(5))) == 8.0);  // sum until finalize
  CHECK(as_double(plait::from_compute<T>(plait::avg{}.finalize(plait::to_compute(v<T>(8)), 2))) == 4.0);
  CHECK(as_double(plait::from_compute<T>(plait::avg{}.finalize(plait::to_compute(v<T>(9)), 2))) ==
        (std::is_integral_v<T> ? 4.0 : 4.5));
  if constexpr (std::is_signed_v<plait::compute_t<T>>) {
    CHECK(as_double(apply(plait::sum{}, v<T>(-3), v<T>(1))) == -2.0);
    CHECK(as_double(apply(plait::prod{}, v<T>(-3), v<T>(2))) == -6.0);
    CHECK(as_double(apply(plait::min{}, v<T>(-3), v<T>(2))) == -3.0);
    CHECK(as_double(apply(plait::max{}, v<T>(-3), v<T>(-2))) == -2.0);
  }
}

TEST_CASE("integer sum and prod wrap modulo 2^bits", "[ops]") {
  CHECK(apply(plait::sum{}, std::int8_t{127}, std::int8_t{1}) == -128);
  CHECK(apply(plait::sum{}, std::uint8_t{255}, std::uint8_t{1}) == 0);
  CHECK(apply(plait::sum{}, std::int16_t{32767}, std::int16_t{1}) == -32768);
  CHECK(apply(plait::sum{}, std::uint16_t{65535}, std::uint16_t{2}) == 1);
  CHECK(apply(plait::sum{}, std::uint32_t{0xffffffffu}, std::uint32_t{1}) == 0);
  CHECK(apply(plait::sum{}, std::uint64_t{0xffffffffffffffffu}, std::uint64_t{3}) == 2);
  CHECK(apply(plait::prod{}, std::uint16_t{65535}, std::uint16_t{65535}) == 1);
  CHECK(apply(plait::prod{}, std::int8_t{-128}, std::int8_t{-1}) == -128);
  CHECK(apply(plait::prod{}, std::int8_t{16}, std::int8_t{16}) == 0);
  CHECK(apply(plait::prod{}, std::uint8_t{16}, std::uint8_t{17}) == 16);
  CHECK(apply(plait::prod{}, std::int32_t{46341}, std::int32_t{46341}) == -2147479015);
  CHECK(apply(plait::prod{}, std::uint64_t{1} << 63, std::uint64_t{2}) == 0);
}

TEST_CASE("avg finalize divides, integers truncating toward zero", "[ops]") {
  const plait::avg op;
  CHECK(op.finalize(std::int32_t{-7}, 2) == -3);
  CHECK(op.finalize(std::int32_t{7}, 2) == 3);
  CHECK(op.finalize(std::int64_t{-9}, 4) == -2);
  CHECK(op.finalize(std::int8_t{-128}, 3) == -42);
  CHECK(op.finalize(std::uint8_t{200}, 200) == 1);  // n does not fit int8/uint8: no wrap
  CHECK(op.finalize(std::int8_t{-100}, 200) == 0);
  CHECK(op.finalize(std::uint64_t{0xffffffffffffffffu}, 5) == 0x3333333333333333u);
  CHECK(op.finalize(-7.0f, 2) == -3.5f);
  CHECK(op.finalize(1.0, 3) == 1.0 / 3.0);
  CHECK(plait::from_compute<half>(op.finalize(plait::to_compute(half(3.0f)), 2)).bits == half(1.5f).bits);
}

TEMPLATE_TEST_CASE("min and max propagate NaN and order signed zeros", "[ops]", float, double) {
  using C = TestType;
  const C nan = std::numeric_limits<C>::quiet_NaN();
  const C inf = std::numeric_limits<C>::infinity();
  const plait::min mn;
  const plait::max mx;
  CHECK(std::isnan(mn(nan, C(1))));
  CHECK(std::isnan(mn(C(1), nan)));
  CHECK(std::isnan(mx(nan, C(1))));
  CHECK(std::isnan(mx(C(1), nan)));
  CHECK(std::isnan(mx(nan, inf)));
  CHECK(std::isnan(mn(-inf, nan)));
  CHECK(std::signbit(mn(C(-0.0), C(0.0))));
  CHECK(std::signbit(mn(C(0.0), C(-0.0))));
  CHECK_FALSE(std::signbit(mx(C(-0.0), C(0.0))));
  CHECK_FALSE(std::signbit(mx(C(0.0), C(-0.0))));
  CHECK(mn(-inf, C(1)) == -inf);
  CHECK(mx(-inf, C(1)) == C(1));
  CHECK(mx(inf, C(1)) == inf);
}

TEST_CASE("min and max on half and bfloat16 keep NaN through the store", "[ops]") {
  const half hnan = half::from_bits(0x7e00);
  const half r = apply(plait::max{}, half(1.0f), hnan);
  CHECK((r.bits & 0x7c00) == 0x7c00);
  CHECK((r.bits & 0x03ff) != 0);
  const bfloat16 b = apply(plait::min{}, bfloat16::from_bits(0xffc0), bfloat16(1.0f));
  CHECK(b.bits == 0xffc0);
}

TEMPLATE_TEST_CASE("band, bor and bxor on every integer type", "[ops]", std::int8_t, std::int16_t, std::int32_t,
                   std::int64_t, std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t) {
  using T = TestType;
  const T a = static_cast<T>(0x5c);  // 0101 1100
  const T b = static_cast<T>(0x36);  // 0011 0110
  CHECK(plait::band{}(a, b) == static_cast<T>(0x14));
  CHECK(plait::bor{}(a, b) == static_cast<T>(0x7e));
  CHECK(plait::bxor{}(a, b) == static_cast<T>(0x6a));
  const T all = static_cast<T>(~T{0});  // -1 for signed types
  CHECK(plait::band{}(all, b) == b);
  CHECK(plait::bor{}(all, b) == all);
  CHECK(plait::bxor{}(all, a) == static_cast<T>(~a));
  CHECK(plait::bxor{}(a, a) == T{0});
}

TEST_CASE("user functors reduce like built-in ops", "[ops]") {
  const absmax op;
  CHECK(apply(op, 2.0f, -3.0f) == -3.0f);
  CHECK(apply(op, bfloat16(-5.0f), bfloat16(4.0f)).bits == bfloat16(-5.0f).bits);
  const sum_of_squares_root rms;
  CHECK(rms.finalize(rms(9.0, 16.0), 2) == 5.0);
}
