// Full-mesh traffic over the shm transport: every rank sends K slots of varying
// sizes to every peer and receives K from each, checking order and every byte.
#include <catch2/catch.hpp>

#include <thread>

#include "shm_test_support.hpp"

namespace {

using namespace plait::testing::shm_test;
using plait::clock;

struct mesh_params {
  int ranks = 2;
  std::size_t slot_bytes = 3000;  // not a multiple of 64: exercises the stride rounding
  std::size_t depth = 4;
  int slots_per_peer = 1000;
  std::chrono::nanoseconds spin = plait::detail::doorbell::dedicated_spin;
  std::chrono::milliseconds wait_bound{10};  // the longest sleep on the doorbell
  std::chrono::seconds limit{60};
};

// Sizes run over 0 .. slot_bytes, with full slots regularly.
std::size_t slot_size(const mesh_params& mp, int from, int to, int i) {
  if (i % 10 == 3) return mp.slot_bytes;
  const auto h = static_cast<std::size_t>(i) * 2654435761u + static_cast<std::size_t>(from) * 97 +
                 static_cast<std::size_t>(to) * 13;
  return h % (mp.slot_bytes + 1);
}

// Depends on sender, receiver, slot number and position: a lost, repeated or
// reordered slot, or one delivered to the wrong rank, shows up as a wrong byte.
std::uint8_t pattern(int from, int to, int i, std::size_t j) {
  return static_cast<std::uint8_t>(static_cast<std::size_t>(from) * 131 + static_cast<std::size_t>(to) * 31 +
                                   static_cast<std::size_t>(i) * 7 + j * 13 + (j >> 8) +
                                   (static_cast<std::size_t>(i) >> 5));
}

std::string check_slot(const mesh_params& mp, int me, int from, int i, const plait::slot_view& v) {
  const std::string where =
      "rank " + std::to_string(me) + ", slot " + std::to_string(i) + " from rank " + std::to_string(from) + ": ";
  if (v.header->desc.sequence != static_cast<std::uint64_t>(i))
    return where + "sequence " + std::to_string(v.header->desc.sequence) + " arrived";
  if (v.header->sender != from) return where + "sender says " + std::to_string(v.header->sender);
  const std::size_t want = slot_size(mp, from, me, i);
  if (v.header->bytes != want)
    return where + std::to_string(v.header->bytes) + " bytes, expected " + std::to_string(want);
  for (std::size_t j = 0; j < want; ++j) {
    const auto got = static_cast<std::uint8_t>(v.payload[j]);
    if (got != pattern(from, me, i, j))
      return where + "byte " + std::to_string(j) + " is " + std::to_string(got) + ", expected " +
             std::to_string(pattern(from, me, i, j));
  }
  return {};
}

std::string mesh_rank(const mesh_params& mp, const temp_dir& dir, int me) {
  plait::testing::file_bootstrap ctx(dir.path(), me, mp.ranks);
  plait::detail::doorbell bell;
  bell.set_spin(mp.spin);
  const std::vector<int> peers = all_but(me, mp.ranks);
  auto links = plait::transport::shm::connect(ctx, bell, config(mp.slot_bytes, mp.depth), peers);
  const auto deadline = clock::now() + mp.limit;
  ctx.barrier("connected", deadline);
  if (auto left = shm_leftovers(dir.job_key()); !left.empty())
    return "after connect, /dev/shm still holds " + left.front();
  for (int p : peers)
    if (!links->reaches(p)) return "reaches(" + std::to_string(p) + ") is false";
  if (links->reaches(me) || links->reaches(mp.ranks)) return "reaches() is true for itself or out of range";
  if (links->slot_bytes() != mp.slot_bytes) return "slot_bytes() is " + std::to_string(links->slot_bytes());

  const int k = mp.slots_per_peer;
  std::vector<int> sent(static_cast<std::size_t>(mp.ranks), 0), received(sent);
  for (;;) {
    const auto seen = bell.snapshot();
    bool moved = false, done = true;
    for (int p : peers) {
      int& s = sent[static_cast<std::size_t>(p)];
      while (s < k) {
        std::byte* payload = links->acquire(p);
        if (payload == nullptr) break;
        plait::detail::slot_header h;
        h.bytes = static_cast<std::uint32_t>(slot_size(mp, me, p, s));
        h.sender = me;
        h.desc.sequence = static_cast<std::uint64_t>(s);
        for (std::size_t j = 0; j < h.bytes; ++j) payload[j] = std::byte{pattern(me, p, s, j)};
        links->post(p, h);
        ++s;
        moved = true;
      }
      int& r = received[static_cast<std::size_t>(p)];
      while (r < k) {
        const plait::slot_view v = links->peek(p);
        if (v.header == nullptr) break;
        if (auto bad = check_slot(mp, me, p, r, v); !bad.empty()) return bad;
        links->release(p);
        ++r;
        moved = true;
      }
      done = done && s == k && r == k;
    }
    if (done) break;
    if (!moved) {
      for (int p : peers) links->health(p);
      if (clock::now() > deadline) {
        std::string state = "rank " + std::to_string(me) + " timed out:";
        for (int p : peers)
          state += " peer " + std::to_string(p) + " sent " + std::to_string(sent[static_cast<std::size_t>(p)]) +
                   " received " + std::to_string(received[static_cast<std::size_t>(p)]) + ";";
        return state;
      }
      bell.wait(seen, mp.wait_bound);
    }
  }
  // Nobody closes its links while a peer may still be waiting on it.
  ctx.barrier("done", deadline);
  return "ok";
}

void run_mesh(const mesh_params& mp) {
  temp_dir dir;
  const auto start = clock::now();
  const auto results =
      run_ranks(mp.ranks, mp.limit + std::chrono::seconds(20), [&](int r, int) { return mesh_rank(mp, dir, r); });
  const auto seconds = std::chrono::duration<double>(clock::now() - start).count();
  for (int r = 0; r < mp.ranks; ++r) {
    INFO("rank " << r);
    CHECK(results[static_cast<std::size_t>(r)] == "ok");
  }
  CHECK(shm_leftovers(dir.job_key()).empty());
  WARN(mp.ranks << " ranks, " << mp.slots_per_peer << " slots per pair: " << seconds << " s");
}

}  // namespace

TEST_CASE("shm full mesh delivers every slot in order with its contents", "[shm][mesh]") {
  mesh_params mp;
  mp.ranks = GENERATE(2, 3, 4, 8);
  CAPTURE(mp.ranks);
  run_mesh(mp);
}

TEST_CASE("shm with more ranks than cores sleeps and is woken by its peers", "[shm][mesh]") {
  mesh_params mp;
  mp.ranks = 8;
  mp.spin = std::chrono::nanoseconds(0);     // no spinning: every wait is a futex sleep
  mp.wait_bound = std::chrono::seconds(20);  // a missed wake-up would cost 20 s
  mp.limit = std::chrono::seconds(60);
  const auto start = clock::now();
  run_mesh(mp);
  // 8 ranks x 7 peers x 1000 slots take well under a second on 2 cores; a few
  // missed wake-ups, or ranks spinning against each other, would not fit in 15 s.
  CHECK(clock::now() - start < std::chrono::seconds(15));
}

TEST_CASE("shm carries 1 MiB slots between 8 ranks", "[shm][mesh]") {
  mesh_params mp;
  mp.ranks = 8;
  mp.slot_bytes = std::size_t{1} << 20;
  mp.depth = 4;
  mp.slots_per_peer = 12;
  run_mesh(mp);
}
