// Single copy over shm: slots posted by reference (the bytes stay in the sender's
// memory, the receiver copies them with process_vm_readv), and what happens when
// the sender withdraws them (detach) or dies with them lent.
//
// Needs what the path needs: transparent huge pages for a madvise'd buffer, the
// PAGEMAP_SCAN ioctl (Linux 6.7+) and CMA between processes of one user. Without
// them the path is never taken, so this executable says why and exits 77 (SKIP).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <sys/mman.h>
#include <sys/syscall.h>

#include <cstdio>

#include "bootstrap/bootstrap_support.hpp"
#include "shm_test_support.hpp"
#include "support/catch_or_skip.hpp"
#include "support/ranks.hpp"

namespace {

using namespace plait::testing::shm_test;
using plait::clock;
using plait::errc;
using plait::transport::shm_detail::shm_link_set;

constexpr std::size_t slot = 128 * 1024;
constexpr std::size_t depth = 4;
constexpr std::size_t huge = 2 * 1024 * 1024;

// A buffer on transparent huge pages (or on 4 KiB pages), filled with a pattern. It
// is mapped here, not malloc'd: the advice must come before the first touch
// (MALLOC_PERTURB_, which meson sets, makes malloc touch what it returns).
struct buffer {
  std::byte* p = nullptr;
  std::size_t n = 0;
  std::size_t mapped = 0;
  void* base = nullptr;
  buffer(std::size_t bytes, bool on_huge_pages, unsigned seed) : n(bytes) {
    mapped = (bytes + huge - 1) / huge * huge + huge;  // room to align to a huge page
    base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("mmap failed");
    p = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(base) + huge - 1) / huge * huge);
    ::madvise(base, mapped, on_huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (std::size_t i = 0; i < n; ++i) p[i] = std::byte{static_cast<unsigned char>((i * 7 + seed) % 251)};
  }
  ~buffer() { ::munmap(base, mapped); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;
};

std::string prerequisite_missing() {
  buffer b(4 * huge, true, 1);
  plait::transport::shm_detail::huge_pages pages;
  if (pages.share(b.p, b.n) < 0.5)
    return "no transparent huge pages for a madvise'd buffer, or no PAGEMAP_SCAN (Linux 6.7+): "
           "shm never lends here";
  const std::uint64_t* word = plait::transport::shm_detail::probe_address();
  const auto address = reinterpret_cast<std::uintptr_t>(word);
  const std::uint64_t value = *word;
  std::fflush(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(plait::transport::shm_detail::probe(::getppid(), address, value) ? 0 : 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "process_vm_readv between processes of this user is denied (ptrace scope, seccomp): "
           "shm never lends here";
  return {};
}

bool same(const std::byte* a, const std::byte* b, std::size_t n) { return std::memcmp(a, b, n) == 0; }

const std::byte one{1};

// Rank 0 lends four slots, then withdraws the two not yet read and overwrites its memory.
std::string lender(plait::testing::file_bootstrap& ctx, plait::link_set& links) {
  const auto deadline = clock::now() + std::chrono::seconds(20);
  buffer b(4 * slot, true, 3);
  std::uint64_t ticket[4];
  for (std::size_t i = 0; i < 4; ++i) {
    if (links.acquire(1) == nullptr) return "no free slot for slot " + std::to_string(i);
    ticket[i] = links.post_from(1, header_for(0, i, slot), b.p + i * slot);
    if (ticket[i] == 0) return "slot " + std::to_string(i) + " from huge pages was not lent";
    if (links.sent(1, ticket[i])) return "slot " + std::to_string(i) + " counts as sent before the peer read it";
  }
  ctx.put("lent", std::span(&one, 1));
  ctx.get("read-two", deadline);
  if (!links.sent(1, ticket[0]) || !links.sent(1, ticket[1])) return "released slots do not count as sent";
  if (links.sent(1, ticket[2])) return "an unread slot counts as sent";
  links.detach();
  std::memset(b.p, 0xee, b.n);  // the memory is ours again: the peer must not see this
  ctx.put("detached", std::span(&one, 1));
  ctx.get("read-all", deadline);
  // Small sends and sends from 4 KiB pages are copied into the slot.
  buffer small_pages(slot, false, 5);
  buffer big_pages(slot, true, 6);
  if (links.acquire(1) == nullptr) return "no free slot after the peer released all";
  if (links.post_from(1, header_for(0, 4, slot), small_pages.p) != 0) return "a send from 4 KiB pages was lent";
  if (links.acquire(1) == nullptr) return "no free slot for the small send";
  if (links.post_from(1, header_for(0, 5, 4096), big_pages.p) != 0) return "a 4 KiB send was lent";
  // Told to lend from any memory (link_set::lend_any_memory), it lends from 4 KiB pages.
  links.lend_any_memory(true);
  if (links.acquire(1) == nullptr) return "no free slot for the send from 4 KiB pages";
  const std::uint64_t any = links.post_from(1, header_for(0, 6, slot), small_pages.p);
  links.lend_any_memory(false);
  if (any == 0) return "a send from 4 KiB pages was not lent after lend_any_memory(true)";
  ctx.barrier("done", deadline);
  if (!links.sent(1, any)) return "the slot lent from 4 KiB pages was read but does not count as sent";
  return "ok";
}

std::string reader(plait::testing::file_bootstrap& ctx, plait::link_set& links, plait::detail::doorbell& bell) {
  const auto deadline = clock::now() + std::chrono::seconds(20);
  buffer want(4 * slot, true, 3);  // what rank 0 lends
  buffer got(4 * slot, true, 9);
  ctx.get("lent", deadline);
  // Slot 0 straight into our memory, slot 1 through fetch().
  plait::slot_view v = wait_for_slot(links, bell, 0);
  if (v.payload != nullptr) return "peek() gave a payload for a slot by reference";
  if (!links.receive_into(0, got.p, slot)) return "receive_into() declined a slot by reference";
  if (!same(got.p, want.p, slot)) return "slot 0 copied from the lender's memory differs";
  links.release(0);
  wait_for_slot(links, bell, 0);
  const std::byte* fetched = links.fetch(0);
  if (fetched == nullptr || !same(fetched, want.p + slot, slot)) return "slot 1 fetched differs";
  links.release(0);
  ctx.put("read-two", std::span(&one, 1));
  ctx.get("detached", deadline);
  // Withdrawn: the slots themselves hold the bytes now, not the (overwritten) memory.
  v = wait_for_slot(links, bell, 0);
  if (v.payload == nullptr || !same(v.payload, want.p + 2 * slot, slot)) return "withdrawn slot 2 differs";
  if (links.receive_into(0, got.p + 2 * slot, slot)) return "receive_into() took a withdrawn slot";
  links.release(0);
  wait_for_slot(links, bell, 0);
  fetched = links.fetch(0);
  if (fetched == nullptr || !same(fetched, want.p + 3 * slot, slot)) return "withdrawn slot 3 fetched differs";
  links.release(0);
  ctx.put("read-all", std::span(&one, 1));
  buffer small_pages(slot, false, 5);
  buffer big_pages(slot, true, 6);
  v = wait_for_slot(links, bell, 0);
  if (v.payload == nullptr || !same(v.payload, small_pages.p, slot)) return "the copied send differs";
  if (links.receive_into(0, got.p, slot)) return "receive_into() took a slot that holds its bytes";
  links.release(0);
  v = wait_for_slot(links, bell, 0);
  if (v.payload == nullptr || !same(v.payload, big_pages.p, 4096)) return "the small send differs";
  links.release(0);
  v = wait_for_slot(links, bell, 0);
  if (v.payload != nullptr) return "the send from 4 KiB pages came through the slot after lend_any_memory(true)";
  if (!links.receive_into(0, got.p, slot)) return "receive_into() declined the slot lent from 4 KiB pages";
  if (!same(got.p, small_pages.p, slot)) return "the slot lent from 4 KiB pages differs";
  links.release(0);
  ctx.barrier("done", deadline);
  return "ok";
}

}  // namespace

TEST_CASE("shm single copy: lent slots are read from the lender's memory, withdrawn ones from the slot",
          "[shm][single_copy]") {
  const auto results = run_linked_pair(config(slot, depth), [](int r, auto& ctx, auto& links, auto& bell) {
    return r == 0 ? lender(ctx, links) : reader(ctx, links, bell);
  });
  CHECK(results[0] == "ok");
  CHECK(results[1] == "ok");
}

TEST_CASE("shm single copy: off on either side keeps every byte in slots", "[shm][single_copy]") {
  for (int off_at = 0; off_at < 2; ++off_at) {
    INFO("single copy off at rank " << off_at);
    auto cfg = config(slot, depth);
    // One rank connects with single copy off (run_linked_pair gives both the same config).
    temp_dir dir;
    const auto results = run_ranks(2, std::chrono::seconds(60), [&](int r, int) -> std::string {
      plait::testing::file_bootstrap ctx(dir.path(), r, 2);
      plait::detail::doorbell bell;
      cfg.single_copy = r != off_at;
      auto links = plait::transport::shm::connect(ctx, bell, cfg, std::vector<int>{1 - r});
      buffer b(slot, true, 4);
      if (r == 0) {
        if (links->sends_from_memory(1)) return "rank 0 sends from memory with single copy off somewhere";
        if (links->post_from(1, header_for(0, 0, slot), b.p) != 0) return "rank 0 lent a slot";
      } else {
        const plait::slot_view v = wait_for_slot(*links, bell, 0);
        if (v.payload == nullptr || !same(v.payload, b.p, slot)) return "the slot's bytes differ";
        links->release(0);
      }
      ctx.barrier("done", clock::now() + std::chrono::seconds(20));
      return "ok";
    });
    CHECK(results[0] == "ok");
    CHECK(results[1] == "ok");
  }
}

TEST_CASE("shm single copy: a lender that dies before its slot is read is peer_lost, not stale bytes",
          "[shm][single_copy][faults]") {
  const auto results = run_linked_pair(config(slot, depth), [](int r, auto& ctx, auto& links, auto& bell) {
    const auto deadline = clock::now() + std::chrono::seconds(20);
    if (r == 0) {
      buffer b(slot, true, 8);
      links.acquire(1);
      if (links.post_from(1, header_for(0, 0, slot), b.p) == 0) return std::string("the slot was not lent");
      const std::int64_t pid = ::getpid();
      ctx.put("pid", std::as_bytes(std::span(&pid, 1)));
      ::raise(SIGKILL);  // dies with the slot lent
      return std::string("still alive after SIGKILL");
    }
    const auto raw = ctx.get("pid", deadline);
    std::int64_t pid = 0;
    std::memcpy(&pid, raw.data(), sizeof pid);
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(pid), 0));
    if (fd >= 0) {
      pollfd p{fd, POLLIN, 0};
      ::poll(&p, 1, 10000);  // until it has exited (bounded)
      ::close(fd);
    }
    buffer got(slot, true, 0);
    wait_for_slot(links, bell, 0);
    try {
      links.receive_into(0, got.p, slot);
    } catch (const plait::error& e) {
      if (e.code() == errc::peer_lost && e.peer() == 0) return std::string("ok");
      return "threw " + std::string(plait::to_string(e.code())) + ": " + e.what();
    }
    return std::string("receive_into() from a dead lender returned without an error");
  });
  CHECK(results[0].find("killed by signal 9") != std::string::npos);
  CHECK(results[1] == "ok");
}

// End to end: broadcast, send/recv and all_gather from buffers on huge pages, whose
// slices go by reference (PLAIT_SINGLE_COPY=always: at every size, whatever the
// ranks per core), at sizes that leave a partial last slice.
TEST_CASE("shm single copy: broadcast, send/recv and all_gather deliver every byte",
          "[shm][single_copy][collectives]") {
  plait::testing::rank_options opt;
  opt.slice_bytes = "256K";
  opt.copy_slice_bytes = "";
  plait::testing::scoped_env env;          // restores the caller's environment afterwards
  env.set("PLAIT_SINGLE_COPY", "always");  // the ranks inherit it
  auto results = plait::testing::run_ranks<plait::transport::shm>(
      2,
      [](plait::communicator<plait::transport::shm>& c) {
        std::vector<plait::testing::blob> out;
        for (std::size_t count : {std::size_t{16384}, std::size_t{300000}, std::size_t{1} << 21}) {
          buffer b(count * sizeof(float), true, 0);
          auto* f = reinterpret_cast<float*>(b.p);
          for (std::size_t i = 0; i < count; ++i) f[i] = c.rank() == 0 ? static_cast<float>(i % 1000) + 0.5f : -1.0f;
          plait::broadcast(c, std::span<float>(f, count), 0);
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < count; ++i) wrong += f[i] != static_cast<float>(i % 1000) + 0.5f;
          buffer m(count * sizeof(float), true, 0);
          auto* g = reinterpret_cast<float*>(m.p);
          if (c.rank() == 1) {
            for (std::size_t i = 0; i < count; ++i) g[i] = static_cast<float>(i % 777);
            plait::send(c, std::span<float>(g, count), 0);
          } else {
            plait::recv(c, std::span<float>(g, count), 1);
            for (std::size_t i = 0; i < count; ++i) wrong += g[i] != static_cast<float>(i % 777);
          }
          buffer shard(count * sizeof(float), true, 0), full(2 * count * sizeof(float), true, 0);
          auto* h = reinterpret_cast<float*>(shard.p);
          auto* a = reinterpret_cast<float*>(full.p);
          for (std::size_t i = 0; i < count; ++i)
            h[i] = static_cast<float>(c.rank() * 1000 + static_cast<int>(i % 999));
          plait::all_gather(c, std::span<const float>(h, count), std::span<float>(a, 2 * count));
          for (std::size_t i = 0; i < 2 * count; ++i)
            wrong += a[i] != static_cast<float>(static_cast<int>(i / count) * 1000 + static_cast<int>(i % count % 999));
          out.push_back(plait::testing::to_blob(std::vector<std::size_t>{count, wrong}));
        }
        return out;
      },
      opt);
  for (int r = 0; r < 2; ++r) {
    const auto& res = results[static_cast<std::size_t>(r)];
    INFO("rank " << r << ": " << res.error);
    REQUIRE(res.error == "");
    REQUIRE(res.blobs.size() == 3);
    for (const auto& b : res.blobs) {
      const auto v = plait::testing::from_blob<std::size_t>(b);
      INFO("count " << v[0]);
      CHECK(v[1] == 0);
    }
  }
}

int main(int argc, char** argv) { return plait::testing::catch_or_skip(prerequisite_missing(), argc, argv); }
