// The TCP link set's wire behaviour, driven byte by byte from the other end of a
// socketpair: framing across partial reads, credit flow control, closing, end of
// stream, and garbage (which must be `protocol`, never a crash or a hang).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cstring>
#include <initializer_list>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <plait/transport/tcp.hpp>
#include <support/file_bootstrap.hpp>

#include "tcp_test_support.hpp"

using namespace std::chrono_literals;
using plait::slot_view;
using plait::detail::fd_handle;
using plait::detail::slot_header;
using plait::transport::tcp_detail::control_frame;
using plait::transport::tcp_detail::control_type;
using plait::transport::tcp_detail::tcp_link_set;

namespace {

constexpr std::size_t slot_bytes = 256;
constexpr std::size_t depth = 2;

// Rank 0's link set on one end of a socketpair; the test plays rank 1 on the other.
struct raw_peer {
  plait::detail::doorbell bell;
  fd_handle raw;
  fd_handle link_end;  // with watch_link_end: a duplicate of rank 0's end, to see what it has read
  std::unique_ptr<tcp_link_set> links;

  explicit raw_peer(bool watch_link_end = false, plait::link_config cfg = {slot_bytes, depth, 300ms}) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    raw.reset(sv[1]);
    if (watch_link_end) link_end.reset(::fcntl(sv[0], F_DUPFD_CLOEXEC, 0));
    std::vector<std::pair<int, fd_handle>> sockets;
    sockets.emplace_back(1, fd_handle(sv[0]));
    links = std::make_unique<tcp_link_set>(0, 2, bell, cfg, std::move(sockets));
  }

  void send(const void* p, std::size_t n) { plait::detail::send_all(raw.get(), p, n, plait::clock::now() + 5s); }
  // Slot `index` from rank 1 as it goes on the wire: header, then the pattern.
  static std::vector<std::byte> slot_frame(std::uint32_t bytes, std::uint64_t index) {
    std::vector<std::byte> frame(sizeof(slot_header) + bytes);
    const slot_header h = plait::testing::pattern_header(1, index, bytes);
    std::memcpy(frame.data(), &h, sizeof h);
    plait::testing::fill_pattern(frame.data() + sizeof h, bytes, 1, 0, index);
    return frame;
  }
  void send_slot(std::uint32_t bytes, std::uint64_t index, bool byte_by_byte = false) {
    const std::vector<std::byte> frame = slot_frame(bytes, index);
    if (!byte_by_byte) return send(frame.data(), frame.size());
    for (std::size_t i = 0; i < frame.size(); ++i) {
      send(&frame[i], 1);
      if (i % 16 == 0) std::this_thread::sleep_for(200us);  // let the reader see partial frames
    }
  }
  void send_control(control_type type, std::uint64_t value) {
    control_frame c;
    c.type = type;
    c.value = value;
    send(&c, sizeof c);
  }
  template <class T>
  T receive() {
    T value;
    plait::detail::recv_all(raw.get(), &value, sizeof value, plait::clock::now() + 5s);
    return value;
  }
  // Waits until rank 0's end has read everything sent to it (watch_link_end).
  bool link_end_drained() {
    const auto until = plait::clock::now() + 2s;
    for (;;) {
      int unread = -1;
      if (::ioctl(link_end.get(), FIONREAD, &unread) == 0 && unread == 0) return true;
      if (plait::clock::now() > until) return false;
      std::this_thread::sleep_for(1ms);
    }
  }
  // True when nothing arrives on the raw end within `quiet`.
  bool silent_for(std::chrono::milliseconds quiet) {
    pollfd p{raw.get(), POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(quiet.count())) == 0;
  }

  slot_view wait_slot() {
    const auto until = plait::clock::now() + 5s;
    for (;;) {
      const auto seen = bell.snapshot();
      if (auto v = links->peek(1); v.header != nullptr) return v;
      if (plait::clock::now() > until) return {};
      bell.wait(seen, 10ms);
    }
  }

  std::optional<plait::error> wait_failure(std::chrono::milliseconds bound = 2000ms) {
    const auto until = plait::clock::now() + bound;
    for (;;) {
      const auto seen = bell.snapshot();
      try {
        links->health(1);
      } catch (const plait::error& e) {
        return e;
      }
      if (plait::clock::now() > until) return std::nullopt;
      bell.wait(seen, 10ms);
    }
  }
};

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("tcp slots written in pieces arrive whole, in order, with every size", "[tcp][frames]") {
  raw_peer t;
  t.send_slot(100, 0, true);
  t.send_slot(0, 1, true);
  for (std::uint64_t i = 0; i < 3; ++i) {
    const std::uint32_t want = i == 0 ? 100 : i == 1 ? 0 : slot_bytes;
    const slot_view v = t.wait_slot();
    REQUIRE(v.header != nullptr);
    REQUIRE(v.header->bytes == want);
    REQUIRE(v.header->desc.sequence == i);
    for (std::size_t j = 0; j < want; ++j) REQUIRE(v.payload[j] == plait::testing::pattern_byte(1, 0, i, j));
    t.links->release(1);
    // Each release returns its slot to the sender as a credit.
    const auto c = t.receive<control_frame>();
    REQUIRE(c.magic == plait::transport::tcp_detail::control_magic);
    REQUIRE(c.type == control_type::credit);
    REQUIRE(c.value == 1);
    if (i == 0) t.send_slot(slot_bytes, 2);  // depth 2: the third slot needs this credit
  }
  REQUIRE(t.links->peek(1).header == nullptr);
  REQUIRE_NOTHROW(t.links->health(1));
}

namespace {

// A frame_reader sink that takes every slot into its own buffer, one per frame.
struct collecting_sink {
  std::vector<std::vector<std::byte>> payloads;
  std::byte* on_slot_header(const slot_header& h) {
    payloads.emplace_back(h.bytes);
    return payloads.back().data();
  }
  void on_slot_complete() {}
  bool on_control(const control_frame&) { return true; }
  void on_garbage(const std::string&) { FAIL("garbage"); }
};

// Writes `frames` on one thread while the reader pumps on this one, until all arrived.
collecting_sink read_all(const std::vector<std::vector<std::byte>>& frames,
                         plait::transport::tcp_detail::frame_reader& reader) {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  fd_handle writer_end(sv[1]), reader_end(sv[0]);
  REQUIRE(::fcntl(reader_end.get(), F_SETFL, O_NONBLOCK) == 0);
  std::vector<std::byte> stream;
  for (const auto& f : frames) stream.insert(stream.end(), f.begin(), f.end());
  std::thread writer(
      [&] { plait::detail::send_all(writer_end.get(), stream.data(), stream.size(), plait::clock::now() + 5s); });
  collecting_sink sink;
  const auto until = plait::clock::now() + 5s;
  while (sink.payloads.size() < frames.size() || reader.mid_frame()) {
    const auto r = reader.pump(reader_end.get(), sink);
    if (r.status != plait::transport::tcp_detail::read_status::drained || plait::clock::now() > until) break;
    pollfd p{reader_end.get(), POLLIN, 0};
    ::poll(&p, 1, 10);
  }
  writer.join();
  return sink;
}

// Appends `count` slots of `bytes` each, numbered on from those already there, as rank 1 writes them.
void add_slot_frames(std::vector<std::vector<std::byte>>& frames, std::size_t count, std::uint32_t bytes) {
  for (std::size_t i = 0; i < count; ++i) frames.push_back(raw_peer::slot_frame(bytes, frames.size()));
}

// Every frame arrived, whole and in order.
void require_payloads(const collecting_sink& sink, const std::vector<std::vector<std::byte>>& frames) {
  REQUIRE(sink.payloads.size() == frames.size());
  for (std::size_t i = 0; i < frames.size(); ++i) {
    const std::size_t bytes = frames[i].size() - sizeof(slot_header);
    REQUIRE(std::memcmp(sink.payloads[i].data(), frames[i].data() + sizeof(slot_header), bytes) == 0);
  }
}

}  // namespace

TEST_CASE("tcp frame reader: large payloads go straight to their destination, small frames many to a read",
          "[tcp][frames]") {
  using plait::transport::tcp_detail::frame_reader;
  std::vector<std::vector<std::byte>> frames;
  frame_reader reader;
  SECTION("after the first large slot, no payload byte is staged and copied") {
    add_slot_frames(frames, 8, 256 * 1024);
    require_payloads(read_all(frames, reader), frames);
    // Only the first frame's start can come through staging (its header was unknown).
    CHECK(reader.staged_payload_bytes() < frame_reader::staging_bytes);
  }
  SECTION("small frames written at once are read many per call") {
    add_slot_frames(frames, 200, 100);
    require_payloads(read_all(frames, reader), frames);
    CHECK(reader.reads() < 50);
  }
  SECTION("a small slot after large ones is read whole, and the next ones many per call again") {
    add_slot_frames(frames, 4, 64 * 1024);
    add_slot_frames(frames, 200, 100);
    require_payloads(read_all(frames, reader), frames);
    CHECK(reader.reads() < 60);
  }
}

TEST_CASE("tcp sends a posted slot as header plus payload, and no more slots than it has credits", "[tcp][frames]") {
  raw_peer t;
  for (std::uint64_t i = 0; i < 3; ++i) {
    std::byte* p = nullptr;
    const auto until = plait::clock::now() + 2s;
    while ((p = t.links->acquire(1)) == nullptr && plait::clock::now() < until) std::this_thread::sleep_for(1ms);
    REQUIRE(p != nullptr);
    REQUIRE(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
    plait::testing::fill_pattern(p, 40 + i, 0, 1, i);
    t.links->post(1, plait::testing::pattern_header(0, i, 40 + i));
  }
  for (std::uint64_t i = 0; i < 2; ++i) {  // depth 2: two credits
    const auto h = t.receive<slot_header>();
    REQUIRE(h.magic == plait::detail::slot_magic);
    REQUIRE(h.bytes == 40 + i);
    REQUIRE(h.desc.sequence == i);
    std::vector<std::byte> payload(h.bytes);
    plait::detail::recv_all(t.raw.get(), payload.data(), payload.size(), plait::clock::now() + 5s);
    for (std::size_t j = 0; j < payload.size(); ++j) REQUIRE(payload[j] == plait::testing::pattern_byte(0, 1, i, j));
  }
  CHECK(t.silent_for(100ms));  // the third slot waits for a credit
  // The send FIFO holds depth slots: with one waiting, one more fits, then none.
  REQUIRE(t.links->acquire(1) != nullptr);
  t.links->post(1, plait::testing::pattern_header(0, 3, 0));
  REQUIRE(t.links->acquire(1) == nullptr);
  t.send_control(control_type::credit, 2);
  REQUIRE(t.receive<slot_header>().desc.sequence == 2);
  std::vector<std::byte> payload(42);
  plait::detail::recv_all(t.raw.get(), payload.data(), payload.size(), plait::clock::now() + 5s);
  REQUIRE(t.receive<slot_header>().desc.sequence == 3);
  REQUIRE_NOTHROW(t.links->health(1));
}

namespace {

// Posts a slot of `bytes` (pattern `index`) to rank 1, waiting up to 2 s for one.
void post_slot(raw_peer& t, std::uint64_t index, std::uint32_t bytes) {
  std::byte* p = nullptr;
  const auto until = plait::clock::now() + 2s;
  while ((p = t.links->acquire(1)) == nullptr && plait::clock::now() < until) std::this_thread::sleep_for(1ms);
  REQUIRE(p != nullptr);
  plait::testing::fill_pattern(p, bytes, 0, 1, index);
  t.links->post(1, plait::testing::pattern_header(0, index, bytes));
}

// Receives the next slot on the raw end; returns its sequence after checking its size
// and payload.
std::uint64_t receive_slot(raw_peer& t, std::uint32_t bytes) {
  const auto h = t.receive<slot_header>();
  REQUIRE(h.magic == plait::detail::slot_magic);
  REQUIRE(h.bytes == bytes);
  std::vector<std::byte> payload(h.bytes);
  plait::detail::recv_all(t.raw.get(), payload.data(), payload.size(), plait::clock::now() + 5s);
  for (std::size_t j = 0; j < payload.size(); ++j)
    REQUIRE(payload[j] == plait::testing::pattern_byte(0, 1, h.desc.sequence, j));
  return h.desc.sequence;
}

}  // namespace

TEST_CASE("tcp with a send window sends full slots up to its bytes, small ones up to the credits", "[tcp][frames]") {
  plait::link_config cfg{slot_bytes, 4, 300ms};
  cfg.send_window_bytes = 2 * slot_bytes;
  raw_peer t(false, cfg);
  // Four credits, but two full slots fill the window.
  for (std::uint64_t i = 0; i < 4; ++i) post_slot(t, i, slot_bytes);
  REQUIRE(receive_slot(t, slot_bytes) == 0);
  REQUIRE(receive_slot(t, slot_bytes) == 1);
  CHECK(t.silent_for(100ms));
  t.send_control(control_type::credit, 1);  // the window frees as the credits come back
  REQUIRE(receive_slot(t, slot_bytes) == 2);
  CHECK(t.silent_for(100ms));
  t.send_control(control_type::credit, 1);
  REQUIRE(receive_slot(t, slot_bytes) == 3);
  t.send_control(control_type::credit, 2);
  // Four slots of a quarter each fit the window: the credits are the limit.
  for (std::uint64_t i = 4; i < 9; ++i) post_slot(t, i, slot_bytes / 4);
  for (std::uint64_t i = 4; i < 8; ++i) REQUIRE(receive_slot(t, slot_bytes / 4) == i);
  CHECK(t.silent_for(100ms));  // no credit left
  t.send_control(control_type::credit, 4);
  REQUIRE(receive_slot(t, slot_bytes / 4) == 8);
  REQUIRE_NOTHROW(t.links->health(1));
}

TEST_CASE("tcp with a send window of frames keeps that many of a larger slice in flight", "[tcp][frames]") {
  // The window's bytes are two half slots; two frames of any size may also be out.
  plait::link_config cfg{slot_bytes, 4, 300ms};
  cfg.send_window_bytes = slot_bytes;
  cfg.send_window_frames = 2;
  raw_peer t(false, cfg);
  for (std::uint64_t i = 0; i < 3; ++i) post_slot(t, i, slot_bytes);
  REQUIRE(receive_slot(t, slot_bytes) == 0);
  REQUIRE(receive_slot(t, slot_bytes) == 1);  // past the bytes, within two frames
  CHECK(t.silent_for(100ms));
  t.send_control(control_type::credit, 2);
  REQUIRE(receive_slot(t, slot_bytes) == 2);
  t.send_control(control_type::credit, 1);
  // Half slots: the bytes and the frames allow two.
  for (std::uint64_t i = 3; i < 6; ++i) post_slot(t, i, slot_bytes / 2);
  REQUIRE(receive_slot(t, slot_bytes / 2) == 3);
  REQUIRE(receive_slot(t, slot_bytes / 2) == 4);
  CHECK(t.silent_for(100ms));
  t.send_control(control_type::credit, 2);
  REQUIRE(receive_slot(t, slot_bytes / 2) == 5);
  t.send_control(control_type::credit, 1);
  // Quarter slots: the bytes allow four, and so do the credits.
  for (std::uint64_t i = 6; i < 10; ++i) post_slot(t, i, slot_bytes / 4);
  for (std::uint64_t i = 6; i < 10; ++i) REQUIRE(receive_slot(t, slot_bytes / 4) == i);
  REQUIRE_NOTHROW(t.links->health(1));
}

TEST_CASE("tcp sends a slot larger than its send window when nothing else is out", "[tcp][frames]") {
  plait::link_config cfg{slot_bytes, 4, 300ms};
  cfg.send_window_bytes = slot_bytes / 2;
  raw_peer t(false, cfg);
  for (std::uint64_t i = 0; i < 3; ++i) post_slot(t, i, slot_bytes);
  REQUIRE(receive_slot(t, slot_bytes) == 0);
  CHECK(t.silent_for(100ms));
  t.send_control(control_type::credit, 1);
  REQUIRE(receive_slot(t, slot_bytes) == 1);
  t.send_control(control_type::credit, 1);
  REQUIRE(receive_slot(t, slot_bytes) == 2);
  REQUIRE_NOTHROW(t.links->health(1));
}

TEST_CASE("tcp sends a payload from the caller's memory, and detach() frees that memory at once", "[tcp][frames]") {
  raw_peer t;
  REQUIRE(t.links->sends_from_memory(1));
  std::vector<std::byte> user(3 * 200);
  for (std::uint64_t i = 0; i < 3; ++i) plait::testing::fill_pattern(user.data() + i * 200, 200, 0, 1, i);
  std::uint64_t ticket[3] = {};
  for (std::uint64_t i = 0; i < 3; ++i) {
    const auto until = plait::clock::now() + 2s;
    while (t.links->acquire(1) == nullptr && plait::clock::now() < until) std::this_thread::sleep_for(1ms);
    REQUIRE(t.links->acquire(1) != nullptr);
    ticket[i] = t.links->post_from(1, plait::testing::pattern_header(0, i, 200), user.data() + i * 200);
  }
  // Depth 2: two credits, so the third frame stays in this rank, read from `user`.
  for (std::uint64_t i = 0; i < 2; ++i) {
    const auto h = t.receive<slot_header>();
    REQUIRE(h.desc.sequence == i);
    std::vector<std::byte> payload(h.bytes);
    plait::detail::recv_all(t.raw.get(), payload.data(), payload.size(), plait::clock::now() + 5s);
    for (std::size_t j = 0; j < payload.size(); ++j) REQUIRE(payload[j] == plait::testing::pattern_byte(0, 1, i, j));
    CHECK(t.links->sent(1, ticket[i]));
  }
  CHECK(t.silent_for(50ms));
  CHECK_FALSE(t.links->sent(1, ticket[2]));
  // A failed call detaches: its buffer may be reused at once, and what goes out is
  // what was posted.
  t.links->detach();
  std::fill(user.begin(), user.end(), std::byte{0xee});
  t.send_control(control_type::credit, 2);
  const auto h = t.receive<slot_header>();
  REQUIRE(h.desc.sequence == 2);
  std::vector<std::byte> payload(h.bytes);
  plait::detail::recv_all(t.raw.get(), payload.data(), payload.size(), plait::clock::now() + 5s);
  for (std::size_t j = 0; j < payload.size(); ++j) REQUIRE(payload[j] == plait::testing::pattern_byte(0, 1, 2, j));
  const auto until = plait::clock::now() + 2s;
  while (!t.links->sent(1, ticket[2]) && plait::clock::now() < until) std::this_thread::sleep_for(1ms);
  CHECK(t.links->sent(1, ticket[2]));
}

TEST_CASE("tcp bytes move in the waiting thread and in the link set's own, handed back and forth", "[tcp][frames]") {
  int sv[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
  plait::detail::doorbell bell[2];
  std::unique_ptr<tcp_link_set> links[2];
  for (int r = 0; r < 2; ++r) {
    std::vector<std::pair<int, fd_handle>> sockets;
    sockets.emplace_back(1 - r, fd_handle(sv[r]));
    links[r] = std::make_unique<tcp_link_set>(r, 2, bell[r], plait::link_config{4096, 4, 2s}, std::move(sockets));
  }
  std::string result[2];
  auto run = [&](int r) {
    const int peer = 1 - r;
    try {
      result[r] = plait::testing::exchange_all(*links[r], bell[r], r, std::span<const int>(&peer, 1), 3000, 30s, true);
    } catch (const std::exception& e) {
      result[r] = e.what();
    }
  };
  std::thread other(run, 1);
  run(0);
  other.join();
  CHECK(result[0].empty());
  CHECK(result[1].empty());
  CAPTURE(result[0], result[1]);
}

TEST_CASE("tcp a waiter that has polled its time sleeps on the socket, keeps the I/O, and wakes for a frame or a ring",
          "[tcp][frames]") {
  raw_peer p;
  p.bell.set_spin(0ns);                // no polling: straight to sleep
  REQUIRE_FALSE(p.links->progress());  // the waiter holds the I/O, as an executor's first look does
  const auto seen = p.bell.snapshot();
  const auto start = plait::clock::now();

  SECTION("a frame wakes it; the waiting thread read it, so nobody rang the doorbell") {
    std::thread sender([&] {
      std::this_thread::sleep_for(50ms);
      p.send_slot(static_cast<std::uint32_t>(plait::testing::pattern_size(1, 0, 0, slot_bytes)), 0);
    });
    p.bell.wait(seen, 5s, plait::io_waiter{p.links.get()});
    sender.join();
    CHECK(plait::clock::now() - start < 4s);
    CHECK(p.bell.snapshot() == seen);  // handed to the progress thread, it would have rung
    const slot_view v = p.links->peek(1);
    REQUIRE(v.header != nullptr);
    CHECK(plait::testing::check_pattern(v, 1, 0, 0, slot_bytes).empty());
  }

  SECTION("a ring from another thread wakes it") {
    std::thread ringer([&] {
      std::this_thread::sleep_for(50ms);
      p.bell.ring();
    });
    p.bell.wait(seen, 5s, plait::io_waiter{p.links.get()});
    ringer.join();
    CHECK(plait::clock::now() - start < 4s);
    CHECK(p.bell.snapshot() != seen);
    CHECK(p.links->peek(1).header == nullptr);
  }

  SECTION("with nothing to wake it, it sleeps its bound") {
    p.bell.wait(seen, 100ms, plait::io_waiter{p.links.get()});
    CHECK(plait::clock::now() - start >= 100ms);
  }
}

namespace {

// Rank 0 in a call: polls (progress(), holding the I/O) until rank 1's next slot is
// here, checks it and releases it.
void take_slot(raw_peer& t, std::uint64_t index, std::uint32_t bytes) {
  const auto until = plait::clock::now() + 2s;
  slot_view v;
  while ((v = t.links->peek(1)).header == nullptr && plait::clock::now() < until) {
    t.links->progress();
    std::this_thread::sleep_for(100us);
  }
  REQUIRE(v.header != nullptr);
  REQUIRE(v.header->desc.sequence == index);
  REQUIRE(v.header->bytes == bytes);
  t.links->release(1);
}

}  // namespace

TEST_CASE("tcp a small credit waits for the next frame while a rank polls or leaves an exchange; otherwise it goes",
          "[tcp][frames]") {
  constexpr std::size_t big = 32 * 1024;  // past the credits that may wait (16 KiB)
  raw_peer t(false, plait::link_config{big, 4, 300ms});
  REQUIRE_FALSE(t.links->progress());  // the waiter holds the I/O, as an executor's first look does
  // An exchange: rank 0 posts a small slot (it goes at once) and takes rank 1's of `sizes`.
  auto exchange = [&t](std::initializer_list<std::uint32_t> sizes = {24}) {
    post_slot(t, 0, 40);
    REQUIRE(receive_slot(t, 40) == 0);
    std::uint64_t i = 0;
    for (const std::uint32_t n : sizes) t.send_slot(n, i++);
    i = 0;
    for (const std::uint32_t n : sizes) take_slot(t, i++, n);
  };

  SECTION("after an exchange of small slots the credit waits, and goes just before the next slot") {
    post_slot(t, 0, 40);  // the waiter posts: it leaves at once
    REQUIRE(receive_slot(t, 40) == 0);
    t.send_slot(24, 0);
    take_slot(t, 0, 24);
    t.links->release_io(true);   // leaves the call
    CHECK(t.silent_for(100ms));  // no lone credit frame
    post_slot(t, 1, 40);         // the next call's frame brings it
    const auto c = t.receive<control_frame>();
    CHECK(c.magic == plait::transport::tcp_detail::control_magic);
    CHECK(c.type == control_type::credit);
    CHECK(c.value == 1);
    REQUIRE(receive_slot(t, 40) == 1);
    REQUIRE_NOTHROW(t.links->health(1));
  }

  SECTION("a credit waiting from the last call waits while the next one polls, and goes as it sleeps") {
    exchange();
    t.links->release_io(true);
    CHECK(t.silent_for(100ms));
    t.links->progress();
    CHECK(t.silent_for(100ms));
    t.links->sleep(20ms, -1);
    CHECK(t.receive<control_frame>().value == 1);
  }

  SECTION("a rank that only received returns its credit as it leaves") {
    t.send_slot(24, 0);
    take_slot(t, 0, 24);
    t.links->release_io(true);
    CHECK(t.receive<control_frame>().value == 1);
  }

  SECTION("half the slots owed: the credits go as it leaves") {
    exchange({24, 24});
    t.links->release_io(true);
    CHECK(t.receive<control_frame>().value == 2);
  }

  SECTION("a large slot owed: its credit goes as it leaves") {
    exchange({static_cast<std::uint32_t>(big)});
    t.links->release_io(true);
    CHECK(t.receive<control_frame>().value == 1);
  }

  SECTION("inside a call, a small credit waits while the rank polls, and goes as it sleeps") {
    exchange();
    t.links->progress();
    CHECK(t.silent_for(100ms));
    t.links->sleep(20ms, -1);  // the pass before the sleep returns every credit
    CHECK(t.receive<control_frame>().value == 1);
  }

  SECTION("inside a call, a small credit waits while the rank polls, and goes when the thread takes the I/O") {
    exchange();
    t.links->progress();
    CHECK(t.silent_for(100ms));
    t.links->release_io(false);
    CHECK(t.receive<control_frame>().value == 1);
  }

  SECTION("inside a call, a small credit waits while the rank polls, and goes with its next frame") {
    exchange();
    t.links->progress();
    CHECK(t.silent_for(100ms));
    post_slot(t, 1, 40);
    CHECK(t.receive<control_frame>().value == 1);
    REQUIRE(receive_slot(t, 40) == 1);
  }

  SECTION("inside a call, half the slots owed or a large slot: the credits go at the next pump") {
    SECTION("half the slots") { exchange({24, 24}); }
    SECTION("a large slot") { exchange({static_cast<std::uint32_t>(big)}); }
    t.links->progress();
    CHECK(t.receive<control_frame>().type == control_type::credit);
  }

  SECTION("a frame that a polling pass sends takes the credits waiting") {
    post_slot(t, 0, 40);
    for (std::uint64_t i = 1; i < 4; ++i) post_slot(t, i, 40);  // every credit spent
    for (std::uint64_t i = 0; i < 4; ++i) REQUIRE(receive_slot(t, 40) == i);
    post_slot(t, 4, 40);  // waits for a credit
    t.send_slot(24, 0);
    take_slot(t, 0, 24);
    t.links->progress();  // the credit waits: the pass has no frame to send
    CHECK(t.silent_for(100ms));
    t.send_control(control_type::credit, 1);
    const auto until = plait::clock::now() + 2s;
    while (!t.links->progress() && plait::clock::now() < until) std::this_thread::sleep_for(1ms);
    const auto c = t.receive<control_frame>();  // before the frame, in the same write
    CHECK(c.magic == plait::transport::tcp_detail::control_magic);
    CHECK(c.value == 1);
    REQUIRE(receive_slot(t, 40) == 4);
  }
}

TEST_CASE("tcp with several peers a polling pass reads only the sockets that have bytes", "[tcp][frames]") {
  plait::detail::doorbell bell;
  std::vector<std::pair<int, fd_handle>> sockets;
  fd_handle raw[2];
  for (int peer = 1; peer <= 2; ++peer) {
    int sv[2];
    REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
    raw[peer - 1].reset(sv[1]);
    sockets.emplace_back(peer, fd_handle(sv[0]));
  }
  tcp_link_set links(0, 3, bell, plait::link_config{slot_bytes, depth, 300ms}, std::move(sockets));
  for (int i = 0; i < 10; ++i) links.progress();
  CHECK(links.socket_reads(1) == 0);
  CHECK(links.socket_reads(2) == 0);
  // Rank 2 sends a slot: only its socket is read.
  std::vector<std::byte> frame(sizeof(slot_header) + 24);
  const slot_header h = plait::testing::pattern_header(2, 0, 24);
  std::memcpy(frame.data(), &h, sizeof h);
  plait::testing::fill_pattern(frame.data() + sizeof h, 24, 2, 0, 0);
  plait::detail::send_all(raw[1].get(), frame.data(), frame.size(), plait::clock::now() + 5s);
  const auto until = plait::clock::now() + 2s;
  while (links.peek(2).header == nullptr && plait::clock::now() < until) {
    links.progress();
    std::this_thread::sleep_for(100us);
  }
  REQUIRE(links.peek(2).header != nullptr);
  CHECK(links.socket_reads(1) == 0);
  CHECK(links.socket_reads(2) > 0);
}

TEST_CASE("tcp a frame expected in the caller's memory lands there only with the header expected; detach() undoes it",
          "[tcp][frames]") {
  using expectation = plait::link_set::expectation;
  raw_peer t(true);
  REQUIRE(t.links->receives_into_memory(1));
  constexpr std::uint32_t n = 200;
  std::vector<std::byte> user(n, std::byte{0xee});
  auto untouched = [&](std::size_t from) {
    for (std::size_t j = from; j < n; ++j)
      if (user[j] != std::byte{0xee}) return false;
    return true;
  };
  auto holds_pattern = [&](const std::byte* p, std::size_t count, std::uint64_t index) {
    for (std::size_t j = 0; j < count; ++j)
      if (p[j] != plait::testing::pattern_byte(1, 0, index, j)) return false;
    return true;
  };

  SECTION("the header expected: the payload is written into the caller's memory, and peek() shows it there") {
    REQUIRE(t.links->expect(1, 0, plait::testing::pattern_header(1, 0, n), user.data()) == expectation::posted);
    t.send_slot(n, 0, true);  // in pieces: the payload goes on into the same place
    const slot_view v = t.wait_slot();
    REQUIRE(v.header != nullptr);
    CHECK(v.header->desc.sequence == 0);
    CHECK(v.payload == user.data());
    CHECK(holds_pattern(user.data(), n, 0));
    t.links->release(1);
    // The next frame was not expected: its slot, as always.
    t.send_slot(n, 1);
    const slot_view w = t.wait_slot();
    REQUIRE(w.header != nullptr);
    CHECK(w.payload != user.data());
    CHECK(holds_pattern(w.payload, n, 1));
  }
  SECTION("the second frame to come, expected while the first is not yet read") {
    REQUIRE(t.links->expect(1, 1, plait::testing::pattern_header(1, 1, n), user.data()) == expectation::posted);
    t.send_slot(n, 0);
    t.send_slot(n, 1);
    REQUIRE(t.wait_slot().payload != user.data());
    t.links->release(1);
    const slot_view v = t.wait_slot();
    REQUIRE(v.header != nullptr);
    CHECK(v.payload == user.data());
    CHECK(holds_pattern(user.data(), n, 1));
  }
  SECTION("any other header (another call, another length, an error notice): the slot, the memory untouched") {
    slot_header want = plait::testing::pattern_header(1, 0, n);
    SECTION("another call") { want.desc.sequence = 7; }
    SECTION("another length") { want.bytes = n - 4; }
    SECTION("another sender") { want.sender = 3; }
    SECTION("a notice where data was expected") { want.flags = plait::detail::slot_error_notice; }
    REQUIRE(t.links->expect(1, 0, want, user.data()) == expectation::posted);
    t.send_slot(n, 0);
    const slot_view v = t.wait_slot();
    REQUIRE(v.header != nullptr);
    CHECK(v.payload != user.data());
    CHECK(holds_pattern(v.payload, n, 0));
    CHECK(untouched(0));
  }
  SECTION("a frame beyond the window is asked for later; one already here has passed") {
    CHECK(t.links->expect(1, depth, plait::testing::pattern_header(1, depth, n), user.data()) == expectation::later);
    t.send_slot(n, 0);
    REQUIRE(t.wait_slot().header != nullptr);
    CHECK(t.links->expect(1, 0, plait::testing::pattern_header(1, 0, n), user.data()) == expectation::passed);
    CHECK(untouched(0));
  }
  SECTION("detach() in the middle of a landing frame: the rest goes to the slot, which ends up whole") {
    REQUIRE(t.links->expect(1, 0, plait::testing::pattern_header(1, 0, n), user.data()) == expectation::posted);
    const std::vector<std::byte> frame = raw_peer::slot_frame(n, 0);
    const std::size_t first = sizeof(slot_header) + n / 2;
    t.send(frame.data(), first);
    // Read from the socket; detach() waits for the reader to finish that pass (the
    // I/O mutex), and what it wrote may be looked at only after (the I/O side
    // writes the caller's memory with no other synchronisation).
    REQUIRE(t.link_end_drained());
    t.links->detach();
    REQUIRE(holds_pattern(user.data(), n / 2, 0));
    t.send(frame.data() + first, frame.size() - first);
    const slot_view v = t.wait_slot();
    REQUIRE(v.header != nullptr);
    CHECK(v.payload != user.data());
    CHECK(holds_pattern(v.payload, n, 0));
    CHECK(untouched(n / 2));
  }
  SECTION("detach() after a frame landed: the slot holds it, and the caller's memory is free at once") {
    REQUIRE(t.links->expect(1, 0, plait::testing::pattern_header(1, 0, n), user.data()) == expectation::posted);
    t.send_slot(n, 0);
    REQUIRE(t.wait_slot().payload == user.data());
    t.links->detach();
    std::fill(user.begin(), user.end(), std::byte{0xee});
    const slot_view v = t.links->peek(1);
    REQUIRE(v.header != nullptr);
    CHECK(v.payload != user.data());
    CHECK(holds_pattern(v.payload, n, 0));
  }
  SECTION("detach() drops an expectation not yet met") {
    REQUIRE(t.links->expect(1, 0, plait::testing::pattern_header(1, 0, n), user.data()) == expectation::posted);
    t.links->detach();
    t.send_slot(n, 0);
    const slot_view v = t.wait_slot();
    REQUIRE(v.header != nullptr);
    CHECK(v.payload != user.data());
    CHECK(untouched(0));
  }
}

TEST_CASE("tcp garbage from a peer is a protocol error naming it", "[tcp][frames]") {
  struct garbage_case {
    const char* name;
    std::function<void(raw_peer&)> send;
    const char* says;
  };
  auto header_with = [](auto change) {
    return [change](raw_peer& t) {
      slot_header h = plait::testing::pattern_header(1, 0, 0);
      change(h);
      t.send(&h, sizeof h);
    };
  };
  const std::vector<garbage_case> cases = {
      {"bad magic",
       [](raw_peer& t) {
         std::vector<std::byte> junk(64, std::byte{0xab});
         t.send(junk.data(), 64);
       },
       "0xabababab"},
      {"text", [](raw_peer& t) { t.send("GET / HTTP/1.0\r\n\r\n", 18); }, "neither a slot"},
      {"slot version", header_with([](slot_header& h) { h.version = 99; }), "version 99"},
      {"slot larger than a slot", header_with([](slot_header& h) { h.bytes = slot_bytes + 1; }), "257 payload bytes"},
      {"4 GiB slot", header_with([](slot_header& h) { h.bytes = 0xffffffffu; }), "4294967295 payload bytes"},
      {"unknown control type", [](raw_peer& t) { t.send_control(static_cast<control_type>(7), 0); }, "unknown type 7"},
      {"control version",
       [](raw_peer& t) {
         control_frame c;
         c.version = 9;
         t.send(&c, sizeof c);
       },
       "control frame version 9"},
      {"credit for nothing sent", [](raw_peer& t) { t.send_control(control_type::credit, 1); }, "credit of 1"},
      {"more slots than credits",
       [](raw_peer& t) {
         for (std::uint64_t i = 0; i <= depth; ++i) t.send_slot(0, i);
       },
       "more slots than this rank granted"},
      {"credit of 2^63", [](raw_peer& t) { t.send_control(control_type::credit, std::uint64_t{1} << 63); },
       "credit of 9223372036854775808"},
      {"closing announcing 2^63 frames",
       [](raw_peer& t) { t.send_control(control_type::closing, std::uint64_t{1} << 31 | std::uint64_t{1} << 63); },
       "announcing 2147483648 more"},
      {"closing announcing too much", [](raw_peer& t) { t.send_control(control_type::closing, depth + 1); },
       "announcing 3 more"},
      {"slot after closing",
       [](raw_peer& t) {
         t.send_control(control_type::closing, 0);
         t.send_slot(8, 0);
       },
       "after its closing frame"},
  };
  for (const auto& c : cases) {
    SECTION(c.name) {
      raw_peer t;
      c.send(t);
      const auto e = t.wait_failure();
      REQUIRE(e.has_value());
      INFO(e->what());
      CHECK(e->code() == plait::errc::protocol);
      CHECK(e->peer() == 1);
      CHECK(e->rank() == 0);
      CHECK(contains(e->what(), "garbage from rank 1"));
      CHECK(contains(e->what(), c.says));
      // Sticky: every later check says the same.
      CHECK_THROWS_AS(t.links->health(1), plait::error);
    }
  }
}

TEST_CASE("tcp end of stream is peer_lost, once the slots that arrived before it are read", "[tcp][frames]") {
  raw_peer t;
  t.send_slot(16, 0);
  t.raw.reset();  // the peer's process is gone
  REQUIRE(t.wait_slot().header != nullptr);
  std::this_thread::sleep_for(50ms);    // the end of stream has been seen by now
  REQUIRE_NOTHROW(t.links->health(1));  // a slot is still there to read
  t.links->release(1);
  const auto e = t.wait_failure(1000ms);
  REQUIRE(e.has_value());
  INFO(e->what());
  CHECK(e->code() == plait::errc::peer_lost);
  CHECK(e->peer() == 1);
  CHECK(contains(e->what(), "rank 1 closed its connection"));
}

TEST_CASE("tcp end of stream inside a frame is peer_lost", "[tcp][frames]") {
  raw_peer t;
  slot_header h = plait::testing::pattern_header(1, 0, 100);
  t.send(&h, sizeof h);
  std::vector<std::byte> half(50);
  t.send(half.data(), half.size());
  t.raw.reset();
  const auto e = t.wait_failure(1000ms);
  REQUIRE(e.has_value());
  CHECK(e->code() == plait::errc::peer_lost);
  CHECK(contains(e->what(), "inside a frame"));
  CHECK(t.links->peek(1).header == nullptr);
}

TEST_CASE("tcp a peer that closed is no error until this rank waits on it for more", "[tcp][frames]") {
  raw_peer t;
  t.send_control(control_type::closing, 2);  // two more slots follow
  t.send_slot(4, 0);
  REQUIRE(t.wait_slot().header != nullptr);
  REQUIRE_NOTHROW(t.links->health(1));
  t.links->release(1);
  std::this_thread::sleep_for(20ms);
  REQUIRE_NOTHROW(t.links->health(1));  // one more is announced
  t.send_slot(4, 1);
  REQUIRE(t.wait_slot().header != nullptr);
  t.links->release(1);
  const auto e = t.wait_failure(1000ms);
  REQUIRE(e.has_value());
  INFO(e->what());
  CHECK(e->code() == plait::errc::peer_lost);
  CHECK(contains(e->what(), "rank 1 closed its connection"));
}

TEST_CASE("tcp sending to a peer that closed is an error even while its slots are unread", "[tcp][frames]") {
  raw_peer t;
  t.send_slot(4, 0);
  t.send_control(control_type::closing, 0);
  REQUIRE(t.wait_slot().header != nullptr);
  std::this_thread::sleep_for(20ms);
  REQUIRE_NOTHROW(t.links->health(1));
  REQUIRE(t.links->acquire(1) == nullptr);
  CHECK_THROWS_AS(t.links->health(1), plait::error);
}

TEST_CASE("tcp close() announces the slots still to come, sends them as credits allow, then ends the stream",
          "[tcp][frames]") {
  raw_peer t;
  for (std::uint64_t i = 0; i < 2; ++i) {
    REQUIRE(t.links->acquire(1) != nullptr);
    t.links->post(1, plait::testing::pattern_header(0, i, 0));
  }
  REQUIRE(t.receive<slot_header>().desc.sequence == 0);
  REQUIRE(t.receive<slot_header>().desc.sequence == 1);
  t.send_control(control_type::credit, 1);  // room for one more
  std::this_thread::sleep_for(20ms);
  for (std::uint64_t i = 2; i < 4; ++i) {
    const auto until = plait::clock::now() + 2s;
    while (t.links->acquire(1) == nullptr && plait::clock::now() < until) std::this_thread::sleep_for(1ms);
    t.links->post(1, plait::testing::pattern_header(0, i, 0));
  }
  REQUIRE(t.receive<slot_header>().desc.sequence == 2);
  t.links->close();
  const auto c = t.receive<control_frame>();
  REQUIRE(c.type == control_type::closing);
  const auto info = plait::transport::tcp_detail::decode_closing(c.value);
  REQUIRE(info.remaining == 1);              // slot 3 still waits for a credit
  CHECK(info.code == plait::errc::aborted);  // a plain close() blames nobody else
  CHECK(info.culprit == -1);
  CHECK(t.silent_for(50ms));
  t.send_control(control_type::credit, 1);
  REQUIRE(t.receive<slot_header>().desc.sequence == 3);
  char byte;
  REQUIRE(::recv(t.raw.get(), &byte, 1, 0) == 0);  // end of stream
  // This rank's own calls now fail fast.
  REQUIRE(t.links->acquire(1) == nullptr);
  try {
    t.links->health(1);
    FAIL("health() after close() must throw");
  } catch (const plait::error& e) {
    CHECK(e.code() == plait::errc::aborted);
  }
}

TEST_CASE("tcp destruction delivers the slots already posted before ending the stream", "[tcp][frames]") {
  raw_peer t;
  for (std::uint64_t i = 0; i < 2; ++i) {
    REQUIRE(t.links->acquire(1) != nullptr);
    t.links->post(1, plait::testing::pattern_header(0, i, 8));
  }
  std::this_thread::sleep_for(50ms);  // both are in the socket, unread: the destructor must wait for them
  std::thread destroy([&] { t.links.reset(); });
  std::vector<std::uint64_t> got;
  for (int i = 0; i < 2; ++i) {
    got.push_back(t.receive<slot_header>().desc.sequence);
    char payload[8];
    plait::detail::recv_all(t.raw.get(), payload, 8, plait::clock::now() + 5s);
  }
  const auto c = t.receive<control_frame>();
  char byte;
  const auto end = ::recv(t.raw.get(), &byte, 1, 0);
  destroy.join();
  CHECK(got == std::vector<std::uint64_t>{0, 1});
  CHECK(c.type == control_type::closing);
  CHECK(end == 0);
}

TEST_CASE("tcp connect, traffic and destruction leave no thread or descriptor behind", "[tcp][frames]") {
  auto count = [](const char* dir) {
    return std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator());
  };
  const auto fds = count("/proc/self/fd"), threads = count("/proc/self/task");
  {
    plait::testing::temp_dir dir;
    std::string errors[2];
    std::thread ranks[2];
    for (int r = 0; r < 2; ++r)
      ranks[r] = std::thread([&, r] {
        try {
          plait::testing::file_bootstrap ctx(dir.path, r, 2);
          plait::detail::doorbell bell;
          const int peer = 1 - r;
          auto links = plait::transport::tcp::connect(ctx, bell, plait::link_config{300, 2, 10s}, std::span(&peer, 1));
          errors[r] = plait::testing::exchange_all(*links, bell, r, std::span(&peer, 1), 50, 10s);
        } catch (const std::exception& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : ranks) t.join();
    CHECK(errors[0].empty());
    CHECK(errors[1].empty());
    raw_peer t;
    t.send_slot(10, 0);
    REQUIRE(t.wait_slot().header != nullptr);
  }
  CHECK(count("/proc/self/fd") == fds);
  CHECK(count("/proc/self/task") == threads);
}
