// DESIGN.md section 4, line by line: every form there compiles as written and does
// what its semantics say. Run under plaitrun (see meson.build) with 3 ranks over tcp;
// prints "contract ok" on each rank and exits non-zero on the first wrong result.
#include <plait/plait.hpp>
#include <plait/transport/hybrid.hpp>
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

namespace {

int failures = 0;

void expect(bool ok, const char* what, int rank) {
  if (!ok) {
    std::fprintf(stderr, "rank %d: %s is wrong\n", rank, what);
    ++failures;
  }
}

}  // namespace

int main() {
  using tcp_comm = plait::communicator<plait::transport::tcp>;
  tcp_comm comm = tcp_comm::from_env();  // §5
  int r = comm.rank(), n = comm.size();
  const std::size_t count = 1000;

  std::vector<float> in(count), out(count);
  for (std::size_t i = 0; i < count; ++i) in[i] = static_cast<float>(r + 1);
  const float total = static_cast<float>(n * (n + 1) / 2);

  plait::all_reduce(comm, std::span<const float>(in), std::span<float>(out),
                    plait::sum{});  // algorithm chosen by the library
  expect(out[0] == total && out[count - 1] == total, "all_reduce (automatic)", r);
  plait::all_reduce<plait::ring>(comm, std::span<const float>(in), std::span<float>(out), plait::max{});
  expect(out[7] == static_cast<float>(n), "all_reduce<ring> max", r);
  plait::all_reduce<plait::tree>(comm, std::span<float>(out), plait::sum{});  // in place
  expect(out[3] == static_cast<float>(n * n), "all_reduce<tree> in place", r);
  plait::request req =
      plait::all_reduce_async<plait::ring>(comm, std::span<const float>(in), std::span<float>(out), plait::sum{});
  req.wait();
  expect(out[999] == total, "all_reduce_async<ring>", r);

  std::vector<float> shard(count / 10, static_cast<float>(r)), full(shard.size() * static_cast<std::size_t>(n));
  plait::all_gather<plait::ring>(comm, std::span<const float>(shard),
                                 std::span<float>(full));  // full.size() == shard.size() * n
  expect(full[shard.size() * static_cast<std::size_t>(n - 1)] == static_cast<float>(n - 1), "all_gather<ring>", r);
  plait::reduce_scatter<plait::ring>(comm, std::span<const float>(full), std::span<float>(shard), plait::sum{});
  expect(shard[0] == static_cast<float>(n * r), "reduce_scatter<ring>", r);

  std::vector<float> buf(count, r == 0 ? 42.0f : 0.0f);
  plait::broadcast<plait::tree>(comm, std::span<float>(buf), /*root=*/0);
  expect(buf[500] == 42.0f, "broadcast<tree>", r);
  plait::reduce<plait::tree>(comm, std::span<const float>(in), std::span<float>(out), plait::sum{}, /*root=*/0);
  if (r == 0) expect(out[1] == total, "reduce<tree> at the root", r);

  std::vector<float> blocks(static_cast<std::size_t>(n) * 4), swapped(blocks.size());
  for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = static_cast<float>(r * 100 + static_cast<int>(i / 4));
  plait::all_to_all(comm, std::span<const float>(blocks), std::span<float>(swapped));  // in/out hold n equal blocks
  expect(swapped[4 * static_cast<std::size_t>(n - 1)] == static_cast<float>((n - 1) * 100 + r), "all_to_all", r);

  if (r == 0) plait::send(comm, std::span<const float>(in), /*peer=*/1);
  if (r == 1) {
    plait::recv(comm, std::span<float>(out), /*peer=*/0);
    expect(out[10] == 1.0f, "send/recv", r);
  }
  plait::barrier(comm);
  plait::all_reduce(comm, std::span<float>(out), plait::sum{}, plait::call_options{.timeout = std::chrono::seconds(3)});

  comm.set_timeout(std::chrono::seconds(30));
  using mixed = plait::communicator<plait::transport::hybrid<plait::transport::shm, plait::transport::tcp>>;
  // shm to ranks on this host, tcp to the others
  mixed both = mixed::from_env();
  std::vector<double> d(5, 1.0);
  plait::all_reduce(both, std::span<double>(d), plait::sum{});
  expect(d[4] == static_cast<double>(n), "hybrid all_reduce", r);

  // Errors carry code, rank, peer and sequence.
  try {
    plait::broadcast<plait::ring>(both, std::span<double>(d), /*root=*/n);
    expect(false, "broadcast with a bad root", r);
  } catch (const plait::error& e) {
    expect(e.code() == plait::errc::invalid_argument && e.rank() == r && e.peer() == -1 && e.sequence() == 2,
           "plait::error fields", r);
  }
  if (failures == 0) std::printf("contract ok on rank %d of %d\n", r, n);
  return failures == 0 ? 0 : 1;
}
