// Misuse a rank can see by itself (DESIGN.md section 6): invalid_argument on that
// rank before any payload moves, and a notice that makes every other rank fail
// promptly with mismatch naming it — never a hang. Also a call's own timeout
// (call_options::timeout): the bound it sets on one call, and the broken
// communicator after it.
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>

#include <catch2/catch.hpp>

#include "support/ranks.hpp"

using namespace plait::testing;

namespace {

constexpr int victim = 1;

// What a rank saw: "" (no error), else "<errc>:<peer>:<milliseconds>".
template <class Comm>
blob outcome(Comm&, const std::function<void()>& call) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string s;
  try {
    call();
  } catch (const plait::error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    s = std::string(plait::to_string(e.code())) + ":" + std::to_string(e.peer()) + ":" + std::to_string(ms.count()) +
        ":" + e.what();
  }
  blob b(s.size());
  if (!s.empty()) std::memcpy(b.data(), s.data(), s.size());  // an empty blob's data() may be null
  return b;
}

rank_options short_timeout() {
  rank_options o;
  o.timeout = "5";
  return o;
}

std::string text(const blob& b) { return std::string(reinterpret_cast<const char*>(b.data()), b.size()); }

// misuse(comm) runs on the victim, proper(comm) on everyone else.
template <class Tr>
void expect_rejected(int n, const std::string& what, std::function<void(plait::communicator<Tr>&)> misuse,
                     std::function<void(plait::communicator<Tr>&)> proper) {
  rank_options opt;
  opt.timeout = "20";
  auto results = run_ranks<Tr>(
      n,
      [&](plait::communicator<Tr>& c) {
        std::vector<blob> out;
        if (c.rank() == victim)
          out.push_back(outcome(c, [&] { misuse(c); }));
        else
          out.push_back(outcome(c, [&] { proper(c); }));
        // The communicator is broken afterwards: a later call fails too.
        out.push_back(outcome(c, [&] { plait::barrier(c); }));
        return out;
      },
      opt);
  for (int r = 0; r < n; ++r) {
    INFO(what << ", rank " << r);
    const auto& res = results[static_cast<std::size_t>(r)];
    REQUIRE(res.error == "");
    REQUIRE(res.blobs.size() == 2);
    const std::string first = text(res.blobs[0]), later = text(res.blobs[1]);
    INFO("first call: " << first << "\nlater call: " << later);
    if (r == victim) {
      CHECK(first.rfind("invalid_argument:-1:", 0) == 0);
      CHECK(later.rfind("invalid_argument:", 0) == 0);
    } else {
      // A rank that never waits on anyone in this call (a broadcast root only sends)
      // completes it; its next call then fails. Everyone else fails in this call.
      const std::string& failed = first.empty() ? later : first;
      CHECK(failed.rfind("mismatch:" + std::to_string(victim) + ":", 0) == 0);
      CHECK(later.rfind("mismatch:", 0) == 0);
      // Promptly: well inside the 20 s timeout.
      const auto colon = failed.find(':', failed.find(':') + 1);
      REQUIRE(colon != std::string::npos);
      CHECK(std::stol(failed.substr(colon + 1)) < 3000);
    }
  }
}

template <class Tr>
void misuse_suite(int n) {
  using C = plait::communicator<Tr>;
  std::vector<float> a(64, 1.0f), b(64, 0.0f), big(64 * static_cast<std::size_t>(n), 1.0f);
  auto proper_all_reduce = [&](C& c) {
    plait::all_reduce<plait::ring>(c, std::span<const float>(a), std::span<float>(b), plait::sum{});
  };

  expect_rejected<Tr>(
      n, "all_reduce with input and output of different sizes",
      [&](C& c) {
        plait::all_reduce<plait::ring>(c, std::span<const float>(a.data(), 63), std::span<float>(b), plait::sum{});
      },
      proper_all_reduce);
  expect_rejected<Tr>(
      n, "all_reduce with partly overlapping buffers",
      [&](C& c) {
        plait::all_reduce<plait::ring>(c, std::span<const float>(big.data(), 64), std::span<float>(big.data() + 1, 64),
                                       plait::sum{});
      },
      proper_all_reduce);
  expect_rejected<Tr>(
      n, "all_gather whose output is not size() shards",
      [&](C& c) {
        plait::all_gather<plait::ring>(c, std::span<const float>(a), std::span<float>(big.data(), big.size() - 1));
      },
      [&](C& c) { plait::all_gather<plait::ring>(c, std::span<const float>(a), std::span<float>(big)); });
  expect_rejected<Tr>(
      n, "all_gather with overlapping buffers",
      [&](C& c) { plait::all_gather<plait::ring>(c, std::span<const float>(big.data(), 64), std::span<float>(big)); },
      [&](C& c) { plait::all_gather<plait::ring>(c, std::span<const float>(a), std::span<float>(big)); });
  expect_rejected<Tr>(
      n, "reduce_scatter whose input is not size() shards",
      [&](C& c) {
        plait::reduce_scatter<plait::ring>(c, std::span<const float>(big.data(), big.size() - 1), std::span<float>(b),
                                           plait::sum{});
      },
      [&](C& c) {
        plait::reduce_scatter<plait::ring>(c, std::span<const float>(big), std::span<float>(b), plait::sum{});
      });
  expect_rejected<Tr>(
      n, "broadcast with a root out of range", [&](C& c) { plait::broadcast<plait::tree>(c, std::span<float>(b), n); },
      [&](C& c) { plait::broadcast<plait::tree>(c, std::span<float>(b), 0); });
  expect_rejected<Tr>(
      n, "broadcast with a negative root", [&](C& c) { plait::broadcast<plait::ring>(c, std::span<float>(b), -1); },
      [&](C& c) { plait::broadcast<plait::ring>(c, std::span<float>(b), 0); });
  expect_rejected<Tr>(
      n, "reduce with a root out of range",
      [&](C& c) { plait::reduce<plait::tree>(c, std::span<const float>(a), std::span<float>(b), plait::sum{}, n + 3); },
      [&](C& c) { plait::reduce<plait::tree>(c, std::span<const float>(a), std::span<float>(b), plait::sum{}, 0); });
  expect_rejected<Tr>(
      n, "all_to_all with a count not divisible by the rank count",
      [&](C& c) {
        plait::all_to_all(c, std::span<const float>(big.data(), big.size() - 1),
                          std::span<float>(big.data(), big.size() - 1));
      },
      [&](C& c) {
        std::vector<float> o(big.size());
        plait::all_to_all(c, std::span<const float>(big), std::span<float>(o));
      });
  expect_rejected<Tr>(
      n, "all_gather whose count overflows",
      [&](C& c) {
        const std::size_t huge = std::numeric_limits<std::size_t>::max() / 2;
        plait::all_gather<plait::ring>(c, std::span<const float>(a.data(), huge), std::span<float>(b.data(), huge));
      },
      [&](C& c) { plait::all_gather<plait::ring>(c, std::span<const float>(a), std::span<float>(big)); });
  expect_rejected<Tr>(
      n, "send to oneself", [&](C& c) { plait::send(c, std::span<const float>(a), c.rank()); },
      [&](C& c) { plait::barrier(c); });
  expect_rejected<Tr>(
      n, "recv from a peer out of range", [&](C& c) { plait::recv(c, std::span<float>(b), n); },
      [&](C& c) { plait::barrier(c); });
}

}  // namespace

TEST_CASE("misuse is invalid_argument on its rank and mismatch naming it on the others (shm)", "[misuse][shm]") {
  misuse_suite<plait::transport::shm>(3);
}

TEST_CASE("misuse is invalid_argument on its rank and mismatch naming it on the others (tcp)", "[misuse][tcp]") {
  misuse_suite<plait::transport::tcp>(4);
}

TEST_CASE("send and recv of different sizes is mismatch", "[misuse][shm]") {
  auto results = run_ranks<plait::transport::shm>(
      2,
      [](plait::communicator<plait::transport::shm>& c) {
        std::vector<blob> out;
        std::vector<float> v(c.rank() == 0 ? 10 : 11);
        out.push_back(outcome(c, [&] {
          if (c.rank() == 0)
            plait::send(c, std::span<const float>(v), 1);
          else
            plait::recv(c, std::span<float>(v), 0);
        }));
        return out;
      },
      short_timeout());
  REQUIRE(results[1].error == "");
  INFO(text(results[1].blobs.at(0)));
  CHECK(text(results[1].blobs.at(0)).rfind("mismatch:0:", 0) == 0);
}

// A call's own timeout (call_options::timeout) counts from the call: a peer that
// never joins it makes it fail with `timeout` naming that peer once the call's time
// is up, not the communicator's (20 s here), and every later call fails with the
// same error. Before it, blocking and async calls on the same communicator, and a
// blocking call issued while an async one is in flight, complete with the right
// values (the blocking path reuses one flight and one call for every call).
TEST_CASE("a call's own timeout bounds it from the call; later calls fail the same way", "[timeout][shm]") {
  using C = plait::communicator<plait::transport::shm>;
  rank_options opt;
  opt.timeout = "20";
  constexpr auto call_timeout = std::chrono::milliseconds(400);
  auto results = run_ranks<plait::transport::shm>(
      2,
      [&](C& c) {
        std::vector<float> a(1000, 1.0f), b(1000, 1.0f);
        std::vector<blob> out;
        auto value = [&](float got) { out.push_back(to_blob(std::vector<float>{got})); };
        for (int i = 0; i < 3; ++i) {
          std::fill(a.begin(), a.end(), 1.0f);
          plait::all_reduce(c, std::span<float>(a), plait::sum{});
          value(a[999]);
          std::fill(b.begin(), b.end(), 1.0f);
          plait::request r = plait::all_reduce_async(c, std::span<float>(b), plait::sum{});
          std::fill(a.begin(), a.end(), 2.0f);
          plait::all_reduce(c, std::span<float>(a), plait::sum{});  // while the async one may be in flight
          r.wait();
          value(b[0]);
          value(a[0]);
        }
        if (c.rank() == 1) {
          std::this_thread::sleep_for(call_timeout * 5);  // never joins rank 0's next call in time
          return out;
        }
        out.push_back(outcome(c, [&] {
          plait::all_reduce(c, std::span<float>(a), plait::sum{}, plait::call_options{.timeout = call_timeout});
        }));
        out.push_back(outcome(c, [&] { plait::all_reduce(c, std::span<float>(a), plait::sum{}); }));
        return out;
      },
      opt);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const auto& res = results[static_cast<std::size_t>(r)];
    REQUIRE(res.error == "");
    REQUIRE(res.blobs.size() == (r == 0 ? 11u : 9u));
    for (std::size_t i = 0; i < 9; ++i) {
      INFO("value " << i);
      CHECK(from_blob<float>(res.blobs[i]).at(0) == (i % 3 == 2 ? 4.0f : 2.0f));
    }
  }
  const std::string first = text(results[0].blobs[9]), later = text(results[0].blobs[10]);
  INFO("timed call: " << first << "\nlater call: " << later);
  REQUIRE(first.rfind("timeout:1:", 0) == 0);
  const long ms = std::stol(first.substr(std::string("timeout:1:").size()));
  CHECK(ms >= call_timeout.count());
  CHECK(ms < call_timeout.count() + 1000);
  CHECK(later.rfind("timeout:1:", 0) == 0);
  CHECK(std::stol(later.substr(std::string("timeout:1:").size())) < 100);
}
