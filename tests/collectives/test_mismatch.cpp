// Ranks that call different collectives (DESIGN.md section 6): every rank fails with
// mismatch within T_op, naming a rank and what differed — no hang, no wrong data,
// no write past a buffer (this file also runs under ASan).
#include <plait/transport/shm.hpp>
#include <plait/transport/tcp.hpp>

#include <chrono>

#include <catch2/catch.hpp>

#include "support/ranks.hpp"

using namespace plait::testing;

namespace {

constexpr int ranks = 4;
constexpr std::size_t n_elems = 4099;

blob text_blob(const std::string& s) {
  return blob(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data() + s.size()));
}

// "errc|peer|ms|what" of the first failing call, "" if every call succeeded.
template <class Comm, class F>
blob first_failure(Comm& c, F calls) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string s;
  try {
    calls(c);
  } catch (const plait::error& e) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
    s = std::string(plait::to_string(e.code())) + "|" + std::to_string(e.peer()) + "|" + std::to_string(ms.count()) +
        "|" + e.what();
  }
  return text_blob(s);
}

// Guarded buffers: the elements past `count` must stay untouched.
struct guarded {
  std::vector<float> v;
  std::size_t count;
  explicit guarded(std::size_t c) : v(c + 64, -7.0f), count(c) {}
  std::span<float> span() { return {v.data(), count}; }
  bool intact() const {
    for (std::size_t i = count; i < v.size(); ++i)
      if (v[i] != -7.0f) return false;
    return true;
  }
};

template <class Tr>
void expect_mismatch_everywhere(const std::string& what, std::function<void(plait::communicator<Tr>&)> odd_rank0,
                                std::function<void(plait::communicator<Tr>&)> others) {
  rank_options opt;
  opt.timeout = "3";
  auto results = run_ranks<Tr>(
      ranks,
      [&](plait::communicator<Tr>& c) {
        std::vector<blob> out;
        out.push_back(first_failure(c, c.rank() == 0 ? odd_rank0 : others));
        out.push_back(first_failure(c, [](plait::communicator<Tr>& k) { plait::barrier(k); }));  // broken afterwards
        return out;
      },
      opt);
  for (int r = 0; r < ranks; ++r) {
    INFO(what << ": rank " << r);
    const auto& res = results[static_cast<std::size_t>(r)];
    REQUIRE(res.error == "");
    REQUIRE(res.blobs.size() == 2);
    const std::string first(reinterpret_cast<const char*>(res.blobs[0].data()), res.blobs[0].size());
    const std::string later(reinterpret_cast<const char*>(res.blobs[1].data()), res.blobs[1].size());
    INFO("first: " << first << "\nlater: " << later);
    // A rank whose part of the call only sends may complete it; then its next call fails.
    const std::string& failed = first.empty() ? later : first;
    CHECK(failed.rfind("mismatch|", 0) == 0);
    CHECK(failed.find("|-1|") == std::string::npos);  // a rank is named
    CHECK(later.rfind("mismatch|", 0) == 0);
    if (!first.empty()) {
      const auto a = first.find('|'), b = first.find('|', a + 1), c = first.find('|', b + 1);
      CHECK(std::stol(first.substr(b + 1, c - b - 1)) < 3000);  // within T_op
    }
  }
}

template <class Tr>
void mismatch_suite() {
  using C = plait::communicator<Tr>;
  auto all_reduce_n = [](std::size_t count) {
    return [count](C& c) {
      guarded g(count);
      plait::all_reduce<plait::ring>(c, g.span(), plait::sum{});
      if (!g.intact()) throw std::runtime_error("all_reduce wrote past its buffer");
    };
  };
  expect_mismatch_everywhere<Tr>("count N+1 against N", all_reduce_n(n_elems + 1), all_reduce_n(n_elems));
  expect_mismatch_everywhere<Tr>("count N/2 against N", all_reduce_n(n_elems / 2), all_reduce_n(n_elems));
  expect_mismatch_everywhere<Tr>("count 0 against N", all_reduce_n(0), all_reduce_n(n_elems));
  expect_mismatch_everywhere<Tr>("all_reduce against broadcast", all_reduce_n(n_elems), [](C& c) {
    guarded g(n_elems);
    plait::broadcast<plait::ring>(c, g.span(), 0);
    if (!g.intact()) throw std::runtime_error("broadcast wrote past its buffer");
  });
  expect_mismatch_everywhere<Tr>(
      "a rank that skips a collective",
      [](C& c) {
        std::vector<float> v(100), full(100 * ranks);
        plait::all_reduce<plait::ring>(c, std::span<float>(v), plait::sum{});
        plait::all_gather<plait::ring>(c, std::span<const float>(v), std::span<float>(full));  // skipped broadcast
      },
      [](C& c) {
        std::vector<float> v(100), full(100 * ranks);
        plait::all_reduce<plait::ring>(c, std::span<float>(v), plait::sum{});
        plait::broadcast<plait::tree>(c, std::span<float>(v), 0);
        plait::all_gather<plait::ring>(c, std::span<const float>(v), std::span<float>(full));
      });
  expect_mismatch_everywhere<Tr>(
      "float against int32 of the same byte count",
      [](C& c) {
        std::vector<std::int32_t> v(n_elems);
        plait::all_reduce<plait::ring>(c, std::span<std::int32_t>(v), plait::sum{});
      },
      all_reduce_n(n_elems));
  expect_mismatch_everywhere<Tr>(
      "sum against max",
      [](C& c) {
        std::vector<float> v(n_elems);
        plait::all_reduce<plait::ring>(c, std::span<float>(v), plait::max{});
      },
      all_reduce_n(n_elems));
  expect_mismatch_everywhere<Tr>(
      "root 0 against root 1",
      [](C& c) {
        std::vector<float> v(n_elems);
        plait::broadcast<plait::tree>(c, std::span<float>(v), 1);
      },
      [](C& c) {
        std::vector<float> v(n_elems);
        plait::broadcast<plait::tree>(c, std::span<float>(v), 0);
      });
  expect_mismatch_everywhere<Tr>("ring against tree", all_reduce_n(n_elems), [](C& c) {
    std::vector<float> v(n_elems);
    plait::all_reduce<plait::tree>(c, std::span<float>(v), plait::sum{});
  });
}

// A peer's frame for another call never reaches this rank's output, even where
// frames land straight in the output (tcp: link_set::expect): 2 ranks, all_gather
// with 256 KiB shards in 64 KiB slices, one rank by the ring and one by direct (so
// every frame header names another algorithm). Each rank's output for the peer's
// shard must still hold what the caller put there.
template <class Tr>
void mismatched_frames_never_land() {
  rank_options opt;
  opt.timeout = "3";
  opt.slice_bytes = "64K";
  opt.copy_slice_bytes = "64K";
  constexpr std::size_t shard = 64 * 1024;
  auto results = run_ranks<Tr>(
      2,
      [&](plait::communicator<Tr>& c) {
        std::vector<float> in(shard, static_cast<float>(c.rank() + 1)), out(2 * shard, -7.0f);
        const blob failure = first_failure(c, [&](plait::communicator<Tr>& k) {
          if (k.rank() == 0)
            plait::all_gather<plait::ring>(k, std::span<const float>(in), std::span<float>(out));
          else
            plait::all_gather<plait::direct>(k, std::span<const float>(in), std::span<float>(out));
        });
        const std::size_t peer = static_cast<std::size_t>(1 - c.rank());
        std::size_t changed = 0;
        for (std::size_t i = peer * shard; i < (peer + 1) * shard; ++i) changed += out[i] != -7.0f ? 1 : 0;
        return std::vector<blob>{failure, text_blob("changed " + std::to_string(changed))};
      },
      opt);
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    const auto& res = results[static_cast<std::size_t>(r)];
    REQUIRE(res.error == "");
    REQUIRE(res.blobs.size() == 2);
    const std::string failed(reinterpret_cast<const char*>(res.blobs[0].data()), res.blobs[0].size());
    const std::string changed(reinterpret_cast<const char*>(res.blobs[1].data()), res.blobs[1].size());
    INFO(failed);
    CHECK(failed.rfind("mismatch|", 0) == 0);
    CHECK(changed == "changed 0");
  }
}

}  // namespace

TEST_CASE("a mismatched peer's frames never reach the output, over shm and tcp", "[mismatch]") {
  SECTION("shm") { mismatched_frames_never_land<plait::transport::shm>(); }
  SECTION("tcp") { mismatched_frames_never_land<plait::transport::tcp>(); }
}

TEST_CASE("mismatched calls fail with mismatch on every rank over shm", "[mismatch][shm]") {
  mismatch_suite<plait::transport::shm>();
}

TEST_CASE("mismatched calls fail with mismatch on every rank over tcp", "[mismatch][tcp]") {
  mismatch_suite<plait::transport::tcp>();
}
