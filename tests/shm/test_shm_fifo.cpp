// FIFO semantics, framing checks, misuse and connect failures of the shm transport.
#include <catch2/catch.hpp>

#include "shm_test_support.hpp"

namespace {

using namespace plait::testing::shm_test;
using plait::clock;
using plait::errc;

// Runs `what` and describes how it failed ("" if it threw the expected code).
template <class F>
std::string expect_error(F&& what, errc want, const std::string& label) {
  try {
    what();
  } catch (const plait::error& e) {
    if (e.code() == want) return {};
    return label + ": threw " + std::string(plait::to_string(e.code())) + " instead of " +
           std::string(plait::to_string(want)) + ": " + e.what();
  }
  return label + ": did not throw " + std::string(plait::to_string(want));
}

constexpr std::size_t depth = 4;
constexpr std::size_t slot = 256;

std::string fifo_sender(plait::testing::file_bootstrap& ctx, plait::link_set& links, plait::detail::doorbell& bell) {
  const auto deadline = clock::now() + std::chrono::seconds(20);
  ctx.get("misuse-checked", deadline);  // the receiver's FIFO must be empty for its checks
  std::byte* first = links.acquire(1);
  if (first == nullptr) return "the first acquire() on an empty FIFO returned nullptr";
  if (links.acquire(1) != first) return "acquire() twice before post() returned different slots";
  if (auto bad = expect_error([&] { links.post(1, header_for(0, 0, slot + 1)); }, errc::invalid_argument,
                              "post() of more bytes than a slot holds");
      !bad.empty())
    return bad;
  for (std::size_t i = 0; i < depth; ++i) {
    std::byte* p = links.acquire(1);
    if (p == nullptr) return "acquire() #" + std::to_string(i) + " returned nullptr before the FIFO was full";
    p[0] = std::byte{static_cast<unsigned char>(i + 1)};
    links.post(1, header_for(0, i, 1));
  }
  if (links.acquire(1) != nullptr) return "acquire() after depth posts without release did not return nullptr";
  if (auto bad =
          expect_error([&] { links.post(1, header_for(0, 99, 1)); }, errc::invalid_argument, "post() into a full FIFO");
      !bad.empty())
    return bad;
  const std::byte one{1};
  ctx.put("full", std::span(&one, 1));
  ctx.get("released-one", deadline);
  // Space comes back once the receiver released a slot (it rang our doorbell).
  for (;;) {
    const auto seen = bell.snapshot();
    if (std::byte* p = links.acquire(1)) {
      p[0] = std::byte{static_cast<unsigned char>(depth + 1)};
      links.post(1, header_for(0, depth, 1));
      break;
    }
    if (clock::now() > deadline) return "acquire() still nullptr after the receiver released a slot";
    bell.wait(seen, std::chrono::milliseconds(10));
  }
  if (links.acquire(1) != nullptr) return "the FIFO has room after refilling the one freed slot";
  ctx.put("refilled", std::span(&one, 1));
  ctx.barrier("done", deadline);
  return "ok";
}

std::string fifo_receiver(plait::testing::file_bootstrap& ctx, plait::link_set& links, plait::detail::doorbell& bell) {
  const auto deadline = clock::now() + std::chrono::seconds(20);
  if (auto bad = expect_error([&] { links.release(0); }, errc::invalid_argument, "release() with nothing received");
      !bad.empty())
    return bad;
  if (auto bad = expect_error([&] { links.acquire(1); }, errc::invalid_argument, "acquire() for itself"); !bad.empty())
    return bad;
  if (auto bad = expect_error([&] { links.peek(7); }, errc::invalid_argument, "peek() for a rank out of range");
      !bad.empty())
    return bad;
  const std::byte one{1};
  ctx.put("misuse-checked", std::span(&one, 1));
  ctx.get("full", deadline);
  for (std::size_t i = 0; i <= depth; ++i) {
    const plait::slot_view v = wait_for_slot(links, bell, 0);
    if (links.peek(0).payload != v.payload) return "peek() twice before release() returned different slots";
    if (v.header->desc.sequence != i || v.header->bytes != 1 ||
        v.payload[0] != std::byte{static_cast<unsigned char>(i + 1)})
      return "slot " + std::to_string(i) + " arrived as sequence " + std::to_string(v.header->desc.sequence) +
             " with " + std::to_string(v.header->bytes) + " bytes, first byte " +
             std::to_string(static_cast<int>(v.payload[0]));
    links.release(0);
    if (i == 0) {
      ctx.put("released-one", std::span(&one, 1));
      ctx.get("refilled", deadline);  // the sender checks the FIFO is full again meanwhile
    }
  }
  if (links.peek(0).header != nullptr) return "a slot arrived that was never posted";
  ctx.barrier("done", deadline);
  return "ok";
}

}  // namespace

TEST_CASE("shm FIFO: acquire is nullptr when full, space returns on release, slots keep their order", "[shm][fifo]") {
  temp_dir dir;
  const auto results = run_ranks(2, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 2);
    plait::detail::doorbell bell;
    const std::vector<int> peers{1 - r};
    auto links = plait::transport::shm::connect(ctx, bell, config(slot, depth), peers);
    return r == 0 ? fifo_sender(ctx, *links, bell) : fifo_receiver(ctx, *links, bell);
  });
  CHECK(results[0] == "ok");
  CHECK(results[1] == "ok");
  CHECK(shm_leftovers(dir.job_key()).empty());
}

TEST_CASE("shm: a slot with a bad header is a protocol error, on peek and on health", "[shm][fifo]") {
  temp_dir dir;
  const auto results = run_ranks(2, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 2);
    plait::detail::doorbell bell;
    const std::vector<int> peers{1 - r};
    auto links = plait::transport::shm::connect(ctx, bell, config(slot, depth), peers);
    const auto deadline = clock::now() + std::chrono::seconds(20);
    if (r == 0) {
      auto h = header_for(0, 0, 8);
      h.magic = 0x12345678;
      if (links->acquire(1) == nullptr) return "no free slot";
      links->post(1, h);
    } else {
      std::string outcome;
      for (;;) {  // peek throws once the garbage slot is there
        const auto seen = bell.snapshot();
        try {
          if (links->peek(0).header != nullptr) {
            outcome = "peek() returned a slot with a bad magic number";
            break;
          }
        } catch (const plait::error& e) {
          if (e.code() != errc::protocol || e.peer() != 0) outcome = std::string("peek() threw ") + e.what();
          break;
        }
        if (clock::now() > deadline) {
          outcome = "the bad slot never arrived";
          break;
        }
        bell.wait(seen, std::chrono::milliseconds(10));
      }
      if (outcome.empty())
        outcome = expect_error([&] { links->health(0); }, errc::protocol, "health() after a bad slot");
      if (outcome.empty())
        outcome = expect_error([&] { links->peek(0); }, errc::protocol, "peek() again after a bad slot");
      if (!outcome.empty()) return outcome;
    }
    ctx.barrier("done", deadline);
    return "ok";
  });
  CHECK(results[0] == "ok");
  CHECK(results[1] == "ok");
}

TEST_CASE("shm connect: ranks with different slot sizes fail with mismatch", "[shm][connect]") {
  temp_dir dir;
  const auto results = run_ranks(2, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 2);
    plait::detail::doorbell bell;
    const std::vector<int> peers{1 - r};
    return expect_error([&] { plait::transport::shm::connect(ctx, bell, config(r == 0 ? 4096 : 8192, 4, 5s), peers); },
                        errc::mismatch, "connect() with different slot sizes");
  });
  CHECK(results[0] == "");
  CHECK(results[1] == "");
  CHECK(shm_leftovers(dir.job_key()).empty());
}

TEST_CASE("shm connect: a rank that never comes is a timeout, and nothing is left in /dev/shm", "[shm][connect]") {
  temp_dir dir;
  plait::testing::file_bootstrap ctx(dir.path(), 0, 2);
  plait::detail::doorbell bell;
  const std::vector<int> peers{1};
  const auto start = clock::now();
  try {
    plait::transport::shm::connect(ctx, bell, config(1024, 4, 300ms), peers);
    FAIL("connect() returned without rank 1");
  } catch (const plait::error& e) {
    CHECK(e.code() == errc::timeout);
  }
  CHECK(clock::now() - start < 5s);
  CHECK(shm_leftovers(dir.job_key()).empty());
  // The doorbell no longer points into the segment that is gone.
  bell.ring();
  CHECK(bell.snapshot() != 0);
}

TEST_CASE("shm connect: bad arguments are invalid_argument before anything is created", "[shm][connect]") {
  temp_dir dir;
  plait::testing::file_bootstrap ctx(dir.path(), 0, 3);
  plait::detail::doorbell bell;
  auto connect = [&](std::vector<int> peers, std::size_t slot_bytes, std::size_t slots) {
    return expect_error([&] { plait::transport::shm::connect(ctx, bell, config(slot_bytes, slots, 1s), peers); },
                        errc::invalid_argument, "connect()");
  };
  CHECK(connect({0, 1}, 1024, 4) == "");  // itself
  CHECK(connect({1, 3}, 1024, 4) == "");  // out of range
  CHECK(connect({1, 1}, 1024, 4) == "");  // twice
  CHECK(connect({1, 2}, 0, 4) == "");     // empty slots
  CHECK(connect({1, 2}, 1024, 0) == "");  // no slots
  CHECK(shm_leftovers(dir.job_key()).empty());
}

TEST_CASE("shm: a rank with no shm peers takes part in connect and reaches nobody", "[shm][connect]") {
  temp_dir dir;
  const auto results = run_ranks(3, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 3);
    plait::detail::doorbell bell;
    const std::vector<int> peers = r == 2 ? std::vector<int>{} : std::vector<int>{1 - r};
    auto links = plait::transport::shm::connect(ctx, bell, config(64, 2), peers);
    const auto deadline = clock::now() + std::chrono::seconds(20);
    if (r == 2) {
      for (int p = 0; p < 3; ++p)
        if (links->reaches(p)) return "rank 2 reaches " + std::to_string(p);
    } else {
      if (links->reaches(2)) return "reaches rank 2, which has no shm link";
      std::byte* p = links->acquire(1 - r);
      if (p == nullptr) return "no free slot";
      p[0] = std::byte{static_cast<unsigned char>(40 + r)};
      links->post(1 - r, header_for(r, 0, 1));
      const plait::slot_view v = wait_for_slot(*links, bell, 1 - r);
      if (v.payload[0] != std::byte{static_cast<unsigned char>(40 + 1 - r)}) return "wrong payload";
      links->release(1 - r);
    }
    ctx.barrier("done", deadline);
    return "ok";
  });
  for (const auto& r : results) CHECK(r == "ok");
  CHECK(shm_leftovers(dir.job_key()).empty());
}

// Staging (link_set::stage): rank 0 copies one payload once and posts it to ranks 1
// and 2, who both read it where it is; a chunk stays taken until every reader has
// released it, and a slot naming a chunk the pool does not have is a protocol error.
namespace {

std::byte pattern(std::size_t chunk, std::size_t i) { return std::byte{static_cast<unsigned char>(chunk * 31 + i)}; }

std::string stage_sender(plait::testing::file_bootstrap& ctx, plait::link_set& links, plait::detail::doorbell& bell) {
  const auto deadline = clock::now() + std::chrono::seconds(20);
  if (!links.shares_copies(1) || !links.shares_copies(2)) return "shares_copies() is false for a reached peer";
  if (links.acquire(1) == nullptr) return "no free slot";
  if (auto bad = expect_error([&] { links.post_staged(1, header_for(0, 0, slot), 0); }, errc::invalid_argument,
                              "post_staged() with no handle");
      !bad.empty())
    return bad;
  std::vector<std::byte> buf(slot);
  if (links.stage(buf.data(), slot + 1) != 0) return "stage() of more bytes than a slot holds returned a handle";
  // depth chunks: the first to both readers, the others to rank 1 only.
  std::uint64_t handles[depth];
  for (std::size_t c = 0; c < depth; ++c) {
    for (std::size_t i = 0; i < slot; ++i) buf[i] = pattern(c, i);
    handles[c] = links.stage(buf.data(), slot);
    if (handles[c] == 0) return "stage() #" + std::to_string(c) + " found no free chunk in an unused pool";
    std::fill(buf.begin(), buf.end(), std::byte{0xee});  // the caller's memory is free once stage() returns
    if (auto bad = expect_error([&] { links.post_staged(1, header_for(0, c, slot - 1), handles[c]); },
                                errc::invalid_argument, "post_staged() of other bytes than were staged");
        !bad.empty())
      return bad;
    for (int peer : {1, 2}) {
      if (peer == 2 && c > 0) continue;
      if (links.acquire(peer) == nullptr) return "no free slot for chunk " + std::to_string(c);
      links.post_staged(peer, header_for(0, c, slot), handles[c]);
    }
  }
  if (handles[0] == handles[1]) return "two stage() calls in a row gave the same chunk";
  // Every chunk is held by rank 1, the first also by rank 2: no room.
  if (links.stage(buf.data(), slot) != 0) return "stage() returned a chunk that readers still hold";
  const std::byte one{1};
  ctx.put("staged", std::span(&one, 1));
  ctx.barrier("read", deadline);  // both readers released everything
  std::uint64_t again = 0;
  for (;;) {  // their releases are visible by now; bounded all the same
    const auto seen = bell.snapshot();
    if ((again = links.stage(buf.data(), slot)) != 0) break;
    if (clock::now() > deadline) return "stage() found no free chunk after every reader released";
    bell.wait(seen, std::chrono::milliseconds(10));
  }
  // A slot that names a chunk past the pool (a peer writing outside the protocol).
  auto h = header_for(0, 9, slot);
  h.flags = plait::detail::slot_staged;
  h.reserved = depth;
  if (links.acquire(2) == nullptr) return "no free slot for the bad one";
  links.post(2, h);
  ctx.barrier("done", deadline);
  return "ok";
}

std::string stage_reader(int r, plait::testing::file_bootstrap& ctx, plait::link_set& links,
                         plait::detail::doorbell& bell) {
  const auto deadline = clock::now() + std::chrono::seconds(20);
  ctx.get("staged", deadline);
  const std::size_t chunks = r == 1 ? depth : 1;
  for (std::size_t c = 0; c < chunks; ++c) {
    const plait::slot_view v = wait_for_slot(links, bell, 0);
    if (!(v.header->flags & plait::detail::slot_staged) || v.header->bytes != slot || v.payload == nullptr)
      return "slot " + std::to_string(c) + " is not a staged one of " + std::to_string(slot) + " bytes";
    for (std::size_t i = 0; i < slot; ++i)
      if (v.payload[i] != pattern(c, i))
        return "chunk " + std::to_string(c) + " byte " + std::to_string(i) + " is not what was staged";
    links.release(0);
  }
  ctx.barrier("read", deadline);
  if (r == 2) {
    std::string outcome;
    for (;;) {
      const auto seen = bell.snapshot();
      try {
        if (links.peek(0).header != nullptr) {
          outcome = "peek() returned a slot naming a chunk past the pool";
          break;
        }
      } catch (const plait::error& e) {
        if (e.code() != errc::protocol) outcome = std::string("peek() threw ") + e.what();
        break;
      }
      if (clock::now() > deadline) {
        outcome = "the bad slot never arrived";
        break;
      }
      bell.wait(seen, std::chrono::milliseconds(10));
    }
    if (!outcome.empty()) return outcome;
  }
  ctx.barrier("done", deadline);
  return "ok";
}

}  // namespace

TEST_CASE("shm staging: one copy read in place by two peers, held until both release", "[shm][fifo][stage]") {
  temp_dir dir;
  const auto results = run_ranks(3, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 3);
    plait::detail::doorbell bell;
    std::vector<int> peers;
    for (int p = 0; p < 3; ++p)
      if (p != r) peers.push_back(p);
    auto links = plait::transport::shm::connect(ctx, bell, config(slot, depth), peers);
    return r == 0 ? stage_sender(ctx, *links, bell) : stage_reader(r, ctx, *links, bell);
  });
  CHECK(results[0] == "ok");
  CHECK(results[1] == "ok");
  CHECK(results[2] == "ok");
  CHECK(shm_leftovers(dir.job_key()).empty());
}

// What a reader measured about slots written past the cache (link_set::
// measured_streamed_slots) reaches the rank that writes to it, per power of two of
// slot bytes, and a later measurement of the same sizes replaces it.
TEST_CASE("shm: a reader's measurement of streamed slots reaches its writer", "[shm][fifo]") {
  temp_dir dir;
  const auto results = run_ranks(2, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 2);
    plait::detail::doorbell bell;
    const std::vector<int> peers{1 - r};
    auto links = plait::transport::shm::connect(ctx, bell, config(slot, depth), peers);
    const auto deadline = clock::now() + std::chrono::seconds(20);
    const std::byte one{1};
    const auto seen = [&](std::size_t bytes) { return links->streamed_slots_measured(1, bytes); };
    if (r == 1) {
      links->measured_streamed_slots(64 * 1024, false);
      links->measured_streamed_slots(128 * 1024, true);
      links->measured_streamed_slots(512, true);  // below 1 KiB: kept nowhere
      ctx.put("measured", std::span(&one, 1));
      ctx.get("seen", deadline);
      links->measured_streamed_slots(65536 + 4096, true);  // the same power of two as 64 KiB
      links->measured_streamed_slots(128 * 1024, false);
      ctx.put("measured-again", std::span(&one, 1));
      ctx.barrier("done", deadline);
      return "ok";
    }
    ctx.get("measured", deadline);
    if (seen(64 * 1024) != 0 || seen(100 * 1024) != 0)
      return "64 KiB: " + std::to_string(seen(64 * 1024)) + " instead of 0 (plain)";
    if (seen(128 * 1024) != 1) return "128 KiB: " + std::to_string(seen(128 * 1024)) + " instead of 1 (streamed)";
    if (seen(32 * 1024) != -1 || seen(256 * 1024) != -1 || seen(512) != -1 || seen(std::size_t{1} << 30) != -1)
      return "a size nobody measured is not -1";
    ctx.put("seen", std::span(&one, 1));
    ctx.get("measured-again", deadline);
    if (seen(64 * 1024) != 1 || seen(128 * 1024) != 0) return "the second measurement did not replace the first";
    ctx.barrier("done", deadline);
    return "ok";
  });
  CHECK(results[0] == "ok");
  CHECK(results[1] == "ok");
  CHECK(shm_leftovers(dir.job_key()).empty());
}

// Lending measured against slots (link_set::measured_lending) travels the same way,
// in a word of its own: neither measurement changes the other. Its word keeps a
// broadcast's sizes of several slices too (128 MiB, 1 GiB), which the streamed one,
// for slots, does not (from 64 MiB).
TEST_CASE("shm: a reader's measurement of lending reaches its writer, apart from streamed slots", "[shm][fifo]") {
  temp_dir dir;
  const auto results = run_ranks(2, std::chrono::seconds(60), [&](int r, int) -> std::string {
    plait::testing::file_bootstrap ctx(dir.path(), r, 2);
    plait::detail::doorbell bell;
    const std::vector<int> peers{1 - r};
    auto links = plait::transport::shm::connect(ctx, bell, config(slot, depth), peers);
    const auto deadline = clock::now() + std::chrono::seconds(20);
    const std::byte one{1};
    if (r == 1) {
      links->measured_lending(64 * 1024, true);
      links->measured_lending(1 << 20, false);
      links->measured_streamed_slots(32 * 1024, true);
      links->measured_lending(std::size_t{128} << 20, true);
      links->measured_lending(std::size_t{1} << 30, false);
      links->measured_streamed_slots(std::size_t{128} << 20, true);
      ctx.put("measured", std::span(&one, 1));
      ctx.get("seen", deadline);
      links->measured_lending(1 << 20, true);
      ctx.put("measured-again", std::span(&one, 1));
      ctx.barrier("done", deadline);
      return "ok";
    }
    const auto lend = [&](std::size_t bytes) { return links->lending_measured(1, bytes); };
    ctx.get("measured", deadline);
    if (lend(64 * 1024) != 1 || lend(100 * 1024) != 1) return "64 KiB: lending not seen as faster";
    if (lend(1 << 20) != 0) return "1 MiB: " + std::to_string(lend(1 << 20)) + " instead of 0 (slots)";
    if (lend(32 * 1024) != -1 || lend(128 * 1024) != -1) return "a size nobody measured for lending is not -1";
    if (lend(std::size_t{128} << 20) != 1 || lend((std::size_t{256} << 20) - 1) != 1)
      return "128 MiB: " + std::to_string(lend(std::size_t{128} << 20)) + " instead of 1 (lending)";
    if (lend(std::size_t{1} << 30) != 0 || lend(std::size_t{512} << 20) != -1 || lend(std::size_t{4} << 40) != -1)
      return "1 GiB measured, 512 MiB not, 4 TiB beyond the word: not 0, -1, -1";
    if (links->streamed_slots_measured(1, std::size_t{128} << 20) != -1)
      return "the streamed word kept a size beyond 64 MiB";
    if (links->streamed_slots_measured(1, 64 * 1024) != -1 || links->streamed_slots_measured(1, 32 * 1024) != 1)
      return "the lending measurement and the streamed one mixed";
    ctx.put("seen", std::span(&one, 1));
    ctx.get("measured-again", deadline);
    if (lend(1 << 20) != 1 || lend(64 * 1024) != 1) return "the second measurement did not replace the first";
    ctx.barrier("done", deadline);
    return "ok";
  });
  CHECK(results[0] == "ok");
  CHECK(results[1] == "ok");
  CHECK(shm_leftovers(dir.job_key()).empty());
}
