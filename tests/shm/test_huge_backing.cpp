// The caller's large buffers on transparent huge pages (detail::huge_backing, and
// through it every collective): which ranges are asked, how often, what a refusal
// does, and that a call leaves its buffers' whole 2 MiB pages on huge pages (or, with
// PLAIT_HUGE_PAGES=off, as they were) with every result exact.
//
// Needs what the feature needs: madvise(MADV_COLLAPSE) (Linux 6.1+) and PAGEMAP_SCAN
// (6.7+) to see the pages. Without them this executable says why and exits 77 (SKIP).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <sys/mman.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>

#include <plait/detail/huge_backing.hpp>
#include <plait/transport/shm.hpp>

#include "bootstrap/bootstrap_support.hpp"
#include "support/catch_or_skip.hpp"
#include "support/ranks.hpp"

namespace {

using plait::detail::huge_backing;
constexpr std::size_t huge = huge_backing::page_bytes;

// Anonymous memory on 4 KiB pages until collapsed: mapped here (not malloc'd, so its
// place is known), aligned to a huge page, and written unless `touch` is false.
// `no_huge` marks it MADV_NOHUGEPAGE, the program's own refusal.
struct mapping {
  void* base = nullptr;
  std::size_t mapped = 0;
  std::byte* aligned = nullptr;  // the first 2 MiB boundary in it
  mapping(std::size_t bytes, bool touch = true, bool no_huge = false) {
    mapped = bytes + huge;
    base = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) throw std::runtime_error("mmap failed");
    aligned = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(base) + huge - 1) / huge * huge);
    if (no_huge) ::madvise(base, mapped, MADV_NOHUGEPAGE);
    if (touch) std::memset(base, 0x5a, mapped);
  }
  ~mapping() { ::munmap(base, mapped); }
  mapping(const mapping&) = delete;
  mapping& operator=(const mapping&) = delete;
};

// Opened per look: a forked rank must read its own /proc/self/pagemap, not its parent's.
double share(const void* p, std::size_t bytes) {
  plait::transport::shm_detail::huge_pages pages;
  return pages.share(p, bytes);
}

std::string prerequisite_missing() {
  mapping m(2 * huge);
  if (::madvise(m.aligned, 2 * huge, huge_backing::collapse) != 0)
    return std::string("madvise(MADV_COLLAPSE) refused a written anonymous buffer (") + std::strerror(errno) +
           "; Linux 6.1+ with transparent huge pages): plait never collapses here";
  if (share(m.aligned, 2 * huge) < 1.0) return "no PAGEMAP_SCAN (Linux 6.7+): the pages cannot be seen";
  return {};
}

}  // namespace

// The calls before ask_at_call: not asked.
void first_calls(huge_backing& h, const void* p, std::size_t bytes) {
  for (std::uint32_t i = 1; i < huge_backing::ask_at_call; ++i) REQUIRE(h.back(p, bytes).bytes == 0);
}

TEST_CASE("huge_backing collapses the whole 2 MiB pages inside a buffer, and only those", "[huge_pages]") {
  mapping m(8 * huge);
  const std::byte* p = m.aligned + 4096;  // a head and a tail of partial pages
  const std::size_t bytes = 5 * huge;     // whole pages: [aligned + 2M, aligned + 5 * 2M)
  REQUIRE(share(m.aligned, 6 * huge) == 0.0);
  huge_backing h;
  first_calls(h, p, bytes);
  CHECK(share(m.aligned, 6 * huge) == 0.0);
  const auto a = h.back(p, bytes);
  CHECK(a.error == 0);
  CHECK(a.bytes == 4 * huge);
  CHECK(share(m.aligned + huge, 4 * huge) == 1.0);
  CHECK(share(m.aligned, huge) == 0.0);             // the head's page holds bytes before the buffer
  CHECK(share(m.aligned + 5 * huge, huge) == 0.0);  // the tail's holds bytes after it
  std::size_t changed = 0;
  for (std::size_t i = 0; i < 6 * huge; ++i) changed += m.aligned[i] != std::byte{0x5a};
  CHECK(changed == 0);
}

TEST_CASE("huge_backing does not ask for a buffer without a whole 2 MiB page", "[huge_pages]") {
  mapping m(4 * huge);
  huge_backing h;
  for (std::uint32_t i = 0; i < huge_backing::ask_at_call; ++i) {
    CHECK(h.back(m.aligned, huge - 1).bytes == 0);
    CHECK(h.back(m.aligned + 4096, 2 * huge - 8192).bytes == 0);  // 4 MiB less 8 KiB across one boundary
  }
  CHECK(share(m.aligned, 4 * huge) == 0.0);
  first_calls(h, m.aligned, huge);
  CHECK(h.back(m.aligned, huge).bytes == huge);
}

TEST_CASE("huge_backing asks for a range again only after recheck_every calls that cover it", "[huge_pages]") {
  mapping m(4 * huge);
  huge_backing h;
  first_calls(h, m.aligned, 4 * huge);
  REQUIRE(h.back(m.aligned, 4 * huge).bytes == 4 * huge);
  CHECK(h.back(m.aligned + huge, huge).bytes == 0);  // inside the remembered range: one call of it
  for (std::uint32_t i = 2; i < huge_backing::recheck_every; ++i) REQUIRE(h.back(m.aligned, 4 * huge).bytes == 0);
  const auto again = h.back(m.aligned, 4 * huge);  // the recheck_every-th call after the collapse
  CHECK(again.bytes == 4 * huge);
  CHECK(again.error == 0);
  CHECK(h.back(m.aligned, 4 * huge).bytes == 0);
}

TEST_CASE("huge_backing remembers its last ranges and forgets the oldest", "[huge_pages]") {
  const std::size_t n = huge_backing::remembered + 1;
  mapping m(n * huge);
  huge_backing h;
  for (std::size_t i = 0; i < n; ++i) REQUIRE(h.back(m.aligned + i * huge, huge).bytes == 0);
  // The newest is at its second call, the oldest forgotten: its count starts again.
  const std::byte* newest = m.aligned + (n - 1) * huge;
  for (std::uint32_t k = 2; k < huge_backing::ask_at_call; ++k) REQUIRE(h.back(newest, huge).bytes == 0);
  CHECK(h.back(newest, huge).bytes == huge);
  CHECK(share(newest, huge) == 1.0);
  first_calls(h, m.aligned, huge);
  CHECK(share(m.aligned, huge) == 0.0);
  CHECK(h.back(m.aligned, huge).bytes == huge);
  CHECK(share(m.aligned, huge) == 1.0);
}

TEST_CASE("huge_backing leaves memory marked MADV_NOHUGEPAGE as it is, and asks again once at the next call",
          "[huge_pages]") {
  mapping m(2 * huge, true, true);
  huge_backing h;
  first_calls(h, m.aligned, 2 * huge);
  const auto a = h.back(m.aligned, 2 * huge);
  CHECK(a.bytes == 2 * huge);
  CHECK(a.error == EINVAL);
  const auto retry = h.back(m.aligned, 2 * huge);
  CHECK(retry.bytes == 2 * huge);
  CHECK(retry.error == EINVAL);
  CHECK(h.back(m.aligned, 2 * huge).bytes == 0);  // then not for recheck_every calls
  CHECK(share(m.aligned, 2 * huge) == 0.0);
}

TEST_CASE("huge_backing collapses a buffer the program had not written at the next call", "[huge_pages]") {
  mapping m(2 * huge, false);
  huge_backing h;
  first_calls(h, m.aligned, 2 * huge);
  CHECK(h.back(m.aligned, 2 * huge).error != 0);  // no pages yet
  std::memset(m.aligned, 1, 2 * huge);            // what the call does
  const auto a = h.back(m.aligned, 2 * huge);
  CHECK(a.bytes == 2 * huge);
  CHECK(a.error == 0);
  CHECK(share(m.aligned, 2 * huge) == 1.0);
}

// End to end over shm: each rank's input and output of all_reduce, all_gather and
// reduce_scatter, mapped on 4 KiB pages with a head and a tail of partial pages, all
// mapped for the whole sweep (as a program's buffers stay), each call made
// ask_at_call times. Per collective the blob holds: wrong elements in the last
// call's output, then the share on huge pages of the input's and the output's whole
// pages before the first call and after the last.
TEST_CASE("a collective puts its buffers' whole 2 MiB pages on huge pages, or with PLAIT_HUGE_PAGES=off leaves them",
          "[huge_pages][collectives][shm]") {
  const bool on = GENERATE(true, false);
  CAPTURE(on);
  plait::testing::scoped_env env;
  env.set("PLAIT_HUGE_PAGES", on ? "on" : "off");
  constexpr std::size_t ranks = 2;
  constexpr std::size_t count = (5 * huge + 8192) / sizeof(float);  // 10 MiB + 8 KiB: 4 whole pages at least
  auto results = plait::testing::run_ranks<plait::transport::shm>(
      static_cast<int>(ranks),
      [](plait::communicator<plait::transport::shm>& c) {
        std::vector<plait::testing::blob> out;
        const auto r = static_cast<std::size_t>(c.rank());
        // The share on huge pages of the whole pages of [p, p + elems).
        const auto whole = [](const float* p, std::size_t elems) {
          const auto b = (reinterpret_cast<std::uintptr_t>(p) + huge - 1) / huge * huge;
          const auto e = reinterpret_cast<std::uintptr_t>(p + elems) / huge * huge;
          return share(reinterpret_cast<const void*>(b), e - b);
        };
        std::vector<std::unique_ptr<mapping>> kept;
        // in: in_elems at 4 KiB past a boundary, o: out_elems at 8 KiB past one.
        const auto check = [&](std::size_t in_elems, std::size_t out_elems, auto&& fill, auto&& call, auto&& expected) {
          auto& a = *kept.emplace_back(std::make_unique<mapping>(in_elems * sizeof(float) + huge));
          auto& b = *kept.emplace_back(std::make_unique<mapping>(out_elems * sizeof(float) + huge));
          auto* in = reinterpret_cast<float*>(a.aligned + 4096);
          auto* o = reinterpret_cast<float*>(b.aligned + 8192);
          for (std::size_t i = 0; i < in_elems; ++i) in[i] = fill(i);
          const double in_before = whole(in, in_elems), out_before = whole(o, out_elems);
          for (std::uint32_t k = 0; k < huge_backing::ask_at_call; ++k)
            call(std::span<const float>(in, in_elems), std::span<float>(o, out_elems));
          std::size_t wrong = 0;
          for (std::size_t i = 0; i < out_elems; ++i) wrong += o[i] != expected(i);
          const std::vector<double> v{static_cast<double>(wrong), in_before, out_before, whole(in, in_elems),
                                      whole(o, out_elems)};
          out.push_back(plait::testing::to_blob(v));
        };
        check(
            count, count, [&](std::size_t i) { return static_cast<float>(i % 1000 + r); },
            [&](auto in, auto o) { plait::all_reduce(c, in, o, plait::sum{}); },
            [](std::size_t i) { return static_cast<float>(2 * (i % 1000) + 1); });
        check(
            count, ranks * count, [&](std::size_t i) { return static_cast<float>(r * 1000 + i % 999); },
            [&](auto in, auto o) { plait::all_gather(c, in, o); },
            [](std::size_t i) { return static_cast<float>(i / count * 1000 + i % count % 999); });
        check(
            ranks * count, count, [&](std::size_t i) { return static_cast<float>(i % 1000 + r); },
            [&](auto in, auto o) { plait::reduce_scatter(c, in, o, plait::sum{}); },
            [&](std::size_t i) { return static_cast<float>(2 * ((r * count + i) % 1000) + 1); });
        return out;
      },
      [] {
        plait::testing::rank_options opt;
        opt.slice_bytes = "";
        opt.copy_slice_bytes = "";
        return opt;
      }());
  const char* calls[] = {"all_reduce", "all_gather", "reduce_scatter"};
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto& res = results[r];
    INFO("rank " << r << ": " << res.error);
    REQUIRE(res.error == "");
    REQUIRE(res.blobs.size() == 3);
    for (std::size_t k = 0; k < 3; ++k) {
      const auto v = plait::testing::from_blob<double>(res.blobs[k]);
      INFO(calls[k] << ": wrong, input and output share before, after: " << v[0] << ", " << v[1] << ", " << v[2] << ", "
                    << v[3] << ", " << v[4]);
      CHECK(v[0] == 0);
      if (on) {
        CHECK(v[3] == 1.0);
        CHECK(v[4] == 1.0);
      } else {
        CHECK(v[3] == v[1]);
        CHECK(v[4] == v[2]);
      }
    }
  }
}

int main(int argc, char** argv) { return plait::testing::catch_or_skip(prerequisite_missing(), argc, argv); }
