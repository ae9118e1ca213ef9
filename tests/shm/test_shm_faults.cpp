// Peer failures over the shm transport: killed, stopped, closed (DESIGN.md section 6).
#include <catch2/catch.hpp>

#include <sstream>
#include <thread>

#include "shm_test_support.hpp"

namespace {

using namespace plait::testing::shm_test;
using plait::clock;
using plait::errc;

// Polls health(peer) on the doorbell until it throws or `window` passes. Returns
// "none" if nothing was thrown, else "<code> <peer> <steady ns> <message>".
std::string watch(plait::link_set& links, plait::detail::doorbell& bell, int peer, std::chrono::nanoseconds window) {
  const auto until = clock::now() + window;
  while (clock::now() < until) {
    const auto seen = bell.snapshot();
    try {
      links.health(peer);
    } catch (const plait::error& e) {
      return std::string(plait::to_string(e.code())) + " " + std::to_string(e.peer()) + " " + std::to_string(now_ns()) +
             " " + e.what();
    }
    bell.wait(seen, std::chrono::milliseconds(10));
  }
  return "none";
}

struct outcome {
  std::string code;
  int peer = -1;
  std::int64_t at_ns = 0;
  std::string message;
};

outcome parse(const std::string& line) {
  outcome o;
  std::istringstream in(line);
  in >> o.code >> o.peer >> o.at_ns;
  std::getline(in, o.message);
  return o;
}

// Bounded sleep for a victim rank: it is killed long before this ends.
void idle(std::chrono::seconds s) {
  const auto until = clock::now() + s;
  while (clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

}  // namespace

TEST_CASE("shm: a peer killed with SIGKILL is peer_lost naming it within 3 s on every survivor", "[shm][faults]") {
  temp_dir dir;
  constexpr int n = 3, victim = 2;
  std::vector<child> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(child::spawn([&, r](int fd) -> std::string {
      plait::testing::file_bootstrap ctx(dir.path(), r, n);
      plait::detail::doorbell bell;
      auto links = plait::transport::shm::connect(ctx, bell, config(1024, 4), all_but(r, n));
      if (r == victim) {
        // Posted before it dies: still readable afterwards.
        std::byte* p = links->acquire(0);
        if (p == nullptr) return "no free slot";
        p[0] = std::byte{0x5a};
        links->post(0, header_for(r, 1, 1));
      }
      ctx.barrier("ready", clock::now() + std::chrono::seconds(20));
      tell(fd, "ready");
      if (r == victim) {
        idle(std::chrono::seconds(30));
        return "the victim was not killed";
      }
      if (r == 0) {  // its slot from the victim is there, so the victim is not what it waits on
        if (auto v = links->peek(victim); v.header == nullptr || v.payload[0] != std::byte{0x5a})
          return "the victim's slot is missing";
        if (auto w = watch(*links, bell, victim, std::chrono::milliseconds(300)); w != "none")
          return "health() failed while the victim's slot was unread: " + w;
        links->release(victim);
      }
      tell(fd, watch(*links, bell, victim, std::chrono::seconds(8)));
      return "ok";
    }));
  const auto deadline = clock::now() + std::chrono::seconds(40);
  for (auto& c : ranks) REQUIRE(c.read_line(deadline) == std::optional<std::string>("ready"));
  const std::int64_t killed_at = now_ns();
  ranks[victim].signal(SIGKILL);
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    INFO("rank " << r);
    const auto line = ranks[static_cast<std::size_t>(r)].read_line(deadline);
    REQUIRE(line);
    const outcome o = parse(*line);
    CHECK(o.code == "peer_lost");
    CHECK(o.peer == victim);
    CHECK(o.message.find("rank 2") != std::string::npos);
    CHECK(o.at_ns - killed_at < 3'000'000'000);
    CHECK(ranks[static_cast<std::size_t>(r)].finish(deadline) == "ok");
  }
  CHECK(ranks[victim].finish(deadline).find("killed by signal 9") != std::string::npos);
  CHECK(shm_leftovers(dir.job_key()).empty());
}

TEST_CASE("shm: a stopped peer is not lost, and its link works again once continued", "[shm][faults]") {
  temp_dir dir;
  std::vector<child> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(child::spawn([&, r](int fd) -> std::string {
      plait::testing::file_bootstrap ctx(dir.path(), r, 2);
      plait::detail::doorbell bell;
      auto links = plait::transport::shm::connect(ctx, bell, config(1024, 4), all_but(r, 2));
      const auto deadline = clock::now() + std::chrono::seconds(30);
      ctx.barrier("ready", deadline);
      tell(fd, "ready");
      if (r == 1) {
        ctx.get("continued", deadline);  // stopped somewhere in here
        std::byte* p = links->acquire(0);
        if (p == nullptr) return "no free slot";
        p[0] = std::byte{0x42};
        links->post(0, header_for(1, 1, 1));
      } else {
        ctx.get("stopped", deadline);
        if (auto w = watch(*links, bell, 1, std::chrono::seconds(2)); w != "none")
          return "health() failed while rank 1 was only stopped: " + w;
        tell(fd, "window passed");
        for (;;) {
          const auto seen = bell.snapshot();
          if (auto v = links->peek(1); v.header != nullptr) {
            if (v.payload[0] != std::byte{0x42}) return "wrong payload after SIGCONT";
            links->release(1);
            break;
          }
          links->health(1);
          if (clock::now() > deadline) return "no slot from rank 1 after SIGCONT";
          bell.wait(seen, std::chrono::milliseconds(10));
        }
      }
      ctx.barrier("done", deadline);
      return "ok";
    }));
  const auto deadline = clock::now() + std::chrono::seconds(40);
  for (auto& c : ranks) REQUIRE(c.read_line(deadline) == std::optional<std::string>("ready"));
  ranks[1].signal(SIGSTOP);
  plait::testing::file_bootstrap parent(dir.path(), 0, 2);
  const std::byte one{1};
  parent.put("stopped", std::span(&one, 1));
  CHECK(ranks[0].read_line(deadline) == std::optional<std::string>("window passed"));
  ranks[1].signal(SIGCONT);
  parent.put("continued", std::span(&one, 1));
  CHECK(ranks[0].finish(deadline) == "ok");
  CHECK(ranks[1].finish(deadline) == "ok");
  CHECK(shm_leftovers(dir.job_key()).empty());
}

TEST_CASE("shm: a peer that calls close() is peer_lost naming it, after its last slots are read", "[shm][faults]") {
  temp_dir dir;
  const auto results = run_ranks(2, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 2);
    plait::detail::doorbell bell;
    auto links = plait::transport::shm::connect(ctx, bell, config(1024, 4), all_but(r, 2));
    const auto deadline = clock::now() + std::chrono::seconds(30);
    const std::byte one{1};
    if (r == 1) {
      for (std::uint64_t i = 0; i < 2; ++i) {
        std::byte* p = links->acquire(0);
        if (p == nullptr) return "no free slot";
        p[0] = std::byte{static_cast<unsigned char>(i)};
        links->post(0, header_for(1, i, 1));
      }
      links->close();
      ctx.put("closed", std::span(&one, 1));
      ctx.get("checked", deadline);  // alive until rank 0 is done: close(), not death, is what it sees
      return "ok";
    }
    ctx.get("closed", deadline);
    for (std::uint64_t i = 0; i < 2; ++i) {
      if (auto w = watch(*links, bell, 1, std::chrono::milliseconds(100)); w != "none")
        return "health() failed with slot " + std::to_string(i) + " still unread: " + w;
      const auto v = links->peek(1);
      if (v.header == nullptr || v.header->desc.sequence != i) return "slot " + std::to_string(i) + " is missing";
      links->release(1);
    }
    const auto start = clock::now();
    const outcome o = parse(watch(*links, bell, 1, std::chrono::seconds(3)));
    ctx.put("checked", std::span(&one, 1));
    if (o.code != "peer_lost" || o.peer != 1 || o.message.find("closed its links") == std::string::npos)
      return "after the close: " + o.code + " " + std::to_string(o.peer) + o.message;
    if (clock::now() - start > std::chrono::milliseconds(500)) return "the close took over 500 ms to be seen";
    return "ok";
  });
  CHECK(results[0] == "ok");
  CHECK(results[1] == "ok");
  CHECK(shm_leftovers(dir.job_key()).empty());
}
