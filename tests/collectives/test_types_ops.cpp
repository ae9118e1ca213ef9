// Every element type x every op that applies, over shm with 3 ranks (DESIGN.md section 8).
#include <plait/transport/shm.hpp>

#include "collectives/matrix.hpp"

using plait::transport::shm;
using namespace plait::testing;

namespace {

template <class T, class Op>
void add(case_list<shm>& cs, int n) {
  for (std::size_t count : {0, 1, 13, 4099}) {
    case_list<shm> one;
    add_all_reduce<shm, T, Op>(one, n, count);
    cs.push_back(one[count % 2 == 0 ? 0 : 2]);  // ring for even counts, tree for odd
  }
}

template <class T>
void add_arith(case_list<shm>& cs, int n) {
  add<T, plait::sum>(cs, n);
  add<T, plait::prod>(cs, n);
  add<T, plait::min>(cs, n);
  add<T, plait::max>(cs, n);
  add<T, plait::avg>(cs, n);
}

template <class T>
void add_int(case_list<shm>& cs, int n) {
  add_arith<T>(cs, n);
  add<T, plait::band>(cs, n);
  add<T, plait::bor>(cs, n);
  add<T, plait::bxor>(cs, n);
}

// A user's own functor, compiled into the fused kernel.
struct absmax {
  float operator()(float a, float b) const { return (a < 0 ? -a : a) > (b < 0 ? -b : b) ? a : b; }
};

}  // namespace

TEST_CASE("every element type x op all-reduces exactly over shm with 3 ranks", "[collectives][types][shm]") {
  const int n = 3;
  check_cases<shm>(n, [=] {
    case_list<shm> cs;
    add_arith<float>(cs, n);
    add_arith<double>(cs, n);
    add_arith<plait::half>(cs, n);
    add_arith<plait::bfloat16>(cs, n);
    add_int<std::int8_t>(cs, n);
    add_int<std::int16_t>(cs, n);
    add_int<std::int32_t>(cs, n);
    add_int<std::int64_t>(cs, n);
    add_int<std::uint8_t>(cs, n);
    add_int<std::uint16_t>(cs, n);
    add_int<std::uint32_t>(cs, n);
    add_int<std::uint64_t>(cs, n);
    add<float, absmax>(cs, n);
    add<plait::bfloat16, absmax>(cs, n);
    return cs;
  });
}
