// hello all-reduce: every rank contributes its rank number; everyone gets the sum.
//
//   plaitrun -n 4 ./hello_all_reduce
#include <plait/plait.hpp>
#include <plait/transport/shm.hpp>

#include <cstdio>
#include <vector>

int main() {
  using comm_t = plait::communicator<plait::transport::shm>;
  comm_t comm = comm_t::from_env();
  const int r = comm.rank(), n = comm.size();

  std::vector<float> grad(1024, static_cast<float>(r));
  plait::all_reduce(comm, std::span<float>(grad), plait::sum{});  // in place, algorithm chosen per call

  const float want = static_cast<float>(n * (n - 1) / 2);
  std::printf("rank %d of %d: grad[0] = %g (expected %g)\n", r, n, grad[0], want);
  return grad[0] == want ? 0 : 1;
}
