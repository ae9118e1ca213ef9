// Schedules on the in-process sim transport: ranks as threads, so every algorithm is
// checked without processes or sockets (and runs under TSan).
#include <plait/plait.hpp>
#include <plait/transport/sim.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>

#include <catch2/catch.hpp>

#include "support/reference.hpp"
#include "support/thread_bootstrap.hpp"

using comm_t = plait::communicator<plait::transport::sim>;
using namespace plait::testing;

namespace {

// Runs body(comm) on n threads; returns the first error message per rank ("" = ok).
template <class F>
std::vector<std::string> on_threads(int n, const std::string& job, F body, std::size_t slice = 1024,
                                    std::vector<int> chain = {}, std::vector<int> cycle = {}) {
  auto st = std::make_shared<thread_store>();
  st->job = job;
  std::vector<std::string> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        plait::detail::comm_config cfg;
        cfg.slice_bytes = slice;
        cfg.timeout = std::chrono::seconds(20);
        cfg.chain = chain;
        cfg.cpu_ring = cycle;
        auto c = comm_t::create(std::make_unique<thread_bootstrap>(st, r, n), cfg);
        body(c, errors[static_cast<std::size_t>(r)]);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("ring and tree schedules produce the reference on the sim transport", "[sim]") {
  const int n = GENERATE(1, 2, 3, 4, 5, 8);
  const std::size_t count = GENERATE(as<std::size_t>{}, 0, 1, 13, 4099, 100003);
  CAPTURE(n, count);
  const auto want = reference_all_reduce<float, plait::sum>(n, count);
  auto errors =
      on_threads(n, "sim-" + std::to_string(n) + "-" + std::to_string(count), [&](comm_t& c, std::string& err) {
        const auto in = exact_pattern<float>(c.rank(), count);
        std::vector<float> out(count);
        plait::all_reduce<plait::ring>(c, std::span<const float>(in), std::span<float>(out), plait::sum{});
        err += compare(want, out, c.rank(), "all_reduce<ring>");
        auto buf = in;
        plait::all_reduce<plait::tree>(c, std::span<float>(buf), plait::sum{});
        err += compare(want, buf, c.rank(), "all_reduce<tree> in place");
        if (n <= plait::direct::max_all_reduce_ranks) {
          auto d = in;
          plait::all_reduce<plait::direct>(c, std::span<float>(d), plait::sum{});
          err += compare(want, d, c.rank(), "all_reduce<direct> in place");
        }
        if (plait::recursive_doubling::supports(n)) {
          auto d = in;
          plait::all_reduce<plait::recursive_doubling>(c, std::span<float>(d), plait::sum{});
          err += compare(want, d, c.rank(), "all_reduce<recursive_doubling> in place");
          std::vector<float> o(count);
          plait::all_reduce<plait::recursive_doubling>(c, std::span<const float>(in), std::span<float>(o),
                                                       plait::sum{});
          err += compare(want, o, c.rank(), "all_reduce<recursive_doubling> out of place");
        }
        std::vector<float> b = c.rank() == n - 1 ? in : std::vector<float>(count);
        plait::broadcast<plait::tree>(c, std::span<float>(b), n - 1);
        err += compare(exact_pattern<float>(n - 1, count), b, c.rank(), "broadcast<tree>");
        plait::barrier(c);
      });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
}

TEST_CASE("ring::broadcast follows the chain it is given, from every root", "[sim][chain]") {
  // The schedule: chain 0-2-1-3 from root 1 runs 1 -> 3 -> 0 -> 2.
  plait::detail::schedule_params p;
  p.size = 4;
  p.root = 1;
  p.count = 10;
  p.slice_elems = 4;
  const std::vector<int> chain = {0, 2, 1, 3};
  p.chain = chain;
  const int want_prev[4] = {3, -1, 0, 1}, want_next[4] = {2, 3, -1, 0};
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    p.rank = r;
    const auto s = plait::ring::broadcast(p);
    REQUIRE(s.size() == 3);  // slices of 4, 4 and 2 elements
    for (const auto& st : s) {
      CHECK(st.recv_peer[0] == want_prev[r]);
      CHECK(st.send_peer[0] == want_next[r]);
    }
  }
  // The data, on the sim transport, with chains that are not rank order.
  const int n = GENERATE(3, 4, 5, 8);
  const std::size_t count = 4099;
  std::vector<int> order;  // the even ranks, then the odd ones (as two CPUs, round robin)
  for (int parity : {0, 1})
    for (int r = parity; r < n; r += 2) order.push_back(r);
  CAPTURE(n, order);
  auto errors = on_threads(
      n, "chain-" + std::to_string(n),
      [&](comm_t& c, std::string& err) {
        for (int root = 0; root < n; ++root) {
          const auto want = exact_pattern<float>(root, count);
          std::vector<float> b = c.rank() == root ? want : std::vector<float>(count);
          plait::broadcast<plait::ring>(c, std::span<float>(b), root);
          err += compare(want, b, c.rank(), "broadcast<ring> from root " + std::to_string(root));
        }
      },
      1024, order);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
}

TEST_CASE("ring's all_reduce and reduce_scatter follow the cycle they are given", "[sim][chain]") {
  // The schedule: cycle 0-2-1-3, so rank 0 sends to 2 and takes from 3, and the last
  // step of a reduce_scatter reduces the rank's own block.
  plait::detail::schedule_params p;
  p.size = 4;
  p.count = 16;
  p.slice_elems = 16;
  const std::vector<int> cycle = {0, 2, 1, 3};
  p.cycle = cycle;
  const int want_prev[4] = {3, 2, 0, 1}, want_next[4] = {2, 3, 1, 0};
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    p.rank = r;
    const auto ar = plait::ring::all_reduce(p);
    REQUIRE(ar.size() == 7);  // 2(n-1) steps and the last receive
    CHECK(ar.front().send_peer[0] == want_next[r]);
    for (std::size_t i = 1; i < ar.size(); ++i) {
      CHECK(ar[i].recv_peer[0] == want_prev[r]);
      if (i + 1 < ar.size()) CHECK(ar[i].send_peer[0] == want_next[r]);
    }
    const auto rs = plait::ring::reduce_scatter(p);
    REQUIRE(rs.size() == 4);
    CHECK(rs.front().send_peer[0] == want_next[r]);
    CHECK(rs.back().recv_peer[0] == want_prev[r]);
    CHECK(rs.back().write_output);
    CHECK(rs.back().src_offset == static_cast<std::size_t>(r) * p.count);  // its own block
  }
  // The data, on the sim transport, with cycles that are not rank order: the even
  // ranks, then the odd ones (two CPUs, round robin), which the communicator takes
  // for all_reduce below 2 MiB and reduce_scatter below 512 KiB (comm_config::
  // ring_follows_cpus), and rank order above.
  const int n = GENERATE(3, 4, 5, 8);
  std::vector<int> order;
  for (int parity : {0, 1})
    for (int r = parity; r < n; r += 2) order.push_back(r);
  CAPTURE(n, order);
  const std::size_t small = 4099,
                    large = plait::detail::comm_config::ring_cpus_all_reduce_below_bytes / sizeof(float) + 7;
  const std::size_t shard = 1001;
  const auto want_small = reference_all_reduce<float, plait::sum>(n, small);
  const auto want_large = reference_all_reduce<float, plait::sum>(n, large);
  auto errors = on_threads(
      n, "cycle-" + std::to_string(n),
      [&](comm_t& c, std::string& err) {
        using plait::detail::collective_kind;  // checked here, not with CHECK: Catch2 is not thread-safe
        const auto& cfg = c.core().config();
        if (!cfg.ring_follows_cpus(collective_kind::all_reduce, small * sizeof(float)) ||
            cfg.ring_follows_cpus(collective_kind::all_reduce, large * sizeof(float)) ||
            !cfg.ring_follows_cpus(collective_kind::reduce_scatter,
                                   shard * sizeof(float) * static_cast<std::size_t>(n)))
          err += "rank " + std::to_string(c.rank()) + ": the cycle is not taken where it should be; ";
        for (const auto* want : {&want_small, &want_large}) {
          const std::size_t count = want->size();
          const auto in = exact_pattern<float>(c.rank(), count);
          std::vector<float> out(count);
          plait::all_reduce<plait::ring>(c, std::span<const float>(in), std::span<float>(out), plait::sum{});
          err += compare(*want, out, c.rank(), "all_reduce<ring> of " + std::to_string(count));
          auto buf = in;
          plait::all_reduce(c, std::span<float>(buf), plait::sum{});
          err += compare(*want, buf, c.rank(), "all_reduce<automatic> in place of " + std::to_string(count));
        }
        // reduce_scatter: rank r's block is the sum of every rank's block r.
        const auto in = exact_pattern<float>(c.rank(), shard * static_cast<std::size_t>(n));
        std::vector<float> got(shard);
        plait::reduce_scatter<plait::ring>(c, std::span<const float>(in), std::span<float>(got), plait::sum{});
        std::vector<float> want(shard, 0.0f);
        for (int q = 0; q < n; ++q) {
          const auto theirs = exact_pattern<float>(q, shard * static_cast<std::size_t>(n));
          for (std::size_t i = 0; i < shard; ++i) want[i] += theirs[static_cast<std::size_t>(c.rank()) * shard + i];
        }
        err += compare(want, got, c.rank(), "reduce_scatter<ring>");
      },
      1024, {}, order);
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
}

// An algorithm written outside the library (docs/algorithms.md, "Adding an
// algorithm"): it hands out the library's schedules (direct's broadcast, the ring's
// and the tree's for the rest) and counts the schedules the collectives ask it for.
struct counting_algorithm {
  static constexpr std::uint8_t id = 200;
  static constexpr const char* name = "counting_algorithm";
  static inline std::atomic<int> made{0};
  static plait::detail::schedule counted(plait::detail::schedule s) {
    ++made;
    return s;
  }
  using params = plait::detail::schedule_params;
  static plait::detail::schedule broadcast(const params& p) { return counted(plait::direct::broadcast(p)); }
  static plait::detail::schedule all_reduce(const params& p) { return counted(plait::ring::all_reduce(p)); }
  static plait::detail::schedule all_gather(const params& p) { return counted(plait::ring::all_gather(p)); }
  static plait::detail::schedule reduce_scatter(const params& p) { return counted(plait::ring::reduce_scatter(p)); }
  static plait::detail::schedule reduce(const params& p) { return counted(plait::tree::reduce(p)); }
};

TEST_CASE("the collectives run the schedules of an algorithm written outside the library", "[sim][extension]") {
  const int n = GENERATE(1, 3, 4);
  const std::size_t count = 4099;
  CAPTURE(n);
  const auto want = reference_all_reduce<float, plait::sum>(n, count);
  const int root = n / 2;
  for (const std::string op : {"broadcast", "all_reduce", "all_gather", "reduce_scatter", "reduce"}) {
    CAPTURE(op);
    counting_algorithm::made = 0;
    auto errors = on_threads(n, "sim-extension-" + op + "-" + std::to_string(n), [&](comm_t& c, std::string& err) {
      const auto in = exact_pattern<float>(c.rank(), count);
      if (op == "broadcast") {
        std::vector<float> b = c.rank() == root ? in : std::vector<float>(count);
        plait::broadcast<counting_algorithm>(c, std::span<float>(b), root);
        err += compare(exact_pattern<float>(root, count), b, c.rank(), "broadcast<counting_algorithm>");
      } else if (op == "all_reduce") {
        std::vector<float> out(count);
        plait::all_reduce<counting_algorithm>(c, std::span<const float>(in), std::span<float>(out), plait::sum{});
        err += compare(want, out, c.rank(), "all_reduce<counting_algorithm>");
      } else if (op == "all_gather") {
        std::vector<float> full(count * static_cast<std::size_t>(n));
        plait::all_gather<counting_algorithm>(c, std::span<const float>(in), std::span<float>(full));
        for (int q = 0; q < n; ++q)
          err += compare(exact_pattern<float>(q, count),
                         std::vector<float>(full.begin() + static_cast<std::ptrdiff_t>(q * count),
                                            full.begin() + static_cast<std::ptrdiff_t>((q + 1) * count)),
                         c.rank(), "all_gather<counting_algorithm>");
      } else if (op == "reduce_scatter") {
        std::vector<float> full(count * static_cast<std::size_t>(n));
        for (int q = 0; q < n; ++q)
          std::copy(in.begin(), in.end(), full.begin() + static_cast<std::ptrdiff_t>(q * count));
        std::vector<float> shard(count);
        plait::reduce_scatter<counting_algorithm>(c, std::span<const float>(full), std::span<float>(shard),
                                                  plait::sum{});
        err += compare(want, shard, c.rank(), "reduce_scatter<counting_algorithm>");
      } else {
        std::vector<float> out(count);
        plait::reduce<counting_algorithm>(c, std::span<const float>(in), std::span<float>(out), plait::sum{}, root);
        err +=
            compare(c.rank() == root ? want : std::vector<float>(count), out, c.rank(), "reduce<counting_algorithm>");
      }
    });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r);
      CHECK(errors[static_cast<std::size_t>(r)] == "");
    }
    CHECK(counting_algorithm::made.load() >= n);  // every rank's schedule came from the algorithm
  }
}

// all_reduce<Algo> on n ranks, which Algo does not support: each rank refuses the
// call itself before any payload moves, so invalid_argument everywhere, saying why.
template <class Algo>
void expect_refused_everywhere(int n, const std::string& why) {
  const std::string name = std::string("all_reduce<") + Algo::name + "> on " + std::to_string(n) + " ranks";
  auto errors = on_threads(n, "sim-refused-" + std::to_string(n), [&](comm_t& c, std::string& err) {
    std::vector<float> v(8, 1.0f);
    try {
      plait::all_reduce<Algo>(c, std::span<float>(v), plait::sum{});
      err = name + " returned";
    } catch (const plait::error& e) {
      if (e.code() != plait::errc::invalid_argument)
        err = name + ": expected invalid_argument, got " + e.what();
      else if (std::string(e.what()).find(why) == std::string::npos)
        err = name + ": the message does not say why: " + e.what();
    }
  });
  for (auto& e : errors) CHECK(e == "");
}

TEST_CASE("all_reduce<direct> on more than 3 ranks is invalid_argument on every rank", "[sim][direct]") {
  expect_refused_everywhere<plait::direct>(4, "2 or 3 ranks");
}

TEST_CASE("all_reduce<recursive_doubling> on 3 or 6 ranks is invalid_argument on every rank", "[sim][doubling]") {
  expect_refused_everywhere<plait::recursive_doubling>(GENERATE(3, 6), "power-of-two");
}

TEST_CASE("all_gather<recursive_doubling>: every shard in place on 1 to 8 ranks, refused on 3 or 6",
          "[sim][doubling]") {
  const int n = GENERATE(1, 2, 3, 4, 6, 8);
  const std::size_t count = GENERATE(std::size_t{0}, std::size_t{5}, std::size_t{1000});
  auto errors = on_threads(n, "sim-gather-rd-" + std::to_string(n), [&](comm_t& c, std::string& err) {
    const auto shard = exact_pattern<float>(c.rank(), count);
    std::vector<float> full(count * static_cast<std::size_t>(n), -1.0f);
    try {
      plait::all_gather<plait::recursive_doubling>(c, std::span<const float>(shard), std::span<float>(full));
    } catch (const plait::error& e) {
      if (plait::recursive_doubling::supports(n) || e.code() != plait::errc::invalid_argument ||
          std::string(e.what()).find("power-of-two") == std::string::npos)
        err = std::string("threw: ") + e.what();
      return;
    }
    if (!plait::recursive_doubling::supports(n)) {
      err = "returned on " + std::to_string(n) + " ranks";
      return;
    }
    std::vector<float> want;
    for (int q = 0; q < n; ++q) {
      const auto s = exact_pattern<float>(q, count);
      want.insert(want.end(), s.begin(), s.end());
    }
    err += compare(want, full, c.rank(), "all_gather<recursive_doubling>");
  });
  for (int r = 0; r < n; ++r) {
    INFO(n << " ranks, count " << count << ", rank " << r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
}

// Floats with rounding: every rank must still hold the same bits, whichever
// algorithm combined them (ring and tree compute each element once and pass it on;
// direct and recursive doubling compute it on every rank, in one association).
TEST_CASE("all_reduce leaves the same bits on every rank for inexact floats", "[sim][bitwise]") {
  const int n = GENERATE(2, 3, 4, 8);
  const std::size_t count = 1000;
  CAPTURE(n);
  std::vector<std::vector<float>> got(static_cast<std::size_t>(n) * 5);
  auto errors = on_threads(n, "sim-bits-" + std::to_string(n), [&](comm_t& c, std::string&) {
    std::vector<float> in(count);
    std::uint32_t x = 2654435761u * static_cast<std::uint32_t>(c.rank() + 1);
    for (auto& v : in) {
      x = x * 1664525u + 1013904223u;
      v = static_cast<float>(x >> 8) * 1e-7f - 0.5f;  // 24 random bits: sums round
    }
    auto slot = [&](int k) -> std::vector<float>& { return got[static_cast<std::size_t>(k * n + c.rank())]; };
    slot(0) = in;
    plait::all_reduce<plait::ring>(c, std::span<float>(slot(0)), plait::sum{});
    slot(1) = in;
    plait::all_reduce<plait::tree>(c, std::span<float>(slot(1)), plait::sum{});
    slot(2) = in;
    plait::all_reduce<plait::automatic>(c, std::span<float>(slot(2)), plait::sum{});
    if (n <= plait::direct::max_all_reduce_ranks) {
      slot(3) = in;
      plait::all_reduce<plait::direct>(c, std::span<float>(slot(3)), plait::sum{});
    }
    if (plait::recursive_doubling::supports(n)) {
      slot(4) = in;
      plait::all_reduce<plait::recursive_doubling>(c, std::span<float>(slot(4)), plait::sum{});
    }
  });
  for (auto& e : errors) CHECK(e == "");
  const char* names[] = {"ring", "tree", "automatic", "direct", "recursive_doubling"};
  for (int k = 0; k < 5; ++k) {
    INFO(names[k]);
    for (int r = 1; r < n; ++r) {
      const auto& a = got[static_cast<std::size_t>(k * n)];
      const auto& b = got[static_cast<std::size_t>(k * n + r)];
      REQUIRE(a.size() == b.size());
      if (a.empty()) continue;  // this algorithm does not run on n ranks
      CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("a rank that skips a collective makes the others fail with mismatch, not hang", "[sim][mismatch]") {
  const int n = 3;
  auto errors = on_threads(n, "sim-mismatch", [&](comm_t& c, std::string&) {
    std::vector<float> v(100, 1.0f);
    if (c.rank() == 0) {
      std::vector<float> big(101, 1.0f);
      plait::all_reduce<plait::ring>(c, std::span<float>(big), plait::sum{});
    } else {
      plait::all_reduce<plait::ring>(c, std::span<float>(v), plait::sum{});
    }
  });
  int mismatches = 0;
  for (auto& e : errors) mismatches += e.find("mismatch") != std::string::npos;
  INFO(errors[0] << "\n" << errors[1] << "\n" << errors[2]);
  CHECK(mismatches >= 2);
}

TEST_CASE("abort() from another thread ends pending and blocked calls with aborted within 100 ms", "[sim][abort]") {
  // 20 rounds; the bound (100 ms from abort() to each call's error) holds on the
  // median, with no round over twice it.
  const int rounds = 20;
  std::vector<long> blocked_us, pending_us;
  for (int round = 0; round < rounds; ++round) {
    std::atomic<bool> done{false};
    auto errors = on_threads(2, "sim-abort-" + std::to_string(round), [&](comm_t& c, std::string& err) {
      if (c.rank() == 1) {  // alive, but never joins the collectives
        for (int i = 0; i < 500 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        return;
      }
      std::vector<float> a(10), b(10);
      plait::request pending = plait::all_reduce_async<plait::ring>(c, std::span<float>(a), plait::sum{});
      std::atomic<long long> aborted_at{0};
      std::thread killer([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        aborted_at.store(std::chrono::steady_clock::now().time_since_epoch().count());
        c.abort();
      });
      auto since_abort = [&] {
        const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
        return std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::steady_clock::duration(now - aborted_at.load()))
            .count();
      };
      auto expect_aborted = [&](const char* what, auto&& call, std::vector<long>* times) {
        try {
          call();
          err += std::string(what) + " returned after abort(); ";
        } catch (const plait::error& e) {
          if (times) times->push_back(static_cast<long>(since_abort()));
          if (e.code() != plait::errc::aborted) err += std::string(what) + ": expected aborted, got " + e.what() + "; ";
        }
      };
      expect_aborted(
          "blocked all_reduce", [&] { plait::all_reduce<plait::ring>(c, std::span<float>(b), plait::sum{}); },
          &blocked_us);
      expect_aborted(
          "pending all_reduce_async", [&] { pending.wait(); }, &pending_us);
      killer.join();
      expect_aborted(
          "a later barrier", [&] { plait::barrier(c); }, nullptr);
      done.store(true);
    });
    INFO("round " << round);
    CHECK(errors[0] == "");
  }
  REQUIRE(blocked_us.size() == static_cast<std::size_t>(rounds));
  REQUIRE(pending_us.size() == static_cast<std::size_t>(rounds));
  for (auto* times : {&blocked_us, &pending_us}) {
    std::sort(times->begin(), times->end());
    const long median = (*times)[times->size() / 2], worst = times->back();
    INFO("median " << median << " us, max " << worst << " us over " << rounds << " rounds");
    CHECK(median <= 100000);
    CHECK(worst <= 200000);
  }
}

TEST_CASE("an async collective makes progress while its caller does not wait", "[sim][async]") {
  const int n = 2;
  std::atomic<long> blocking_ms{-1};
  auto errors = on_threads(n, "sim-async", [&](comm_t& c, std::string& err) {
    std::vector<float> v(100000, 1.0f);
    if (c.rank() == 0) {
      plait::request req = plait::all_reduce_async<plait::ring>(c, std::span<float>(v), plait::sum{});
      std::this_thread::sleep_for(std::chrono::milliseconds(800));  // busy with something else, not waiting
      req.wait();
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      plait::all_reduce<plait::ring>(c, std::span<float>(v), plait::sum{});
      blocking_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    }
    if (v[99999] != 2.0f) err = "wrong result";
  });
  CHECK(errors[0] == "");
  CHECK(errors[1] == "");
  INFO("the blocking peer took " << blocking_ms.load() << " ms");
  CHECK(blocking_ms.load() >= 0);
  CHECK(blocking_ms.load() < 600);  // it did not wait for rank 0's wait()
}

TEST_CASE("calls that differ only in root, count or direction keep their own schedules, call after call",
          "[sim][reuse]") {
  // The communicator reuses finished calls and keeps recent schedules by what they
  // were made from; each of these pairs differs in one field of that key only.
  const int n = GENERATE(2, 3);
  CAPTURE(n);
  auto errors = on_threads(n, "sim-reuse-" + std::to_string(n), [&](comm_t& c, std::string& err) {
    const int me = c.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
    for (int round = 0; round < 3; ++round) {
      for (int root : {0, 1}) {
        std::vector<float> b(300, static_cast<float>(me == root ? 10 * root + round : -1));
        plait::broadcast(c, std::span<float>(b), root);
        if (b.front() != static_cast<float>(10 * root + round) || b.back() != b.front())
          err += "broadcast root " + std::to_string(root) + " round " + std::to_string(round) + "; ";
      }
      for (std::size_t count : {std::size_t{300}, std::size_t{301}}) {
        std::vector<float> v(count, static_cast<float>(me + 1));
        plait::request r = plait::all_reduce_async(c, std::span<float>(v), plait::sum{});
        r.wait();
        if (v.front() != static_cast<float>(n * (n + 1) / 2) || v.back() != v.front())
          err += "all_reduce count " + std::to_string(count) + "; ";
      }
      // Same count both ways (with 2 ranks the same peer too): a send and a receive.
      std::vector<float> mine(300, static_cast<float>(me)), got(300, -1.0f);
      plait::send(c, std::span<const float>(mine), next);
      plait::recv(c, std::span<float>(got), prev);
      if (got.front() != static_cast<float>(prev) || got.back() != got.front()) err += "send/recv; ";
    }
  });
  for (auto& e : errors) CHECK(e == "");
}

TEST_CASE("isend then blocking recv on a ring does not deadlock (per-pair ordering)", "[sim][async]") {
  const int n = 4;
  auto errors = on_threads(n, "sim-isend", [&](comm_t& c, std::string& err) {
    std::vector<float> mine(50000, static_cast<float>(c.rank())), got(50000);
    for (int round = 0; round < 3; ++round) {
      plait::request s = plait::send_async(c, std::span<const float>(mine), (c.rank() + 1) % n);
      plait::recv(c, std::span<float>(got), (c.rank() + n - 1) % n);
      s.wait();
      if (got[49999] != static_cast<float>((c.rank() + n - 1) % n)) err = "wrong data";
      plait::all_reduce<plait::ring>(c, std::span<float>(got), plait::sum{});
    }
  });
  for (auto& e : errors) CHECK(e == "");
}

TEST_CASE("a rank that leaves mid-job is named by every rank still waiting, also through others", "[sim][peer_lost]") {
  const int n = 5, gone = 2;
  auto errors = on_threads(n, "sim-cascade", [&](comm_t& c, std::string& err) {
    if (c.rank() == gone) return;  // destroys its communicator: its links close
    try {
      std::vector<float> v(1 << 16, 1.0f);
      for (int i = 0; i < 1000; ++i) plait::all_reduce<plait::ring>(c, std::span<float>(v), plait::sum{});
      err = "no error although rank 2 left";
    } catch (const plait::error& e) {
      if (e.code() != plait::errc::peer_lost || e.peer() != gone) err = e.what();
    }
  });
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    CHECK(errors[static_cast<std::size_t>(r)] == "");
  }
}
